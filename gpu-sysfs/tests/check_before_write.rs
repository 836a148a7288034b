#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! Every name, board and capacity check runs before the first write, on every path: `vgpu
//! apply` (the plan) and `vgpu create` / the agent's create (the target, resolved before the
//! write). The fake kernel records every write, so "nothing written" is checked, not assumed.

use gpu_core::layout::LayoutFile;
use gpu_core::{ParentId, PciAddress};
use gpu_sysfs::Host;
use gpu_sysfs::actuate::{ActuateError, create_target, create_vgpu, set_vf_type};
use gpu_sysfs::apply::{ApplyError, ApplyOptions, apply_layout};
use gpu_sysfs::testing::FakeKernel;

const H200_TYPES: &[(u32, &str)] = &[
    (1414, "NVIDIA H200X-1-18C"),
    (1417, "NVIDIA H200X-2-35C"),
    (1420, "NVIDIA H200X-3-71C"),
    (1428, "NVIDIA H200X-141C"),
];

fn addr(s: &str) -> PciAddress {
    s.parse().unwrap()
}

/// An H200 (VFs 0000:26:00.4 …) whose first VF holds a 1g MIG-backed vGPU.
fn partly_used_h200() -> FakeKernel {
    let k = FakeKernel::vendor_vfio_host(0x2335, 141 * 1024, H200_TYPES, 4).unwrap();
    set_vf_type(&k, &addr("0000:26:00.4"), 1414, false).unwrap();
    k
}

fn no_names(n: &str) -> Result<PciAddress, ActuateError> {
    panic!("{n:?} should not need resolving by name")
}

#[test]
fn apply_of_a_mig_name_that_is_no_type_of_the_board_clears_nothing() {
    let k = partly_used_h200();
    let writes = k.writes().len();
    // 3g on an H200 is 71 GB: H200X-3-40C names no H200 type.
    let text = "version: v1\nvgpu-configs:\n  c:\n    - devices: all\n      vgpu-devices:\n        H200X-3-40C: 1\n";
    let file = LayoutFile::parse(text).unwrap();
    let e = apply_layout(
        &k,
        file.select(Some("c")).unwrap(),
        &ApplyOptions {
            force: true,
            ..ApplyOptions::new("h200")
        },
        &mut |_| {},
    )
    .unwrap_err();
    assert!(
        matches!(e, ApplyError::Layout(_)),
        "refused by the plan: {e}"
    );
    assert!(e.to_string().contains("H200X-3-40C"), "{e}");
    assert_eq!(
        k.writes().len(),
        writes,
        "nothing written: {:?}",
        k.writes()
    );
    assert_eq!(
        k.read_string("sys/bus/pci/devices/0000:26:00.4/nvidia/current_vgpu_type")
            .unwrap()
            .trim(),
        "1414",
        "the existing 1g vGPU is kept"
    );
}

#[test]
fn create_of_a_type_the_gpu_does_not_offer_writes_nothing() {
    let k = partly_used_h200();
    let writes = k.writes().len();
    for (parent, profile) in [
        ("0000:26:00.0", "H200X-3-40C"),
        ("0000:26:00.5", "H200X-3-40C"),
        ("0000:26:00.5", "L40S-24Q"),
        ("0000:26:00.5", "9999"),
    ] {
        let parent: ParentId = parent.parse().unwrap();
        let e = create_target(&k, &parent, profile, no_names)
            .and_then(|t| create_vgpu(&k, &t, None, profile, false))
            .unwrap_err();
        assert!(e.to_string().contains(profile), "{parent} {profile}: {e}");
    }
    assert_eq!(
        k.writes().len(),
        writes,
        "nothing written: {:?}",
        k.writes()
    );
}

#[test]
fn create_of_a_type_that_no_longer_fits_is_refused_before_its_write() {
    let k = partly_used_h200();
    // The whole-GPU time-sliced type cannot join a MIG-backed vGPU: the VF does not list it.
    let writes = k.writes().len();
    let parent: ParentId = "0000:26:00.5".parse().unwrap();
    let e = create_target(&k, &parent, "H200X-141C", no_names)
        .and_then(|t| create_vgpu(&k, &t, None, "H200X-141C", false))
        .unwrap_err();
    assert!(e.to_string().contains("H200X-141C"), "{e}");
    assert_eq!(
        k.writes().len(),
        writes,
        "nothing written: {:?}",
        k.writes()
    );
}
