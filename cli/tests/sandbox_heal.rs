//! `gpuslice sandbox reload-driver` drops every vGPU of a sandbox as a reload of NVIDIA's vGPU
//! manager does, and an agent keeping a layout on that sandbox makes it again within one
//! resync (`layout-restored`, counted in `/metrics`).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::io::{Read as _, Write as _};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

fn gpuslice(dir: Option<&Path>, args: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_gpuslice"));
    c.env_remove("GPUSLICE_ROOT");
    if let Some(d) = dir {
        c.arg("--root")
            .arg(format!("sandbox:{}", d.display()))
            .args(["--node", "demo"]);
    }
    c.args(args);
    c
}

fn ok(o: Output) -> String {
    assert!(
        o.status.success(),
        "exit {:?}\nstdout: {}\nstderr: {}",
        o.status.code(),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn mdevs(dir: &Path) -> usize {
    let out = ok(gpuslice(Some(dir), &["-o", "json", "vgpu", "list"])
        .output()
        .unwrap());
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    v["mdevs"].as_array().map_or(0, Vec::len)
}

struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn get(socket: &Path, path: &str) -> String {
    let mut s = UnixStream::connect(socket).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(1))).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    out
}

/// Waits until `/metrics` shows `line`.
fn wait_metric(socket: &Path, line: &str) {
    let end = Instant::now() + Duration::from_secs(30);
    loop {
        if socket.exists() && get(socket, "/metrics").contains(line) {
            return;
        }
        assert!(Instant::now() < end, "no {line:?} in /metrics within 30 s");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn an_agent_on_a_sandbox_restores_its_layout_after_reload_driver() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("sbx");
    ok(gpuslice(None, &["sandbox", "init", dir.to_str().unwrap()])
        .output()
        .unwrap());
    let sock = t.path().join("a.sock");
    let layout = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/layouts/a2.yaml");
    let _agent = Running(
        gpuslice(
            Some(&dir),
            &[
                "agent",
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
    wait_metric(&sock, "gpuslice_agent_layouts_applied_total 1\n");
    assert_eq!(mdevs(&dir), 4);
    let out = ok(gpuslice(Some(&dir), &["sandbox", "reload-driver"])
        .output()
        .unwrap());
    assert_eq!(
        out.trim(),
        "vGPU manager reloaded: 4 mdev(s) removed, 0 VF type(s) cleared"
    );
    wait_metric(&sock, "gpuslice_agent_layout_restored_total 1\n");
    assert_eq!(mdevs(&dir), 4);
    let events = get(&sock, "/v1/events?since=0&format=ndjson");
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

#[test]
fn reload_driver_is_refused_while_a_vgpu_is_held_and_needs_a_sandbox() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("sbx");
    ok(gpuslice(None, &["sandbox", "init", dir.to_str().unwrap()])
        .output()
        .unwrap());
    let before = mdevs(&dir);
    assert_eq!(before, 3, "the bundled A2 holds three vGPUs");
    let listed = ok(gpuslice(Some(&dir), &["-o", "json", "vgpu", "list"])
        .output()
        .unwrap());
    let v: serde_json::Value = serde_json::from_str(&listed).unwrap();
    let uuid = v["mdevs"][0]["uuid"].as_str().unwrap().to_owned();
    let pid = ok(gpuslice(Some(&dir), &["sandbox", "hold", &uuid])
        .output()
        .unwrap());
    let o = gpuslice(Some(&dir), &["sandbox", "reload-driver"])
        .output()
        .unwrap();
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains(&uuid) && err.contains("in use"), "{err}");
    assert_eq!(mdevs(&dir), before);
    ok(gpuslice(Some(&dir), &["sandbox", "unhold", pid.trim()])
        .output()
        .unwrap());
    let o = ok(
        gpuslice(Some(&dir), &["-o", "json", "sandbox", "reload-driver"])
            .output()
            .unwrap(),
    );
    let v: serde_json::Value = serde_json::from_str(&o).unwrap();
    assert_eq!(v["mdevs"].as_array().unwrap().len(), 3, "{v}");
    assert_eq!(mdevs(&dir), 0);
    let o = gpuslice(None, &["sandbox", "reload-driver"])
        .output()
        .unwrap();
    assert!(!o.status.success());
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("not a sandbox"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
}
