//! `gpuslice topology --nvml-lib` on an H200 with two MIG-backed vGPUs: with NVML's GPU-instance
//! placements (the C NVML stand-in of gpu-health) the pool's `migSlots` hold exactly the
//! reported starts; without NVML, or when NVML disagrees with sysfs, each vGPU is held wherever
//! it may sit and a disagreement is named in the GPU's warnings.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod nvml_stub;

use std::process::Command;

use gpu_sysfs::testing::fixtures::{h200_mig_host, h200_pf};

/// `gpuslice topology -o json` of the one-H200 host whose VFs 0 and 1 hold an `H200X-1-18C`
/// and whose free VFs list the 1g, 1g.35gb, 2g and 3g types, with `extra` arguments. Returns
/// the exit code, the H200's pool and the H200's warnings.
fn topology(extra: &[&str]) -> (Option<i32>, serde_json::Value, Vec<String>) {
    let tree = h200_mig_host(&[(0, 1414), (1, 1414)], &[1414, 1415, 1416, 1417, 1418]).unwrap();
    let o = Command::new(env!("CARGO_BIN_EXE_gpuslice"))
        .env_remove("GPUSLICE_ROOT")
        .arg("--root")
        .arg(tree.root())
        .args(["--node", "h200", "topology", "-o", "json"])
        .args(extra)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap_or_else(|e| {
        panic!("not JSON ({e}); stderr: {err}");
    });
    let pf = h200_pf(0);
    let pool = v["mediatedDevices"]["pools"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["gpu"] == pf.as_str())
        .unwrap()
        .clone();
    let gpu = v["gpus"]
        .as_array()
        .unwrap()
        .iter()
        .find(|g| g["address"] == pf.as_str())
        .unwrap();
    let warnings = gpu["warnings"]
        .as_array()
        .map(|w| w.iter().map(|s| s.as_str().unwrap().to_owned()).collect())
        .unwrap_or_default();
    (o.status.code(), pool, warnings)
}

#[test]
fn mig_slots_hold_the_starts_nvml_reports() {
    let Some((_dir, lib)) = nvml_stub::build(&["STUB_MIG_GI={19,0,1},{19,1,1}"]) else {
        return;
    };
    let (code, pool, warnings) = topology(&["--nvml-lib", lib.to_str().unwrap()]);
    assert_eq!(code, Some(0));
    assert_eq!(
        pool["migSlots"],
        serde_json::json!({
            "board": "H200X",
            "placed": [
                {"profile": "1g.18gb", "start": 0},
                {"profile": "1g.18gb", "start": 1}
            ],
            "creatable": ["1g.18gb", "1g.35gb", "2g.35gb", "3g.71gb"]
        })
    );
    // With every GPU instance placed, the product's seven compute slices are the total.
    assert_eq!(pool["migSlicesTotal"], 7);
    assert!(
        warnings.iter().all(|w| !w.starts_with("MIG slots:")),
        "{warnings:?}"
    );
}

#[test]
fn without_nvml_each_mig_backed_vgpu_is_held_wherever_it_may_sit() {
    let (code, pool, warnings) = topology(&["--no-nvml"]);
    assert_eq!(code, Some(0));
    let slots = &pool["migSlots"];
    assert_eq!(slots.get("placed"), None);
    assert_eq!(slots["unplaced"], serde_json::json!(["1g.18gb", "1g.18gb"]));
    assert!(warnings.iter().all(|w| !w.starts_with("MIG slots:")));
}

#[test]
fn nvml_placements_that_disagree_with_sysfs_are_not_used_and_the_gpu_says_so() {
    // The stand-in's default: 1g at 0 and 4, which leave no 3g start, yet the driver lists
    // the 3g.
    let Some((_dir, lib)) = nvml_stub::build(&[]) else {
        return;
    };
    let (code, pool, warnings) = topology(&["--nvml-lib", lib.to_str().unwrap()]);
    assert_eq!(code, Some(0));
    assert_eq!(
        pool["migSlots"]["unplaced"],
        serde_json::json!(["1g.18gb", "1g.18gb"])
    );
    assert_eq!(
        warnings
            .iter()
            .filter(|w| w.starts_with("MIG slots:"))
            .collect::<Vec<_>>(),
        [
            "MIG slots: NVML's GPU-instance placements disagree with sysfs (the driver still \
          lists a 3g.71gb type, which has no free start beside them); each MIG-backed vGPU is \
          held wherever it may sit"
        ]
    );
}

#[test]
fn an_nvml_library_that_does_not_open_is_an_error_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("libnvidia-ml.so.1");
    let tree = h200_mig_host(&[], &[1414]).unwrap();
    let o = Command::new(env!("CARGO_BIN_EXE_gpuslice"))
        .env_remove("GPUSLICE_ROOT")
        .arg("--root")
        .arg(tree.root())
        .args(["topology", "--nvml-lib"])
        .arg(&missing)
        .output()
        .unwrap();
    assert_ne!(o.status.code(), Some(0));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains(&missing.display().to_string()), "{err}");
}

/// The DRA export of the same host read with NVML's placements: the MIG placements beside the
/// two 1g vGPUs at slots 0 and 1 are published, those overlapping them are not (without the
/// placements, none would be).
#[test]
fn the_dra_export_publishes_the_mig_placements_beside_nvmls_instances() {
    let Some((_dir, lib)) = nvml_stub::build(&["STUB_MIG_GI={19,0,1},{19,1,1}"]) else {
        return;
    };
    let tree = h200_mig_host(&[(0, 1414), (1, 1414)], &[1414, 1415, 1416, 1417, 1418]).unwrap();
    let run = |args: &[&str]| {
        let o = Command::new(env!("CARGO_BIN_EXE_gpuslice"))
            .env_remove("GPUSLICE_ROOT")
            .arg("--root")
            .arg(tree.root())
            .args(["--node", "h200"])
            .args(args)
            .output()
            .unwrap();
        assert_eq!(
            o.status.code(),
            Some(0),
            "{}",
            String::from_utf8_lossy(&o.stderr)
        );
        String::from_utf8(o.stdout).unwrap()
    };
    let topo: serde_json::Value = serde_json::from_str(&run(&[
        "topology",
        "-o",
        "json",
        "--nvml-lib",
        lib.to_str().unwrap(),
    ]))
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let fleet = dir.path().join("fleet.json");
    std::fs::write(&fleet, serde_json::json!({ "nodes": [topo] }).to_string()).unwrap();
    let json = run(&[
        "export",
        "dra",
        "--inventory",
        fleet.to_str().unwrap(),
        "-o",
        "json",
    ]);
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    let mut mig: Vec<String> = v["items"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|s| s["spec"]["devices"].as_array().cloned().unwrap_or_default())
        .filter_map(|d| d["name"].as_str().map(str::to_owned))
        .filter(|n| n.starts_with("mig-"))
        .collect();
    mig.sort();
    let pf = h200_pf(0).replace([':', '.'], "-");
    let starts = |slices: &str| -> Vec<String> {
        mig.iter()
            .filter(|n| n.starts_with(&format!("mig-{pf}-{slices}-")))
            .map(|n| n.rsplit('-').next().unwrap().to_owned())
            .collect()
    };
    // 1g.18gb at 2-6 and 1g.35gb (two memory slices) at 2, 4 and 6; 2g at 2 and 4.
    assert_eq!(
        starts("1g"),
        ["s2", "s3", "s4", "s5", "s6", "s2", "s4", "s6"],
        "{mig:?}"
    );
    assert_eq!(starts("2g"), ["s2", "s4"], "{mig:?}");
    // The 3g fits at 4 (memory slices 4-7), which the driver lists as creatable: the pool total
    // read from the listed types does not include the two 1g, so they are not subtracted twice.
    assert_eq!(starts("3g"), ["s4"], "{mig:?}");
    assert!(
        mig.iter()
            .all(|n| !n.ends_with("-s0") && !n.ends_with("-s1")),
        "{mig:?}"
    );
}
