//! `gpuslice place` with a fleet whose allocations an orchestrator wrote in the platform guide's
//! short shape (`parent`, `profile`, `framebufferMiB`, `uuid` per device).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod export_support;

use export_support::*;
use serde_json::{Value, json};

/// A fleet of one modelled H200 (VFs 0000:18:00.4 and .5) whose VF .4 holds a 3g vGPU given in
/// the short shape.
fn fleet_file(dir: &std::path::Path, device: Value) -> std::path::PathBuf {
    let mut doc = serde_json::to_value(fleet(vec![h200_node("h200", 1)])).unwrap();
    doc["allocations"] = json!([{"machine": "vm-1", "node": "h200", "devices": [device]}]);
    let p = dir.join("fleet.json");
    std::fs::write(&p, doc.to_string()).unwrap();
    p
}

fn machine(dir: &std::path::Path, profile: &str) -> std::path::PathBuf {
    let p = dir.join(format!("{profile}.yaml"));
    std::fs::write(
        &p,
        format!("name: vm-2\ndevices: [{{name: gpu, profile: {profile}}}]\n"),
    )
    .unwrap();
    p
}

#[test]
fn place_charges_a_short_shape_allocation_and_takes_the_other_vf() {
    let dir = tempfile::tempdir().unwrap();
    let f = fleet_file(
        dir.path(),
        json!({
            "parent": "0000:18:00.4",
            "profile": "1418",
            "framebufferMiB": 72704,
            "uuid": "1b2c3d4e-5f60-4a7b-8c9d-0e1f2a3b4c5d",
        }),
    );
    let m = machine(dir.path(), "H200X-3-71C");
    let out = ok(&[
        "place",
        "--inventory",
        f.to_str().unwrap(),
        "--machine",
        m.to_str().unwrap(),
        "-o",
        "json",
    ]);
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["devices"][0]["parent"], "0000:18:00.5", "{out}");
    // The whole GPU no longer fits beside the held 3g.
    let m = machine(dir.path(), "H200X-7-141C");
    let refused = run(&[
        "place",
        "--inventory",
        f.to_str().unwrap(),
        "--machine",
        m.to_str().unwrap(),
    ]);
    assert_eq!(refused.status.code(), Some(3));
}

#[test]
fn place_names_the_device_whose_parent_is_not_in_the_topology() {
    let dir = tempfile::tempdir().unwrap();
    let f = fleet_file(
        dir.path(),
        json!({
            "parent": "0000:18:01.2",
            "profile": "1418",
            "uuid": "1b2c3d4e-5f60-4a7b-8c9d-0e1f2a3b4c5d",
        }),
    );
    let m = machine(dir.path(), "H200X-3-71C");
    let out = run(&[
        "place",
        "--inventory",
        f.to_str().unwrap(),
        "--machine",
        m.to_str().unwrap(),
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("Machine \"vm-1\": device 0 (parent 0000:18:01.2, profile \"1418\")")
            && err.contains("node \"h200\" has no vGPU parent 0000:18:01.2"),
        "{err}"
    );
}
