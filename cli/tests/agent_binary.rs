//! `gpuslice` leaves the servers' stacks out and hands `agent`, `metrics --listen` and `dra
//! publish` to the `gpuslice-agent` binary next to it: the process becomes it (same pid), the
//! rest of the command line runs in `gpuslice` itself, and without `gpuslice-agent` the served
//! commands fail with a message that says what to install, while every other command works.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use gpu_sysfs::testing::TreeBuilder;

struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `gpuslice` copied alone into a directory of its own (no `gpuslice-agent` beside it).
fn alone(dir: &Path) -> PathBuf {
    let bin = dir.join("gpuslice");
    std::fs::copy(env!("CARGO_BIN_EXE_gpuslice"), &bin).unwrap();
    bin
}

/// `bin --root ROOT --node node-a ARGS...`, run to its end.
fn on_host<S: AsRef<std::ffi::OsStr>>(bin: &Path, root: &Path, args: &[S]) -> Output {
    Command::new(bin)
        .arg("--root")
        .arg(root)
        .args(["--node", "node-a"])
        .args(args)
        .output()
        .unwrap()
}

fn host() -> gpu_sysfs::testing::builder::Tree {
    let mut b = TreeBuilder::new();
    b.mdev_parent("mbochs", &[]);
    b.finish().unwrap()
}

#[test]
fn gpuslice_agent_becomes_the_agent_binary_in_the_same_process() {
    let tree = host();
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("agent.sock");
    let child = Command::new(env!("CARGO_BIN_EXE_gpuslice"))
        .arg("--root")
        .arg(tree.root())
        .args(["--node", "node-a", "agent", "--listen"])
        .arg(format!("unix:{}", sock.display()))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let pid = child.id();
    let _running = Running(child);
    let deadline = Instant::now() + Duration::from_secs(30);
    while !sock.exists() {
        assert!(Instant::now() < deadline, "the agent did not listen");
        std::thread::sleep(Duration::from_millis(20));
    }
    // The pid `gpuslice` was started as now runs gpuslice-agent: no parent left waiting.
    let exe = std::fs::read_link(format!("/proc/{pid}/exe")).unwrap();
    assert_eq!(
        exe.file_name().and_then(|n| n.to_str()),
        Some("gpuslice-agent"),
        "{}",
        exe.display()
    );
}

#[test]
fn without_the_agent_binary_served_commands_say_what_to_install_and_the_rest_works() {
    let tree = host();
    let dir = tempfile::tempdir().unwrap();
    let bin = alone(dir.path());
    let sock = dir.path().join("agent.sock");
    for args in [
        vec![
            "agent".to_owned(),
            "--listen".to_owned(),
            format!("unix:{}", sock.display()),
        ],
        vec![
            "metrics".to_owned(),
            "--listen".to_owned(),
            "127.0.0.1:0".to_owned(),
        ],
    ] {
        let out = on_host(&bin, tree.root(), &args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(
            err.contains("gpuslice-agent")
                && err.contains(&dir.path().join("gpuslice-agent").display().to_string())
                && err.contains("cargo install --path cli"),
            "{args:?}: {err}"
        );
        assert!(!sock.exists(), "nothing was served");
    }
    // Help and every one-shot command need no second binary.
    let help = Command::new(&bin)
        .args(["agent", "--help"])
        .output()
        .unwrap();
    assert!(help.status.success());
    assert!(String::from_utf8_lossy(&help.stdout).contains("--listen"));
    let metrics = on_host(&bin, tree.root(), &["metrics"]);
    assert!(
        metrics.status.success(),
        "{}",
        String::from_utf8_lossy(&metrics.stderr)
    );
    assert!(String::from_utf8_lossy(&metrics.stdout).contains("gpuslice_"));
    let topology = on_host(&bin, tree.root(), &["topology", "-o", "json"]);
    assert!(topology.status.success());
}

#[test]
fn the_agent_binary_takes_the_whole_command_line_too() {
    let tree = host();
    let json = ["topology", "-o", "json"];
    let via_agent = on_host(
        Path::new(env!("CARGO_BIN_EXE_gpuslice-agent")),
        tree.root(),
        &json,
    );
    let direct = on_host(
        Path::new(env!("CARGO_BIN_EXE_gpuslice")),
        tree.root(),
        &json,
    );
    assert!(via_agent.status.success());
    assert_eq!(via_agent.stdout, direct.stdout);
    let version = Command::new(env!("CARGO_BIN_EXE_gpuslice-agent"))
        .arg("--version")
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&version.stdout).starts_with("gpuslice "));
}
