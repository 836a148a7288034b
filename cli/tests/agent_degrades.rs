//! `gpuslice agent --dra` with an API server whose `/version` is garbage: the agent does not
//! exit; its API answers, `/healthz` says why the slices are not published, and the kubelet
//! plugin registers.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[path = "../../gpu-agent/tests/apiserver/mod.rs"]
mod apiserver;

use std::io::{Read as _, Write as _};
use std::os::unix::net::UnixStream;
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

fn healthz(socket: &Path) -> Option<serde_json::Value> {
    let mut s = UnixStream::connect(socket).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    s.write_all(b"GET /healthz HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")
        .ok()?;
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    serde_json::from_str(out.split("\r\n\r\n").nth(1)?).ok()
}

#[test]
fn a_garbage_version_from_the_api_server_leaves_the_agent_serving() {
    let server = ApiServer::start("not-a-version");
    server.add_node("node-a", "uid-node-a");
    let k = FakeKernel::a2_mdev_host().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("a.sock");
    let mut agent = Running(
        Command::new(env!("CARGO_BIN_EXE_gpuslice"))
            .arg("--root")
            .arg(k.root_dir().unwrap())
            .args(["--node", "node-a", "agent", "--uevents", "off", "--listen"])
            .arg(format!("unix:{}", socket.display()))
            .arg("--dra")
            .arg("--kubeconfig")
            .arg(server.kubeconfig())
            .arg("--kubelet-dir")
            .arg(dir.path().join("kubelet"))
            .arg("--cdi-dir")
            .arg(dir.path().join("cdi"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let registration = dir
        .path()
        .join("kubelet/plugins_registry/gpu.gpuslice.dev-reg.sock");
    let t0 = Instant::now();
    let doc = loop {
        assert!(
            agent.0.try_wait().unwrap().is_none(),
            "the agent exited on the API server's /version"
        );
        if let Some(doc) = healthz(&socket).filter(|_| registration.exists()) {
            break doc;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "the agent never served"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(doc["status"], "ok", "{doc}");
    assert_eq!(doc["slicePublisher"]["ready"], false, "{doc}");
    assert!(
        doc["slicePublisher"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("not a Kubernetes version")),
        "{doc}"
    );
    assert!(server.writes().is_empty(), "{:?}", server.writes());
    std::thread::sleep(Duration::from_millis(500));
    assert!(agent.0.try_wait().unwrap().is_none(), "the agent exited");
}
