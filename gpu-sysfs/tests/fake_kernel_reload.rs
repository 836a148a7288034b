//! A reload of the vGPU manager in the fake kernel drops every vGPU as the real one does: mdev
//! instances gone, every VF's `current_vgpu_type` back to 0, the capacity given back; refused
//! while a VM holds one open.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use gpu_sysfs::Host;
use gpu_sysfs::testing::FakeKernel;

const U1: &str = "de306c9f-a714-4373-a290-dc15d4e49b71";
const U2: &str = "de306c9f-a714-4373-a290-dc15d4e49b72";

fn a2_create(k: &FakeKernel, vf: &str, uuid: &str) {
    k.write(
        &format!("sys/class/mdev_bus/{vf}/mdev_supported_types/nvidia-746/create"),
        uuid.as_bytes(),
    )
    .unwrap();
}

fn available(k: &FakeKernel, vf: &str) -> String {
    k.read_string(&format!(
        "sys/class/mdev_bus/{vf}/mdev_supported_types/nvidia-746/available_instances"
    ))
    .unwrap()
}

#[test]
fn a_reload_removes_every_mdev_of_an_a2_and_gives_the_framebuffer_back() {
    let k = FakeKernel::a2_mdev_host().unwrap();
    a2_create(&k, "0000:08:00.4", U1);
    a2_create(&k, "0000:08:00.5", U2);
    assert_eq!(available(&k, "0000:08:00.4"), "0");
    let dropped = k.reload_vgpu_manager().unwrap();
    assert_eq!(
        dropped
            .mdevs
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>(),
        [U1, U2]
    );
    assert!(dropped.vfs.is_empty());
    assert!(k.list("sys/bus/mdev/devices").unwrap().is_empty());
    assert!(!k.exists(&format!("sys/class/mdev_bus/0000:08:00.4/{U1}")));
    assert_eq!(available(&k, "0000:08:00.4"), "1");
    // The same UUID can be made again, as the agent does after a reload.
    a2_create(&k, "0000:08:00.4", U1);
}

#[test]
fn a_reload_clears_every_vendor_vfio_vf_of_an_l40s() {
    let k = FakeKernel::l40s_vendor_vfio_host(4).unwrap();
    let ty = |f: &str| format!("sys/bus/pci/devices/0000:26:00.{f}/nvidia/current_vgpu_type");
    k.write(&ty("4"), b"1155").unwrap();
    k.write(&ty("5"), b"1155").unwrap();
    let full = k
        .read_string("sys/bus/pci/devices/0000:26:00.6/nvidia/creatable_vgpu_types")
        .unwrap();
    assert_eq!(full, "ID    : vGPU Name", "two 24 GB vGPUs fill the card");
    let dropped = k.reload_vgpu_manager().unwrap();
    assert_eq!(
        dropped
            .vfs
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>(),
        ["0000:26:00.4", "0000:26:00.5"]
    );
    assert!(dropped.mdevs.is_empty());
    for f in ["4", "5", "6", "7"] {
        assert_eq!(k.read_string(&ty(f)).unwrap(), "0");
    }
    let free = k
        .read_string("sys/bus/pci/devices/0000:26:00.6/nvidia/creatable_vgpu_types")
        .unwrap();
    assert!(free.contains("1155  : NVIDIA L40S-24Q"), "{free}");
    k.write(&ty("4"), b"1155").unwrap();
}

#[test]
fn a_reload_while_a_vm_holds_a_vgpu_is_refused_and_changes_nothing() {
    let k = FakeKernel::a2_mdev_host().unwrap();
    a2_create(&k, "0000:08:00.4", U1);
    a2_create(&k, "0000:08:00.5", U2);
    let pid = k
        .open_device(&format!("sys/bus/mdev/devices/{U2}"))
        .unwrap();
    let e = k.reload_vgpu_manager().unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::ResourceBusy);
    assert!(e.to_string().contains(U2), "{e}");
    assert_eq!(k.list("sys/bus/mdev/devices").unwrap().len(), 2);
    k.close_device(pid).unwrap();
    assert_eq!(k.reload_vgpu_manager().unwrap().mdevs.len(), 2);
}
