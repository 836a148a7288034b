//! `gpuslice mig list|apply|assert|clear` on sandbox hosts, each command a separate process,
//! NVML's MIG state kept in the sandbox between them.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod sandbox_support;

use std::path::Path;

use sandbox_support::{gpuslice, ok, on, stderr, stdout};

const CONFIGS: &str = "examples/hosts/mig-configs.yaml";

fn init(dir: &Path, from: &str) {
    ok(gpuslice(&[
        "sandbox",
        "init",
        "--from",
        from,
        dir.to_str().unwrap(),
    ]));
}

fn list(dir: &Path) -> serde_json::Value {
    serde_json::from_slice(&ok(on(dir, &["mig", "list", "-o", "json"])).stdout).unwrap()
}

#[test]
fn instances_made_by_a_mig_parted_config_are_listed_as_gpuslices_and_cleared_by_a_later_process() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("h100");
    init(&dir, "examples/hosts/h100-sxm-mig-off.umockdev");
    let before = list(&dir);
    assert_eq!(before[0]["migMode"], "disabled");
    assert_eq!(before[0]["gpuInstances"].as_array().unwrap().len(), 0);
    ok(on(
        &dir,
        &["mig", "apply", "-f", CONFIGS, "-c", "all-balanced"],
    ));
    let after = list(&dir);
    let gpu = &after[0];
    assert_eq!(gpu["migMode"], "enabled");
    let gis = gpu["gpuInstances"].as_array().unwrap();
    assert_eq!(gis.len(), 4);
    assert!(gis.iter().all(|g| g["madeBy"] == "gpuslice"), "{gis:?}");
    let three = gis.iter().find(|g| g["profile"] == "3g.40gb").unwrap();
    assert_eq!(
        (three["start"].as_u64(), three["slices"].as_u64()),
        (Some(4), Some(4))
    );
    let p = gpu["profiles"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "1g.10gb")
        .unwrap();
    assert_eq!(p["memoryMiB"], 10240);
    assert_eq!(p["placements"].as_array().unwrap().len(), 0);
    // The host matches; another config does not (exit 1).
    ok(on(
        &dir,
        &["mig", "assert", "-f", CONFIGS, "-c", "all-balanced"],
    ));
    let o = on(&dir, &["mig", "assert", "-f", CONFIGS, "-c", "all-1g.10gb"]);
    assert_eq!(o.status.code(), Some(1), "{}", stdout(&o));
    ok(on(&dir, &["mig", "clear"]));
    assert_eq!(list(&dir)[0]["gpuInstances"].as_array().unwrap().len(), 0);
}

#[test]
fn a_mig_mode_change_is_refused_while_the_gpu_has_vfs_and_nothing_changes() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("h200");
    init(&dir, "examples/hosts/h200-mig.umockdev");
    assert_eq!(list(&dir)[0]["migMode"], "enabled");
    let o = on(&dir, &["mig", "apply", "-f", CONFIGS, "-c", "all-disabled"]);
    assert_eq!(o.status.code(), Some(2), "{}", stdout(&o));
    assert!(stderr(&o).contains("sriov-manage -e"), "{}", stderr(&o));
    assert_eq!(list(&dir)[0]["migMode"], "enabled");
    // Instances can still be made in MIG mode: the H200's own profile names.
    let o = on(&dir, &["mig", "apply", "-f", CONFIGS, "-c", "all-1g.10gb"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("no GPU-instance profile \"1g.10gb\""),
        "{}",
        stderr(&o)
    );
}

#[test]
fn a_recording_has_no_driver_so_mig_says_it_needs_nvml() {
    let o = gpuslice(&[
        "--root",
        "examples/hosts/h100-sxm-mig-off.umockdev",
        "mig",
        "list",
    ]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("MIG needs NVML"), "{}", stderr(&o));
    let o = gpuslice(&[
        "--root",
        "examples/hosts/h100-sxm-mig-off.umockdev",
        "sandbox",
        "reset",
        "0000:18:00.0",
    ]);
    assert_eq!(o.status.code(), Some(2));
}

#[test]
fn a_mig_backed_vgpu_gets_its_gpu_instance_made_and_its_removal_destroys_it() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("h200");
    init(&dir, "examples/hosts/h200-mig.umockdev");
    let o = ok(on(
        &dir,
        &[
            "vgpu",
            "create",
            "--parent",
            "0000:18:00.0",
            "--profile",
            "H200X-3-71C",
        ],
    ));
    assert!(stderr(&o).contains("made GPU instance"), "{}", stderr(&o));
    let gis = list(&dir)[0]["gpuInstances"].clone();
    assert_eq!(gis.as_array().unwrap().len(), 1, "{gis}");
    assert_eq!(gis[0]["profile"], "3g.71gb");
    assert_eq!(gis[0]["madeBy"], "gpuslice");
    let vf = stdout(&o)
        .split_whitespace()
        .find(|w| w.starts_with("0000:18:"))
        .unwrap()
        .to_owned();
    let o = ok(on(&dir, &["vgpu", "remove", &vf]));
    assert!(
        stderr(&o).contains("destroyed GPU instance"),
        "{}",
        stderr(&o)
    );
    assert_eq!(list(&dir)[0]["gpuInstances"].as_array().unwrap().len(), 0);
}

#[test]
fn a_refusal_is_a_json_error_of_its_kind() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("h200");
    init(&dir, "examples/hosts/h200-mig.umockdev");
    let o = on(
        &dir,
        &[
            "-o",
            "json",
            "mig",
            "apply",
            "-f",
            CONFIGS,
            "-c",
            "all-disabled",
        ],
    );
    assert_eq!(o.status.code(), Some(2));
    // After the sandbox's notice line, the error document.
    let e = stderr(&o);
    let doc: serde_json::Value = serde_json::from_str(&e[e.find('{').unwrap()..]).unwrap();
    assert_eq!(doc["error"]["kind"], "in-use", "{doc}");
}

/// The type IDs the first VF of the bundled H200 lists as creatable now (not those listed as
/// needing a GPU instance first).
fn listed(dir: &Path) -> Vec<String> {
    let v: serde_json::Value =
        serde_json::from_slice(&ok(on(dir, &["vgpu", "types", "-o", "json"])).stdout).unwrap();
    v[0]["types"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| t["needsGpuInstance"] != true)
        .map(|t| t["id"].as_str().unwrap().to_owned())
        .collect()
}

fn profiles_by_whom(dir: &Path) -> Vec<(String, String)> {
    list(dir)[0]["gpuInstances"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| {
            (
                g["profile"].as_str().unwrap().to_owned(),
                g["madeBy"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

#[test]
fn the_fake_kernel_lists_what_mig_apply_made_and_a_layout_makes_and_clears_only_its_own_instances()
{
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("h200");
    init(&dir, "examples/hosts/h200-mig.umockdev");
    let cfg = t.path().join("mig.yaml");
    std::fs::write(
        &cfg,
        "version: v1\nmig-configs:\n  two:\n    - devices: all\n      mig-enabled: true\n      \
         mig-devices:\n        \"3g.71gb\": 1\n        \"1g.18gb\": 1\n",
    )
    .unwrap();
    ok(on(
        &dir,
        &["mig", "apply", "-f", cfg.to_str().unwrap(), "-c", "two"],
    ));
    // The driver lists the MIG-backed types of the instances there are (3g and 1g), no 2g.
    let ids = listed(&dir);
    assert!(
        ids.contains(&"1418".to_owned()) && ids.contains(&"1414".to_owned()),
        "{ids:?}"
    );
    assert!(!ids.contains(&"1417".to_owned()), "{ids:?}");
    // The layout wants a 3g, a 2g and a 1g: only the 2g instance is made for it.
    let layout = ["-f", "examples/hosts/layouts.yaml", "-c", "h200-3g-2g-1g"];
    let o = ok(on(&dir, &[&["vgpu", "apply"][..], &layout[..]].concat()));
    assert!(
        stderr(&o).contains("(2g.35gb) made at start"),
        "{}",
        stderr(&o)
    );
    let mut have = profiles_by_whom(&dir);
    have.sort();
    assert_eq!(have.len(), 3, "{have:?}");
    // Clearing the layout takes the instance made for it, never those `mig apply` made.
    ok(on(&dir, &[&["vgpu", "clear"][..], &layout[..]].concat()));
    let mut left: Vec<String> = profiles_by_whom(&dir).into_iter().map(|(p, _)| p).collect();
    left.sort();
    assert_eq!(left, ["1g.18gb", "3g.71gb"]);
}
