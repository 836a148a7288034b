//! `dra prepare --state-dir` goes through the host layer: a store directory that is a symlink is
//! refused before the host is changed, and nothing is written through the link.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod export_support;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use export_support::*;
use serde_json::json;

/// Every file under `dir` with its content.
fn files(dir: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    let mut out = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            let meta = std::fs::symlink_metadata(&p).unwrap();
            if meta.is_dir() {
                stack.push(p.clone());
            } else if meta.is_file() {
                out.insert(p.clone(), std::fs::read(&p).unwrap_or_default());
            }
        }
    }
    out
}

#[test]
fn a_state_dir_that_is_a_link_is_refused_before_the_host_changes() {
    let a2 = a2_root();
    let dir = tempfile::tempdir().unwrap();
    let elsewhere = dir.path().join("elsewhere");
    std::fs::create_dir(&elsewhere).unwrap();
    let state = dir.path().join("state");
    std::os::unix::fs::symlink(&elsewhere, &state).unwrap();
    let claim = json!({
        "kind": "ResourceClaim",
        "metadata": {"uid": "uid-link"},
        "status": {"allocation": {"devices": {
            "results": [{
                "request": "vgpu",
                "driver": "gpu.gpuslice.dev",
                "pool": "a2-host",
                "device": "vgpu-0000-08-00-0-4096mi",
                "shareID": "5f0b4e3a-9c1d-4c7e-8a55-2f6d0b9e1a77",
            }],
            "config": [{
                "source": "FromClaim",
                "requests": ["vgpu"],
                "opaque": {"driver": "gpu.gpuslice.dev", "parameters": {"profile": "A2-4Q"}},
            }],
        }}},
    });
    let f = dir.path().join("claim.json");
    std::fs::write(&f, claim.to_string()).unwrap();
    let before = files(a2.path());
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
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    // The one state directory names the link it does not follow.
    assert!(
        stderr.contains("the link") && stderr.contains("not followed"),
        "{stderr}"
    );
    assert!(
        files(&elsewhere).is_empty(),
        "nothing was written through the link"
    );
    assert_eq!(files(a2.path()), before, "the host is as it was");
}
