//! `gpuslice doctor`: the table and JSON on modelled hosts and the real A2 capture (golden
//! files), and the exit code: 0 unless a check fails, then 1.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod export_support;

use export_support::*;
use gpu_sysfs::testing::doctor_hosts;

fn doctor(root: &std::path::Path, json: bool) -> (Option<i32>, String) {
    let mut args = vec!["--root", root.to_str().unwrap(), "--node", "n1", "doctor"];
    if json {
        args.extend(["-o", "json"]);
    }
    let out = run(&args);
    (out.status.code(), String::from_utf8(out.stdout).unwrap())
}

#[test]
fn a_ready_node_exits_zero() {
    let t = doctor_hosts::ready().unwrap();
    let (code, table) = doctor(t.root(), false);
    golden("doctor", "ready.txt", &table);
    assert_eq!(code, Some(0));
    assert!(
        table.ends_with("Node n1: 12 ok, 0 warn, 0 fail\n"),
        "{table}"
    );
    assert!(!table.contains("Fixes"));
}

#[test]
fn a_broken_node_exits_one_and_lists_the_fixes() {
    let t = doctor_hosts::broken().unwrap();
    let (code, table) = doctor(t.root(), false);
    golden("doctor", "broken.txt", &table);
    assert_eq!(code, Some(1));
    assert!(table.contains("\nFixes\n  iommu: enable VT-d / AMD-Vi in the firmware"));
    let (code, json) = doctor(t.root(), true);
    golden("doctor", "broken.json", &json);
    assert_eq!(code, Some(1));
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(v["verdict"], "fail");
    let iommu = &v["checks"][0];
    assert_eq!(iommu["check"], "iommu");
    assert_eq!(iommu["verdict"], "fail");
    assert!(iommu["fix"].as_str().unwrap().contains("iommu=pt"));
}

#[test]
fn a_degraded_node_and_the_a2_capture() {
    let t = doctor_hosts::degraded().unwrap();
    let (code, table) = doctor(t.root(), false);
    golden("doctor", "degraded.txt", &table);
    assert_eq!(code, Some(1), "the T4's IOMMU group fails");
    let a2 = a2_root();
    let (code, table) = doctor(a2.path(), false);
    golden("doctor", "a2-capture.txt", &table);
    assert_eq!(code, Some(0), "only warnings: {table}");
    assert!(table.contains("iommu-group   matrox0 (0000:01:00.1)"));
}

/// VFs vfio-pci took (`vfio-pci.ids=10de:26b9`) are named with their driver and the fix in
/// `doctor`, `topology` and `vgpu apply`, never as a missing vGPU manager; a VF whose state
/// cannot be read is named in each too.
#[test]
fn vfs_another_driver_holds_are_named_with_the_fix_everywhere() {
    let t = doctor_hosts::vfs_elsewhere().unwrap();
    let (code, table) = doctor(t.root(), false);
    golden("doctor", "vfs-elsewhere.txt", &table);
    assert_eq!(code, Some(1), "{table}");
    assert!(table.contains("vf-drivers"), "{table}");
    assert!(table.contains("remove 10de:26b9"), "{table}");
    assert!(table.contains("VF 0000:27:00.5"), "{table}");
    assert!(!table.contains("install NVIDIA's vGPU manager"), "{table}");
    let root = t.root().to_str().unwrap();
    let out = run(&["--root", root, "--node", "n1", "topology"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("bound to vfio-pci") && err.contains("vfio-pci.ids=10de:26b9"),
        "{err}"
    );
    assert!(err.contains("0000:27:00.5"), "{err}");
    let dir = tempfile::tempdir().unwrap();
    let layout = dir.path().join("l.yaml");
    std::fs::write(
        &layout,
        "version: v1\nvgpu-configs:\n  first:\n    - devices: [0]\n      vgpu-devices:\n        L40S-24Q: 1\n  second:\n    - devices: [1]\n      vgpu-devices:\n        L40S-24Q: 1\n",
    )
    .unwrap();
    let apply = |config: &str| {
        let l = layout.to_str().unwrap();
        let out = run(&[
            "--root",
            root,
            "--node",
            "n1",
            "vgpu",
            "apply",
            "-f",
            l,
            "-c",
            config,
            "--dry-run",
        ]);
        let all = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        (out.status.success(), all)
    };
    let (ok, all) = apply("first");
    assert!(!ok, "{all}");
    assert!(all.contains("bound to vfio-pci"), "{all}");
    assert!(
        !all.contains("is the NVIDIA vGPU host driver loaded"),
        "{all}"
    );
    let (ok, all) = apply("second");
    assert!(ok, "{all}");
    assert!(
        all.contains("VF 0000:27:00.5") && all.contains("cannot be read"),
        "{all}"
    );
}

#[test]
fn a_write_that_did_not_finish_is_a_warning_naming_it_and_what_to_check() {
    let t = doctor_hosts::ready().unwrap();
    let dir = t.root().join("var/lib/gpuslice/node");
    std::fs::create_dir_all(&dir).unwrap();
    // What a `gpuslice realize` killed half-way leaves behind.
    let intent = r#"{"op": "realize", "what": "realize Machine vm1: bind 0000:26:00.0 to vfio-pci",
        "check": "`gpuslice topology`", "state": "started", "pid": 4242, "started": 1,
        "creates": [{"kind": "gpu-bind", "gpu": "0000:26:00.0"}]}"#;
    std::fs::write(dir.join("intent.json"), intent).unwrap();
    let (code, table) = doctor(t.root(), false);
    assert_eq!(code, Some(0), "a warning, not a failure: {table}");
    let line = table
        .lines()
        .find(|l| l.contains("interrupted-write"))
        .unwrap_or_else(|| panic!("{table}"));
    assert!(line.starts_with("WARN"), "{line}");
    assert!(
        line.contains("an earlier gpuslice write (process 4242, realize: realize Machine vm1"),
        "{line}"
    );
    assert!(
        table.contains("`gpuslice agent` undoes at start"),
        "{table}"
    );
    assert!(
        table.ends_with("Node n1: 12 ok, 1 warn, 0 fail\n"),
        "{table}"
    );
    let (_, json) = doctor(t.root(), true);
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(v["verdict"], "warn");
}
