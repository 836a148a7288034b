//! Every change the agent makes to a host goes through `gpu_node` (the one writer, its lock and
//! its choice of parent): no source file of the agent calls the actuation layer's writing steps
//! or takes the host lock on its own.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::{Path, PathBuf};

/// The actuation layer's steps that change a host, and the lock's own door.
const WRITES: &[&str] = &[
    "create_mdev(",
    "create_mdev_on_gpu(",
    "create_mdevs(",
    "create_vgpu(",
    "set_vf_type(",
    "remove_mdev(",
    "clear_vf(",
    "bind_gpu(",
    "release_gpu(",
    "enable_sriov(",
    "disable_sriov(",
];

fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            sources(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

#[test]
fn the_agent_changes_the_host_only_through_the_nodes_one_writer() {
    let mut files = Vec::new();
    sources(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("src"),
        &mut files,
    );
    assert!(files.len() > 20, "{files:?}");
    let mut found = Vec::new();
    for f in &files {
        let text = std::fs::read_to_string(f).unwrap();
        for (n, line) in text.lines().enumerate() {
            let code = line.split("//").next().unwrap_or_default();
            let direct = WRITES
                .iter()
                .any(|w| code.contains(&format!("actuate::{w}")));
            let lock = code.contains("LayoutLock::acquire(") || code.contains("dra::lock_host(");
            if direct || lock {
                found.push(format!("{}:{}: {}", f.display(), n + 1, line.trim()));
            }
        }
    }
    assert!(
        found.is_empty(),
        "writes around gpu_node:\n{}",
        found.join("\n")
    );
}
