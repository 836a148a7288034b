//! Discovery against fake trees modelled on real hosts: the QEMU lab, an 8-GPU H200 vendor-VFIO
//! server, a workstation; and against broken input.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

mod discover_support;

use discover_support::*;
use gpu_core::{GpuState, ParentId, PciAddress, VgpuFramework};
use gpu_sysfs::discover::{DiscoverOptions, discover};
use gpu_sysfs::testing::{MdevTypeSpec, PciSpec, TreeBuilder};
use gpu_sysfs::{RealHost, SysfsError};

fn addr(s: &str) -> PciAddress {
    s.parse().unwrap()
}

fn states(t: &gpu_core::NodeTopology) -> Vec<(String, String, GpuState, Option<String>)> {
    t.gpus
        .iter()
        .map(|g| {
            (
                g.name.clone(),
                g.address.to_string(),
                g.state,
                g.state_reason.clone(),
            )
        })
        .collect()
}

#[test]
fn lab_host_blocks_the_two_displays_sharing_a_group_with_the_nic_behind_the_bridge() {
    let tree = lab_host();
    let t = topology_of(tree.root());
    let shared = |other: &str| {
        Some(format!(
            "IOMMU group 3 shared with 0000:01:02.0 (8086:100e, driver e1000), {other}"
        ))
    };
    assert_eq!(
        states(&t),
        [
            ("gpu0".into(), "0000:00:02.0".into(), GpuState::Free, None),
            ("gpu1".into(), "0000:00:03.0".into(), GpuState::Free, None),
            (
                "gpu2".into(),
                "0000:01:01.0".into(),
                GpuState::Blocked,
                shared("0000:01:03.0 (1234:1111, driver bochs-drm)")
            ),
            (
                "gpu3".into(),
                "0000:01:03.0".into(),
                GpuState::Blocked,
                Some(
                    "IOMMU group 3 shared with 0000:01:01.0 (1234:1111, driver bochs-drm), \
                     0000:01:02.0 (8086:100e, driver e1000)"
                        .into()
                )
            ),
            ("gpu4".into(), "0000:02:00.0".into(), GpuState::Free, None),
        ]
    );
    assert!(t.gpus[0].boot_vga);
}

#[test]
fn lab_host_offers_the_sample_mdev_parents_with_the_kernels_counts() {
    let tree = lab_host();
    let t = topology_of(tree.root());
    let ids: Vec<String> = t
        .mediated_devices
        .parents
        .iter()
        .map(|p| p.id.to_string())
        .collect();
    assert_eq!(ids, ["mbochs", "mdpy", "mtty"]);
    let mbochs = t.parent(&ParentId::Named("mbochs".into())).unwrap();
    assert_eq!(mbochs.gpu, None);
    let counts: Vec<(String, u32)> = mbochs
        .profiles
        .iter()
        .map(|p| (p.name.clone(), p.available_instances))
        .collect();
    assert_eq!(
        counts,
        [
            ("mbochs-large".into(), 4),
            ("mbochs-medium".into(), 15),
            ("mbochs-small".into(), 63)
        ]
    );
    assert_eq!(mbochs.instances.len(), 1);
    assert_eq!(mbochs.instances[0].profile.as_str(), "mbochs-small");
    let mtty = t.parent(&ParentId::Named("mtty".into())).unwrap();
    assert_eq!(mtty.profiles[0].name, "Single port serial");
    assert_eq!(
        mtty.profiles[0].description, None,
        "mtty has no description"
    );
    assert!(mtty.warnings.is_empty(), "{:?}", mtty.warnings);
    // mbochs states each type's video memory (4/16/64 MB): its pool is sized from them, and
    // holds the one small instance; mtty and mdpy state no size and share by the counts alone.
    let pools: Vec<String> = t
        .mediated_devices
        .pools
        .iter()
        .map(|p| p.gpu.to_string())
        .collect();
    assert_eq!(pools, ["mbochs"]);
    let pool = t.pool(&ParentId::Named("mbochs".into())).unwrap();
    assert_eq!(pool.used_mib, 4);
    assert!(pool.total_mib >= 256, "{pool:?}");
    assert!(pool.mixed_size, "the sample drivers mix sizes: {pool:?}");
}

#[test]
fn mdev_parents_option_publishes_only_the_listed_parents() {
    let tree = lab_host();
    let host = RealHost::new(tree.root()).unwrap();
    let opts = DiscoverOptions::new("lab").with_mdev_parents(vec![
        ParentId::Named("mtty".into()),
        ParentId::Named("nosuch".into()),
    ]);
    let t = discover(&host, &opts).unwrap();
    let ids: Vec<String> = t
        .mediated_devices
        .parents
        .iter()
        .map(|p| p.id.to_string())
        .collect();
    assert_eq!(ids, ["mtty"]);
    assert_eq!(
        t.warnings,
        ["--mdev-parents: nosuch is not a vGPU parent on this host"]
    );
}

#[test]
fn mdev_parents_option_accepts_a_gpu_and_keeps_its_pool_whole() {
    let h = a2_host();
    let opts = DiscoverOptions::new("a2").with_mdev_parents(vec!["0000:08:01.7".parse().unwrap()]);
    let t = discover(&h.host(), &opts).unwrap();
    assert_eq!(t.mediated_devices.parents.len(), 1);
    let pool = &t.mediated_devices.pools[0];
    assert_eq!(pool.parents, [ParentId::Pci(addr("0000:08:01.7"))]);
    assert_eq!(
        pool.used_mib, 12288,
        "instances on unpublished VFs still use the card"
    );

    let opts = DiscoverOptions::new("a2").with_mdev_parents(vec!["0000:08:00.0".parse().unwrap()]);
    let t = discover(&h.host(), &opts).unwrap();
    assert_eq!(
        t.mediated_devices.parents.len(),
        16,
        "a GPU selects all its VFs"
    );
}

#[test]
fn h200_host_has_eight_vendor_vfio_gpus_with_16_parents_of_15_types_each() {
    let tree = h200_host(&[]);
    let t = topology_of(tree.root());
    assert_eq!(t.gpus.len(), 8);
    assert_eq!(t.mediated_devices.parents.len(), 128);
    for (i, g) in t.gpus.iter().enumerate() {
        assert_eq!(g.name, format!("nvidia{i}"));
        assert_eq!(g.address.to_string(), h200_pf(i));
        assert_eq!(g.vgpu_framework, Some(VgpuFramework::VendorVfio));
        assert_eq!(g.state, GpuState::InUse);
        assert_eq!(g.memory_mib, Some(141 * 1024));
        assert_eq!(g.numa_node, Some(u32::from(i >= 4)));
        let pool = t.pool(&ParentId::Pci(g.address)).unwrap();
        assert_eq!(pool.parents.len(), 16);
        assert_eq!(
            (pool.mig_slices_total, pool.mig_slices_used),
            (Some(7), Some(0))
        );
    }
    let p = t.parent(&ParentId::Pci(addr(&h200_vf(0, 0)))).unwrap();
    assert_eq!(p.profiles.len(), 15);
    let one_g = p.profiles.iter().find(|x| x.id.as_str() == "1414").unwrap();
    assert_eq!(
        (one_g.mig_slices, one_g.mig_memory_gib),
        (Some(1), Some(18))
    );
    let whole = p.profiles.iter().find(|x| x.id.as_str() == "1428").unwrap();
    assert_eq!(
        (whole.mig_slices, whole.framebuffer_mib),
        (None, Some(144384))
    );
    assert!(p.profiles.iter().all(|x| x.available_instances == 1));
}

#[test]
fn h200_with_mig_instances_locks_out_time_sliced_types_and_counts_slices() {
    // GPU 0: two 1g MIG-backed vGPUs; GPU 1: the whole-card type.
    let tree = h200_host(&[(0, 0, 1414), (0, 1, 1414), (1, 3, 1428)]);
    let t = topology_of(tree.root());
    let pool0 = t.pool(&ParentId::Pci(addr(&h200_pf(0)))).unwrap();
    assert_eq!(pool0.mig_slices_used, Some(2));
    assert_eq!(pool0.used_mib, 0);
    // Only MIG-backed types up to 4 slices are still listed, but the H200's device ID gives
    // its geometry: all seven slices and the 141 GB of the whole-GPU profile, exactly.
    assert_eq!(pool0.mig_slices_total, Some(7));
    let g0 = t.gpu_by_name("nvidia0").unwrap();
    assert_eq!(g0.memory_mib, Some(141 * 1024));
    assert!(!g0.memory_is_lower_bound);
    assert!(
        !g0.warnings.iter().any(|w| w.contains("lower bound")),
        "{:?}",
        g0.warnings
    );
    let free_vf = t.parent(&ParentId::Pci(addr(&h200_vf(0, 2)))).unwrap();
    assert!(free_vf.profiles.iter().all(|p| p.mig_slices.is_some()));
    let busy = t.parent(&ParentId::Pci(addr(&h200_vf(0, 0)))).unwrap();
    assert_eq!(
        busy.instances[0].profile_name.as_deref(),
        Some("NVIDIA H200X-1-18C")
    );
    // The two 1g GPU instances are recorded with unknown starts (sysfs does not say where
    // they sit), with what the driver still lists beside them: a 4g, so they are not in
    // slots 0-3, and one 3g still fits there for sure.
    let slots = pool0.mig_slots.as_ref().unwrap();
    assert_eq!(slots.board, "H200X");
    assert!(slots.placed.is_empty());
    assert_eq!(slots.unplaced, ["1g.18gb", "1g.18gb"]);
    assert!(slots.creatable.iter().any(|n| n == "4g.71gb"), "{slots:?}");
    let three_g = free_vf
        .profiles
        .iter()
        .find(|p| p.mig_slices == Some(3))
        .unwrap();
    assert_eq!(three_g.available_instances, 1, "{three_g:?}");

    let pool1 = t.pool(&ParentId::Pci(addr(&h200_pf(1)))).unwrap();
    assert_eq!((pool1.total_mib, pool1.used_mib), (144384, 144384));
    let g1 = t.gpu_by_name("nvidia1").unwrap();
    let other = t.parent(&ParentId::Pci(addr(&h200_vf(1, 0)))).unwrap();
    assert!(
        other.profiles.is_empty(),
        "a used-up GPU lists only the header"
    );
    assert_eq!(g1.state, GpuState::InUse);
}

#[test]
fn workstation_names_gpus_per_family_and_blocks_the_igpu_sharing_a_group_with_usb() {
    let tree = workstation_host();
    let t = topology_of(tree.root());
    assert_eq!(
        states(&t),
        [
            (
                "intel0".into(),
                "0000:00:02.0".into(),
                GpuState::Blocked,
                Some("IOMMU group 0 shared with 0000:00:14.0 (8086:7ae0, driver xhci_hcd)".into())
            ),
            (
                "radeon0".into(),
                "0000:03:00.0".into(),
                GpuState::Free,
                None
            ),
            (
                "nvidia0".into(),
                "0000:0a:00.0".into(),
                GpuState::Free,
                None
            ),
            (
                "radeon1".into(),
                "0000:0c:00.0".into(),
                GpuState::InUse,
                Some("bound to vfio-pci".into())
            ),
        ]
    );
    let nv = t.gpu_by_name("nvidia0").unwrap();
    let funcs: Vec<String> = nv.functions.iter().map(|f| f.address.to_string()).collect();
    assert_eq!(funcs, ["0000:0a:00.1", "0000:0a:00.2", "0000:0a:00.3"]);
    assert_eq!(nv.functions[0].driver.as_deref(), Some("snd_hda_intel"));
    assert!(nv.model.contains("4090"), "{}", nv.model);
    let r0 = t.gpu_by_name("radeon0").unwrap();
    assert_eq!(r0.numa_node, None, "numa_node -1 means none");
    let link = r0.link.as_ref().unwrap();
    assert_eq!((link.current_width, link.max_width), (Some(8), Some(16)));
    assert!(t.mediated_devices.parents.is_empty());
}

#[test]
fn addresses_sort_numerically_across_wide_domains() {
    let mut b = TreeBuilder::new();
    b.pci(
        "10000:01:00.0",
        PciSpec::new(0x10de, 0x2330, 0x030200).group(2),
    );
    b.pci(
        "ffff:01:00.0",
        PciSpec::new(0x10de, 0x2330, 0x030200).group(1),
    );
    let tree = b.finish().unwrap();
    let t = topology_of(tree.root());
    let names: Vec<(String, String)> = t
        .gpus
        .iter()
        .map(|g| (g.name.clone(), g.address.to_string()))
        .collect();
    assert_eq!(
        names,
        [
            ("nvidia0".into(), "ffff:01:00.0".into()),
            ("nvidia1".into(), "10000:01:00.0".into())
        ]
    );
}

#[test]
fn ampere_pf_with_sriov_not_enabled_is_reported_as_such_not_as_vendor_vfio() {
    let mut b = TreeBuilder::new();
    b.pci(
        "0000:3b:00.0",
        PciSpec::new(0x10de, 0x20f1, 0x030200)
            .driver("nvidia")
            .group(7),
    );
    b.attr("0000:3b:00.0", "sriov_totalvfs", "16\n")
        .attr("0000:3b:00.0", "sriov_numvfs", "0\n");
    let tree = b.finish().unwrap();
    let t = topology_of(tree.root());
    let g = &t.gpus[0];
    assert_eq!(g.vgpu_framework, None);
    assert_eq!(g.state, GpuState::Free);
    let s = g.sriov.as_ref().unwrap();
    assert_eq!((s.total_vfs, s.num_vfs), (16, 0));
    assert!(
        g.warnings.iter().any(|w| w.contains("no VFs are enabled")),
        "{:?}",
        g.warnings
    );
}

#[test]
fn malformed_and_unreadable_files_become_warnings_on_the_device() {
    let tree = h200_host(&[]);
    let root = tree.root();
    let vf = h200_vf(2, 5);
    let vf_dir = root.join(format!("sys/devices/pci0000:00/{vf}/nvidia"));
    std::fs::write(
        vf_dir.join("creatable_vgpu_types"),
        "ID    : vGPU Name\n1414  : NVIDIA H200X-1-18C\n\n1428 : NVIDIA H200X-141C\n",
    )
    .unwrap();
    std::fs::write(
        root.join(format!("sys/devices/pci0000:00/{}/numa_node", h200_pf(3))),
        "zero\n",
    )
    .unwrap();
    // A directory where a file should be reads as an error (EISDIR), like an unreadable file.
    let cur = root.join(format!(
        "sys/devices/pci0000:00/{}/nvidia/current_vgpu_type",
        h200_vf(4, 0)
    ));
    std::fs::remove_file(&cur).unwrap();
    std::fs::create_dir(&cur).unwrap();

    let t = topology_of(root);
    assert_eq!(t.gpus.len(), 8, "the scan went on");
    let p = t.parent(&ParentId::Pci(addr(&vf))).unwrap();
    assert!(p.profiles.is_empty());
    let expected = format!("sys/bus/pci/devices/{vf}/nvidia/creatable_vgpu_types:3: blank line");
    assert_eq!(p.warnings, [expected]);
    let g3 = t.gpu_by_name("nvidia3").unwrap();
    assert_eq!(g3.numa_node, None);
    assert!(
        g3.warnings[0].contains("numa_node") && g3.warnings[0].contains("\"zero\""),
        "{:?}",
        g3.warnings
    );
    // A VF whose type cannot be read is reported and left out: neither offered nor planned.
    assert!(t.parent(&ParentId::Pci(addr(&h200_vf(4, 0)))).is_none());
    assert_eq!(t.warnings.len(), 1, "{:?}", t.warnings);
    assert!(
        t.warnings[0].starts_with(&format!(
            "VF {} of GPU {}: skipped",
            h200_vf(4, 0),
            h200_pf(4)
        )) && t.warnings[0].contains("nvidia/current_vgpu_type: "),
        "{:?}",
        t.warnings
    );
}

#[test]
fn invalid_root_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let host = RealHost::new(dir.path()).unwrap();
    let e = discover(&host, &DiscoverOptions::new("n")).unwrap_err();
    assert!(matches!(e, SysfsError::InvalidRoot { .. }));
    assert!(
        e.to_string().contains("cannot list sys/bus/pci/devices"),
        "{e}"
    );
}

#[test]
fn non_vfio_pci_types_are_listed_but_not_offered() {
    let mut b = TreeBuilder::new();
    let mut ccw = MdevTypeSpec::new("vfio_ccw-io", "I/O subchannel", 1, None);
    ccw.device_api = "vfio-ccw".into();
    b.mdev_parent("css0", &[ccw]);
    let tree = b.finish().unwrap();
    let t = topology_of(tree.root());
    let p = &t.mediated_devices.parents[0].profiles[0];
    assert_eq!(
        (
            p.device_api.as_str(),
            p.reported_instances,
            p.available_instances
        ),
        ("vfio-ccw", Some(1), 0)
    );
}
