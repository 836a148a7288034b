//! The node's one writer on the fake kernel: each operation one call under the host-wide lock,
//! checked before its first write, answering with what it did.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use gpu_core::{ClassifiedError, ErrorKind, MdevUuid, ParentId, PciAddress};
use gpu_node::{Node, NodeError, Removed, Target, VgpuId};
use gpu_sysfs::actuate::Created;
use gpu_sysfs::discover::DiscoverOptions;
use gpu_sysfs::testing::FakeKernel;

fn pci(a: &str) -> PciAddress {
    a.parse().unwrap()
}

fn uuid(n: u32) -> MdevUuid {
    MdevUuid::for_machine("vm", "gpu", n)
}

fn no_names(n: &str) -> Result<PciAddress, NodeError> {
    panic!("{n:?} should not need resolving by name")
}

fn create(node: &Node<'_>, parent: &str, profile: &str, u: Option<MdevUuid>) -> Created {
    node.create_vgpu(
        &parent.parse::<ParentId>().unwrap(),
        profile,
        false,
        no_names,
        |_| Ok(u),
    )
    .unwrap()
}

fn mdev_parent(c: &Created) -> ParentId {
    match c {
        Created::Mdev(m) => m.parent.clone(),
        Created::VendorVfio(v) => panic!("expected an mdev, got VF {}", v.vf),
    }
}

#[test]
fn a_vgpu_asked_on_a_gpu_lands_on_its_first_vf_with_room_and_its_uuid_finds_it_again() {
    let k = FakeKernel::a2_mdev_host().unwrap();
    let opts = DiscoverOptions::new("node-a");
    let node = Node::new(&k, &opts);
    let first = create(&node, "0000:08:00.0", "A2-4Q", Some(uuid(0)));
    assert_eq!(mdev_parent(&first), ParentId::Pci(pci("0000:08:00.4")));
    let second = create(&node, "0000:08:00.0", "A2-4Q", Some(uuid(1)));
    assert_eq!(mdev_parent(&second), ParentId::Pci(pci("0000:08:00.5")));
    // The same request again: found where it is, nothing written.
    let again = create(&node, "0000:08:00.0", "A2-4Q", Some(uuid(0)));
    assert_eq!(mdev_parent(&again), ParentId::Pci(pci("0000:08:00.4")));
    assert!(matches!(again, Created::Mdev(ref m) if !m.changed));
    // The choice is the one function's, asked under the lock.
    let locked = node.lock().unwrap();
    let t = locked
        .choose_target(&ParentId::Pci(pci("0000:08:00.0")), "A2-4Q", None, no_names)
        .unwrap();
    assert_eq!(
        t,
        Target::Mdev {
            parent: ParentId::Pci(pci("0000:08:00.6")),
            type_id: "nvidia-746".parse().unwrap(),
            on_gpu: Some(pci("0000:08:00.0")),
        }
    );
}

#[test]
fn an_mdev_without_a_uuid_is_refused_before_anything_is_written() {
    let k = FakeKernel::a2_mdev_host().unwrap();
    let opts = DiscoverOptions::new("node-a");
    let node = Node::new(&k, &opts);
    let e = node
        .create_vgpu(
            &ParentId::Pci(pci("0000:08:00.0")),
            "A2-4Q",
            false,
            no_names,
            |_| Ok(None),
        )
        .unwrap_err();
    assert!(matches!(e, NodeError::Unnamed { .. }), "{e}");
    assert_eq!(e.kind(), ErrorKind::InvalidArgument);
    assert!(k.writes().is_empty(), "{:?}", k.writes());
}

#[test]
fn an_unknown_profile_keeps_the_kind_and_message_of_the_step_below() {
    let k = FakeKernel::a2_mdev_host().unwrap();
    let opts = DiscoverOptions::new("node-a");
    let node = Node::new(&k, &opts);
    let e = node
        .create_vgpu(
            &ParentId::Pci(pci("0000:08:00.4")),
            "A2-99Q",
            false,
            no_names,
            |_| Ok(Some(uuid(0))),
        )
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::UnknownProfile);
    assert!(
        e.to_string()
            .starts_with("0000:08:00.4 has no vGPU type \"A2-99Q\""),
        "{e}"
    );
}

#[test]
fn a_vgpu_a_vm_holds_is_not_removed_unless_forced() {
    let k = FakeKernel::a2_mdev_host().unwrap();
    let opts = DiscoverOptions::new("node-a");
    let node = Node::new(&k, &opts);
    create(&node, "0000:08:00.4", "A2-4Q", Some(uuid(0)));
    k.open_device(&format!("sys/bus/mdev/devices/{}", uuid(0)))
        .unwrap();
    let e = node.remove_vgpu(&VgpuId::Mdev(uuid(0)), false).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InUse);
    let msg = gpu_core::error_chain(&e);
    assert!(
        msg.starts_with(&format!("cannot remove mdev {}: ", uuid(0))) && msg.contains("in use by"),
        "{msg}"
    );
    assert!(
        k.root()
            .join(format!("sys/bus/mdev/devices/{}", uuid(0)))
            .exists()
    );
    let r = node.remove_vgpu(&VgpuId::Mdev(uuid(0)), true).unwrap();
    assert!(matches!(r, Removed::Mdev(ref m) if m.changed));
    // Asked again: nothing to remove, nothing written.
    assert!(
        !node
            .remove_vgpu(&VgpuId::Mdev(uuid(0)), false)
            .unwrap()
            .changed()
    );
}

#[test]
fn sriov_disable_is_refused_while_a_vf_holds_a_vgpu_and_then_takes_the_vfs_away() {
    let k = FakeKernel::l40s_vendor_vfio_host(4).unwrap();
    let opts = DiscoverOptions::new("node-a");
    let node = Node::new(&k, &opts);
    let pf = pci("0000:26:00.0");
    let made = create(&node, "0000:26:00.0", "NVIDIA L40S-24Q", None);
    let Created::VendorVfio(set) = made else {
        panic!("expected a vendor-VFIO vGPU");
    };
    let writes = k.writes().len();
    let e = node.disable_sriov(&pf).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InUse);
    let msg = gpu_core::error_chain(&e);
    assert!(
        msg.starts_with("cannot disable SR-IOV on 0000:26:00.0: "),
        "{msg}"
    );
    assert!(
        msg.contains(&format!("VF {} holds vGPU type", set.vf)),
        "{msg}"
    );
    assert_eq!(k.writes().len(), writes, "nothing written when refused");
    node.remove_vgpu(&VgpuId::Vf(set.vf), false).unwrap();
    let done = node.disable_sriov(&pf).unwrap();
    assert!(done.changed);
    assert_eq!(done.vfs.len(), 4);
    let numvfs = std::fs::read_to_string(
        k.root()
            .join("sys/bus/pci/devices/0000:26:00.0/sriov_numvfs"),
    )
    .unwrap();
    assert_eq!(numvfs.trim(), "0");
    assert!(
        !k.root()
            .join(format!("sys/bus/pci/devices/{}", set.vf))
            .exists()
    );
    // Again: nothing to disable.
    assert!(!node.disable_sriov(&pf).unwrap().changed);
}

#[test]
fn sriov_disable_is_refused_while_a_process_holds_a_vf_open() {
    let k = FakeKernel::l40s_vendor_vfio_host(2).unwrap();
    let opts = DiscoverOptions::new("node-a");
    let node = Node::new(&k, &opts);
    let vf = gpu_sysfs::actuate::vfs_of(&k, &pci("0000:26:00.0"))[1];
    k.open_device(&format!("sys/bus/pci/devices/{vf}")).unwrap();
    let e = node.disable_sriov(&pci("0000:26:00.0")).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InUse);
    let msg = gpu_core::error_chain(&e);
    assert!(msg.contains(&format!("VF {vf} is open by pid")), "{msg}");
}

#[test]
fn a_whole_gpu_is_bound_and_released_and_a_shared_group_is_refused_by_name() {
    let k = FakeKernel::passthrough_host().unwrap();
    let opts = DiscoverOptions::new("node-a");
    let node = Node::new(&k, &opts);
    let b = node.bind_gpu(&pci("0000:01:00.0")).unwrap();
    assert!(b.changed());
    assert!(
        b.functions
            .iter()
            .all(|f| f.driver_after.as_deref() == Some("vfio-pci"))
    );
    let r = node.release_gpu(&pci("0000:01:00.0"), false).unwrap();
    assert!(r.changed());
    let e = node.bind_gpu(&pci("0000:02:00.0")).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::GroupNotViable);
    assert!(
        e.to_string()
            .starts_with("cannot bind 0000:02:00.0 to vfio-pci"),
        "{e}"
    );
}

#[test]
fn a_second_writer_waits_for_the_lock_and_gives_up_after_its_timeout() {
    let k = FakeKernel::a2_mdev_host().unwrap();
    let opts = DiscoverOptions::new("node-a");
    let holder = Node::new(&k, &opts);
    let held = holder.lock().unwrap();
    assert!(held.path().ends_with("run/gpuslice/vgpu.lock"));
    let told = std::sync::atomic::AtomicBool::new(false);
    let tell = |_: &std::path::Path| told.store(true, std::sync::atomic::Ordering::SeqCst);
    let other = Node::new(&k, &opts)
        .lock_timeout(Some(Duration::from_millis(100)))
        .on_lock_wait(&tell);
    let e = other
        .create_vgpu(
            &ParentId::Pci(pci("0000:08:00.4")),
            "A2-4Q",
            false,
            no_names,
            |_| Ok(Some(uuid(0))),
        )
        .unwrap_err();
    assert!(matches!(e, NodeError::Lock(_)), "{e}");
    assert_eq!(e.kind(), ErrorKind::Busy);
    assert!(told.load(std::sync::atomic::Ordering::SeqCst));
    assert!(k.writes().is_empty());
    drop(held);
    create(&other, "0000:08:00.4", "A2-4Q", Some(uuid(0)));
}
