//! `gpuslice dra unprepare` undoes only what `dra prepare` changed: a device the claim asked for
//! that was already in place (recorded as `found`) is left as it was.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod export_support;

use export_support::*;
use gpu_sysfs::testing::builder::{MdevTypeSpec, Tree};
use gpu_sysfs::testing::{PciSpec, TreeBuilder};
use serde_json::{Value, json};

const SHARE: &str = "2c6f1e8a-4b3d-4f5a-9e7c-8d1b2a3c4e5f";
const T4: &str = "0000:3b:00.0";

fn t4_type(id: &str, name: &str, fb_mib: u64, max: u32, available: u32) -> MdevTypeSpec {
    MdevTypeSpec::new(
        id,
        name,
        available,
        Some(&format!(
            "num_heads=4, frl_config=60, framebuffer={fb_mib}M, max_resolution=5120x2880, \
             max_instance={max}"
        )),
    )
}

/// A Tesla T4 (no SR-IOV: the PF is the mdev parent) holding one T4-4Q whose UUID is the
/// claim's share ID, made before the claim was prepared (an earlier prepare whose record was
/// lost, or another tool).
fn t4_with_the_claims_mdev() -> Tree {
    let mut b = TreeBuilder::new();
    b.pci(
        T4,
        PciSpec::new(0x10de, 0x1eb8, 0x030200)
            .driver("nvidia")
            .group(30)
            .numa(0),
    );
    b.mdev_parent(
        T4,
        &[
            t4_type("nvidia-222", "GRID T4-1Q", 1024, 16, 0),
            t4_type("nvidia-230", "GRID T4-4Q", 4096, 4, 3),
            t4_type("nvidia-232", "GRID T4-16Q", 16384, 1, 0),
        ],
    );
    b.mdev_instance(SHARE, T4, "nvidia-230");
    b.finish().unwrap()
}

fn claim(device: &str) -> Value {
    json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "vm-1-gpu", "namespace": "default", "uid": "9d2e"},
        "status": {"allocation": {"devices": {
            "results": [{
                "request": "vgpu",
                "driver": "gpu.gpuslice.dev",
                "pool": "t4-host",
                "device": device,
                "shareID": SHARE,
            }],
            "config": [{
                "source": "FromClaim",
                "requests": ["vgpu"],
                "opaque": {"driver": "gpu.gpuslice.dev", "parameters": {"profile": "T4-4Q"}},
            }],
        }}},
    })
}

#[test]
fn unprepare_leaves_a_device_that_was_in_place_before_prepare() {
    let tree = t4_with_the_claims_mdev();
    let root = tree.root().to_str().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let state = state.to_str().unwrap();
    let base = ["--root", root, "--node", "t4-host"];

    // The export publishes the T4's 4 GiB vGPUs under this name.
    let mut args = base.to_vec();
    args.extend(["export", "dra", "--state-dir", state]);
    let slices = ok(&args);
    let device = "vgpu-0000-3b-00-0-4096mi";
    assert!(slices.contains(device), "{slices}");

    let f = dir.path().join("claim.json");
    std::fs::write(&f, claim(device).to_string()).unwrap();
    let mut args = base.to_vec();
    args.extend([
        "dra",
        "prepare",
        "--claim",
        f.to_str().unwrap(),
        "--state-dir",
        state,
    ]);
    let v: Value = serde_json::from_str(&ok(&args)).unwrap();
    // Nothing was changed: the mdev was there, so it is recorded as found, not as an action.
    assert_eq!(v["actions"], json!([]), "{v}");
    // The answer still hands the claim's device to the VM, and says it was found in place.
    assert_eq!(v["found"][0]["uuid"], SHARE, "{v}");
    let qemu = v["qemu"].to_string();
    assert!(qemu.contains(SHARE), "the VM is given the found mdev: {v}");
    let records: Vec<_> = std::fs::read_dir(dir.path().join("state/claims"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(records.len(), 1);
    let record: Value =
        serde_json::from_str(&std::fs::read_to_string(&records[0]).unwrap()).unwrap();
    assert_eq!(record["actions"], json!([]), "{record}");
    assert_eq!(record["found"][0]["action"], "create-mdev", "{record}");
    assert_eq!(record["found"][0]["uuid"], SHARE, "{record}");

    let mut args = base.to_vec();
    args.extend([
        "dra",
        "unprepare",
        "--claim-uid",
        "9d2e",
        "--state-dir",
        state,
    ]);
    let out: Value = serde_json::from_str(&ok(&args)).unwrap();
    assert_eq!(out["removed"], json!([]), "{out}");
    // The mdev is still there; the claim's record is gone.
    let link = tree.root().join(format!("sys/bus/mdev/devices/{SHARE}"));
    assert!(
        link.symlink_metadata().is_ok(),
        "unprepare removed the mdev it found"
    );
    assert!(
        std::fs::read_dir(dir.path().join("state/claims"))
            .unwrap()
            .next()
            .is_none()
    );
}
