//! MIG on request through the CLI on the bundled H200 sandbox (MIG mode on, 16 VFs offering
//! MIG-backed types), each command a separate process: `realize` makes a vGPU's missing GPU
//! instance, `vgpu create` turns MIG mode on where nothing uses the GPU, and `topology` /
//! `vgpu types` list the MIG-backed types whose instance does not exist yet.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod sandbox_support;

use std::path::Path;

use sandbox_support::{gpuslice, ok, on, stderr, stdout};

const CONFIGS: &str = "examples/hosts/mig-configs.yaml";
const GPU: &str = "0000:18:00.0";

fn h200(t: &tempfile::TempDir) -> std::path::PathBuf {
    let dir = t.path().join("h200");
    ok(gpuslice(&[
        "sandbox",
        "init",
        "--from",
        "examples/hosts/h200-mig.umockdev",
        dir.to_str().unwrap(),
    ]));
    dir
}

fn json(dir: &Path, args: &[&str]) -> serde_json::Value {
    let args = [&["-o", "json"][..], args].concat();
    serde_json::from_slice(&ok(on(dir, &args)).stdout).unwrap()
}

fn instances(dir: &Path) -> Vec<(String, u64)> {
    json(dir, &["mig", "list"])[0]["gpuInstances"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| {
            (
                g["profile"].as_str().unwrap().to_owned(),
                g["start"].as_u64().unwrap(),
            )
        })
        .collect()
}

/// `vgpu create` of `profile` on the H200.
fn create(dir: &Path, profile: &str) -> std::process::Output {
    on(
        dir,
        &["vgpu", "create", "--parent", GPU, "--profile", profile],
    )
}

/// The JSON error document of a refused command.
fn error_of(o: &std::process::Output) -> serde_json::Value {
    assert_eq!(o.status.code(), Some(2), "{}", stdout(o));
    let e = stderr(o);
    serde_json::from_str(&e[e.find('{').unwrap()..]).unwrap()
}

fn allocation(dir: &Path, vfs: &[&str]) -> std::path::PathBuf {
    allocation_at(dir, vfs, None)
}

/// An allocation of 3g vGPUs on `vfs`, each with `start` as its `gpuInstanceStart` when given.
fn allocation_at(dir: &Path, vfs: &[&str], start: Option<u8>) -> std::path::PathBuf {
    let node = json(dir, &["topology"])["node"]
        .as_str()
        .unwrap()
        .to_owned();
    let devices: Vec<serde_json::Value> = vfs
        .iter()
        .enumerate()
        .map(|(i, vf)| {
            serde_json::json!({
                "kind": "vgpu", "request": "gpu", "index": i, "parent": vf, "gpu": GPU,
                "framework": "vendor-vfio", "profile": "1418",
                "profileName": "NVIDIA H200X-3-71C",
                "uuid": format!("00000000-0000-0000-0000-00000000000{i}"),
                "gpuInstanceStart": start,
            })
        })
        .collect();
    let doc = serde_json::json!({"machine": "vm1", "node": node, "devices": devices});
    let path = dir.with_extension("allocation.json");
    std::fs::write(&path, doc.to_string()).unwrap();
    path
}

#[test]
fn realize_makes_the_gpu_instance_of_a_mig_backed_vgpu_and_vgpu_remove_destroys_it() {
    let t = tempfile::tempdir().unwrap();
    let dir = h200(&t);
    assert!(instances(&dir).is_empty());
    let a = allocation(&dir, &["0000:18:00.4"]);
    ok(on(&dir, &["realize", "--allocation", a.to_str().unwrap()]));
    assert_eq!(instances(&dir), [("3g.71gb".to_owned(), 4)]);
    let mine = json(&dir, &["mig", "list"])[0]["gpuInstances"][0]["madeBy"].clone();
    assert_eq!(mine, "gpuslice");
    let o = ok(on(&dir, &["vgpu", "remove", "0000:18:00.4"]));
    assert!(
        stderr(&o).contains("destroyed GPU instance"),
        "{}",
        stderr(&o)
    );
    assert!(instances(&dir).is_empty());
}

#[test]
fn a_realize_whose_instances_cannot_fit_is_refused_with_nothing_made() {
    let t = tempfile::tempdir().unwrap();
    let dir = h200(&t);
    let a = allocation(&dir, &["0000:18:00.4", "0000:18:00.5", "0000:18:00.6"]);
    let o = on(
        &dir,
        &["-o", "json", "realize", "--allocation", a.to_str().unwrap()],
    );
    let doc = error_of(&o);
    assert_eq!(doc["error"]["kind"], "exhausted", "{doc}");
    assert!(
        stderr(&o).contains("no room for a 3g.71gb"),
        "{}",
        stderr(&o)
    );
    assert!(instances(&dir).is_empty());
    let held = json(&dir, &["vgpu", "list"]);
    assert_eq!(held.as_array().map_or(0, Vec::len), 0, "{held}");
}

#[test]
fn realize_makes_the_instance_at_the_allocations_gpu_instance_start_or_refuses_an_illegal_one() {
    let t = tempfile::tempdir().unwrap();
    let dir = h200(&t);
    let bad = allocation_at(&dir, &["0000:18:00.4"], Some(2));
    let o = on(
        &dir,
        &[
            "-o",
            "json",
            "realize",
            "--allocation",
            bad.to_str().unwrap(),
        ],
    );
    assert_eq!(error_of(&o)["error"]["kind"], "invalid-argument");
    assert!(
        stderr(&o).contains("2 is not a legal start"),
        "{}",
        stderr(&o)
    );
    assert!(instances(&dir).is_empty());
    let a = allocation_at(&dir, &["0000:18:00.4"], Some(0));
    ok(on(&dir, &["realize", "--allocation", a.to_str().unwrap()]));
    assert_eq!(instances(&dir), [("3g.71gb".to_owned(), 0)]);
}

/// The H200 idle with MIG mode off: its VFs disabled, then MIG mode turned off.
fn idle_with_mig_off(dir: &Path) {
    ok(on(dir, &["sriov", "disable", GPU]));
    ok(on(
        dir,
        &["mig", "apply", "-f", CONFIGS, "-c", "all-disabled"],
    ));
    assert_eq!(json(dir, &["mig", "list"])[0]["migMode"], "disabled");
}

#[test]
fn vgpu_create_of_a_mig_backed_type_turns_mig_mode_on_where_nothing_uses_the_gpu() {
    let t = tempfile::tempdir().unwrap();
    let dir = h200(&t);
    idle_with_mig_off(&dir);
    let o = ok(create(&dir, "H200X-3-71C"));
    assert!(stderr(&o).contains("made GPU instance"), "{}", stderr(&o));
    assert_eq!(json(&dir, &["mig", "list"])[0]["migMode"], "enabled");
    assert_eq!(instances(&dir), [("3g.71gb".to_owned(), 4)]);
    let listed = json(&dir, &["vgpu", "list"]).to_string();
    assert!(listed.contains("1418"), "{listed}");
}

#[test]
fn vgpu_create_is_refused_naming_the_vfs_when_mig_mode_must_go_on_after_sriov() {
    let t = tempfile::tempdir().unwrap();
    let dir = h200(&t);
    idle_with_mig_off(&dir);
    ok(on(&dir, &["sriov", "enable", GPU]));
    let o = on(
        &dir,
        &[
            &["-o", "json", "vgpu", "create", "--parent", GPU][..],
            &["--profile", "H200X-3-71C"][..],
        ]
        .concat(),
    );
    let doc = error_of(&o);
    assert_eq!(doc["error"]["kind"], "in-use", "{doc}");
    let text = doc["error"]["message"].to_string() + &stderr(&o);
    assert!(
        text.contains("MIG-backed") && text.contains("sriov"),
        "{text}"
    );
    assert_eq!(json(&dir, &["mig", "list"])[0]["migMode"], "disabled");
    assert!(instances(&dir).is_empty());
}

#[test]
fn types_whose_gpu_instance_does_not_exist_are_listed_as_needing_one_and_can_be_asked_for() {
    let t = tempfile::tempdir().unwrap();
    let dir = h200(&t);
    // A 3g vGPU holds the one instance made for it: no MIG-backed type has a free instance.
    ok(create(&dir, "H200X-3-71C"));
    let topo = json(&dir, &["topology"]);
    let m = &topo["gpus"][0]["migBackedTypes"];
    assert_eq!(m["source"], "sandbox", "{m}");
    let types = m["types"].as_array().unwrap();
    assert_eq!(types.len(), 7, "{m}");
    assert!(types.iter().all(|t| t["needsGpuInstance"] == true), "{m}");
    let text = stdout(&ok(on(&dir, &["topology"])));
    assert!(text.contains("no GPU instance yet"), "{text}");
    let listed = json(&dir, &["vgpu", "types", "--parent", "0000:18:00.5"]);
    let two = listed[0]["types"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["id"] == "1417")
        .cloned()
        .unwrap();
    assert_eq!(two["needsGpuInstance"], true, "{two}");
    assert_eq!(two["availableInstances"], 0, "{two}");
    // Asked for, it is made with its instance.
    ok(create(&dir, "H200X-2-35C"));
    assert!(instances(&dir).iter().any(|(p, _)| p == "2g.35gb"));
}
