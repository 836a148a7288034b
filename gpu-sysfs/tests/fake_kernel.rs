//! The fake kernel reacts to writes as the real kernel did in the recorded runs
//! (Linux 6.1 sample mdev drivers, vfio-pci binding) and as NVIDIA's drivers are documented to.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use gpu_sysfs::Host;
use gpu_sysfs::actuate::error::errno;
use gpu_sysfs::testing::{FakeKernel, SriovManage};

const MBOCHS: &str = "sys/class/mdev_bus/mbochs/mdev_supported_types";
const U1: &str = "de306c9f-a714-4373-a290-dc15d4e49b71";

fn counts(k: &FakeKernel, parent: &str, types: &[&str]) -> Vec<u32> {
    types
        .iter()
        .map(|t| {
            k.read_string(&format!(
                "sys/class/mdev_bus/{parent}/mdev_supported_types/{t}/available_instances"
            ))
            .unwrap()
            .parse()
            .unwrap()
        })
        .collect()
}

fn mbochs(k: &FakeKernel) -> Vec<u32> {
    counts(
        k,
        "mbochs",
        &["mbochs-small", "mbochs-medium", "mbochs-large"],
    )
}

fn uuid(i: u32) -> String {
    format!("00000000-0000-4000-8000-{i:012x}")
}

fn os_err(r: std::io::Result<()>) -> i32 {
    r.unwrap_err().raw_os_error().unwrap()
}

#[test]
fn mbochs_types_share_one_256_mb_pool() {
    let k = FakeKernel::sample_mdev_drivers().unwrap();
    assert_eq!(mbochs(&k), [64, 16, 4]);
    k.write(&format!("{MBOCHS}/mbochs-small/create"), U1.as_bytes())
        .unwrap();
    assert_eq!(mbochs(&k), [63, 15, 3]);
    for i in 0..3 {
        k.write(&format!("{MBOCHS}/mbochs-large/create"), uuid(i).as_bytes())
            .unwrap();
    }
    assert_eq!(mbochs(&k), [15, 3, 0]);
    let full = k.write(&format!("{MBOCHS}/mbochs-large/create"), uuid(9).as_bytes());
    assert_eq!(os_err(full), errno::ENOSPC);
    assert!(!k.exists(&format!("sys/bus/mdev/devices/{}", uuid(9))));
}

#[test]
fn a_created_instance_looks_like_the_kernels() {
    let k = FakeKernel::sample_mdev_drivers().unwrap();
    k.write(
        &format!("{MBOCHS}/mbochs-small/create"),
        format!("{U1}\n").as_bytes(),
    )
    .unwrap();
    let inst = format!("sys/bus/mdev/devices/{U1}");
    assert_eq!(
        k.resolve_link(&inst).unwrap(),
        format!("sys/devices/virtual/mbochs/mbochs/{U1}")
    );
    assert_eq!(
        k.read_string(&format!("{inst}/mdev_type/name")).unwrap(),
        "mbochs-small"
    );
    let group = k.resolve_link(&format!("{inst}/iommu_group")).unwrap();
    assert!(group.starts_with("sys/kernel/iommu_groups/"), "{group}");
    assert!(k.exists(&format!("{MBOCHS}/mbochs-small/devices/{U1}/remove")));
    assert_eq!(k.list(&format!("{inst}/vfio-dev")).unwrap(), ["vfio0"]);
}

#[test]
fn duplicate_uuids_are_refused_on_every_parent_and_in_either_case() {
    let k = FakeKernel::sample_mdev_drivers().unwrap();
    k.write(&format!("{MBOCHS}/mbochs-small/create"), U1.as_bytes())
        .unwrap();
    for path in [
        format!("{MBOCHS}/mbochs-small/create"),
        format!("{MBOCHS}/mbochs-medium/create"),
        "sys/class/mdev_bus/mtty/mdev_supported_types/mtty-1/create".to_owned(),
    ] {
        assert_eq!(os_err(k.write(&path, U1.as_bytes())), errno::EEXIST);
    }
    let upper = U1.to_ascii_uppercase();
    assert_eq!(
        os_err(k.write(&format!("{MBOCHS}/mbochs-small/create"), upper.as_bytes())),
        errno::EEXIST
    );
}

#[test]
fn malformed_uuids_are_invalid() {
    let k = FakeKernel::sample_mdev_drivers().unwrap();
    for bad in ["not-a-uuid", "12345678-1234-1234-1234-12345678zzzz", ""] {
        let r = k.write(&format!("{MBOCHS}/mbochs-small/create"), bad.as_bytes());
        assert_eq!(os_err(r), errno::EINVAL, "{bad:?}");
    }
    assert_eq!(mbochs(&k), [64, 16, 4]);
}

#[test]
fn remove_with_1_restores_capacity_and_0_does_nothing() {
    let k = FakeKernel::sample_mdev_drivers().unwrap();
    let before = k.snapshot().unwrap();
    k.write(&format!("{MBOCHS}/mbochs-large/create"), U1.as_bytes())
        .unwrap();
    assert_eq!(mbochs(&k), [48, 12, 3]);
    let remove = format!("sys/bus/mdev/devices/{U1}/remove");
    k.write(&remove, b"0").unwrap();
    assert!(k.exists(&remove));
    k.write(&remove, b"1").unwrap();
    assert!(!k.exists(&format!("sys/bus/mdev/devices/{U1}")));
    assert_eq!(
        k.snapshot().unwrap(),
        before,
        "remove undoes create exactly"
    );
}

#[test]
fn mtty_counts_ports_and_mdpy_runs_out_with_eusers() {
    let k = FakeKernel::sample_mdev_drivers().unwrap();
    let mtty = "sys/class/mdev_bus/mtty/mdev_supported_types";
    assert_eq!(counts(&k, "mtty", &["mtty-1", "mtty-2"]), [24, 12]);
    k.write(&format!("{mtty}/mtty-2/create"), uuid(1).as_bytes())
        .unwrap();
    assert_eq!(counts(&k, "mtty", &["mtty-1", "mtty-2"]), [22, 11]);
    assert!(
        !k.exists(&format!("{mtty}/mtty-1/description")),
        "mtty has none"
    );

    let mdpy = "sys/class/mdev_bus/mdpy/mdev_supported_types";
    for i in 0..4 {
        k.write(&format!("{mdpy}/mdpy-vga/create"), uuid(10 + i).as_bytes())
            .unwrap();
    }
    assert_eq!(
        counts(&k, "mdpy", &["mdpy-vga", "mdpy-xga", "mdpy-hd"]),
        [0, 0, 0]
    );
    let r = k.write(&format!("{mdpy}/mdpy-hd/create"), uuid(20).as_bytes());
    assert_eq!(os_err(r), errno::EUSERS);
}

#[test]
fn nvidia_vfs_share_the_cards_framebuffer_with_one_size() {
    let k = FakeKernel::a2_mdev_host().unwrap();
    let types = ["nvidia-742", "nvidia-746", "nvidia-750", "nvidia-754"];
    // A free VF offers one instance of every type: per-VF counts overstate what fits.
    assert_eq!(counts(&k, "0000:08:00.4", &types), [1, 1, 1, 1]);
    k.write(
        "sys/class/mdev_bus/0000:08:00.4/mdev_supported_types/nvidia-746/create",
        U1.as_bytes(),
    )
    .unwrap();
    assert_eq!(
        counts(&k, "0000:08:00.4", &types),
        [0, 0, 0, 0],
        "VF holds one"
    );
    // Other VFs: only 4 GB types still fit (same-size rule), 3 × 4 GB left.
    assert_eq!(counts(&k, "0000:08:00.5", &types), [0, 1, 0, 1]);
    for (i, vf) in ["0000:08:00.5", "0000:08:00.6", "0000:08:00.7"]
        .iter()
        .enumerate()
    {
        k.write(
            &format!("sys/class/mdev_bus/{vf}/mdev_supported_types/nvidia-754/create"),
            uuid(i as u32).as_bytes(),
        )
        .unwrap();
    }
    assert_eq!(
        counts(&k, "0000:08:01.0", &types),
        [0, 0, 0, 0],
        "card full"
    );
    let r = k.write(
        "sys/class/mdev_bus/0000:08:01.0/mdev_supported_types/nvidia-746/create",
        uuid(7).as_bytes(),
    );
    assert_eq!(os_err(r), errno::ENOSPC);
}

#[test]
fn sriov_manage_enables_vendor_vfio_vfs() {
    let k = FakeKernel::l40s_vendor_vfio_host(0).unwrap();
    let out = k
        .run(
            "/usr/lib/nvidia/sriov-manage",
            &["-e".into(), "0000:26:00.0".into()],
            Duration::from_secs(1),
        )
        .unwrap();
    assert_eq!(out.status, Some(0));
    assert_eq!(
        k.read_string("sys/bus/pci/devices/0000:26:00.0/sriov_numvfs")
            .unwrap(),
        "32"
    );
    assert_eq!(
        k.resolve_link("sys/bus/pci/devices/0000:26:00.0/virtfn0")
            .unwrap(),
        "sys/devices/pci0000:00/0000:26:00.4"
    );
    let listed = k
        .read_string("sys/bus/pci/devices/0000:26:00.4/nvidia/creatable_vgpu_types")
        .unwrap();
    assert!(listed.starts_with("ID    : vGPU Name"));
    assert!(listed.contains("1155  : NVIDIA L40S-24Q"), "{listed}");
}

#[test]
fn vendor_vfio_types_shrink_every_sibling_list() {
    let k = FakeKernel::l40s_vendor_vfio_host(4).unwrap();
    let vf = |f: &str| format!("sys/bus/pci/devices/0000:26:00.{f}/nvidia");
    k.write(&format!("{}/current_vgpu_type", vf("4")), b"1155")
        .unwrap();
    assert_eq!(
        k.read_string(&format!("{}/current_vgpu_type", vf("4")))
            .unwrap(),
        "1155"
    );
    let sibling = k
        .read_string(&format!("{}/creatable_vgpu_types", vf("5")))
        .unwrap();
    assert_eq!(
        sibling, "ID    : vGPU Name\n1155  : NVIDIA L40S-24Q\n1165  : NVIDIA L40S-24A",
        "only 24 GB types fit next to a 24 GB vGPU"
    );
    assert_eq!(
        os_err(k.write(&format!("{}/current_vgpu_type", vf("4")), b"1155")),
        errno::EPERM,
        "a VF that has a type refuses another"
    );
    assert_eq!(
        os_err(k.write(&format!("{}/current_vgpu_type", vf("5")), b"1152")),
        errno::EIO,
        "8 GB does not fit next to 24 GB"
    );
    k.write(&format!("{}/current_vgpu_type", vf("5")), b"1155")
        .unwrap();
    assert_eq!(
        k.read_string(&format!("{}/creatable_vgpu_types", vf("6")))
            .unwrap(),
        "ID    : vGPU Name",
        "a used-up GPU lists just the header"
    );
    k.write(&format!("{}/current_vgpu_type", vf("4")), b"0")
        .unwrap();
    k.write(&format!("{}/current_vgpu_type", vf("5")), b"0")
        .unwrap();
    assert!(
        k.read_string(&format!("{}/creatable_vgpu_types", vf("6")))
            .unwrap()
            .contains("1152  : NVIDIA L40S-8Q")
    );
}

#[test]
fn driver_override_needs_a_newline_to_clear() {
    let k = FakeKernel::passthrough_host().unwrap();
    let ov = "sys/bus/pci/devices/0000:01:00.0/driver_override";
    assert_eq!(k.read_string(ov).unwrap(), "(null)");
    k.write(ov, b"vfio-pci").unwrap();
    k.write(ov, b"").unwrap();
    assert_eq!(
        k.read_string(ov).unwrap(),
        "vfio-pci",
        "empty write does nothing"
    );
    k.write(ov, b"\n").unwrap();
    assert_eq!(k.read_string(ov).unwrap(), "(null)");
    k.write(ov, b"vfio-pci\n").unwrap();
    assert_eq!(k.read_string(ov).unwrap(), "vfio-pci");
}

#[test]
fn binding_follows_override_unbind_and_probe() {
    let k = FakeKernel::passthrough_host().unwrap();
    let dev = "sys/bus/pci/devices/0000:01:00.0";
    let driver = || {
        k.resolve_link(&format!("{dev}/driver"))
            .ok()
            .map(|d| d.rsplit('/').next().unwrap().to_owned())
    };
    assert_eq!(
        os_err(k.write("sys/bus/pci/drivers/vfio-pci/bind", b"0000:01:00.0")),
        errno::EBUSY
    );
    k.write(&format!("{dev}/driver/unbind"), b"0000:01:00.0")
        .unwrap();
    assert_eq!(driver(), None);
    assert_eq!(
        os_err(k.write("sys/bus/pci/drivers/vfio-pci/bind", b"0000:01:00.0")),
        errno::ENODEV,
        "vfio-pci does not take a device without an override"
    );
    k.write(&format!("{dev}/driver_override"), b"vfio-pci")
        .unwrap();
    k.write("sys/bus/pci/drivers_probe", b"0000:01:00.0")
        .unwrap();
    assert_eq!(driver().as_deref(), Some("vfio-pci"));
    assert_eq!(
        k.read_link(&format!("{dev}/driver")).unwrap().to_str(),
        Some("../../../bus/pci/drivers/vfio-pci")
    );
    k.write("sys/bus/pci/drivers/vfio-pci/unbind", b"0000:01:00.0")
        .unwrap();
    k.write(&format!("{dev}/driver_override"), b"\n").unwrap();
    k.write("sys/bus/pci/drivers_probe", b"0000:01:00.0")
        .unwrap();
    assert_eq!(
        driver().as_deref(),
        Some("nvidia"),
        "back to the host driver"
    );
}

#[test]
fn drivers_probe_succeeds_even_when_the_probe_fails() {
    let k = FakeKernel::passthrough_host()
        .unwrap()
        .with_silent_probe_failure("0000:01:00.0");
    let dev = "sys/bus/pci/devices/0000:01:00.0";
    k.write(&format!("{dev}/driver_override"), b"vfio-pci")
        .unwrap();
    k.write(&format!("{dev}/driver/unbind"), b"0000:01:00.0")
        .unwrap();
    k.write("sys/bus/pci/drivers_probe", b"0000:01:00.0")
        .unwrap();
    assert!(
        k.read_link(&format!("{dev}/driver")).is_err(),
        "left unbound"
    );
    // vfio-pci also cannot take a device without an IOMMU group, silently.
    let dev4 = "sys/bus/pci/devices/0000:04:00.0";
    k.write(&format!("{dev4}/driver_override"), b"vfio-pci")
        .unwrap();
    k.write(&format!("{dev4}/driver/unbind"), b"0000:04:00.0")
        .unwrap();
    k.write("sys/bus/pci/drivers_probe", b"0000:04:00.0")
        .unwrap();
    assert!(k.read_link(&format!("{dev4}/driver")).is_err());
}

#[test]
fn the_kth_write_fails_without_effect_and_every_write_is_logged() {
    let k = FakeKernel::sample_mdev_drivers()
        .unwrap()
        .failing_at(2, errno::EBUSY);
    let before_second = {
        k.write(&format!("{MBOCHS}/mbochs-small/create"), uuid(1).as_bytes())
            .unwrap();
        k.snapshot().unwrap()
    };
    let r = k.write(&format!("{MBOCHS}/mbochs-small/create"), uuid(2).as_bytes());
    assert_eq!(os_err(r), errno::EBUSY);
    assert_eq!(k.snapshot().unwrap(), before_second);
    k.write(&format!("{MBOCHS}/mbochs-small/create"), uuid(3).as_bytes())
        .unwrap();
    let log = k.writes();
    assert_eq!(log.len(), 3);
    assert_eq!(log[1].errno, Some(errno::EBUSY));
    assert_eq!(log[2].data, uuid(3));
    assert_eq!(log[0].errno, None);
}

#[test]
fn sriov_manage_faults_are_injectable() {
    let args = ["-e".to_owned(), "0000:26:00.0".to_owned()];
    let k = FakeKernel::l40s_vendor_vfio_host(0)
        .unwrap()
        .hanging("/usr/lib/nvidia/sriov-manage");
    let out = k
        .run(
            "/usr/lib/nvidia/sriov-manage",
            &args,
            Duration::from_secs(1),
        )
        .unwrap();
    assert!(out.timed_out);
    let k = FakeKernel::l40s_vendor_vfio_host(0)
        .unwrap()
        .with_sriov_manage(SriovManage::ExitsZeroWithoutEnabling);
    let out = k
        .run(
            "/usr/lib/nvidia/sriov-manage",
            &args,
            Duration::from_secs(1),
        )
        .unwrap();
    assert_eq!(out.status, Some(0));
    assert_eq!(
        k.read_string("sys/bus/pci/devices/0000:26:00.0/sriov_numvfs")
            .unwrap(),
        "0"
    );
    assert_eq!(k.runs().len(), 1);
}

#[test]
fn sriov_numvfs_writes_follow_the_kernels_rules() {
    let k = FakeKernel::l40s_vendor_vfio_host(0).unwrap();
    let f = "sys/bus/pci/devices/0000:26:00.0/sriov_numvfs";
    assert_eq!(os_err(k.write(f, b"33")), errno::ERANGE);
    k.write(f, b"2").unwrap();
    assert_eq!(k.list("sys/bus/pci/devices").unwrap().len(), 3);
    assert_eq!(os_err(k.write(f, b"4")), errno::EBUSY);
    k.write(f, b"0").unwrap();
    assert_eq!(k.list("sys/bus/pci/devices").unwrap(), ["0000:26:00.0"]);
}

#[test]
fn an_open_device_shows_up_as_a_process_fd() {
    let k = FakeKernel::passthrough_host()
        .unwrap()
        .with_open_device("sys/bus/pci/devices/0000:01:00.0");
    let pids = k.list("proc").unwrap();
    assert_eq!(pids.len(), 1);
    let fds = k.list(&format!("proc/{}/fd", pids[0])).unwrap();
    let targets: Vec<String> = fds
        .iter()
        .map(|fd| {
            k.read_link(&format!("proc/{}/fd/{fd}", pids[0]))
                .unwrap()
                .to_string_lossy()
                .into_owned()
        })
        .collect();
    assert!(targets.contains(&"/dev/vfio/1".to_owned()), "{targets:?}");
}

#[test]
fn concurrent_creates_never_overdraw_the_pool() {
    let k = std::sync::Arc::new(FakeKernel::sample_mdev_drivers().unwrap());
    let threads: Vec<_> = (0..4)
        .map(|t| {
            let k = k.clone();
            std::thread::spawn(move || {
                (0..3)
                    .filter(|i| {
                        k.write(
                            &format!("{MBOCHS}/mbochs-large/create"),
                            uuid(t * 10 + i).as_bytes(),
                        )
                        .is_ok()
                    })
                    .count()
            })
        })
        .collect();
    let made: usize = threads.into_iter().map(|t| t.join().unwrap()).sum();
    assert_eq!(made, 4, "256 MB hold four 64 MB instances");
    assert_eq!(mbochs(&k), [0, 0, 0]);
}

/// The real A2 capture (`tests/data/a2-vf-0000-08-01.7`): with an A2-4C, an A2-4A and an A2-4Q on
/// the card, a free VF reports 1 for the three 4 GB types and 0 for all others. The fake kernel,
/// given the same three instances, reports exactly what the real driver did.
#[test]
fn nvidia_counts_match_the_real_a2_capture() {
    let k = FakeKernel::a2_mdev_host().unwrap();
    for (vf, ty, u) in [
        ("0000:08:00.4", "nvidia-754", uuid(1)),
        ("0000:08:00.6", "nvidia-751", uuid(2)),
        ("0000:08:02.0", "nvidia-746", uuid(3)),
    ] {
        k.write(
            &format!("sys/class/mdev_bus/{vf}/mdev_supported_types/{ty}/create"),
            u.as_bytes(),
        )
        .unwrap();
    }
    let real = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/a2-vf-0000-08-01.7/mdev_supported_types");
    let mut compared = 0;
    for e in std::fs::read_dir(&real).unwrap() {
        let e = e.unwrap();
        let ty = e.file_name().to_string_lossy().into_owned();
        let want = std::fs::read_to_string(e.path().join("available_instances")).unwrap();
        let name = std::fs::read_to_string(e.path().join("name")).unwrap();
        let base = format!("sys/class/mdev_bus/0000:08:01.7/mdev_supported_types/{ty}");
        assert_eq!(
            k.read_string(&format!("{base}/available_instances"))
                .unwrap(),
            want.trim(),
            "{ty}"
        );
        assert_eq!(k.read_string(&format!("{base}/name")).unwrap(), name.trim());
        compared += 1;
    }
    assert_eq!(compared, 15);
}

/// A free VF of an idle L40S lists exactly what the real one did (`tests/data/l40s-vf-0000-26-00.4`).
#[test]
fn an_idle_l40s_vf_lists_what_the_real_one_did() {
    let k = FakeKernel::l40s_vendor_vfio_host(2).unwrap();
    let real = std::fs::read(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/data/l40s-vf-0000-26-00.4/nvidia/creatable_vgpu_types"),
    )
    .unwrap();
    let fake = k
        .read("sys/bus/pci/devices/0000:26:00.5/nvidia/creatable_vgpu_types")
        .unwrap();
    assert_eq!(
        String::from_utf8(fake).unwrap(),
        String::from_utf8(real).unwrap()
    );
    assert_eq!(
        k.read_string("sys/bus/pci/devices/0000:26:00.5/nvidia/current_vgpu_type")
            .unwrap(),
        "0"
    );
}
