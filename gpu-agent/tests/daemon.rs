//! The agent's daemon started from the library: built from a [`DaemonConfig`] in-process, it
//! answers `/healthz` on the unix socket it was given, and stops its parts in order (the server,
//! the slice publisher, the kubelet plugin, the watchers), removing every socket it made.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod apiserver;

use std::io::{Read as _, Write as _};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::{Duration, Instant};

use apiserver::ApiServer;
use gpu_agent::daemon::{Part, Stop};
use gpu_agent::{Daemon, DaemonConfig, DaemonDra, DaemonError, Listen, UeventMode};
use gpu_sysfs::Host as _;
use gpu_sysfs::testing::FakeKernel;

/// A daemon on `root` serving `socket`, with nothing of the live host (no uevents, no NVML, no
/// periodic resync).
fn config(root: &Path, socket: &Path) -> DaemonConfig {
    DaemonConfig {
        listen: vec![Listen::Unix(socket.to_owned())],
        uevents: UeventMode::Off,
        nvml: false,
        resync: None,
        ..DaemonConfig::new("node-a", root)
    }
}

fn get(socket: &Path, path: &str) -> String {
    let mut s = UnixStream::connect(socket).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    out
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

async fn wait_for(what: &str, within: Duration, mut ok: impl FnMut() -> bool) {
    let t0 = Instant::now();
    while !ok() {
        assert!(t0.elapsed() < within, "{what}: not within {within:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[test]
fn a_daemon_built_from_a_config_answers_healthz_on_its_unix_socket_and_removes_it_when_stopped() {
    let k = FakeKernel::a2_mdev_host().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("a.sock");
    let daemon = Daemon::open(config(k.root_dir().unwrap(), &socket)).unwrap();
    let rt = runtime();
    let stopped = rt.block_on(async {
        let running = daemon.start().await.unwrap();
        assert_eq!(
            running.addresses(),
            vec![format!("unix:{}", socket.display())]
        );
        let agent = std::sync::Arc::clone(running.agent());
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let served = tokio::spawn(running.serve_until(async {
            let _ = stopped.await;
        }));
        let s = socket.clone();
        let answer = tokio::task::spawn_blocking(move || get(&s, "/healthz"))
            .await
            .unwrap();
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        assert!(answer.contains(r#""status":"ok""#), "{answer}");
        stop.send(()).unwrap();
        let stopped = served.await.unwrap().unwrap();
        assert!(
            *agent.shutdown_signal().borrow(),
            "the agent was not told to stop"
        );
        stopped
    });
    assert_eq!(stopped.order(), vec![Part::Server, Part::Watchers]);
    assert!(
        stopped.parts.iter().all(|(_, s)| matches!(s, Stop::Done)),
        "{stopped:?}"
    );
    assert!(!socket.exists(), "the socket was left behind");
}

#[test]
fn a_daemon_with_dra_stops_its_server_then_publisher_then_plugin_then_watchers() {
    let server = ApiServer::start("v1.36.2");
    server.add_node("node-a", "uid-node-a");
    let k = FakeKernel::a2_mdev_host().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("a.sock");
    let mut dra = DaemonDra::new("gpu.gpuslice.dev");
    dra.plugin.kubelet_dir = dir.path().join("kubelet");
    dra.plugin.cdi_dir = dir.path().join("cdi");
    dra.kubeconfig = Some(server.kubeconfig());
    let (registration, endpoint) = (dra.plugin.registration_socket(), dra.plugin.endpoint());
    let daemon = Daemon::open(DaemonConfig {
        dra: Some(dra),
        ..config(k.root_dir().unwrap(), &socket)
    })
    .unwrap();
    let rt = runtime();
    let stopped = rt.block_on(async {
        let running = daemon.start().await.unwrap();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let served = tokio::spawn(running.serve_until(async {
            let _ = stopped.await;
        }));
        wait_for("the node's slices", Duration::from_secs(60), || {
            !server.slices().is_empty()
        })
        .await;
        wait_for("the plugin's sockets", Duration::from_secs(30), || {
            registration.exists() && endpoint.exists()
        })
        .await;
        stop.send(()).unwrap();
        served.await.unwrap().unwrap()
    });
    assert_eq!(
        stopped.order(),
        vec![Part::Server, Part::Publisher, Part::Plugin, Part::Watchers]
    );
    assert!(
        stopped.parts.iter().all(|(_, s)| matches!(s, Stop::Done)),
        "{stopped:?}"
    );
    assert!(!socket.exists(), "the agent's socket was left behind");
    assert!(
        !registration.exists(),
        "the registration socket was left behind"
    );
    assert!(!endpoint.exists(), "the DRA socket was left behind");
}

#[test]
fn a_tcp_listener_without_a_token_is_refused_before_the_host_is_opened() {
    let dir = tempfile::tempdir().unwrap();
    // A root that does not exist: the listener is refused before the root is looked at.
    let err = Daemon::open(DaemonConfig {
        listen: vec![Listen::Tcp("127.0.0.1:0".to_owned())],
        ..config(&dir.path().join("no-such-root"), &dir.path().join("a.sock"))
    })
    .unwrap_err();
    assert!(
        matches!(&err, DaemonError::TcpWithoutToken(a) if a == "127.0.0.1:0"),
        "{err:?}"
    );
    assert!(err.to_string().contains("needs --token-file"), "{err}");
}

fn body_json(answer: &str) -> serde_json::Value {
    let body = answer.split("\r\n\r\n").nth(1).unwrap_or("");
    serde_json::from_str(body).unwrap_or(serde_json::Value::Null)
}

#[test]
fn a_too_old_api_server_stops_only_the_publisher_which_publishes_once_the_server_is_upgraded() {
    let server = ApiServer::start("v1.33.4");
    server.add_node("node-a", "uid-node-a");
    let k = FakeKernel::a2_mdev_host().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("a.sock");
    let mut dra = DaemonDra::new("gpu.gpuslice.dev");
    dra.plugin.kubelet_dir = dir.path().join("kubelet");
    dra.plugin.cdi_dir = dir.path().join("cdi");
    dra.kubeconfig = Some(server.kubeconfig());
    let registration = dra.plugin.registration_socket();
    let daemon = Daemon::open(DaemonConfig {
        dra: Some(dra),
        ..config(k.root_dir().unwrap(), &socket)
    })
    .unwrap();
    let rt = runtime();
    rt.block_on(async {
        // The agent starts: its API and its kubelet plugin serve.
        let running = daemon.start().await.unwrap();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let served = tokio::spawn(running.serve_until(async {
            let _ = stopped.await;
        }));
        let s = socket.clone();
        let ask = move |path: &'static str| {
            let s = s.clone();
            async move {
                tokio::task::spawn_blocking(move || get(&s, path))
                    .await
                    .unwrap()
            }
        };
        let health = ask("/healthz").await;
        assert!(health.starts_with("HTTP/1.1 200"), "{health}");
        let doc = body_json(&health);
        assert_eq!(doc["status"], "ok", "{doc}");
        assert_eq!(doc["slicePublisher"]["ready"], false, "{doc}");
        assert!(
            doc["slicePublisher"]["message"]
                .as_str()
                .is_some_and(|m| m.contains("1.34")),
            "{doc}"
        );
        let metrics = ask("/metrics").await;
        assert!(
            metrics.contains("\ngpuslice_agent_slice_publisher_blocked 1\n"),
            "{metrics}"
        );
        assert!(registration.exists(), "the kubelet plugin does not serve");
        assert!(server.writes().is_empty(), "{:?}", server.writes());
        // The cluster is upgraded: the publisher, asking again, publishes.
        server.state.lock().unwrap().git_version = "v1.36.2".to_owned();
        wait_for("the node's slices", Duration::from_secs(60), || {
            !server.slices().is_empty()
        })
        .await;
        let mut ready = serde_json::Value::Null;
        for _ in 0..100 {
            ready = body_json(&ask("/healthz").await);
            if ready["slicePublisher"]["ready"] == true {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert_eq!(ready["slicePublisher"]["ready"], true, "{ready}");
        assert!(
            ask("/metrics")
                .await
                .contains("\ngpuslice_agent_slice_publisher_blocked 0\n")
        );
        stop.send(()).unwrap();
        served.await.unwrap().unwrap();
    });
}
