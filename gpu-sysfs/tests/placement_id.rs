#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! A vGPU's mixed-size placement ID, as its VF reports it (`nvidia/placement_id`), is shown on
//! its instance (`placementId` in `topology -o json`, `vgpu list` and the agent's JSON); a VF
//! that reports none, or `Not Applicable`, shows none: never guessed.

use gpu_core::{ParentId, PciAddress};
use gpu_sysfs::RealHost;
use gpu_sysfs::discover::{DiscoverOptions, discover};
use gpu_sysfs::testing::{PciSpec, TreeBuilder};

fn addr(s: &str) -> PciAddress {
    s.parse().unwrap()
}

/// A VF, the types it lists, the type it holds, what its `nvidia/placement_id` says.
type Vf<'a> = (&'a str, &'a [(u32, &'a str)], u32, Option<&'a str>);

/// A GPU (PF `pf`, PCI device `device`) with `vfs` VFs of NVIDIA's vendor VFIO, each given as
/// (VF, the types it lists, the type it holds, what its `nvidia/placement_id` says).
fn host(device: u16, pf: &str, vfs: &[Vf<'_>]) -> (gpu_sysfs::testing::builder::Tree, RealHost) {
    let spec = || PciSpec::new(0x10de, device, 0x030200).driver("nvidia");
    let mut b = TreeBuilder::new();
    b.pci(pf, spec().group(40)).sriov(
        pf,
        u32::try_from(vfs.len()).unwrap(),
        32,
        4,
        1,
        spec(),
        Some(41),
    );
    for (vf, listed, current, placement) in vfs {
        b.vendor_vfio_vf(vf, listed, *current);
        if let Some(text) = placement {
            b.attr(vf, "nvidia/placement_id", text);
        }
    }
    let tree = b.finish().unwrap();
    let host = RealHost::new(tree.root()).unwrap();
    (tree, host)
}

#[test]
fn each_vgpu_shows_the_placement_its_vf_reports_and_none_when_it_reports_none() {
    let (_tree, host) = host(
        0x26b9,
        "0000:26:00.0",
        &[
            ("0000:26:00.4", &[], 1155, Some("24\n")),
            (
                "0000:26:00.5",
                &[(1149, "NVIDIA L40S-12Q")],
                1149,
                Some("0\n"),
            ),
            ("0000:26:00.6", &[], 1149, Some("Not Applicable\n")),
        ],
    );
    let t = discover(&host, &DiscoverOptions::new("n")).unwrap();
    let placement =
        |vf: &str| t.parent(&ParentId::Pci(addr(vf))).unwrap().instances[0].placement_id;
    assert_eq!(placement("0000:26:00.4"), Some(24));
    assert_eq!(placement("0000:26:00.5"), Some(0));
    assert_eq!(placement("0000:26:00.6"), None);
    let json = serde_json::to_value(&t).unwrap().to_string();
    assert!(json.contains("\"placementId\":24"), "{json}");
}

#[test]
fn vgpu_list_shows_each_vfs_placement_id() {
    let (_tree, host) = host(
        0x26b9,
        "0000:26:00.0",
        &[
            ("0000:26:00.4", &[], 1155, Some("24\n")),
            ("0000:26:00.5", &[], 1149, None),
        ],
    );
    let listing = gpu_sysfs::actuate::list_vgpus(&host).unwrap();
    let got: Vec<_> = listing
        .vendor_vfio
        .iter()
        .map(|v| (v.vf.to_string(), v.placement_id))
        .collect();
    assert_eq!(
        got,
        vec![
            ("0000:26:00.4".to_owned(), Some(24)),
            ("0000:26:00.5".to_owned(), None)
        ]
    );
    let json = serde_json::to_string(&listing).unwrap();
    assert!(json.contains("\"placementId\":24"), "{json}");
}

#[test]
fn a_mig_board_without_known_geometry_is_never_planned_by_compute_slices() {
    // A board gpuslice has no MIG geometry for (device 0x9999, types of board ZZ9): seven
    // 1-slice types listed. Counting compute slices would plan seven; its memory slices are
    // unknown, so each MIG-backed type is refused and the GPU says why.
    let listed: &[(u32, &str)] = &[(2001, "NVIDIA ZZ9-1-10C"), (2002, "NVIDIA ZZ9-3-40C")];
    let (_tree, host) = host(
        0x9999,
        "0000:41:00.0",
        &[
            ("0000:41:00.4", listed, 0, None),
            ("0000:41:00.5", listed, 0, None),
        ],
    );
    let t = discover(&host, &DiscoverOptions::new("n")).unwrap();
    let pool = t
        .pool(&ParentId::Pci(addr("0000:41:00.0")))
        .expect("a pool for the GPU");
    let slots = pool.mig_slots.as_ref().expect("slots of an unknown board");
    assert_eq!(slots.board, "ZZ9");
    let parent = t.parent(&ParentId::Pci(addr("0000:41:00.4"))).unwrap();
    for profile in &parent.profiles {
        let e = pool.room(profile).unwrap_err().to_string();
        assert!(
            e.contains("no MIG geometry is known"),
            "{}: {e}",
            profile.name
        );
    }
    let gpu = t
        .gpus
        .iter()
        .find(|g| g.address == addr("0000:41:00.0"))
        .unwrap();
    assert!(
        gpu.warnings
            .iter()
            .any(|w| w.contains("no MIG geometry is known for board")),
        "{:?}",
        gpu.warnings
    );
}
