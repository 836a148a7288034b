//! What a vGPU create makes, decided once for `gpuslice vgpu create` and the agent: an mdev
//! parent named directly, a GPU whose VFs are mdev parents, a vendor-VFIO VF given or picked.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use gpu_core::{ErrorKind, ParentId, PciAddress};
use gpu_sysfs::RealHost;
use gpu_sysfs::actuate::{ActuateError, CreateTarget, create_target};
use gpu_sysfs::testing::fixtures::{h200_host, h200_pf, h200_vf};
use gpu_sysfs::testing::{MdevTypeSpec, PciSpec, TreeBuilder};

fn pci(a: &str) -> PciAddress {
    a.parse().unwrap()
}

fn no_names(n: &str) -> Result<PciAddress, ActuateError> {
    panic!("{n:?} should not need resolving by name")
}

#[test]
fn a_vendor_vfio_gpu_gets_its_first_free_vf_and_a_vf_given_is_used_as_is() {
    let tree = h200_host(&[(0, 0, 1425)]).unwrap();
    let host = RealHost::new(tree.root()).unwrap();
    let gpu = ParentId::Pci(pci(&h200_pf(0)));
    assert_eq!(
        create_target(&host, &gpu, "NVIDIA H200X-35C", no_names).unwrap(),
        CreateTarget::VendorVfio {
            vf: pci(&h200_vf(0, 1)),
            type_num: 1425
        }
    );
    let vf = ParentId::Pci(pci(&h200_vf(0, 3)));
    assert_eq!(
        create_target(&host, &vf, "1425", no_names).unwrap(),
        CreateTarget::VendorVfio {
            vf: pci(&h200_vf(0, 3)),
            type_num: 1425
        }
    );
    // A name is resolved by the caller's lookup (discovery, or the agent's snapshot).
    let named = ParentId::Named("nvidia0".to_owned());
    let t = create_target(&host, &named, "1425", |n| {
        assert_eq!(n, "nvidia0");
        Ok::<_, ActuateError>(pci(&h200_pf(0)))
    })
    .unwrap();
    assert!(!t.is_mdev());
}

#[test]
fn a_gpu_whose_vfs_all_hold_a_type_has_no_free_vf() {
    let busy: Vec<(usize, u32, u32)> = (0..16).map(|n| (0, n, 1422)).collect();
    let tree = h200_host(&busy).unwrap();
    let host = RealHost::new(tree.root()).unwrap();
    let gpu = ParentId::Pci(pci(&h200_pf(0)));
    let e = create_target(&host, &gpu, "1422", no_names).unwrap_err();
    assert!(matches!(e, ActuateError::NoFreeVf { .. }), "{e}");
    assert_eq!(e.kind(), ErrorKind::Exhausted);
    assert!(e.to_string().contains("no free VF of"), "{e}");
}

#[test]
fn an_mdev_parent_is_used_directly_and_a_gpu_with_mdev_vfs_picks_one_at_create_time() {
    let mut b = TreeBuilder::new();
    b.pci(
        "0000:08:00.0",
        PciSpec::new(0x10de, 0x25b6, 0x030200).driver("nvidia"),
    )
    .sriov(
        "0000:08:00.0",
        2,
        16,
        4,
        1,
        PciSpec::new(0x10de, 0x25b6, 0x030200).driver("nvidia"),
        Some(21),
    )
    .mdev_parent(
        "0000:08:00.4",
        &[MdevTypeSpec::new("nvidia-746", "NVIDIA A2-4Q", 1, None)],
    );
    let tree = b.finish().unwrap();
    let host = RealHost::new(tree.root()).unwrap();
    let vf = ParentId::Pci(pci("0000:08:00.4"));
    assert_eq!(
        create_target(&host, &vf, "A2-4Q", no_names).unwrap(),
        CreateTarget::Mdev {
            parent: vf.clone(),
            type_id: "nvidia-746".parse().unwrap()
        }
    );
    let gpu = ParentId::Pci(pci("0000:08:00.0"));
    let t = create_target(&host, &gpu, "A2-4Q", no_names).unwrap();
    assert_eq!(
        t,
        CreateTarget::MdevOnGpu {
            gpu: pci("0000:08:00.0"),
            type_id: "nvidia-746".parse().unwrap()
        }
    );
    assert!(t.is_mdev());
    let e = create_target(&host, &vf, "A2-8Q", no_names).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::UnknownProfile, "{e}");
}

#[test]
fn a_gpu_that_is_no_vgpu_parent_is_refused_with_what_to_do() {
    let mut b = TreeBuilder::new();
    b.pci(
        "0000:3b:00.0",
        PciSpec::new(0x10de, 0x1eb8, 0x030200).driver("nvidia"),
    );
    let tree = b.finish().unwrap();
    let host = RealHost::new(tree.root()).unwrap();
    let e = create_target(&host, &ParentId::Pci(pci("0000:3b:00.0")), "1", no_names).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unsupported);
    assert!(
        e.to_string()
            .contains("run `gpuslice sriov enable 0000:3b:00.0` first"),
        "{e}"
    );
}
