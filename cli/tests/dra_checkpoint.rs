//! `gpuslice dra prepare|unprepare` and the checkpoint: the record carries its phase and the
//! host's boot ID; after a reboot a prepare makes the claim's devices again (the same VF) instead
//! of answering from the record; unprepare refuses a root that is no host, as prepare does.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod export_support;

use export_support::*;
use serde_json::{Value, json};

const BOOT_A: &str = "3f1c2b7e-9a4d-4e8b-b1c2-5d6e7f8a9b0c";
const BOOT_B: &str = "8c0d1e2f-3a4b-4c5d-8e6f-7a8b9c0d1e2f";

fn set_boot(root: &std::path::Path, boot: &str) {
    let f = root.join("proc/sys/kernel/random/boot_id");
    std::fs::create_dir_all(f.parent().unwrap()).unwrap();
    std::fs::write(f, format!("{boot}\n")).unwrap();
}

fn claim_file(dir: &std::path::Path) -> String {
    let v = json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "vm-1-gpu", "namespace": "default", "uid": "7c2a"},
        "status": {"allocation": {"devices": {
            "results": [{"request": "vgpu", "driver": "gpu.gpuslice.dev", "pool": "l40s-host",
                         "device": "vgpu-0000-26-00-0-24576mi"}],
            "config": [{"requests": ["vgpu"], "opaque": {
                "driver": "gpu.gpuslice.dev", "parameters": {"profile": "L40S-24Q"}}}],
        }}},
    });
    let p = dir.join("claim.json");
    std::fs::write(&p, v.to_string()).unwrap();
    p.to_str().unwrap().to_owned()
}

#[test]
fn after_a_reboot_prepare_types_the_same_vf_again_instead_of_answering_from_the_record() {
    let tree = l40s_root(false);
    let root = tree.root().to_str().unwrap();
    set_boot(tree.root(), BOOT_A);
    let dir = tempfile::tempdir().unwrap();
    let f = claim_file(dir.path());
    let prepare = || -> Value {
        serde_json::from_str(&ok(&[
            "--root",
            root,
            "--node",
            "l40s-host",
            "dra",
            "prepare",
            "--claim",
            &f,
        ]))
        .unwrap()
    };
    let first = prepare();
    let vf = first["actions"][0]["vf"].as_str().unwrap().to_owned();
    let record_path = tree.root().join("var/lib/gpuslice/dra/claims/7c2a.json");
    let record: Value =
        serde_json::from_str(&std::fs::read_to_string(&record_path).unwrap()).unwrap();
    assert_eq!(record["phase"], "completed");
    assert_eq!(record["bootId"], BOOT_A);
    assert_eq!(prepare()["unchanged"], true);

    // The reboot: the VF's type is gone (vGPUs do not survive it), the boot ID is new.
    let current = tree
        .root()
        .join(format!("sys/bus/pci/devices/{vf}/nvidia/current_vgpu_type"));
    std::fs::write(&current, "0\n").unwrap();
    set_boot(tree.root(), BOOT_B);
    let again = prepare();
    assert_eq!(again["unchanged"], false);
    assert_eq!(again["actions"], first["actions"]);
    assert_eq!(std::fs::read_to_string(&current).unwrap().trim(), "1155");
    let record: Value =
        serde_json::from_str(&std::fs::read_to_string(&record_path).unwrap()).unwrap();
    assert_eq!(record["bootId"], BOOT_B);
    assert_eq!(prepare()["unchanged"], true);
}

#[test]
fn unprepare_refuses_a_root_that_is_no_host_as_prepare_does() {
    let empty = tempfile::tempdir().unwrap();
    let root = empty.path().to_str().unwrap();
    let f = claim_file(empty.path());
    let p = run(&["--root", root, "dra", "prepare", "--claim", &f]);
    let u = run(&["--root", root, "dra", "unprepare", "--claim-uid", "7c2a"]);
    assert_eq!(p.status.code(), u.status.code());
    assert_ne!(u.status.code(), Some(0));
    let (p, u) = (
        String::from_utf8_lossy(&p.stderr),
        String::from_utf8_lossy(&u.stderr),
    );
    assert!(u.contains("invalid host root"), "{u}");
    assert_eq!(p, u);
    let missing = empty.path().join("missing");
    let root = missing.to_str().unwrap();
    let p = run(&["--root", root, "dra", "prepare", "--claim", &f]);
    let u = run(&["--root", root, "dra", "unprepare", "--claim-uid", "7c2a"]);
    assert_eq!(p.status.code(), u.status.code());
    assert_eq!(p.stderr, u.stderr);
    assert!(!missing.exists());
}
