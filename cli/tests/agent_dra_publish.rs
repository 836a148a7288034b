//! `gpuslice agent --dra` publishes its node's ResourceSlices to the API server it reads claims
//! from (the stand-in on loopback), owned by the Node; `--no-publish` leaves the slices to
//! another process and writes nothing.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[path = "../../gpu-agent/tests/apiserver/mod.rs"]
mod apiserver;

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use apiserver::ApiServer;
use gpu_sysfs::Host as _;
use gpu_sysfs::testing::FakeKernel;

struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn start(root: &Path, dir: &Path, kubeconfig: &Path, extra: &[&str]) -> Running {
    let child = Command::new(env!("CARGO_BIN_EXE_gpuslice"))
        .arg("--root")
        .arg(root)
        .args(["--node", "node-a", "agent", "--uevents", "off", "--listen"])
        .arg(format!("unix:{}", dir.join("a.sock").display()))
        .arg("--dra")
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .arg("--kubelet-dir")
        .arg(dir.join("kubelet"))
        .arg("--cdi-dir")
        .arg(dir.join("cdi"))
        .args(extra)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    Running(child)
}

fn wait_for(what: &str, within: Duration, mut ok: impl FnMut() -> bool) {
    let t0 = Instant::now();
    while !ok() {
        assert!(t0.elapsed() < within, "{what}: not within {within:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn the_agent_with_dra_publishes_its_nodes_slices_owned_by_the_node() {
    let server = ApiServer::start("v1.36.2");
    server.add_node("node-a", "uid-node-a");
    let k = FakeKernel::a2_mdev_host().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let _agent = start(k.root_dir().unwrap(), dir.path(), &server.kubeconfig(), &[]);
    wait_for("the node's slices", Duration::from_secs(60), || {
        !server.slices().is_empty()
    });
    let slices = server.slices();
    for (name, s) in &slices {
        assert_eq!(s["spec"]["pool"]["name"], "node-a", "{name}");
        assert_eq!(s["spec"]["driver"], "gpu.gpuslice.dev", "{name}");
        assert_eq!(
            s["spec"]["pool"]["resourceSliceCount"].as_u64(),
            Some(slices.len() as u64),
            "{name}"
        );
        assert_eq!(
            s["metadata"]["ownerReferences"][0]["uid"], "uid-node-a",
            "{name}"
        );
    }
    assert!(
        slices.values().any(|s| s["spec"]["devices"]
            .as_array()
            .is_some_and(|d| !d.is_empty())),
        "no slice lists a device: {slices:?}"
    );
}

#[test]
fn no_publish_leaves_the_slices_alone() {
    let server = ApiServer::start("v1.36.2");
    server.add_node("node-a", "uid-node-a");
    let k = FakeKernel::a2_mdev_host().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let reg = dir
        .path()
        .join("kubelet/plugins_registry/gpu.gpuslice.dev-reg.sock");
    let _agent = start(
        k.root_dir().unwrap(),
        dir.path(),
        &server.kubeconfig(),
        &["--no-publish"],
    );
    wait_for("the registration socket", Duration::from_secs(60), || {
        reg.exists()
    });
    std::thread::sleep(Duration::from_millis(1500));
    assert!(server.writes().is_empty(), "{:?}", server.writes());
}
