//! Actuation against the fake kernel: what each operation writes, what it refuses, and how its
//! errors read.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use gpu_core::{MdevUuid, ParentId, PciAddress, VgpuTypeId};
use gpu_sysfs::Host;
use gpu_sysfs::actuate::error::errno;
use gpu_sysfs::actuate::{
    self, ActuateError, MdevCreate, SriovOptions, bind_gpu, clear_vf, create_mdev, enable_sriov,
    release_gpu, remove_mdev, set_vf_type,
};
use gpu_sysfs::testing::{FakeKernel, SriovManage};

fn req(parent: &str, ty: &str, uuid: MdevUuid) -> MdevCreate {
    MdevCreate {
        parent: parent.parse().unwrap(),
        type_id: ty.parse().unwrap(),
        uuid,
    }
}

fn pci(s: &str) -> PciAddress {
    s.parse().unwrap()
}

fn avail(k: &FakeKernel, parent: &str, ty: &str) -> String {
    k.read_string(&format!(
        "sys/class/mdev_bus/{parent}/mdev_supported_types/{ty}/available_instances"
    ))
    .unwrap()
}

// ----- mdev ------------------------------------------------------------------------------------

#[test]
fn create_makes_the_machines_stable_uuid_and_hands_it_to_qemu() {
    let k = FakeKernel::sample_mdev_drivers().unwrap();
    let uuid = MdevUuid::for_machine("vm1", "gpu", 0);
    let made = create_mdev(&k, &req("mbochs", "mbochs-small", uuid)).unwrap();
    assert!(made.changed);
    assert_eq!(made.type_name.as_deref(), Some("mbochs-small"));
    assert_eq!(
        made.handoff.qemu,
        format!("-device vfio-pci,sysfsdev=/sys/bus/mdev/devices/{uuid}")
    );
    assert!(made.handoff.libvirt.contains(&format!("uuid='{uuid}'")));
    assert_eq!(avail(&k, "mbochs", "mbochs-small"), "63");
    let json = serde_json::to_value(&made).unwrap();
    assert_eq!(json["typeId"], "mbochs-small");
    assert_eq!(json["sysfsPath"], format!("/sys/bus/mdev/devices/{uuid}"));
}

#[test]
fn creating_the_same_instance_again_is_success_without_a_write() {
    let k = FakeKernel::sample_mdev_drivers().unwrap();
    let uuid = MdevUuid::for_machine("vm1", "gpu", 0);
    create_mdev(&k, &req("mbochs", "mbochs-small", uuid)).unwrap();
    let again = create_mdev(&k, &req("mbochs", "mbochs-small", uuid)).unwrap();
    assert!(!again.changed);
    assert_eq!(k.writes().len(), 1);
    assert_eq!(avail(&k, "mbochs", "mbochs-small"), "63");
}

#[test]
fn the_same_uuid_with_another_type_is_an_error_naming_both() {
    let k = FakeKernel::sample_mdev_drivers().unwrap();
    let uuid = MdevUuid::for_machine("vm1", "gpu", 0);
    create_mdev(&k, &req("mbochs", "mbochs-small", uuid)).unwrap();
    let e = create_mdev(&k, &req("mbochs", "mbochs-large", uuid)).unwrap_err();
    assert!(matches!(e, ActuateError::ExistsOtherType { .. }), "{e:?}");
    assert_eq!(
        e.to_string(),
        format!("mdev {uuid} already exists as mbochs-small on mbochs, not mbochs-large on mbochs")
    );
    let e = create_mdev(&k, &req("mtty", "mtty-1", uuid)).unwrap_err();
    assert!(e.to_string().contains("not mtty-1 on mtty"), "{e}");
    assert_eq!(k.writes().len(), 1, "refused before writing");
}

#[test]
fn an_exhausted_pool_reads_as_no_capacity() {
    let k = FakeKernel::sample_mdev_drivers().unwrap();
    for i in 0..4 {
        create_mdev(
            &k,
            &req("mdpy", "mdpy-vga", MdevUuid::for_machine("vm", "d", i)),
        )
        .unwrap();
    }
    let e = create_mdev(
        &k,
        &req("mdpy", "mdpy-hd", MdevUuid::for_machine("vm", "d", 9)),
    )
    .unwrap_err();
    assert_eq!(e.errno(), Some(errno::EUSERS));
    assert_eq!(
        e.to_string(),
        "/sys/class/mdev_bus/mdpy/mdev_supported_types/mdpy-hd/create: no capacity left for this type (EUSERS)"
    );
}

#[test]
fn unknown_parents_and_types_are_named_with_what_exists() {
    let k = FakeKernel::sample_mdev_drivers().unwrap();
    let u = MdevUuid::for_machine("vm", "d", 0);
    let e = create_mdev(&k, &req("nosuch", "mbochs-small", u)).unwrap_err();
    assert_eq!(
        e.to_string(),
        "mdev parent nosuch not found (no /sys/class/mdev_bus/nosuch)"
    );
    let e = create_mdev(&k, &req("mtty", "mtty-9", u)).unwrap_err();
    assert_eq!(
        e.to_string(),
        "mtty has no vGPU type \"mtty-9\"; it offers: mtty-1 (Single port serial), mtty-2 (Dual port serial)"
    );
    assert!(k.writes().is_empty());
}

#[test]
fn profiles_resolve_by_directory_name_or_number() {
    let k = FakeKernel::a2_mdev_host().unwrap();
    let vf: ParentId = "0000:08:00.4".parse().unwrap();
    for p in ["nvidia-746", "A2-4Q", "NVIDIA A2-4Q", "a2-4q", "746"] {
        assert_eq!(
            actuate::resolve_mdev_profile(&k, &vf, p).unwrap().as_str(),
            "nvidia-746",
            "{p}"
        );
    }
    assert!(matches!(
        actuate::resolve_mdev_profile(&k, &vf, "A2-3Q"),
        Err(ActuateError::UnknownProfile { .. })
    ));
}

#[test]
fn remove_returns_the_capacity_and_is_idempotent() {
    let k = FakeKernel::sample_mdev_drivers().unwrap();
    let u = MdevUuid::for_machine("vm", "d", 0);
    create_mdev(&k, &req("mbochs", "mbochs-large", u)).unwrap();
    assert_eq!(avail(&k, "mbochs", "mbochs-small"), "48");
    let r = remove_mdev(&k, &u, false).unwrap();
    assert!(r.changed);
    assert_eq!(r.type_id.unwrap().as_str(), "mbochs-large");
    assert_eq!(avail(&k, "mbochs", "mbochs-small"), "64");
    let again = remove_mdev(&k, &u, false).unwrap();
    assert!(!again.changed);
}

#[test]
fn an_instance_a_vm_holds_is_not_removed_unless_forced() {
    let k = FakeKernel::sample_mdev_drivers().unwrap();
    let u = MdevUuid::for_machine("vm", "d", 0);
    create_mdev(&k, &req("mbochs", "mbochs-small", u)).unwrap();
    let pid = k.open_device(&format!("sys/bus/mdev/devices/{u}")).unwrap();
    let e = remove_mdev(&k, &u, false).unwrap_err();
    assert!(
        e.to_string().starts_with(&format!(
            "mdev {u} is in use by pid {pid} (qemu-system-x86)"
        )),
        "{e}"
    );
    assert_eq!(k.writes().len(), 1, "no remove was written");
    let listed = actuate::list_instances(&k).unwrap();
    assert_eq!(listed[0].held_by.as_ref().unwrap().pid, pid);
    assert!(remove_mdev(&k, &u, true).unwrap().changed);
}

#[test]
fn the_vfio_cdev_counts_as_open_too() {
    let k = FakeKernel::sample_mdev_drivers().unwrap();
    let u = MdevUuid::for_machine("vm", "d", 0);
    create_mdev(&k, &req("mbochs", "mbochs-small", u)).unwrap();
    k.open_device("/dev/vfio/devices/vfio0").unwrap();
    assert!(matches!(
        remove_mdev(&k, &u, false),
        Err(ActuateError::InUse { .. })
    ));
}

#[test]
fn nvidia_mdev_on_a_vf_of_a_full_card_is_refused_by_the_kernel() {
    let k = FakeKernel::a2_mdev_host().unwrap();
    let vfs = [
        "0000:08:00.4",
        "0000:08:00.5",
        "0000:08:00.6",
        "0000:08:00.7",
    ];
    for (i, vf) in vfs.iter().enumerate() {
        create_mdev(
            &k,
            &req(vf, "nvidia-746", MdevUuid::for_machine("vm", "g", i as u32)),
        )
        .unwrap();
    }
    let e = create_mdev(
        &k,
        &req(
            "0000:08:01.0",
            "nvidia-746",
            MdevUuid::for_machine("vm", "g", 9),
        ),
    )
    .unwrap_err();
    assert!(matches!(e, ActuateError::Exhausted { .. }), "{e}");
}

// ----- vendor VFIO -----------------------------------------------------------------------------

#[test]
fn a_vf_takes_a_type_by_name_and_gives_it_back() {
    let k = FakeKernel::l40s_vendor_vfio_host(4).unwrap();
    let vf = pci("0000:26:00.5");
    let id = actuate::resolve_vf_profile(&k, &vf, "L40S-24Q").unwrap();
    assert_eq!(id, 1155);
    let set = set_vf_type(&k, &vf, id, false).unwrap();
    assert!(set.changed);
    assert_eq!(set.type_name.as_deref(), Some("NVIDIA L40S-24Q"));
    assert_eq!(set.handoff.qemu, "-device vfio-pci,host=0000:26:00.5");
    assert!(set.handoff.libvirt.contains("managed='no'"));
    assert!(!set_vf_type(&k, &vf, 1155, false).unwrap().changed);
    let cleared = clear_vf(&k, &vf, false).unwrap();
    assert_eq!(cleared.previous.unwrap().as_str(), "1155");
    assert!(!clear_vf(&k, &vf, false).unwrap().changed);
}

#[test]
fn a_type_that_no_longer_fits_is_refused_before_writing() {
    let k = FakeKernel::l40s_vendor_vfio_host(4).unwrap();
    set_vf_type(&k, &pci("0000:26:00.4"), 1155, false).unwrap();
    let writes = k.writes().len();
    let e = set_vf_type(&k, &pci("0000:26:00.5"), 1152, false).unwrap_err();
    assert_eq!(
        e.to_string(),
        "0000:26:00.5: vGPU type 1152 cannot be created now (GPU full, or other vGPUs on it have another size); creatable: 1155 (NVIDIA L40S-24Q), 1165 (NVIDIA L40S-24A)"
    );
    assert_eq!(k.writes().len(), writes);
}

#[test]
fn retyping_clears_then_sets_and_restores_when_the_new_type_fails() {
    let k = FakeKernel::l40s_vendor_vfio_host(4).unwrap();
    let vf = pci("0000:26:00.4");
    set_vf_type(&k, &vf, 1155, false).unwrap();
    let re = set_vf_type(&k, &vf, 1152, false).unwrap();
    assert_eq!(re.previous.unwrap().as_str(), "1155");
    assert_eq!(actuate::current_type(&k, &vf).unwrap(), 1152);
    // The 8 GB type is in use on a sibling: 24 GB no longer fits after clearing 0000:26:00.4.
    set_vf_type(&k, &pci("0000:26:00.5"), 1152, false).unwrap();
    let e = set_vf_type(&k, &vf, 1155, false).unwrap_err();
    assert!(matches!(e, ActuateError::NotCreatable { .. }), "{e}");
    assert_eq!(actuate::current_type(&k, &vf).unwrap(), 1152, "restored");
}

#[test]
fn a_vf_in_use_is_not_cleared_or_retyped_unless_forced() {
    let k = FakeKernel::l40s_vendor_vfio_host(4).unwrap();
    let vf = pci("0000:26:00.4");
    set_vf_type(&k, &vf, 1155, false).unwrap();
    k.open_device("sys/bus/pci/devices/0000:26:00.4").unwrap();
    assert!(matches!(
        clear_vf(&k, &vf, false),
        Err(ActuateError::InUse { .. })
    ));
    assert!(matches!(
        set_vf_type(&k, &vf, 1152, false),
        Err(ActuateError::InUse { .. })
    ));
    assert_eq!(actuate::current_type(&k, &vf).unwrap(), 1155);
    assert!(clear_vf(&k, &vf, true).unwrap().changed);
}

#[test]
fn the_pf_is_not_a_vendor_vfio_vf() {
    let k = FakeKernel::l40s_vendor_vfio_host(4).unwrap();
    let e = set_vf_type(&k, &pci("0000:26:00.0"), 1155, false).unwrap_err();
    assert!(
        e.to_string()
            .contains("not an NVIDIA vendor-VFIO virtual function"),
        "{e}"
    );
}

// ----- SR-IOV ----------------------------------------------------------------------------------

#[test]
fn sriov_enable_runs_sriov_manage_and_checks_numvfs() {
    let k = FakeKernel::l40s_vendor_vfio_host(0).unwrap();
    let r = enable_sriov(&k, &pci("0000:26:00.0"), &SriovOptions::default()).unwrap();
    assert!(r.changed);
    assert_eq!(r.numvfs, 32);
    assert_eq!(r.vfs[0], pci("0000:26:00.4"));
    assert_eq!(
        k.runs(),
        [(
            "/usr/lib/nvidia/sriov-manage".to_owned(),
            vec!["-e".to_owned(), "0000:26:00.0".to_owned()]
        )]
    );
    let again = enable_sriov(&k, &pci("0000:26:00.0"), &SriovOptions::default()).unwrap();
    assert!(!again.changed);
    assert_eq!(k.runs().len(), 1, "nothing runs when VFs exist");
}

#[test]
fn sriov_manage_runs_through_chroot_in_a_container() {
    let k = FakeKernel::l40s_vendor_vfio_host(0).unwrap();
    let root = k.root().to_string_lossy().into_owned();
    let opts = SriovOptions {
        chroot: Some(root.clone()),
        ..SriovOptions::default()
    };
    enable_sriov(&k, &pci("0000:26:00.0"), &opts).unwrap();
    assert_eq!(k.runs()[0].0, "/usr/sbin/chroot");
    assert_eq!(k.runs()[0].1[0], root);
}

#[test]
fn a_hanging_sriov_manage_is_a_timeout() {
    let k = FakeKernel::l40s_vendor_vfio_host(0)
        .unwrap()
        .hanging("/usr/lib/nvidia/sriov-manage");
    let opts = SriovOptions {
        timeout: Duration::from_secs(5),
        ..SriovOptions::default()
    };
    let e = enable_sriov(&k, &pci("0000:26:00.0"), &opts).unwrap_err();
    assert_eq!(
        e.to_string(),
        "/usr/lib/nvidia/sriov-manage -e 0000:26:00.0 did not finish within 5 s and was killed"
    );
}

#[test]
fn sriov_manage_exiting_0_without_vfs_is_caught() {
    let k = FakeKernel::l40s_vendor_vfio_host(0)
        .unwrap()
        .with_sriov_manage(SriovManage::ExitsZeroWithoutEnabling);
    let e = enable_sriov(&k, &pci("0000:26:00.0"), &SriovOptions::default()).unwrap_err();
    assert!(matches!(e, ActuateError::SriovNotEnabled { .. }), "{e}");
    assert!(e.to_string().contains("sriov_numvfs is 0"), "{e}");
}

#[test]
fn sriov_manage_stderr_is_kept_in_the_error() {
    let k = FakeKernel::l40s_vendor_vfio_host(0)
        .unwrap()
        .with_sriov_manage(SriovManage::Fails(
            "Cannot enable VFs: GPU is in use\n".to_owned(),
        ));
    let e = enable_sriov(&k, &pci("0000:26:00.0"), &SriovOptions::default()).unwrap_err();
    assert_eq!(
        e.to_string(),
        "/usr/lib/nvidia/sriov-manage -e 0000:26:00.0 failed (exit status 1): Cannot enable VFs: GPU is in use"
    );
}

#[test]
fn sriov_on_a_device_without_it_is_refused() {
    let k = FakeKernel::passthrough_host().unwrap();
    let e = enable_sriov(&k, &pci("0000:01:00.0"), &SriovOptions::default()).unwrap_err();
    assert_eq!(
        e.to_string(),
        "0000:01:00.0: is not SR-IOV capable (no sriov_numvfs)"
    );
    assert!(k.runs().is_empty());
}

// ----- vfio-pci --------------------------------------------------------------------------------

fn driver(k: &FakeKernel, a: &str) -> Option<String> {
    k.read_link(&format!("sys/bus/pci/devices/{a}/driver"))
        .ok()
        .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
}

#[test]
fn binding_moves_the_gpu_and_its_audio_function_to_vfio_pci() {
    let k = FakeKernel::passthrough_host().unwrap();
    let b = bind_gpu(&k, &pci("0000:01:00.0")).unwrap();
    assert_eq!(b.iommu_groups, [1]);
    let addrs: Vec<String> = b.functions.iter().map(|f| f.address.to_string()).collect();
    assert_eq!(addrs, ["0000:01:00.0", "0000:01:00.1"]);
    assert_eq!(driver(&k, "0000:01:00.0").as_deref(), Some("vfio-pci"));
    assert_eq!(driver(&k, "0000:01:00.1").as_deref(), Some("vfio-pci"));
    assert_eq!(
        b.functions[1].driver_before.as_deref(),
        Some("snd_hda_intel")
    );
    assert_eq!(
        b.functions[0].handoff.qemu,
        "-device vfio-pci,host=0000:01:00.0"
    );
    let written: Vec<(String, String)> = k
        .writes()
        .into_iter()
        .map(|w| (w.path, w.data))
        .take(3)
        .collect();
    assert_eq!(
        written,
        [
            (
                "sys/bus/pci/devices/0000:01:00.0/driver_override".to_owned(),
                "vfio-pci".to_owned()
            ),
            (
                "sys/bus/pci/devices/0000:01:00.0/driver/unbind".to_owned(),
                "0000:01:00.0".to_owned()
            ),
            (
                "sys/bus/pci/drivers_probe".to_owned(),
                "0000:01:00.0".to_owned()
            ),
        ]
    );
    let n = k.writes().len();
    assert!(!bind_gpu(&k, &pci("0000:01:00.0")).unwrap().changed());
    assert_eq!(k.writes().len(), n, "binding again writes nothing");
}

#[test]
fn release_returns_every_function_to_its_host_driver() {
    let k = FakeKernel::passthrough_host().unwrap();
    let before = k.snapshot().unwrap();
    bind_gpu(&k, &pci("0000:01:00.0")).unwrap();
    let r = release_gpu(&k, &pci("0000:01:00.0"), false).unwrap();
    assert!(r.changed());
    assert_eq!(driver(&k, "0000:01:00.0").as_deref(), Some("nvidia"));
    assert_eq!(driver(&k, "0000:01:00.1").as_deref(), Some("snd_hda_intel"));
    assert_eq!(
        k.read_string("sys/bus/pci/devices/0000:01:00.0/driver_override")
            .unwrap(),
        "(null)"
    );
    assert_eq!(k.snapshot().unwrap(), before);
    assert!(
        k.writes()
            .iter()
            .any(|w| w.path.ends_with("driver_override") && w.data == "\n"),
        "cleared with a newline"
    );
}

#[test]
fn a_gpu_sharing_its_group_with_a_nic_is_refused_before_any_write() {
    let k = FakeKernel::passthrough_host().unwrap();
    let e = bind_gpu(&k, &pci("0000:02:00.0")).unwrap_err();
    assert_eq!(
        e.to_string(),
        "0000:02:00.0: IOMMU group 2 also holds 0000:03:00.0 (driver e1000e), which are not part of the card; a VM can only take the whole group"
    );
    assert!(k.writes().is_empty());
}

#[test]
fn a_gpu_without_an_iommu_group_is_refused() {
    let k = FakeKernel::passthrough_host().unwrap();
    let e = bind_gpu(&k, &pci("0000:04:00.0")).unwrap_err();
    assert!(matches!(e, ActuateError::NoIommu { .. }), "{e}");
    assert!(k.writes().is_empty());
}

#[test]
fn a_silent_probe_failure_is_caught_and_rolled_back() {
    let k = FakeKernel::passthrough_host()
        .unwrap()
        .with_silent_probe_failure("0000:01:00.1");
    let before = k.snapshot().unwrap();
    let e = bind_gpu(&k, &pci("0000:01:00.0")).unwrap_err();
    assert_eq!(
        e.to_string(),
        "0000:01:00.1: vfio-pci did not bind after drivers_probe (driver now: none); check dmesg"
    );
    assert_eq!(k.snapshot().unwrap(), before, "the GPU went back too");
}

#[test]
fn a_gpu_in_use_is_not_released_unless_forced() {
    let k = FakeKernel::passthrough_host().unwrap();
    bind_gpu(&k, &pci("0000:01:00.0")).unwrap();
    k.open_device("/dev/vfio/1").unwrap();
    let n = k.writes().len();
    let e = release_gpu(&k, &pci("0000:01:00.0"), false).unwrap_err();
    assert!(matches!(e, ActuateError::InUse { .. }), "{e}");
    assert_eq!(k.writes().len(), n);
    release_gpu(&k, &pci("0000:01:00.0"), true).unwrap();
}

#[test]
fn companion_functions_are_same_slot_and_same_vendor_but_never_vfs() {
    let k = FakeKernel::a2_mdev_host().unwrap();
    assert_eq!(
        actuate::card_functions(&k, &pci("0000:08:00.0")).unwrap(),
        [pci("0000:08:00.0")]
    );
    let e = bind_gpu(&k, &pci("0000:08:00.4")).unwrap_err();
    assert!(matches!(e, ActuateError::Unsupported { .. }), "{e}");
    let k = FakeKernel::passthrough_host().unwrap();
    assert_eq!(
        actuate::card_functions(&k, &pci("0000:05:00.0")).unwrap(),
        [pci("0000:05:00.0"), pci("0000:05:00.1")]
    );
}

#[test]
fn a_missing_device_is_named() {
    let k = FakeKernel::passthrough_host().unwrap();
    let e = bind_gpu(&k, &pci("0000:09:00.0")).unwrap_err();
    assert_eq!(
        e.to_string(),
        "PCI device 0000:09:00.0 not found (no /sys/bus/pci/devices/0000:09:00.0)"
    );
}

#[test]
fn identities_that_could_escape_the_root_never_parse() {
    assert!("../../etc".parse::<ParentId>().is_err());
    assert!("mbochs/../../x".parse::<ParentId>().is_err());
    assert!("../nvidia-746".parse::<VgpuTypeId>().is_err());
    assert!("0000:01:00.0/../..".parse::<PciAddress>().is_err());
    assert!(
        "de306c9f-a714-4373-a290-dc15d4e49b7/"
            .parse::<MdevUuid>()
            .is_err()
    );
}

#[test]
fn an_mdev_on_an_sriov_card_goes_to_a_free_vf_and_stays_there_across_restarts() {
    let k = FakeKernel::a2_mdev_host().unwrap();
    let gpu = pci("0000:08:00.0");
    let u0 = MdevUuid::for_machine("vm", "g", 0);
    let u1 = MdevUuid::for_machine("vm", "g", 1);
    let a = actuate::create_mdev_on_gpu(&k, &gpu, "A2-4Q", u0).unwrap();
    assert_eq!(a.parent.to_string(), "0000:08:00.4");
    assert_eq!(a.type_id.as_str(), "nvidia-746");
    let b = actuate::create_mdev_on_gpu(&k, &gpu, "A2-4Q", u1).unwrap();
    assert_eq!(b.parent.to_string(), "0000:08:00.5");
    let again = actuate::create_mdev_on_gpu(&k, &gpu, "A2-4Q", u0).unwrap();
    assert!(!again.changed);
    assert_eq!(again.parent.to_string(), "0000:08:00.4");
    for i in 2..4 {
        actuate::create_mdev_on_gpu(&k, &gpu, "A2-4Q", MdevUuid::for_machine("vm", "g", i))
            .unwrap();
    }
    let e = actuate::create_mdev_on_gpu(&k, &gpu, "A2-4Q", MdevUuid::for_machine("vm", "g", 9))
        .unwrap_err();
    assert!(matches!(e, ActuateError::Exhausted { .. }), "{e}");
    let e = actuate::create_mdev_on_gpu(&k, &gpu, "A2-2Q", MdevUuid::for_machine("vm", "g", 9))
        .unwrap_err();
    assert!(
        matches!(e, ActuateError::Exhausted { .. }),
        "same-size rule: {e}"
    );
}

#[test]
fn a_typed_vf_resolves_profile_names_through_its_siblings() {
    let k = FakeKernel::l40s_vendor_vfio_host(4).unwrap();
    let vf = pci("0000:26:00.4");
    set_vf_type(&k, &vf, 1152, false).unwrap();
    assert_eq!(
        actuate::resolve_vf_profile(&k, &vf, "L40S-8Q").unwrap(),
        1152
    );
    let e = actuate::resolve_vf_profile(&k, &vf, "L40S-48Q").unwrap_err();
    assert!(
        e.to_string().starts_with(
            "0000:26:00.0 has no vGPU type \"L40S-48Q\"; it offers: 1152 (NVIDIA L40S-8Q)"
        ),
        "{e}"
    );
}

#[test]
fn a_gpu_shared_as_vgpus_is_not_taken_from_under_them() {
    let k = FakeKernel::a2_mdev_host().unwrap();
    let e = bind_gpu(&k, &pci("0000:08:00.0")).unwrap_err();
    assert_eq!(
        e.to_string(),
        "0000:08:00.0: has 16 SR-IOV VFs enabled (vGPU host); clear their vGPUs and disable SR-IOV before binding the GPU to vfio-pci"
    );
    // A conflict with what the host holds, as the agent answers it (409), not a bad request.
    assert_eq!(e.kind(), gpu_core::ErrorKind::Conflict);
    // A pre-Ampere card is an mdev parent itself.
    let mut b = gpu_sysfs::testing::TreeBuilder::new();
    b.pci(
        "0000:3b:00.0",
        gpu_sysfs::testing::PciSpec::new(0x10de, 0x1eb8, 0x030200)
            .driver("nvidia")
            .group(3),
    )
    .mdev_parent(
        "0000:3b:00.0",
        &[gpu_sysfs::testing::MdevTypeSpec::new(
            "nvidia-222",
            "GRID T4-4Q",
            3,
            Some("framebuffer=4096M, max_instance=4"),
        )],
    )
    .mdev_instance(
        "de306c9f-a714-4373-a290-dc15d4e49b71",
        "0000:3b:00.0",
        "nvidia-222",
    );
    let k = FakeKernel::new(b.finish().unwrap()).unwrap();
    let e = bind_gpu(&k, &pci("0000:3b:00.0")).unwrap_err();
    assert!(
        e.to_string().contains(
            "is shared as vGPUs (1 mdev instance(s): de306c9f-a714-4373-a290-dc15d4e49b71)"
        ),
        "{e}"
    );
    assert!(k.writes().is_empty());
}

#[test]
fn binding_the_boot_gpu_warns_that_the_console_goes_away() {
    let mut b = gpu_sysfs::testing::TreeBuilder::new();
    let mut spec = gpu_sysfs::testing::PciSpec::new(0x1002, 0x73bf, 0x030000)
        .driver("amdgpu")
        .group(4);
    spec.boot_vga = Some(true);
    b.pci("0000:0a:00.0", spec);
    let k = FakeKernel::new(b.finish().unwrap()).unwrap();
    let r = bind_gpu(&k, &pci("0000:0a:00.0")).unwrap();
    assert_eq!(
        r.warnings,
        ["0000:0a:00.0 is the boot VGA device: the host console on it goes away"]
    );
}
