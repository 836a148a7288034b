//! The fake kernel reacts to writes as the real kernel did in the recorded runs
//! (Linux 6.1 sample mdev drivers, vfio-pci binding) and as NVIDIA's drivers are documented to.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use gpu_sysfs::Host;
use gpu_sysfs::actuate::error::errno;
use gpu_sysfs::testing::{FakeKernel, SriovManage, TreeBuilder};

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
    for bad in [
        "not-a-uuid",
        "12345678-1234-1234-1234-12345678zzzz",
        "{de306c9f-a714-4373-a290-dc15d4e49b71}",
        "de306c9fa7144373a290dc15d4e49b71",
        " de306c9f-a714-4373-a290-dc15d4e49b7",
    ] {
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
        errno::ENODEV,
        "vfio-pci does not match a device without an override, bound or not"
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

// ----- what the real kernel showed (lab/FINDINGS.md), one test per difference ---------------

fn driver_of(k: &FakeKernel, bdf: &str) -> Option<String> {
    k.resolve_link(&format!("sys/bus/pci/devices/{bdf}/driver"))
        .ok()
        .map(|d| d.rsplit('/').next().unwrap().to_owned())
}

fn group_of(k: &FakeKernel, dev: &str) -> String {
    k.resolve_link(&format!("{dev}/iommu_group"))
        .unwrap()
        .rsplit('/')
        .next()
        .unwrap()
        .to_owned()
}

/// FINDINGS row 1.
#[test]
fn an_empty_write_to_any_attribute_succeeds_and_changes_nothing() {
    let k = FakeKernel::sample_mdev_drivers().unwrap();
    k.write(&format!("{MBOCHS}/mbochs-small/create"), U1.as_bytes())
        .unwrap();
    let before = k.snapshot().unwrap();
    k.write(&format!("{MBOCHS}/mbochs-small/create"), b"")
        .unwrap();
    k.write(&format!("sys/bus/mdev/devices/{U1}/remove"), b"")
        .unwrap();
    assert_eq!(k.snapshot().unwrap(), before);

    let k = FakeKernel::passthrough_host().unwrap();
    let before = k.snapshot().unwrap();
    for f in [
        "sys/bus/pci/drivers/nvidia/unbind",
        "sys/bus/pci/drivers/vfio-pci/bind",
        "sys/bus/pci/drivers_probe",
        "sys/bus/pci/devices/0000:01:00.0/driver_override",
    ] {
        k.write(f, b"").unwrap();
    }
    assert_eq!(k.snapshot().unwrap(), before);
    assert!(k.writes().iter().all(|w| w.errno.is_none()));
}

/// FINDINGS rows 2 and 3.
#[test]
fn create_takes_36_or_37_bytes_and_parses_the_first_36() {
    let k = FakeKernel::sample_mdev_drivers().unwrap();
    let create = format!("{MBOCHS}/mbochs-small/create");
    for (i, tail) in ["x", "\n", " ", "\0"].iter().enumerate() {
        let u = uuid(i as u32);
        k.write(&create, format!("{u}{tail}").as_bytes()).unwrap();
        assert!(k.exists(&format!("sys/bus/mdev/devices/{u}")), "{tail:?}");
    }
    let upper = uuid(7).to_ascii_uppercase();
    k.write(&create, format!("{upper}x").as_bytes()).unwrap();
    assert!(k.exists(&format!("sys/bus/mdev/devices/{}", uuid(7))));
    for bad in [
        format!("{}\n\n", uuid(8)),
        format!("{}xy", uuid(8)),
        uuid(8)[..35].to_owned(),
        format!("{}\n", &uuid(8)[..35]),
    ] {
        assert_eq!(
            os_err(k.write(&create, bad.as_bytes())),
            errno::EINVAL,
            "{bad:?}"
        );
    }
    assert!(!k.exists(&format!("sys/bus/mdev/devices/{}", uuid(8))));
    assert_eq!(mbochs(&k), [59, 14, 3]);
}

/// FINDINGS rows 4 to 6: `remove` is `kstrtoul(buf, 0, ..)`, not a boolean.
#[test]
fn remove_parses_an_unsigned_number_and_any_non_zero_value_removes() {
    let k = FakeKernel::sample_mdev_drivers().unwrap();
    let create = format!("{MBOCHS}/mbochs-small/create");
    let remove = format!("sys/bus/mdev/devices/{U1}/remove");
    k.write(&create, U1.as_bytes()).unwrap();
    for invalid in [
        "y",
        "Y",
        "n",
        "on",
        "off",
        "true",
        "-1",
        " 1",
        "1 ",
        "1\n\n",
        "0x",
        "08",
        "1x",
        "18446744073709551616",
    ] {
        assert_eq!(
            os_err(k.write(&remove, invalid.as_bytes())),
            errno::EINVAL,
            "{invalid:?}"
        );
    }
    for no_op in ["0", "0\n", "00", "0x0", "+0", "0\0garbage"] {
        k.write(&remove, no_op.as_bytes()).unwrap();
    }
    assert!(k.exists(&remove), "nothing above removed it");
    for (i, removes) in [
        "2",
        "0x1",
        "0X1f",
        "010",
        "+1",
        "1\n",
        "18446744073709551615",
    ]
    .iter()
    .enumerate()
    {
        let u = uuid(i as u32);
        k.write(&create, u.as_bytes()).unwrap();
        k.write(
            &format!("sys/bus/mdev/devices/{u}/remove"),
            removes.as_bytes(),
        )
        .unwrap();
        assert!(
            !k.exists(&format!("sys/bus/mdev/devices/{u}")),
            "{removes:?}"
        );
    }
    assert_eq!(mbochs(&k), [63, 15, 3]);
}

/// FINDINGS row 7: the driver-match test comes before the busy test.
#[test]
fn binding_a_device_still_bound_to_its_driver_is_enodev_unless_the_override_names_the_driver() {
    let k = FakeKernel::passthrough_host().unwrap();
    let bind = "sys/bus/pci/drivers/vfio-pci/bind";
    assert_eq!(os_err(k.write(bind, b"0000:01:00.0")), errno::ENODEV);
    k.write(
        "sys/bus/pci/devices/0000:01:00.0/driver_override",
        b"vfio-pci",
    )
    .unwrap();
    assert_eq!(
        os_err(k.write(bind, b"0000:01:00.0")),
        errno::EBUSY,
        "the override matches, so the device is busy with nvidia"
    );
    assert_eq!(driver_of(&k, "0000:01:00.0").as_deref(), Some("nvidia"));
}

/// FINDINGS rows 8 and 9: the probe's own error comes back through `bind`, but not through
/// `drivers_probe`.
#[test]
fn an_explicit_vfio_pci_bind_without_an_iommu_group_fails_with_the_probes_einval() {
    let k = FakeKernel::passthrough_host().unwrap();
    let dev = "sys/bus/pci/devices/0000:04:00.0";
    k.write(&format!("{dev}/driver_override"), b"vfio-pci")
        .unwrap();
    k.write(&format!("{dev}/driver/unbind"), b"0000:04:00.0")
        .unwrap();
    assert_eq!(
        os_err(k.write("sys/bus/pci/drivers/vfio-pci/bind", b"0000:04:00.0")),
        errno::EINVAL
    );
    assert_eq!(driver_of(&k, "0000:04:00.0"), None);
    k.write("sys/bus/pci/drivers_probe", b"0000:04:00.0")
        .unwrap();
    assert_eq!(driver_of(&k, "0000:04:00.0"), None, "silently left unbound");

    let k = FakeKernel::passthrough_host()
        .unwrap()
        .with_silent_probe_failure("0000:02:00.0");
    let dev = "sys/bus/pci/devices/0000:02:00.0";
    k.write(&format!("{dev}/driver_override"), b"vfio-pci")
        .unwrap();
    k.write(&format!("{dev}/driver/unbind"), b"0000:02:00.0")
        .unwrap();
    assert_eq!(
        os_err(k.write("sys/bus/pci/drivers/vfio-pci/bind", b"0000:02:00.0")),
        errno::EINVAL,
        "an injected probe failure is reported by bind too"
    );
}

/// FINDINGS row 11.
#[test]
fn a_new_mdev_takes_the_lowest_free_iommu_group_number() {
    let k = {
        let mut b = TreeBuilder::new();
        gpu_sysfs::testing::fake_kernel::add_passthrough_devices(&mut b);
        gpu_sysfs::testing::fake_kernel::add_sample_mdev_drivers(&mut b);
        FakeKernel::new(b.finish().unwrap())
            .unwrap()
            .with_sample_pools()
    };
    // Hardware groups 1, 2 and 5 exist: the first mdevs get 0, 3 and 4.
    let mut groups = Vec::new();
    for i in 0..3 {
        k.write(&format!("{MBOCHS}/mbochs-small/create"), uuid(i).as_bytes())
            .unwrap();
        groups.push(group_of(&k, &format!("sys/bus/mdev/devices/{}", uuid(i))));
    }
    assert_eq!(groups, ["0", "3", "4"]);
    k.write(&format!("sys/bus/mdev/devices/{}/remove", uuid(1)), b"1")
        .unwrap();
    assert!(!k.exists("sys/kernel/iommu_groups/3"));
    k.write(&format!("{MBOCHS}/mbochs-small/create"), uuid(9).as_bytes())
        .unwrap();
    assert_eq!(
        group_of(&k, &format!("sys/bus/mdev/devices/{}", uuid(9))),
        "3",
        "a freed number is reused"
    );
    k.write(
        &format!("{MBOCHS}/mbochs-small/create"),
        uuid(10).as_bytes(),
    )
    .unwrap();
    assert_eq!(
        group_of(&k, &format!("sys/bus/mdev/devices/{}", uuid(10))),
        "6"
    );
}

/// FINDINGS row 10: with or without an IOMMU, an mdev's group is VFIO's emulated one.
#[test]
fn an_mdev_group_is_named_vfio_noiommu_with_type_unknown_even_without_an_iommu() {
    let k = FakeKernel::sample_mdev_drivers().unwrap();
    assert!(
        k.list("sys/kernel/iommu_groups").unwrap().is_empty(),
        "no IOMMU"
    );
    k.write(&format!("{MBOCHS}/mbochs-small/create"), U1.as_bytes())
        .unwrap();
    assert_eq!(k.list("sys/kernel/iommu_groups").unwrap(), ["0"]);
    let g = "sys/kernel/iommu_groups/0";
    let mut entries = k.list(g).unwrap();
    entries.sort();
    assert_eq!(entries, ["devices", "name", "reserved_regions", "type"]);
    assert_eq!(k.read_string(&format!("{g}/name")).unwrap(), "vfio-noiommu");
    assert_eq!(k.read_string(&format!("{g}/type")).unwrap(), "unknown");
    assert_eq!(
        k.resolve_link(&format!("{g}/devices/{U1}")).unwrap(),
        format!("sys/devices/virtual/mbochs/mbochs/{U1}")
    );
}

/// FINDINGS row 12, for PCI devices.
#[test]
fn binding_to_vfio_pci_creates_the_groups_dev_vfio_node_until_the_groups_last_vfio_device_goes() {
    let k = FakeKernel::passthrough_host().unwrap();
    assert_eq!(k.list("dev/vfio").unwrap(), ["vfio"], "the container only");
    for bdf in ["0000:01:00.0", "0000:01:00.1"] {
        let dev = format!("sys/bus/pci/devices/{bdf}");
        k.write(&format!("{dev}/driver_override"), b"vfio-pci")
            .unwrap();
        k.write(&format!("{dev}/driver/unbind"), bdf.as_bytes())
            .unwrap();
        k.write("sys/bus/pci/drivers_probe", bdf.as_bytes())
            .unwrap();
    }
    let mut nodes = k.list("dev/vfio").unwrap();
    nodes.sort();
    assert_eq!(nodes, ["1", "vfio"]);
    assert_eq!(
        k.list("sys/bus/pci/devices/0000:01:00.0/vfio-dev").unwrap(),
        ["vfio0"]
    );
    assert_eq!(
        k.list("sys/bus/pci/devices/0000:01:00.1/vfio-dev").unwrap(),
        ["vfio1"]
    );
    k.write("sys/bus/pci/drivers/vfio-pci/unbind", b"0000:01:00.0")
        .unwrap();
    assert!(k.exists("dev/vfio/1"), "01:00.1 still holds the group");
    assert!(!k.exists("sys/bus/pci/devices/0000:01:00.0/vfio-dev"));
    k.write("sys/bus/pci/drivers/vfio-pci/unbind", b"0000:01:00.1")
        .unwrap();
    assert_eq!(k.list("dev/vfio").unwrap(), ["vfio"]);
}

/// FINDINGS row 12, for mdevs.
#[test]
fn each_mdev_has_its_groups_dev_vfio_node_while_it_exists() {
    let k = FakeKernel::sample_mdev_drivers().unwrap();
    let before = k.snapshot().unwrap();
    for i in 0..2 {
        k.write(&format!("{MBOCHS}/mbochs-small/create"), uuid(i).as_bytes())
            .unwrap();
    }
    let mut nodes = k.list("dev/vfio").unwrap();
    nodes.sort();
    assert_eq!(nodes, ["0", "1", "vfio"]);
    for i in 0..2 {
        k.write(&format!("sys/bus/mdev/devices/{}/remove", uuid(i)), b"1")
            .unwrap();
    }
    assert_eq!(k.list("dev/vfio").unwrap(), ["vfio"]);
    assert_eq!(k.snapshot().unwrap(), before);
}

/// FINDINGS row 13.
#[test]
fn an_mdev_directory_has_driver_subsystem_power_uevent_and_vendor_entries() {
    let k = FakeKernel::sample_mdev_drivers().unwrap();
    k.write(&format!("{MBOCHS}/mbochs-medium/create"), U1.as_bytes())
        .unwrap();
    let inst = format!("sys/bus/mdev/devices/{U1}");
    let mut entries = k.list(&inst).unwrap();
    entries.sort();
    assert_eq!(
        entries,
        [
            "driver",
            "iommu_group",
            "mdev_type",
            "power",
            "remove",
            "subsystem",
            "uevent",
            "vendor",
            "vfio-dev"
        ]
    );
    assert_eq!(
        k.read_link(&format!("{inst}/driver")).unwrap().to_str(),
        Some("../../../../../bus/mdev/drivers/mbochs")
    );
    assert_eq!(
        k.read_link(&format!("{inst}/subsystem")).unwrap().to_str(),
        Some("../../../../../bus/mdev")
    );
    assert_eq!(
        k.read_link(&format!("{inst}/iommu_group"))
            .unwrap()
            .to_str(),
        Some("../../../../../kernel/iommu_groups/0")
    );
    assert!(k.exists(&format!("sys/bus/mdev/drivers/mbochs/{U1}")));
    assert_eq!(
        k.read_string(&format!("{inst}/vendor/memory")).unwrap(),
        "16 MB"
    );
    assert_eq!(
        k.read_string(&format!("{inst}/uevent")).unwrap(),
        "DRIVER=mbochs"
    );
    assert_eq!(
        k.read_string(&format!("{inst}/power/runtime_status"))
            .unwrap(),
        "unsupported"
    );
    assert_eq!(
        k.read_link(&format!("{inst}/vfio-dev/vfio0/device"))
            .unwrap()
            .to_str(),
        Some(format!("../../../{U1}").as_str())
    );

    let mdpy = "sys/class/mdev_bus/mdpy/mdev_supported_types";
    k.write(&format!("{mdpy}/mdpy-xga/create"), uuid(1).as_bytes())
        .unwrap();
    assert_eq!(
        k.read_string(&format!(
            "sys/bus/mdev/devices/{}/vendor/resolution",
            uuid(1)
        ))
        .unwrap(),
        "1024x768"
    );
    let mtty = "sys/class/mdev_bus/mtty/mdev_supported_types";
    k.write(&format!("{mtty}/mtty-1/create"), uuid(2).as_bytes())
        .unwrap();
    assert_eq!(
        k.read_string(&format!(
            "sys/bus/mdev/devices/{}/vendor/sample_mdev_dev",
            uuid(2)
        ))
        .unwrap(),
        format!("This is MDEV {}", uuid(2))
    );
}

/// NVIDIA's instances, as the real A2 host shows them (its umockdev capture).
#[test]
fn an_nvidia_mdev_is_bound_to_nvidia_vgpu_vfio_with_its_nvidia_files() {
    let k = FakeKernel::a2_mdev_host().unwrap();
    k.write(
        "sys/class/mdev_bus/0000:08:00.4/mdev_supported_types/nvidia-754/create",
        U1.as_bytes(),
    )
    .unwrap();
    let inst = format!("sys/bus/mdev/devices/{U1}");
    assert_eq!(
        k.read_link(&format!("{inst}/driver")).unwrap().to_str(),
        Some("../../../../bus/mdev/drivers/nvidia-vgpu-vfio")
    );
    assert_eq!(
        k.read_string(&format!("{inst}/nvidia/vm_name")).unwrap(),
        ""
    );
    assert_eq!(
        k.read_string(&format!("{inst}/uevent")).unwrap(),
        "DRIVER=nvidia-vgpu-vfio"
    );
    // Hardware groups 20..=36 are taken; VFIO's emulated group takes the lowest free number.
    assert_eq!(group_of(&k, &inst), "0");
}

// ----- what the kernel's source makes as strict (not recorded by the lab) ----------------------

#[test]
fn bus_attributes_name_a_device_exactly_as_the_kernel_names_it() {
    let k = FakeKernel::passthrough_host().unwrap();
    for spelling in [
        "01:00.0",
        "0000:01:00.0 ",
        " 0000:01:00.0",
        "0000:01:00.0\n\n",
    ] {
        assert_eq!(
            os_err(k.write("sys/bus/pci/drivers/nvidia/unbind", spelling.as_bytes())),
            errno::ENODEV,
            "{spelling:?}"
        );
    }
    k.write("sys/bus/pci/drivers/nvidia/unbind", b"0000:01:00.0\n")
        .unwrap();
    assert_eq!(
        os_err(k.write("sys/bus/pci/drivers_probe", b"01:00.0")),
        errno::ENODEV
    );
    k.write("sys/bus/pci/drivers_probe", b"0000:01:00.0\n")
        .unwrap();
    assert_eq!(driver_of(&k, "0000:01:00.0").as_deref(), Some("nvidia"));
}

#[test]
fn driver_override_keeps_what_comes_before_the_first_newline() {
    let k = FakeKernel::passthrough_host().unwrap();
    let ov = "sys/bus/pci/devices/0000:01:00.0/driver_override";
    k.write(ov, b"vfio-pci\nnvidia").unwrap();
    assert_eq!(k.read_string(ov).unwrap(), "vfio-pci");
    k.write(ov, b"\0").unwrap();
    assert_eq!(k.read_string(ov).unwrap(), "(null)", "a NUL clears as well");
    assert_eq!(os_err(k.write(ov, &[b'a'; 4095])), errno::EINVAL);
}

#[test]
fn sriov_numvfs_parses_like_kstrtou16_and_new_vfs_take_the_lowest_free_groups() {
    let k = FakeKernel::l40s_vendor_vfio_host(0).unwrap();
    let f = "sys/bus/pci/devices/0000:26:00.0/sriov_numvfs";
    for bad in [" 2", "2 ", "two", "65536"] {
        assert_eq!(os_err(k.write(f, bad.as_bytes())), errno::EINVAL, "{bad:?}");
    }
    k.write(f, b"0x2\n").unwrap();
    assert_eq!(k.read_string(f).unwrap(), "2");
    // The PF holds group 30; the VFs get 0 and 1.
    assert_eq!(group_of(&k, "sys/bus/pci/devices/0000:26:00.4"), "0");
    assert_eq!(group_of(&k, "sys/bus/pci/devices/0000:26:00.5"), "1");
    assert!(
        k.read_string("sys/kernel/iommu_groups/0/name").is_err(),
        "hardware groups have no name"
    );
}
