//! `gpuslice agent --layout FILE -c NAME`: the layout is checked before anything starts, applied
//! at start (a `layout-applied` event naming the file), the agent's figures end `/metrics`, and
//! on a sandbox whose vGPU manager is reloaded (`sandbox reload-driver`) the layout is made again
//! within one resync (`layout-restored`).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::io::{Read as _, Write as _};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use gpu_sysfs::testing::builder::Tree;
use gpu_sysfs::testing::{MdevTypeSpec, TreeBuilder};

const U1: &str = "de306c9f-a714-4373-a290-dc15d4e49b71";

fn host() -> Tree {
    let mut b = TreeBuilder::new();
    b.mdev_parent(
        "mbochs",
        &[MdevTypeSpec::new("mbochs-small", "mbochs-small", 63, None)],
    )
    .mdev_instance(U1, "mbochs", "mbochs-small");
    b.finish().unwrap()
}

fn agent(root: &Path, args: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_gpuslice"));
    c.arg("--root")
        .arg(root)
        .arg("--node")
        .arg("node-a")
        .arg("agent");
    c.args(args);
    c
}

struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn get(socket: &Path, path: &str) -> String {
    get_within(socket, path, Duration::from_secs(10))
}

fn get_within(socket: &Path, path: &str, within: Duration) -> String {
    let mut s = UnixStream::connect(socket).unwrap();
    s.set_read_timeout(Some(within)).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    out
}

#[test]
fn a_layout_that_does_not_parse_or_is_missing_is_refused_before_the_agent_starts() {
    let tree = host();
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("a.sock");
    let listen = format!("unix:{}", sock.display());
    let bad = dir.path().join("bad.yaml");
    std::fs::write(&bad, "version: v1\nvgpu-configs: [").unwrap();
    for file in [bad.clone(), dir.path().join("missing.yaml")] {
        let out = agent(
            tree.root(),
            &["--listen", &listen, "--layout", file.to_str().unwrap()],
        )
        .output()
        .unwrap();
        assert!(!out.status.success());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("--layout"), "{err}");
        assert!(!sock.exists());
    }
    let out = agent(tree.root(), &["--listen", &listen, "-c", "lab"])
        .output()
        .unwrap();
    assert!(!out.status.success(), "-c needs --layout");
}

#[test]
fn the_watched_layout_is_applied_at_start_and_counted_in_metrics() {
    let tree = host();
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("a.sock");
    let file = dir.path().join("layout.yaml");
    std::fs::write(
        &file,
        "version: v1\nvgpu-configs:\n  lab:\n    mbochs: {mbochs-small: 1}\n",
    )
    .unwrap();
    let state = dir.path().join("state");
    let _a = Running(
        agent(
            tree.root(),
            &[
                "--listen",
                &format!("unix:{}", sock.display()),
                "--state-dir",
                state.to_str().unwrap(),
                "--layout",
                file.to_str().unwrap(),
                "-c",
                "lab",
                "--resync",
                "0",
            ],
        )
        .stderr(Stdio::null())
        .spawn()
        .unwrap(),
    );
    let end = Instant::now() + Duration::from_secs(20);
    let event = loop {
        if sock.exists() {
            let (head, body) = {
                let m = get(&sock, "/metrics");
                let (h, b) = m.split_once("\r\n\r\n").unwrap_or(("", ""));
                (h.to_owned(), b.to_owned())
            };
            assert!(head.contains(" 200 "), "{head}");
            if body.contains("gpuslice_agent_layouts_applied_total 1\n") {
                break get_within(
                    &sock,
                    "/v1/events?since=0&format=ndjson",
                    Duration::from_secs(1),
                );
            }
        }
        assert!(
            Instant::now() < end,
            "the layout was not applied within 20 s"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    // The stream stays open; what it sent before the read timed out is enough.
    let applied = event
        .lines()
        .filter(|l| l.starts_with('{'))
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .find(|e| e["kind"] == "layout-applied")
        .unwrap_or_else(|| panic!("no layout-applied event in {event}"));
    assert_eq!(applied["data"]["source"], file.display().to_string());
    assert_eq!(applied["data"]["config"], "lab");
    assert_eq!(applied["data"]["status"], "unchanged", "{applied}");
}

/// Waits until `/metrics` on `sock` shows `line`.
fn wait_metric(sock: &Path, line: &str) {
    let end = Instant::now() + Duration::from_secs(30);
    // The socket file may stand a moment before the agent listens on it.
    while !(UnixStream::connect(sock).is_ok() && get(sock, "/metrics").contains(line)) {
        assert!(Instant::now() < end, "no {line:?} in /metrics within 30 s");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn on_a_sandbox_the_layout_is_made_again_after_reload_driver() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("sbx");
    let cli = || {
        let mut c = Command::new(env!("CARGO_BIN_EXE_gpuslice"));
        c.env_remove("GPUSLICE_ROOT");
        c
    };
    let init = cli().args(["sandbox", "init"]).arg(&dir).output().unwrap();
    assert!(init.status.success(), "{init:?}");
    let root = std::path::PathBuf::from(format!("sandbox:{}", dir.display()));
    let sock = t.path().join("a.sock");
    let layout = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/layouts/a2.yaml");
    let _a = Running(
        agent(
            &root,
            &[
                "--listen",
                &format!("unix:{}", sock.display()),
                "--state-dir",
                t.path().join("state").to_str().unwrap(),
                "--layout",
                layout.to_str().unwrap(),
                "-c",
                "a2-4q",
                "--resync",
                "1",
            ],
        )
        .stderr(Stdio::null())
        .spawn()
        .unwrap(),
    );
    let mdevs = || {
        let out = cli()
            .arg("--root")
            .arg(&root)
            .args(["-o", "json", "vgpu", "list"])
            .output()
            .unwrap();
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        v["mdevs"].as_array().map_or(0, Vec::len)
    };
    wait_metric(&sock, "gpuslice_agent_layouts_applied_total 1\n");
    assert_eq!(mdevs(), 4);
    let out = cli()
        .arg("--root")
        .arg(&root)
        .args(["sandbox", "reload-driver"])
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "vGPU manager reloaded: 4 mdev(s) removed, 0 VF type(s) cleared"
    );
    wait_metric(&sock, "gpuslice_agent_layout_restored_total 1\n");
    assert_eq!(mdevs(), 4);
    let events = get_within(
        &sock,
        "/v1/events?since=0&format=ndjson",
        Duration::from_secs(1),
    );
    let restored = events
        .lines()
        .filter(|l| l.starts_with('{'))
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .find(|e| e["kind"] == "layout-restored")
        .unwrap_or_else(|| panic!("no layout-restored event in {events}"));
    assert_eq!(
        restored["data"]["missing"],
        serde_json::json!(["nvidia0 (0000:08:00.0): A2-4Q 0 of 4"]),
        "{restored}"
    );
}
