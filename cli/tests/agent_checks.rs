//! `gpuslice agent` checks every option before anything touches the host: a TCP listener without
//! a token, a listen address that cannot be bound, a state directory linked out of the root, all
//! stop it before reconcile re-creates a promised vGPU. Under `--root TREE` without `--listen` it
//! serves on the socket inside the tree, never on the real host's.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::io::{Read as _, Write as _};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use gpu_sysfs::testing::builder::Tree;
use gpu_sysfs::testing::{MdevTypeSpec, TreeBuilder};

const U1: &str = "de306c9f-a714-4373-a290-dc15d4e49b71";
const CREATE: &str = "sys/devices/virtual/mbochs/mbochs/mdev_supported_types/mbochs-small/create";

/// A tree with a promise whose instance is missing: reconcile would write its UUID to `create`.
fn host_with_a_missing_promise() -> Tree {
    let mut b = TreeBuilder::new();
    b.mdev_parent(
        "mbochs",
        &[MdevTypeSpec::new("mbochs-small", "mbochs-small", 63, None)],
    );
    b.file(
        "var/lib/gpuslice/agent/promises.json",
        &format!(
            r#"{{"version":1,"promises":[{{"device":{{"framework":"mdev","uuid":"{U1}","parent":"mbochs","typeId":"mbochs-small"}},"profile":"mbochs-small","phase":"created"}}]}}"#
        ),
    );
    b.finish().unwrap()
}

fn agent(root: &Path, args: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_gpuslice"));
    c.arg("--root")
        .arg(root)
        .arg("--node")
        .arg("node-a")
        .arg("agent")
        .args(["--uevents", "off", "--resync", "0"]);
    c.args(args);
    c
}

fn create_written(tree: &Tree) -> String {
    std::fs::read_to_string(tree.root().join(CREATE)).unwrap()
}

fn refused(tree: &Tree, args: &[&str]) -> String {
    let out = agent(tree.root(), args).output().unwrap();
    assert!(!out.status.success(), "{args:?} started");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn tcp_without_a_token_is_refused_before_reconcile_touches_the_host() {
    let tree = host_with_a_missing_promise();
    let err = refused(&tree, &["--listen", "tcp:127.0.0.1:0"]);
    assert!(err.contains("needs --token-file"), "{err}");
    assert_eq!(create_written(&tree), "", "reconcile ran: {err}");
}

#[test]
fn a_short_token_is_refused_before_reconcile_touches_the_host() {
    let tree = host_with_a_missing_promise();
    let dir = tempfile::tempdir().unwrap();
    let token = dir.path().join("token");
    std::fs::write(&token, "short\n").unwrap();
    let err = refused(
        &tree,
        &[
            "--listen",
            "tcp:127.0.0.1:0",
            "--token-file",
            token.to_str().unwrap(),
        ],
    );
    assert!(err.contains("shorter than 16 characters"), "{err}");
    assert_eq!(create_written(&tree), "");
}

#[test]
fn a_listen_address_that_cannot_be_bound_is_refused_before_reconcile() {
    let tree = host_with_a_missing_promise();
    let dir = tempfile::tempdir().unwrap();
    // A regular file where the socket should go: not replaced, not served.
    let file = dir.path().join("not-a-socket");
    std::fs::write(&file, "keep").unwrap();
    let err = refused(&tree, &["--listen", &format!("unix:{}", file.display())]);
    assert!(err.contains("not a socket"), "{err}");
    assert_eq!(create_written(&tree), "", "reconcile ran: {err}");
}

#[test]
fn a_state_dir_linked_out_of_the_root_is_refused_before_any_listener() {
    let tree = host_with_a_missing_promise();
    let outside = tempfile::tempdir().unwrap();
    let agent_dir = tree.root().join("var/lib/gpuslice/agent");
    std::fs::remove_dir_all(&agent_dir).unwrap();
    std::os::unix::fs::symlink(outside.path(), &agent_dir).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("a.sock");
    let err = refused(&tree, &["--listen", &format!("unix:{}", sock.display())]);
    assert!(err.contains("outside the root"), "{err}");
    assert!(!sock.exists(), "no listener was bound");
    assert_eq!(create_written(&tree), "");
}

struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn under_a_root_without_listen_the_agent_serves_on_the_socket_inside_the_root() {
    let mut b = TreeBuilder::new();
    b.mdev_parent(
        "mbochs",
        &[MdevTypeSpec::new("mbochs-small", "mbochs-small", 63, None)],
    );
    let tree = b.finish().unwrap();
    let _a = Running(
        agent(tree.root(), &[])
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let sock = tree.root().join("run/gpuslice/agent.sock");
    let end = Instant::now() + Duration::from_secs(20);
    while !sock.exists() {
        assert!(Instant::now() < end, "no socket at {}", sock.display());
        std::thread::sleep(Duration::from_millis(50));
    }
    let mut s = UnixStream::connect(&sock).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(b"GET /healthz HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    assert!(out.starts_with("HTTP/1.1 200"), "{out}");
}
