//! Every command keeps to `--root`: run on a tree inside a temporary directory, none of them
//! changes a file outside it, and the state they keep (the health baseline, DRA claims) lands
//! under the root, never in the machine's own `/var/lib/gpuslice` or `/run/gpuslice`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use gpu_sysfs::testing::{PciSpec, TreeBuilder};

/// Every file under `dir` with its content (symlinks by target).
fn snapshot(dir: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    let mut out = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            let p = e.path();
            let meta = std::fs::symlink_metadata(&p).unwrap();
            if meta.file_type().is_symlink() {
                let t = std::fs::read_link(&p).unwrap();
                out.insert(p, t.to_string_lossy().as_bytes().to_vec());
            } else if meta.is_dir() {
                out.insert(p.clone(), Vec::new());
                stack.push(p);
            } else {
                out.insert(p.clone(), std::fs::read(&p).unwrap_or_default());
            }
        }
    }
    out
}

const MACHINE: &str = r#"{"name": "vm", "devices": [{"name": "gpu", "vendor": "nvidia"}]}"#;

const LAYOUT: &str =
    "version: v1\nvgpu-configs:\n  none:\n    - devices: all\n      vgpu-devices: {}\n";

#[test]
fn no_command_changes_anything_outside_the_root() {
    let mut b = TreeBuilder::new();
    b.pci(
        "0000:3b:00.0",
        PciSpec::new(0x10de, 0x1eb8, 0x030200)
            .driver("nvidia")
            .group(10)
            .link(16, 16, "8.0 GT/s PCIe", "8.0 GT/s PCIe"),
    );
    let tree = b.finish().unwrap();
    let root = tree.root().to_path_buf();
    // What the commands read besides the root lives in a directory of its own, watched too.
    let outside = tempfile::tempdir().unwrap();
    let fleet = outside.path().join("fleet.json");
    let machine = outside.path().join("machine.json");
    let layout = outside.path().join("layout.yaml");
    std::fs::write(&machine, MACHINE).unwrap();
    std::fs::write(&layout, LAYOUT).unwrap();
    let topo = Command::new(env!("CARGO_BIN_EXE_gpuslice"))
        .arg("--root")
        .arg(&root)
        .args(["--node", "n1", "-o", "json", "topology", "--no-nvml"])
        .output()
        .unwrap();
    assert!(
        topo.status.success(),
        "{}",
        String::from_utf8_lossy(&topo.stderr)
    );
    let node: serde_json::Value = serde_json::from_slice(&topo.stdout).unwrap();
    std::fs::write(&fleet, serde_json::json!({ "nodes": [node] }).to_string()).unwrap();

    let machine_state =
        [Path::new("/var/lib/gpuslice"), Path::new("/run/gpuslice")].map(|p| (p, p.exists()));
    let before = snapshot(outside.path());
    let (f, m, l) = (
        fleet.to_str().unwrap(),
        machine.to_str().unwrap(),
        layout.to_str().unwrap(),
    );
    let commands: Vec<Vec<&str>> = vec![
        vec!["topology"],
        vec!["gpu", "list"],
        vec!["vgpu", "list"],
        vec!["health", "--record-baseline"],
        vec!["metrics"],
        vec!["export", "dra"],
        vec!["export", "kubevirt"],
        vec!["export", "qemu", "--address", "0000:3b:00.0"],
        vec!["export", "libvirt", "--address", "0000:3b:00.0"],
        vec!["vgpu", "apply", "--dry-run", "-f", l],
        vec!["vgpu", "assert", "-f", l],
        vec!["place", "--inventory", f, "--machine", m],
        vec!["gpu", "list", "--inventory", f],
        vec!["metrics", "--inventory", f],
    ];
    let mut ran = Vec::new();
    for args in &commands {
        let o = Command::new(env!("CARGO_BIN_EXE_gpuslice"))
            .env_remove("GPUSLICE_ROOT")
            .arg("--root")
            .arg(&root)
            .args(["--node", "n1"])
            .args(args)
            .output()
            .unwrap();
        ran.push(format!("{args:?} -> {:?}", o.status.code()));
    }
    assert_eq!(
        snapshot(outside.path()),
        before,
        "a command changed files outside the root: {ran:#?}"
    );
    for (p, existed) in machine_state {
        assert_eq!(p.exists(), existed, "{} appeared: {ran:#?}", p.display());
    }
    assert!(
        root.join(gpu_health::BASELINE_PATH).exists(),
        "the baseline is kept under the root: {ran:#?}"
    );
}
