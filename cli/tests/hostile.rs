//! The CLI against hostile trees and names: nothing outside the root is read or written, a FIFO
//! hangs nothing, and no name injects lines into the Prometheus exposition.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use gpu_sysfs::testing::{MdevTypeSpec, PciSpec, TreeBuilder};

const GPU: &str = "0000:41:00.0";

fn bin() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_gpuslice"));
    c.env_remove("GPUSLICE_ROOT");
    c
}

/// Runs the CLI on `root`, killing it after `limit` (a hang fails the test, it does not stall it).
fn run_within(root: &Path, args: &[&str], limit: Duration) -> Output {
    let mut child = bin()
        .arg("--root")
        .arg(root)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let start = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if start.elapsed() > limit {
            let _ = child.kill();
            panic!("gpuslice {args:?} still running after {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

fn run(root: &Path, args: &[&str]) -> Output {
    run_within(root, args, Duration::from_secs(60))
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// A base directory with `root/` (one GPU with one mdev type named `type_name`) and `outside/`.
fn tree(type_name: &str) -> (tempfile::TempDir, std::path::PathBuf) {
    let base = tempfile::tempdir().unwrap();
    let root = base.path().join("root");
    std::fs::create_dir_all(base.path().join("outside")).unwrap();
    std::fs::write(base.path().join("outside/secret"), "victim\n").unwrap();
    let mut b = TreeBuilder::at(&root);
    b.pci(
        GPU,
        PciSpec::new(0x10de, 0x1eb8, 0x030200)
            .driver("nvidia")
            .group(7),
    )
    .mdev_parent(GPU, &[MdevTypeSpec::new("nvidia-222", type_name, 16, None)]);
    b.finish().unwrap();
    (base, root)
}

fn type_file(root: &Path, leaf: &str) -> std::path::PathBuf {
    root.join(format!(
        "sys/devices/pci0000:00/{GPU}/mdev_supported_types/nvidia-222/{leaf}"
    ))
}

#[test]
fn metrics_refuses_a_node_name_that_would_inject_lines() {
    let (_base, root) = tree("GRID T4-1B");
    let o = run(&root, &["--node", "a\"\nevil 1", "metrics"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o.stderr));
    assert!(o.stdout.is_empty(), "{}", text(&o.stdout));
    assert!(text(&o.stderr).contains("--node"), "{}", text(&o.stderr));
}

#[test]
fn a_type_name_with_quotes_and_newlines_is_escaped_in_the_exposition() {
    let (_base, root) = tree("GRID T4-1B\"} 1\nevil_injected 1\n#");
    let o = run(&root, &["--node", "n1", "metrics"]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let out = text(&o.stdout);
    assert!(
        !out.lines().any(|l| l.starts_with("evil_injected")),
        "{out}"
    );
    let line = out
        .lines()
        .find(|l| l.starts_with("gpuslice_vgpu_available_instances"))
        .or_else(|| out.lines().find(|l| l.contains("profile=")))
        .unwrap_or_else(|| panic!("no profile series in {out}"));
    assert!(
        line.contains(r#"T4-1B\"} 1\nevil_injected 1\n#""#),
        "{line}"
    );
}

#[test]
fn topology_against_a_fifo_finishes_and_warns() {
    let (_base, root) = tree("GRID T4-1B");
    let name = type_file(&root, "name");
    std::fs::remove_file(&name).unwrap();
    assert!(
        Command::new("mkfifo")
            .arg(&name)
            .status()
            .unwrap()
            .success()
    );
    for args in [
        &["--node", "n1", "topology"][..],
        &["--node", "n1", "topology", "-o", "json"],
        &["--node", "n1", "gpu", "list"],
        &["--node", "n1", "metrics"],
        &["--node", "n1", "health", "--no-nvml"],
    ] {
        let o = run_within(&root, args, Duration::from_secs(20));
        assert!(o.status.success(), "{args:?}: {}", text(&o.stderr));
    }
    let o = run(&root, &["--node", "n1", "topology"]);
    assert!(text(&o.stderr).contains("is a FIFO"), "{}", text(&o.stderr));
}

#[test]
fn a_type_name_linked_outside_is_not_printed_by_any_command() {
    let (_base, root) = tree("GRID T4-1B");
    let name = type_file(&root, "name");
    std::fs::remove_file(&name).unwrap();
    let depth = name.strip_prefix(&root).unwrap().components().count();
    std::os::unix::fs::symlink(format!("{}outside/secret", "../".repeat(depth)), &name).unwrap();
    for args in [
        &["--node", "n1", "topology", "-o", "json"][..],
        &["--node", "n1", "metrics"],
        &["--node", "n1", "export", "dra"],
    ] {
        let o = run(&root, args);
        assert!(!text(&o.stdout).contains("victim"), "{args:?} printed it");
    }
    let o = run(&root, &["--node", "n1", "topology"]);
    assert!(
        text(&o.stderr).contains("leads outside the root"),
        "{}",
        text(&o.stderr)
    );
}

#[test]
fn record_baseline_does_not_overwrite_a_file_a_planted_temporary_links_to() {
    let (base, root) = tree("GRID T4-1B");
    let tmp = "var/lib/gpuslice/health-baseline.json.tmp";
    std::fs::create_dir_all(root.join("var/lib/gpuslice")).unwrap();
    std::os::unix::fs::symlink(format!("{}outside/secret", "../".repeat(4)), root.join(tmp))
        .unwrap();
    let o = run(
        &root,
        &["--node", "n1", "health", "--no-nvml", "--record-baseline"],
    );
    assert!(o.status.success(), "{}", text(&o.stderr));
    assert_eq!(
        std::fs::read_to_string(base.path().join("outside/secret")).unwrap(),
        "victim\n"
    );
    assert!(root.join("var/lib/gpuslice/health-baseline.json").exists());
}

#[test]
fn vgpu_apply_against_a_fifo_does_not_hold_the_lock_hanging() {
    let (base, root) = tree("GRID T4-1B");
    let avail = type_file(&root, "available_instances");
    std::fs::remove_file(&avail).unwrap();
    assert!(
        Command::new("mkfifo")
            .arg(&avail)
            .status()
            .unwrap()
            .success()
    );
    let layout = base.path().join("layout.yaml");
    std::fs::write(
        &layout,
        format!("version: v1\nvgpu-configs:\n  one:\n    \"{GPU}\": {{GRID T4-1B: 1}}\n"),
    )
    .unwrap();
    let f = layout.to_str().unwrap();
    for _ in 0..2 {
        // Whatever the verdict, it comes at once and the lock is free for the next run.
        let o = run_within(
            &root,
            &[
                "--node",
                "n1",
                "vgpu",
                "apply",
                "-f",
                f,
                "--lock-timeout",
                "2",
            ],
            Duration::from_secs(20),
        );
        assert!(
            !text(&o.stderr).contains("another gpuslice apply holds"),
            "{}",
            text(&o.stderr)
        );
    }
}
