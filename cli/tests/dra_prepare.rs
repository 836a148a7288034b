//! `gpuslice dra prepare|unprepare`: an allocation result mapped back to a parent or VF, made on
//! the host through the actuation layer, recorded, and undone.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod export_support;

use export_support::*;
use serde_json::{Value, json};

const SHARE: &str = "5f0b4e3a-9c1d-4c7e-8a55-2f6d0b9e1a77";

fn claim(uid: &str, pool: &str, device: &str, profile: Option<&str>) -> Value {
    let mut config = vec![];
    if let Some(p) = profile {
        config.push(json!({
            "source": "FromClaim",
            "requests": ["vgpu"],
            "opaque": {"driver": "gpu.gpuslice.dev", "parameters": {"profile": p}},
        }));
    }
    json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "vm-1-gpu", "namespace": "default", "uid": uid},
        "status": {"allocation": {"devices": {
            "results": [{
                "request": "vgpu",
                "driver": "gpu.gpuslice.dev",
                "pool": pool,
                "device": device,
                "shareID": SHARE,
            }],
            "config": config,
        }}},
    })
}

fn write(dir: &std::path::Path, name: &str, v: &Value) -> String {
    let p = dir.join(name);
    std::fs::write(&p, serde_json::to_string_pretty(v).unwrap()).unwrap();
    p.to_str().unwrap().to_owned()
}

#[test]
fn an_a2_vgpu_claim_plans_an_mdev_on_a_free_vf_named_by_the_share_id() {
    let a2 = a2_root();
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let f = write(
        dir.path(),
        "claim.json",
        &claim(
            "uid-1",
            "a2-host",
            "vgpu-0000-08-00-0-4096mi",
            Some("A2-4Q"),
        ),
    );
    let out = ok(&[
        "--root",
        a2.path().to_str().unwrap(),
        "--node",
        "a2-host",
        "dra",
        "prepare",
        "--claim",
        &f,
        "--state-dir",
        state.to_str().unwrap(),
        "--dry-run",
    ]);
    let v: Value = serde_json::from_str(&out).unwrap();
    let a = &v["actions"][0];
    assert_eq!(a["action"], "create-mdev");
    assert_eq!(a["typeId"], "nvidia-746");
    assert_eq!(a["profile"], "A2-4Q");
    assert_eq!(a["uuid"], SHARE);
    let parent = a["parent"].as_str().unwrap();
    assert!(
        !A2_BUSY_VFS.iter().any(|(vf, _)| *vf == parent),
        "{parent} already holds a vGPU"
    );
    assert_eq!(
        v["qemu"][1],
        format!("vfio-pci,sysfsdev=/sys/bus/mdev/devices/{SHARE}")
    );
    assert!(!state.exists(), "a dry run records nothing");
}

#[test]
fn a_claim_is_refused_when_it_does_not_match_the_node() {
    let a2 = a2_root();
    let root = a2.path().to_str().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let state = state.to_str().unwrap();
    let cases = [
        (
            claim("u", "a2-host", "vgpu-0000-08-00-0-4096mi", None),
            "offers A2-4A, A2-4C, A2-4Q; name one in the claim's opaque config",
        ),
        (
            claim("u", "a2-host", "vgpu-0000-08-00-0-4096mi", Some("A2-8Q")),
            "does not offer profile A2-8Q",
        ),
        (
            claim("u", "other-node", "vgpu-0000-08-00-0-4096mi", Some("A2-4Q")),
            "is in pool other-node, this node is a2-host",
        ),
        (
            claim("u", "a2-host", "vgpu-0000-99-00-0-4096mi", Some("A2-4Q")),
            "is not published by any GPU of node a2-host",
        ),
        (json!({"kind": "ResourceClaim"}), "holds no allocation"),
    ];
    for (c, expect) in cases {
        let f = write(dir.path(), "claim.json", &c);
        let out = run(&[
            "--root",
            root,
            "--node",
            "a2-host",
            "dra",
            "prepare",
            "--claim",
            &f,
            "--claim-uid",
            "u",
            "--state-dir",
            state,
            "--dry-run",
        ]);
        assert_eq!(out.status.code(), Some(2));
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(expect), "expected {expect:?} in {err}");
    }
    let f = write(
        dir.path(),
        "claim.json",
        &claim("../x", "a2-host", "vgpu-0000-08-00-0-4096mi", Some("A2-4Q")),
    );
    let out = run(&[
        "--root",
        root,
        "--node",
        "a2-host",
        "dra",
        "prepare",
        "--claim",
        &f,
        "--state-dir",
        state,
    ]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("is not a Kubernetes UID"));
}

#[test]
fn an_l40s_claim_types_a_vf_is_recorded_counted_once_and_unprepared() {
    let tree = l40s_root(false);
    let root = tree.root().to_str().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let state = state.to_str().unwrap();
    let f = write(
        dir.path(),
        "claim.json",
        &claim(
            "3b1c",
            "l40s-host",
            "vgpu-0000-26-00-0-24576mi",
            Some("L40S-24Q"),
        ),
    );
    let base = ["--root", root, "--node", "l40s-host"];
    let prepare = |extra: &[&str]| {
        let mut args = base.to_vec();
        args.extend(["dra", "prepare", "--claim", &f, "--state-dir", state]);
        args.extend(extra);
        ok(&args)
    };
    let v: Value = serde_json::from_str(&prepare(&[])).unwrap();
    assert_eq!(v["unchanged"], false);
    let a = &v["actions"][0];
    assert_eq!(a["action"], "set-vf-type");
    assert_eq!(a["typeId"], "1155");
    let vf = a["vf"].as_str().unwrap().to_owned();
    let current = tree
        .root()
        .join(format!("sys/bus/pci/devices/{vf}/nvidia/current_vgpu_type"));
    assert_eq!(std::fs::read_to_string(&current).unwrap().trim(), "1155");
    assert_eq!(v["qemu"][1], format!("vfio-pci,host={vf}"));

    // The driver now lists only what still fits GPU-wide; the typed VF lists nothing.
    for n in 4..8 {
        let other = format!("0000:26:00.{n}");
        let list = if other == vf {
            "ID    : vGPU Name\n"
        } else {
            "ID    : vGPU Name\n1155  : NVIDIA L40S-24Q\n1165  : NVIDIA L40S-24A\n"
        };
        std::fs::write(
            tree.root().join(format!(
                "sys/bus/pci/devices/{other}/nvidia/creatable_vgpu_types"
            )),
            list,
        )
        .unwrap();
    }

    // kubelet retries: the same claim answers the same without touching the host.
    let again: Value = serde_json::from_str(&prepare(&[])).unwrap();
    assert_eq!(again["unchanged"], true);
    assert_eq!(again["actions"], v["actions"]);

    // The export does not subtract the scheduler's own vGPU a second time.
    let mut args = base.to_vec();
    args.extend(["export", "dra", "--state-dir", state]);
    let yaml = ok(&args);
    assert!(yaml.contains("value: \"48Gi\""), "{yaml}");
    let none = dir.path().join("none");
    let mut args = base.to_vec();
    args.extend(["export", "dra", "--state-dir", none.to_str().unwrap()]);
    let foreign = ok(&args);
    assert!(!foreign.contains("value: \"48Gi\""), "{foreign}");

    // A plain file is not sysfs: writing "0" over "1155" would leave "0155". The kernel's side of
    // clearing is covered by the actuation tests against the fake kernel; here the VF reads as
    // cleared and unprepare must still drop the record, idempotently.
    std::fs::write(&current, "0\n").unwrap();
    let mut args = base.to_vec();
    args.extend([
        "dra",
        "unprepare",
        "--claim-uid",
        "3b1c",
        "--state-dir",
        state,
    ]);
    let out: Value = serde_json::from_str(&ok(&args)).unwrap();
    assert_eq!(out["removed"], json!([vf]));
    assert_eq!(
        std::fs::read_dir(dir.path().join("state/claims"))
            .unwrap()
            .count(),
        0
    );
    // Unprepare twice is fine.
    let out: Value = serde_json::from_str(&ok(&args)).unwrap();
    assert_eq!(out["removed"], json!([]));
}
