#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! The fake kernel's H200 in MIG mode behaves as the driver does: a MIG-backed type needs a free
//! GPU-instance slot range at an allowed start (gpu-core's geometry table), the per-VF creatable
//! lists shrink as slots are used, and time-sliced and MIG-backed types never mix. A layout on a
//! partly used MIG GPU that asks for a type the product cannot hold fails before anything is
//! cleared.

use gpu_core::PciAddress;
use gpu_core::layout::LayoutFile;
use gpu_sysfs::Host;
use gpu_sysfs::actuate::set_vf_type;
use gpu_sysfs::apply::{ApplyError, ApplyOptions, apply_layout};
use gpu_sysfs::testing::FakeKernel;

/// H200 SXM types (IDs as the fake lists them; 1414 and 1428 as on a real H200).
const H200_TYPES: &[(u32, &str)] = &[
    (1414, "NVIDIA H200X-1-18C"),
    (1417, "NVIDIA H200X-2-35C"),
    (1420, "NVIDIA H200X-3-71C"),
    (1428, "NVIDIA H200X-141C"),
];

fn addr(s: &str) -> PciAddress {
    s.parse().unwrap()
}

fn h200(vfs: u32) -> FakeKernel {
    FakeKernel::vendor_vfio_host(0x2335, 141 * 1024, H200_TYPES, vfs).unwrap()
}

fn listed(k: &FakeKernel, vf: &str) -> Vec<u32> {
    let text = k
        .read_string(&format!(
            "sys/bus/pci/devices/{vf}/nvidia/creatable_vgpu_types"
        ))
        .unwrap();
    text.lines()
        .skip(1)
        .filter_map(|l| l.split(':').next()?.trim().parse().ok())
        .collect()
}

#[test]
fn an_empty_h200_lists_every_type() {
    let k = h200(4);
    assert_eq!(listed(&k, "0000:26:00.5"), vec![1414, 1417, 1420, 1428]);
}

#[test]
fn creatable_lists_shrink_as_mig_slots_are_used() {
    let k = h200(4);
    set_vf_type(&k, &addr("0000:26:00.4"), 1420, false).unwrap();
    assert_eq!(
        listed(&k, "0000:26:00.5"),
        vec![1414, 1417, 1420],
        "one 3g (slots 0-3) leaves room for every MIG profile and no time-sliced type"
    );
    set_vf_type(&k, &addr("0000:26:00.5"), 1420, false).unwrap();
    assert_eq!(
        listed(&k, "0000:26:00.6"),
        Vec::<u32>::new(),
        "two 3g hold all 8 memory slices with one compute slice left: no 1g fits"
    );
}

#[test]
fn a_mig_type_without_a_free_start_is_refused_by_the_driver() {
    let k = h200(4);
    set_vf_type(&k, &addr("0000:26:00.4"), 1420, false).unwrap();
    set_vf_type(&k, &addr("0000:26:00.5"), 1420, false).unwrap();
    let e = set_vf_type(&k, &addr("0000:26:00.6"), 1414, false).unwrap_err();
    assert!(e.to_string().contains("1414"), "{e}");
    assert_eq!(
        k.read_string("sys/bus/pci/devices/0000:26:00.6/nvidia/current_vgpu_type")
            .unwrap()
            .trim(),
        "0"
    );
}

#[test]
fn a_time_sliced_type_never_joins_mig_backed_ones() {
    let k = h200(4);
    set_vf_type(&k, &addr("0000:26:00.4"), 1414, false).unwrap();
    assert!(!listed(&k, "0000:26:00.5").contains(&1428));
    assert!(set_vf_type(&k, &addr("0000:26:00.5"), 1428, false).is_err());
}

#[test]
fn an_unsupported_type_on_a_partly_used_mig_gpu_fails_before_anything_is_cleared() {
    let k = h200(4);
    set_vf_type(&k, &addr("0000:26:00.4"), 1414, false).unwrap();
    let before = k.snapshot().unwrap();
    let writes = k.writes().len();
    // No H200 GPU-instance profile has 5 slices: the layout can never be reached, so the
    // existing 1g vGPU must not be cleared to try.
    let text = "version: v1\nvgpu-configs:\n  five:\n    - devices: all\n      vgpu-devices:\n        H200X-5-90C: 1\n";
    let file = LayoutFile::parse(text).unwrap();
    let e = apply_layout(
        &k,
        file.select(Some("five")).unwrap(),
        &ApplyOptions {
            force: true,
            ..ApplyOptions::new("h200")
        },
        &mut |_| {},
    )
    .unwrap_err();
    let msg = e.to_string();
    assert!(
        matches!(e, ApplyError::Layout(_)),
        "refused by the plan: {msg}"
    );
    assert!(msg.contains("H200X-5-90C"), "names the type: {msg}");
    assert_eq!(
        k.writes().len(),
        writes,
        "nothing written: {:?}",
        k.writes()
    );
    let kernel = |m: &std::collections::BTreeMap<String, gpu_sysfs::testing::Entry>| {
        m.iter()
            .filter(|(p, _)| p.starts_with("sys/"))
            .map(|(p, e)| (p.clone(), e.clone()))
            .collect::<Vec<_>>()
    };
    assert!(
        kernel(&k.snapshot().unwrap()) == kernel(&before),
        "the host changed"
    );
}
