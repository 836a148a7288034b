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

#[test]
fn each_vgpu_shows_the_placement_its_vf_reports_and_none_when_it_reports_none() {
    let mut b = TreeBuilder::new();
    b.pci(
        "0000:26:00.0",
        PciSpec::new(0x10de, 0x26b9, 0x030200)
            .driver("nvidia")
            .group(40),
    )
    .sriov(
        "0000:26:00.0",
        3,
        32,
        4,
        1,
        PciSpec::new(0x10de, 0x26b9, 0x030200).driver("nvidia"),
        Some(41),
    );
    b.vendor_vfio_vf("0000:26:00.4", &[], 1155);
    b.vendor_vfio_vf("0000:26:00.5", &[(1149, "NVIDIA L40S-12Q")], 1149);
    b.vendor_vfio_vf("0000:26:00.6", &[], 1149);
    b.attr("0000:26:00.4", "nvidia/placement_id", "24\n");
    b.attr("0000:26:00.5", "nvidia/placement_id", "0\n");
    b.attr("0000:26:00.6", "nvidia/placement_id", "Not Applicable\n");
    let tree = b.finish().unwrap();
    let host = RealHost::new(tree.root()).unwrap();
    let t = discover(&host, &DiscoverOptions::new("n")).unwrap();
    let placement = |vf: &str| {
        t.parent(&ParentId::Pci(addr(vf))).unwrap().instances[0].placement_id
    };
    assert_eq!(placement("0000:26:00.4"), Some(24));
    assert_eq!(placement("0000:26:00.5"), Some(0));
    assert_eq!(placement("0000:26:00.6"), None);
    let json = serde_json::to_value(&t).unwrap().to_string();
    assert!(json.contains("\"placementId\":24"), "{json}");
}

#[test]
fn vgpu_list_shows_each_vfs_placement_id() {
    let mut b = TreeBuilder::new();
    b.pci(
        "0000:26:00.0",
        PciSpec::new(0x10de, 0x26b9, 0x030200)
            .driver("nvidia")
            .group(40),
    )
    .sriov(
        "0000:26:00.0",
        2,
        32,
        4,
        1,
        PciSpec::new(0x10de, 0x26b9, 0x030200).driver("nvidia"),
        Some(41),
    );
    b.vendor_vfio_vf("0000:26:00.4", &[], 1155);
    b.vendor_vfio_vf("0000:26:00.5", &[], 1149);
    b.attr("0000:26:00.4", "nvidia/placement_id", "24\n");
    let tree = b.finish().unwrap();
    let host = RealHost::new(tree.root()).unwrap();
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
