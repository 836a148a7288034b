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

fn example_fleet() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/fleet/fleet.yaml")
}

#[test]
fn gpu_list_of_a_fleet_shows_a_gpu_an_allocation_holds_as_in_use_by_that_machine() {
    let fleet = example_fleet();
    let fleet = fleet.to_str().unwrap();
    // train-1 holds nvidia3 of gpu-h100 whole (created).
    let table = ok(&["--node", "gpu-h100", "gpu", "list", "--inventory", fleet]);
    let row = table.lines().find(|l| l.contains("nvidia3")).unwrap();
    assert!(row.contains("in-use") && row.contains("train-1"), "{table}");
    let json: serde_json::Value = serde_json::from_str(&ok(&[
        "--node",
        "gpu-h100",
        "-o",
        "json",
        "gpu",
        "list",
        "--inventory",
        fleet,
    ]))
    .unwrap();
    let gpus = json.as_array().unwrap();
    let held = gpus.iter().find(|g| g["name"] == "nvidia3").unwrap();
    assert_eq!(held["state"], "in-use");
    assert_eq!(held["allocatedTo"], serde_json::json!(["train-1"]));
    let free = gpus.iter().find(|g| g["name"] == "nvidia0").unwrap();
    assert_eq!(free["state"], "free");
    assert_eq!(free["allocatedTo"], serde_json::json!([]));
}

#[test]
fn topology_shows_a_fleet_node_with_the_machine_holding_each_instance() {
    let t = l40s_applied_without_nvml();
    let root = t.root().to_str().unwrap();
    let node: serde_json::Value = serde_json::from_str(&ok(&[
        "--root", root, "--node", "l40s-1", "-o", "json", "topology",
    ]))
    .unwrap();
    let fleet = serde_json::json!({
        "nodes": [node],
        "allocations": [{
            "machine": "vm-a",
            "node": "l40s-1",
            "status": "created",
            "devices": [{
                "parent": "0000:26:00.4",
                "profile": "1155",
                "uuid": "6a1f3c52-1b8e-4f8e-9a3d-2f1c0b9d7e41"
            }]
        }]
    });
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("fleet.json");
    std::fs::write(&path, fleet.to_string()).unwrap();
    let path = path.to_str().unwrap();

    let table = ok(&["--node", "l40s-1", "topology", "--inventory", path]);
    let held = table
        .lines()
        .find(|l| l.contains("0000:26:00.4  NVIDIA"))
        .unwrap();
    assert!(held.trim_end().ends_with("Machine vm-a"), "{table}");
    let other = table
        .lines()
        .find(|l| l.contains("0000:26:00.5  NVIDIA"))
        .unwrap();
    assert!(other.trim_end().ends_with('-'), "{table}");
    assert!(table.contains("GPU memory: 49152 MiB allocated"), "{table}");

    let out = run(&["topology", "--inventory", path]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("--node NAME (nodes: l40s-1)"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn export_cloud_init_with_json_output_prints_json() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("client_configuration_token.tok");
    std::fs::write(&f, "eyJhbGciOiJSUzI1NiJ9.token.signature\n").unwrap();
    let out = ok(&[
        "-o",
        "json",
        "export",
        "cloud-init",
        "--license-token",
        f.to_str().unwrap(),
    ]);
    let v: serde_json::Value = serde_json::from_str(&out).expect("JSON on stdout");
    let files = v["write_files"].as_array().unwrap();
    assert_eq!(files.len(), 2);
    assert_eq!(files[1]["path"], "/etc/nvidia/gridd.conf");
}

#[test]
fn a_vf_whose_type_cannot_be_read_is_skipped_and_the_plan_uses_the_others() {
    let t = l40s_root(false);
    // A directory where the file should be reads as an error (EISDIR), like an unreadable file.
    let cur = t
        .root()
        .join("sys/bus/pci/devices/0000:26:00.4/nvidia/current_vgpu_type");
    let real = std::fs::canonicalize(&cur).unwrap();
    std::fs::remove_file(&real).unwrap();
    std::fs::create_dir(&real).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let layout = dir.path().join("l.yaml");
    std::fs::write(
        &layout,
        "version: v1\nvgpu-configs:\n  two:\n    \"0000:26:00.0\": {L40S-24Q: 2}\n",
    )
    .unwrap();
    let root = t.root().to_str().unwrap();
    let out = run(&[
        "--root",
        root,
        "--node",
        "l40s-1",
        "-o",
        "json",
        "vgpu",
        "apply",
        "-f",
        layout.to_str().unwrap(),
        "-c",
        "two",
        "--dry-run",
    ]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let parents: Vec<String> = report["plan"]["steps"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["op"] == "create")
        .map(|s| s["instance"]["parent"].as_str().unwrap_or("?").to_owned())
        .collect();
    assert_eq!(parents, ["0000:26:00.5", "0000:26:00.6"], "{report}");
    let topo = run(&["--root", root, "--node", "l40s-1", "topology"]);
    assert!(
        String::from_utf8_lossy(&topo.stderr)
            .contains("VF 0000:26:00.4 of GPU 0000:26:00.0: skipped"),
        "{}",
        String::from_utf8_lossy(&topo.stderr)
    );
}
