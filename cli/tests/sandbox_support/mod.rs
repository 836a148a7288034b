//! Running `gpuslice` on a sandbox host from the tests: each command a separate process from
//! the repository's root, without the caller's `GPUSLICE_ROOT`.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The repository's root.
pub fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// `gpuslice ARGS` from the repository's root.
pub fn gpuslice(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_gpuslice"))
        .env_remove("GPUSLICE_ROOT")
        .current_dir(workspace())
        .args(args)
        .output()
        .unwrap()
}

/// `gpuslice --root sandbox:DIR --node demo ARGS`.
pub fn on(dir: &Path, args: &[&str]) -> Output {
    let root = format!("sandbox:{}", dir.display());
    let mut all = vec!["--root", root.as_str(), "--node", "demo"];
    all.extend_from_slice(args);
    gpuslice(&all)
}

pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// The output of a command that must succeed (else the test fails showing both streams).
pub fn ok(o: Output) -> Output {
    assert!(
        o.status.success(),
        "exit {:?}\nstdout: {}\nstderr: {}",
        o.status.code(),
        stdout(&o),
        stderr(&o)
    );
    o
}

/// A sandbox of the bundled L40S host (vendor-VFIO, same-size mode at first) made in `tmp/l40s`.
pub fn l40s_sandbox(tmp: &Path) -> PathBuf {
    let dir = tmp.join("l40s");
    ok(gpuslice(&[
        "sandbox",
        "init",
        "--from",
        "examples/hosts/l40s-vendor-vfio.umockdev",
        dir.to_str().unwrap(),
    ]));
    dir
}
