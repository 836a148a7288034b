//! `gpuslice export dra --k8s-version` by patch release: before 1.36.2 one vGPU size per GPU as
//! per-instance devices (`--size-for`), from 1.36.2 the size-lock encoding, said on stderr; `dra
//! check` refuses what a version's scheduler would over-allocate; `dra prepare` refuses a claim
//! that breaks the same-size rule before any write.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod export_support;

use export_support::*;
use serde_json::{Value, json};

fn devices(yaml: &str) -> Vec<Value> {
    use serde::Deserialize;
    serde_yaml_ng::Deserializer::from_str(yaml)
        .map(|d| Value::deserialize(d).unwrap())
        .filter(|v| v["kind"] == "ResourceSlice")
        .flat_map(|s| s["spec"]["devices"].as_array().cloned().unwrap_or_default())
        .collect()
}

/// Runs `gpuslice ARGS`, asserting success; returns stdout and stderr.
fn export(args: &[&str]) -> (String, String) {
    let out = run(args);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    (
        String::from_utf8(out.stdout).unwrap(),
        String::from_utf8(out.stderr).unwrap(),
    )
}

fn a2_export(version: &str) -> (String, String) {
    let a2 = a2_root();
    let state = a2.path().join("no-state");
    export(&[
        "--root",
        a2.path().to_str().unwrap(),
        "--node",
        "a2-host",
        "export",
        "dra",
        "--k8s-version",
        version,
        "--state-dir",
        state.to_str().unwrap(),
    ])
}

fn check(yaml: &str, version: &str) -> (Option<i32>, String) {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("slices.yaml");
    std::fs::write(&f, yaml).unwrap();
    let out = run(&[
        "dra",
        "check",
        f.to_str().unwrap(),
        "--k8s-version",
        version,
    ]);
    (
        out.status.code(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

#[test]
fn a_minor_alone_means_its_oldest_patch_and_gets_the_safe_encoding() {
    for (v, lock) in [
        ("1.36", false),
        ("1.36.0", false),
        ("1.36.1", false),
        ("1.36.2", true),
        ("1.37", true),
    ] {
        let (yaml, stderr) = a2_export(v);
        let devs = devices(&yaml);
        let multi = devs
            .iter()
            .filter(|d| d["allowMultipleAllocations"] == true)
            .count();
        if lock {
            assert!(stderr.contains("size-lock encoding"), "{v}: {stderr}");
            assert_eq!(multi, 1, "{v}");
        } else {
            assert!(
                stderr.contains(&format!("Kubernetes {v}: one-size-per-instance encoding")),
                "{v}: {stderr}"
            );
            assert_eq!(multi, 0, "{v}: {yaml}");
            assert_eq!(devs[0]["name"], "vgpu-0000-08-00-0-4096mi-0");
        }
    }
}

#[test]
fn size_for_publishes_one_device_per_vgpu_of_the_chosen_size_before_1_36_2() {
    let dir = tempfile::tempdir().unwrap();
    let f = write_fleet(dir.path(), "fleet.json", &fleet(vec![mixed_node("ws-1")]));
    let fleet_export = |v: &str, extra: &[&str]| {
        let mut args = vec![
            "export",
            "dra",
            "--inventory",
            f.to_str().unwrap(),
            "--k8s-version",
            v,
        ];
        args.extend_from_slice(extra);
        export(&args)
    };
    // No size chosen: the Ada's vGPUs are left out, saying how to choose.
    let (yaml, stderr) = fleet_export("1.35", &[]);
    assert!(
        stderr.contains("--size-for 0000:17:00.0=PROFILE"),
        "{stderr}"
    );
    assert!(
        devices(&yaml)
            .iter()
            .all(|d| !d["name"].as_str().unwrap().starts_with("vgpu-0000-17-00-0"))
    );
    // 8 GB chosen: six devices of 8 GB, each consuming its share; the whole GPU all of it.
    let (yaml, _) = fleet_export("1.35", &["--size-for", "0000:17:00.0=RTX6000-Ada-8Q"]);
    let devs = devices(&yaml);
    let ada: Vec<&Value> = devs
        .iter()
        .filter(|d| d["name"].as_str().unwrap().starts_with("vgpu-0000-17-00-0"))
        .collect();
    let names: Vec<&str> = ada.iter().map(|d| d["name"].as_str().unwrap()).collect();
    assert_eq!(
        names,
        (0..6)
            .map(|i| format!("vgpu-0000-17-00-0-8192mi-{i}"))
            .collect::<Vec<_>>()
    );
    for d in &ada {
        assert!(d.get("allowMultipleAllocations").is_none());
        assert_eq!(
            d["consumesCounters"][0]["counters"]["framebuffer"]["value"],
            "8Gi"
        );
        assert_eq!(d["attributes"]["profile_RTX6000_Ada_8Q"]["bool"], true);
    }
    let whole = devs
        .iter()
        .find(|d| d["name"] == "gpu-0000-17-00-0")
        .unwrap();
    assert_eq!(
        whole["consumesCounters"][0]["counters"]["framebuffer"]["value"],
        "48Gi"
    );
    assert_eq!(check(&yaml, "1.35").0, Some(0));
    // From 1.36.2 the choice does not matter: the size-lock encoding offers every size.
    let (with, _) = fleet_export("1.37", &["--size-for", "0000:17:00.0=RTX6000-Ada-8Q"]);
    let (without, _) = fleet_export("1.37", &[]);
    assert_eq!(with, without);
    // A malformed choice is an error naming it.
    let out = run(&["export", "dra", "--size-for", "17:00.0"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("expected GPU=PROFILE"));
}

#[test]
fn check_refuses_uncounted_shares_before_1_36_2_and_multi_devices_without_capacity() {
    let dir = tempfile::tempdir().unwrap();
    let f = write_fleet(dir.path(), "fleet.json", &fleet(vec![mixed_node("ws-1")]));
    let yaml = ok(&["export", "dra", "--inventory", f.to_str().unwrap()]);
    let (code, text) = check(&yaml, "1.36");
    assert_eq!(code, Some(1), "{text}");
    assert!(
        text.contains("does not count across scheduling cycles (kubernetes#139034"),
        "{text}"
    );
    assert_eq!(check(&yaml, "1.36.2").0, Some(0));
    // A multi-allocatable device that declares no capacity is charged twice (#140433).
    let mut docs: Vec<Value> = {
        use serde::Deserialize;
        serde_yaml_ng::Deserializer::from_str(&yaml)
            .map(|d| Value::deserialize(d).unwrap())
            .filter(|v| !v.is_null())
            .collect()
    };
    for d in &mut docs {
        let devs = d
            .get_mut("spec")
            .and_then(|s| s.get_mut("devices"))
            .and_then(Value::as_array_mut);
        if let Some(devs) = devs {
            for dev in devs
                .iter_mut()
                .filter(|d| d["allowMultipleAllocations"] == true)
            {
                dev.as_object_mut().unwrap().remove("capacity");
            }
        }
    }
    let bare = json!({"apiVersion": "v1", "kind": "List", "items": docs}).to_string();
    let (code, text) = check(&bare, "1.37");
    assert_eq!(code, Some(1), "{text}");
    assert!(
        text.contains("declares no capacity, so the scheduler charges its counters twice"),
        "{text}"
    );
}

#[test]
fn prepare_refuses_a_second_size_on_a_locked_gpu_naming_the_gpu_and_both_sizes() {
    // The A2 capture holds three 4 GB vGPUs: a claim of a 2 GB one (published before the lock,
    // or by a scheduler before 1.36.2) is refused before any write.
    let a2 = a2_root();
    let dir = tempfile::tempdir().unwrap();
    let claim = json!({
        "metadata": {"uid": "uid-2g"},
        "status": {"allocation": {"devices": {
            "results": [{"request": "vgpu", "driver": "gpu.gpuslice.dev", "pool": "a2-host",
                         "device": "vgpu-0000-08-00-0-2048mi-0"}],
            "config": [{"opaque": {"driver": "gpu.gpuslice.dev",
                                   "parameters": {"profile": "A2-2Q"}}}],
        }}},
    });
    let f = dir.path().join("claim.json");
    std::fs::write(&f, claim.to_string()).unwrap();
    let state = dir.path().join("state");
    let out = run(&[
        "--root",
        a2.path().to_str().unwrap(),
        "--node",
        "a2-host",
        "dra",
        "prepare",
        "--claim",
        f.to_str().unwrap(),
        "--state-dir",
        state.to_str().unwrap(),
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_ne!(out.status.code(), Some(0), "{stderr}");
    assert!(
        stderr.contains(
            "GPU 0000:08:00.0 would hold time-sliced vGPUs of two sizes, 2048 MiB and 4096 MiB"
        ),
        "{stderr}"
    );
    assert!(!state.exists(), "nothing recorded");
}
