#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! Exact type names before suffix-stripped ones, across every name source: a MIG-backed type with
//! an attribute suffix (`H100XM-1-10CME`: with media engines) is another device than its base type
//! (`H100XM-1-10C`), so a layout asking for the suffixed name is never satisfied by, or written as,
//! the base type when the driver or the remembered names know the exact name.

use gpu_core::PciAddress;
use gpu_core::layout::LayoutFile;
use gpu_sysfs::Host;
use gpu_sysfs::actuate::set_vf_type;
use gpu_sysfs::apply::{ApplyOptions, ApplyStatus, NAMES_PATH, apply_layout, assert_config};
use gpu_sysfs::testing::FakeKernel;

/// An H100 SXM5 80GB (board `H100XM`) in MIG mode, as its driver names the types (`ME`: with media engines).
const H100_TYPES: &[(u32, &str)] = &[
    (999, "NVIDIA H100XM-1-10C"),
    (1001, "NVIDIA H100XM-1-10CME"),
];

const LAYOUTS: &str = "version: v1
vgpu-configs:
  graphics:
    - devices: all
      vgpu-devices:
        H100XM-1-10CME: 2
  one-graphics:
    - devices: all
      vgpu-devices:
        H100XM-1-10CME: 1
";

fn addr(s: &str) -> PciAddress {
    s.parse().unwrap()
}

fn vf_type(k: &FakeKernel, vf: &str) -> String {
    k.read_string(&format!(
        "sys/bus/pci/devices/{vf}/nvidia/current_vgpu_type"
    ))
    .unwrap()
    .trim()
    .to_owned()
}

/// The card filled by another tool with two base-type (999) vGPUs: it lists nothing, and only
/// the remembered names (from an earlier listing) know both types.
fn full_of_base_types() -> FakeKernel {
    let k = FakeKernel::vendor_vfio_host(0x2330, 80 * 1024, H100_TYPES, 2).unwrap();
    for vf in ["0000:26:00.4", "0000:26:00.5"] {
        set_vf_type(&k, &addr(vf), 999, false).unwrap();
    }
    let names = k.root().join(NAMES_PATH);
    std::fs::create_dir_all(names.parent().unwrap()).unwrap();
    std::fs::write(
        names,
        r#"{"999": "NVIDIA H100XM-1-10C", "1001": "NVIDIA H100XM-1-10CME"}"#,
    )
    .unwrap();
    k
}

#[test]
fn a_suffixed_type_the_remembered_names_know_is_not_met_by_its_base_type() {
    let k = full_of_base_types();
    let file = LayoutFile::parse(LAYOUTS).unwrap();
    let a = assert_config(
        &k,
        file.select(Some("graphics")).unwrap(),
        &ApplyOptions::new("dc").discover,
    )
    .unwrap();
    assert!(
        !a.applied,
        "two H100XM-1-10C (999) are not two H100XM-1-10CME (1001): {:?}",
        a.diff
    );
}

#[test]
fn apply_replaces_base_types_with_the_exact_suffixed_type() {
    let k = full_of_base_types();
    let file = LayoutFile::parse(LAYOUTS).unwrap();
    let report = apply_layout(
        &k,
        file.select(Some("graphics")).unwrap(),
        &ApplyOptions {
            force: true,
            ..ApplyOptions::new("dc")
        },
        &mut |_| {},
    )
    .unwrap();
    assert_eq!(report.status, ApplyStatus::Applied, "{:?}", report.plan);
    for vf in ["0000:26:00.4", "0000:26:00.5"] {
        assert_eq!(vf_type(&k, vf), "1001", "{vf} holds the exact type");
    }
}

#[test]
fn the_base_type_is_used_only_when_no_source_knows_the_exact_name() {
    // A driver that lists only the base name, and nothing remembered: stripping is the only way.
    let k = FakeKernel::vendor_vfio_host(0x2330, 80 * 1024, &H100_TYPES[..1], 2).unwrap();
    let file = LayoutFile::parse(LAYOUTS).unwrap();
    let report = apply_layout(
        &k,
        file.select(Some("one-graphics")).unwrap(),
        &ApplyOptions::new("dc"),
        &mut |_| {},
    )
    .unwrap();
    assert_eq!(report.status, ApplyStatus::Applied);
    assert_eq!(vf_type(&k, "0000:26:00.4"), "999");
}

/// H200 SXM types as its driver lists them.
const H200_TYPES: &[(u32, &str)] = &[
    (1414, "NVIDIA H200X-1-18C"),
    (1417, "NVIDIA H200X-2-35C"),
    (1428, "NVIDIA H200X-141C"),
];

#[test]
fn an_a100_type_is_refused_for_a_full_h200_nothing_names_before_any_write() {
    // Another tool gave the H200 one whole-card vGPU; no NVML, no remembered names, and a full
    // GPU lists nothing: the board comes from the PCI device ID alone.
    let k = FakeKernel::vendor_vfio_host(0x2335, 141 * 1024, H200_TYPES, 2).unwrap();
    set_vf_type(&k, &addr("0000:26:00.4"), 1428, false).unwrap();
    let before = k.snapshot().unwrap();
    let writes = k.writes().len();
    let text = "version: v1\nvgpu-configs:\n  a100:\n    - devices: all\n      vgpu-devices:\n        A100-40C: 1\n";
    let file = LayoutFile::parse(text).unwrap();
    let e = apply_layout(
        &k,
        file.select(Some("a100")).unwrap(),
        &ApplyOptions {
            force: true,
            ..ApplyOptions::new("h200")
        },
        &mut |_| {},
    )
    .unwrap_err();
    let msg = e.to_string();
    assert!(
        msg.contains("A100-40C") && msg.contains("0000:26:00.0") && msg.contains("H200X"),
        "names the type, the GPU and its board: {msg}"
    );
    assert_eq!(k.writes().len(), writes, "nothing written");
    assert_eq!(vf_type(&k, "0000:26:00.4"), "1428", "the VF keeps its vGPU");
    let after = k.snapshot().unwrap();
    let kernel = |m: &std::collections::BTreeMap<String, gpu_sysfs::testing::Entry>| {
        m.iter()
            .filter(|(p, _)| p.starts_with("sys/"))
            .map(|(p, e)| (p.clone(), e.clone()))
            .collect::<Vec<_>>()
    };
    assert!(kernel(&after) == kernel(&before), "the host changed");
}
