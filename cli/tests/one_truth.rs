#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! Issue 27, "one truth": every command answers a question the same way: a remembered type
//! name, a GPU's totals, which instances a fleet allocation holds, and placement's answers.

mod export_support;

use export_support::*;
use gpu_sysfs::testing::builder::Tree;
use gpu_sysfs::testing::{PciSpec, TreeBuilder};

/// An L40S (PF 0000:26:00.0, 4 VFs) on which `vgpu apply` set L40S-24Q (1155) on VFs 26:00.4
/// and 26:00.5 without NVML: the card is full, so no VF lists a type, and the names gpuslice
/// saw are remembered in `run/gpuslice/vgpu-type-names.json`.
fn l40s_applied_without_nvml() -> Tree {
    let mut b = TreeBuilder::new();
    b.pci(
        "0000:26:00.0",
        PciSpec::new(0x10de, 0x26b9, 0x030200)
            .driver("nvidia")
            .group(40)
            .numa(0)
            .subsystem(0x10de, 0x1851),
    )
    .sriov(
        "0000:26:00.0",
        4,
        32,
        4,
        1,
        PciSpec::new(0x10de, 0x26b9, 0x030200).driver("nvidia"),
        Some(41),
    );
    b.vendor_vfio_vf("0000:26:00.4", &[], 1155);
    b.vendor_vfio_vf("0000:26:00.5", &[], 1155);
    b.vendor_vfio_vf("0000:26:00.6", &[], 0);
    b.vendor_vfio_vf("0000:26:00.7", &[], 0);
    b.file(
        "run/gpuslice/vgpu-type-names.json",
        r#"{"1155": "NVIDIA L40S-24Q", "1153": "NVIDIA L40S-12Q"}"#,
    );
    b.finish().unwrap()
}

#[test]
fn names_gpuslice_remembered_name_the_types_in_topology_vgpu_list_and_export_kubevirt() {
    let t = l40s_applied_without_nvml();
    let root = t.root().to_str().unwrap();

    let table = ok(&["--root", root, "--node", "l40s-1", "topology"]);
    assert!(
        table.contains("0000:26:00.4  NVIDIA L40S-24Q  24576 MiB"),
        "topology names the remembered type and its size:\n{table}"
    );
    assert!(!table.contains("0 MiB allocated of 0 MiB total"), "{table}");

    let listed: serde_json::Value =
        serde_json::from_str(&ok(&["--root", root, "-o", "json", "vgpu", "list"])).unwrap();
    let names: Vec<&str> = listed["vendorVfio"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["typeName"].as_str().unwrap_or("-"))
        .collect();
    assert_eq!(names, ["NVIDIA L40S-24Q", "NVIDIA L40S-24Q"]);

    let out = run(&["--root", root, "--node", "l40s-1", "export", "kubevirt"]);
    assert!(out.status.success());
    let yaml = String::from_utf8(out.stdout).unwrap();
    assert!(
        yaml.contains("resourceName: nvidia.com/L40S-24Q"),
        "export kubevirt permits the configured type:\n{yaml}"
    );
    assert!(!String::from_utf8_lossy(&out.stderr).contains("no VF has a vGPU type set"));
}
