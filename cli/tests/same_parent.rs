//! One request, one parent: a vGPU asked for on a GPU lands on the same parent whether it is made
//! by `gpuslice vgpu create`, by the agent's `POST /v1/vgpus` or by a layout (`vgpu apply`), on
//! the same sandbox host. All three ask the node's one writer (`gpu_node`), which chooses.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::io::{Read as _, Write as _};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

const U1: &str = "11111111-2222-3333-4444-555555555555";

fn gpuslice(dir: &Path, args: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_gpuslice"));
    c.env_remove("GPUSLICE_ROOT")
        .arg("--root")
        .arg(format!("sandbox:{}", dir.display()))
        .args(["--node", "demo"])
        .args(args);
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

fn sandbox(from: &Path) -> (tempfile::TempDir, std::path::PathBuf) {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("sbx");
    ok(Command::new(env!("CARGO_BIN_EXE_gpuslice"))
        .env_remove("GPUSLICE_ROOT")
        .args(["sandbox", "init", dir.to_str().unwrap(), "--from"])
        .arg(from)
        .output()
        .unwrap());
    (t, dir)
}

struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn http(sock: &Path, method: &str, path: &str, body: &str) -> (String, serde_json::Value) {
    let mut s = UnixStream::connect(sock).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: a\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    let (head, body) = out.split_once("\r\n\r\n").unwrap_or((&out, ""));
    let status = head.lines().next().unwrap_or("").to_owned();
    (status, serde_json::from_str(body).unwrap_or_default())
}

/// The parent of mdev `uuid` on the sandbox, from `vgpu list -o json`.
fn parent_of(dir: &Path, uuid: &str) -> String {
    let list: serde_json::Value =
        serde_json::from_str(&ok(gpuslice(dir, &["vgpu", "list", "-o", "json"])
            .output()
            .unwrap()))
        .unwrap();
    list["mdevs"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["uuid"] == uuid)
        .unwrap_or_else(|| panic!("no mdev {uuid} in {list}"))["parent"]
        .as_str()
        .unwrap()
        .to_owned()
}

/// The mdevs on the sandbox's GPU `0000:08:00.0` a layout made (UUIDs gpuslice derives), with
/// their parents.
fn made_by_layout(before: &[String], dir: &Path) -> Vec<String> {
    let list: serde_json::Value =
        serde_json::from_str(&ok(gpuslice(dir, &["vgpu", "list", "-o", "json"])
            .output()
            .unwrap()))
        .unwrap();
    list["mdevs"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| !before.contains(&m["uuid"].as_str().unwrap().to_owned()))
        .map(|m| m["parent"].as_str().unwrap().to_owned())
        .collect()
}

fn uuids(dir: &Path) -> Vec<String> {
    let list: serde_json::Value =
        serde_json::from_str(&ok(gpuslice(dir, &["vgpu", "list", "-o", "json"])
            .output()
            .unwrap()))
        .unwrap();
    list["mdevs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["uuid"].as_str().unwrap().to_owned())
        .collect()
}

#[test]
fn a_vgpu_made_by_the_cli_the_agent_and_a_layout_lands_on_the_same_parent() {
    let recording =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/hosts/a2-sriov-mdev.umockdev");
    let (t, dir) = sandbox(&recording);

    // `vgpu create` on the GPU.
    ok(gpuslice(
        &dir,
        &[
            "vgpu",
            "create",
            "--parent",
            "0000:08:00.0",
            "--profile",
            "A2-4Q",
            "--uuid",
            U1,
        ],
    )
    .output()
    .unwrap());
    let by_cli = parent_of(&dir, U1);
    ok(gpuslice(&dir, &["vgpu", "remove", U1]).output().unwrap());

    // `POST /v1/vgpus` with the same request, to an agent serving the same sandbox.
    let sock = t.path().join("agent.sock");
    let agent = Running(
        gpuslice(
            &dir,
            &[
                "agent",
                "--listen",
                &format!("unix:{}", sock.display()),
                "--state-dir",
                t.path().join("state").to_str().unwrap(),
                "--resync",
                "0",
            ],
        )
        .stderr(Stdio::null())
        .spawn()
        .unwrap(),
    );
    let end = Instant::now() + Duration::from_secs(20);
    while !sock.exists() {
        assert!(Instant::now() < end, "the agent did not listen within 20 s");
        std::thread::sleep(Duration::from_millis(50));
    }
    let (status, made) = http(
        &sock,
        "POST",
        "/v1/vgpus",
        &format!(r#"{{"parent": "0000:08:00.0", "profile": "A2-4Q", "uuid": "{U1}"}}"#),
    );
    assert!(
        status.contains(" 200 ") || status.contains(" 201 "),
        "{status} {made}"
    );
    let by_agent = made["parent"].as_str().unwrap().to_owned();
    let (status, gone) = http(&sock, "DELETE", &format!("/v1/vgpus/{U1}"), "");
    assert!(status.contains(" 200 "), "{status} {gone}");
    drop(agent);

    // A layout asking the GPU for one more A2-4Q than it holds.
    let before = uuids(&dir);
    let file = t.path().join("layout.yaml");
    std::fs::write(
        &file,
        "version: v1\nvgpu-configs:\n  more:\n    - devices: all\n      vgpu-devices: {A2-4C: 1, A2-4A: 1, A2-4Q: 2}\n",
    )
    .unwrap();
    ok(
        gpuslice(&dir, &["vgpu", "apply", "-f", file.to_str().unwrap()])
            .output()
            .unwrap(),
    );
    let by_layout = made_by_layout(&before, &dir);

    assert_eq!(by_cli, "0000:08:00.5", "the first VF with room");
    assert_eq!(by_agent, by_cli);
    assert_eq!(by_layout, vec![by_cli]);
}

/// The VFs of the sandbox that have a vGPU type, from `vgpu list -o json`.
fn vfs_with_a_type(dir: &Path) -> Vec<String> {
    let list: serde_json::Value =
        serde_json::from_str(&ok(gpuslice(dir, &["vgpu", "list", "-o", "json"])
            .output()
            .unwrap()))
        .unwrap();
    let vfs = list["vendorVfio"].as_array().unwrap().iter();
    vfs.map(|v| v["vf"].as_str().unwrap().to_owned()).collect()
}

/// One L40S-24Q asked of the L40S sandbox's GPU (four VFs; `held`, when given, held open by a
/// stand-in VM first) by `vgpu create`, by the agent's `POST /v1/vgpus` and by a layout, each
/// undone before the next: the VF each chose.
fn vendor_vfio_roads(held: Option<&str>) -> (String, String, Vec<String>) {
    let k = gpu_sysfs::testing::FakeKernel::l40s_vendor_vfio_host(4).unwrap();
    let (t, dir) = sandbox(k.root());
    let holder = held.map(|vf| ok(gpuslice(&dir, &["sandbox", "hold", vf]).output().unwrap()));
    let create = ["vgpu", "create", "--parent", "0000:26:00.0"];
    let args = [&create[..], &["--profile", "L40S-24Q", "-o", "json"]].concat();
    let made: serde_json::Value =
        serde_json::from_str(&ok(gpuslice(&dir, &args).output().unwrap())).unwrap();
    let by_cli = made["vf"].as_str().unwrap().to_owned();
    ok(gpuslice(&dir, &["vgpu", "remove", &by_cli])
        .output()
        .unwrap());

    let sock = t.path().join("agent.sock");
    let listen = format!("unix:{}", sock.display());
    let state = t.path().join("state");
    let agent_args = ["agent", "--listen", &listen, "--resync", "0", "--state-dir"];
    let agent = Running(
        gpuslice(
            &dir,
            &[&agent_args[..], &[state.to_str().unwrap()]].concat(),
        )
        .stderr(Stdio::null())
        .spawn()
        .unwrap(),
    );
    let end = Instant::now() + Duration::from_secs(20);
    while !sock.exists() {
        assert!(Instant::now() < end, "the agent did not listen within 20 s");
        std::thread::sleep(Duration::from_millis(50));
    }
    let body = r#"{"parent": "0000:26:00.0", "profile": "L40S-24Q"}"#;
    let (status, made) = http(&sock, "POST", "/v1/vgpus", body);
    assert!(
        status.contains(" 201 ") || status.contains(" 200 "),
        "{status} {made}"
    );
    let by_agent = made["vf"].as_str().unwrap().to_owned();
    let (status, gone) = http(&sock, "DELETE", &format!("/v1/vgpus/{by_agent}"), "");
    assert!(status.contains(" 200 "), "{status} {gone}");
    drop(agent);

    assert!(vfs_with_a_type(&dir).is_empty());
    let file = t.path().join("layout.yaml");
    let layout = "version: v1\nvgpu-configs:\n  one:\n    - devices: all\n      vgpu-devices: {L40S-24Q: 1}\n";
    std::fs::write(&file, layout).unwrap();
    ok(
        gpuslice(&dir, &["vgpu", "apply", "-f", file.to_str().unwrap()])
            .output()
            .unwrap(),
    );
    let by_layout = vfs_with_a_type(&dir);
    if let Some(pid) = holder {
        ok(gpuslice(&dir, &["sandbox", "unhold", pid.trim()])
            .output()
            .unwrap());
    }
    (by_cli, by_agent, by_layout)
}

#[test]
fn a_vendor_vfio_vgpu_made_by_the_cli_the_agent_and_a_layout_lands_on_the_same_vf() {
    let (by_cli, by_agent, by_layout) = vendor_vfio_roads(None);
    assert_eq!(by_cli, "0000:26:00.4", "the first free VF");
    assert_eq!(by_agent, by_cli);
    assert_eq!(by_layout, vec![by_cli]);
}

/// A VF a VM holds open is passed over by every road: `vgpu create` and the agent choose the
/// next free VF, and a layout's creation, chosen again right before its write by the same
/// chooser (`gpu_node::target::choose_on_gpu`), goes there too instead of the VF its plan named.
#[test]
fn a_vf_a_vm_holds_open_is_passed_over_by_the_cli_the_agent_and_a_layout_alike() {
    let (by_cli, by_agent, by_layout) = vendor_vfio_roads(Some("0000:26:00.4"));
    assert_eq!(by_cli, "0000:26:00.5", "the held VF is passed over");
    assert_eq!(by_agent, by_cli);
    assert_eq!(by_layout, vec![by_cli]);
}
