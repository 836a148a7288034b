//! Hostile peers of the agent's Kubernetes surfaces: a process that bound the plugin's socket and
//! never accepts, an API server whose answers never end, a conflict that never clears, a kubelet
//! that names 2,000 unknown claims with a short deadline or a claim name of 3.9 MB. Each wait and
//! read is bounded, and the agent serves on.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod apiserver;
mod support;

use std::io::{Read as _, Write as _};
use std::os::fd::AsRawFd as _;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use apiserver::ApiServer;
use gpu_agent::dra::proto::dra_v1;
use gpu_agent::dra::{DraConfig, DraPlugin};
use gpu_agent::kube::{ClientOptions, KubeClient, KubeError};
use gpu_agent::{Agent, AgentConfig, Daemon, DaemonConfig, DaemonDra, Listen, UeventMode};
use gpu_sysfs::Host as _;
use gpu_sysfs::testing::FakeKernel;

const DRIVER: &str = "gpu.gpuslice.dev";
const MIB: u64 = 1024 * 1024;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// A unix socket bound by a "process" that listens with a backlog of 0 and never accepts,
/// its backlog filled: a connect to it can only wait.
fn full_backlog_socket(path: &Path) -> Vec<std::os::fd::OwnedFd> {
    use nix::sys::socket::{
        AddressFamily, Backlog, SockFlag, SockType, UnixAddr, bind, connect, listen, socket,
    };
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    let l = socket(
        AddressFamily::Unix,
        SockType::Stream,
        SockFlag::SOCK_CLOEXEC,
        None,
    )
    .unwrap();
    let addr = UnixAddr::new(path).unwrap();
    bind(l.as_raw_fd(), &addr).unwrap();
    listen(&l, Backlog::new(0).unwrap()).unwrap();
    let mut held = vec![l];
    // Queue connections until the kernel says the backlog is full.
    for _ in 0..64 {
        let c = socket(
            AddressFamily::Unix,
            SockType::Stream,
            SockFlag::SOCK_NONBLOCK | SockFlag::SOCK_CLOEXEC,
            None,
        )
        .unwrap();
        let full = connect(c.as_raw_fd(), &addr).is_err();
        held.push(c);
        if full {
            return held;
        }
    }
    panic!("the backlog never filled");
}

fn dra_daemon(root: &Path, dir: &Path, server: &ApiServer) -> (DaemonConfig, DaemonDra) {
    let mut dra = DaemonDra::new(DRIVER);
    dra.plugin.kubelet_dir = dir.join("kubelet");
    dra.plugin.cdi_dir = dir.join("cdi");
    dra.kubeconfig = Some(server.kubeconfig());
    let config = DaemonConfig {
        listen: vec![Listen::Unix(dir.join("a.sock"))],
        uevents: UeventMode::Off,
        nvml: false,
        resync: None,
        ..DaemonConfig::new("node-a", root)
    };
    (config, dra)
}

#[test]
fn a_process_that_bound_dra_sock_and_never_accepts_does_not_hang_the_start() {
    let server = ApiServer::start("v1.36.2");
    server.add_node("node-a", "uid-node-a");
    let k = FakeKernel::a2_mdev_host().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (config, dra) = dra_daemon(k.root_dir().unwrap(), dir.path(), &server);
    let endpoint = dra.plugin.endpoint();
    let _held = full_backlog_socket(&endpoint);
    let socket = dir.path().join("a.sock");
    let daemon = Daemon::open(DaemonConfig {
        dra: Some(dra),
        ..config
    })
    .unwrap();
    // On a thread of its own: a start that hangs in the probe fails the test instead of hanging it.
    let (tx, rx) = std::sync::mpsc::channel();
    let s = socket.clone();
    std::thread::spawn(move || {
        let rt = runtime();
        rt.block_on(async move {
            let running = daemon.start().await.unwrap();
            let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
            let served = tokio::spawn(running.serve_until(async {
                let _ = stopped.await;
            }));
            let mut answer = String::new();
            for _ in 0..100 {
                let s = s.clone();
                answer = tokio::task::spawn_blocking(move || support::get(&s, "/healthz").body)
                    .await
                    .unwrap();
                if answer.contains("draPlugin") {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            let metrics = {
                let s = s.clone();
                tokio::task::spawn_blocking(move || support::get(&s, "/metrics").body)
                    .await
                    .unwrap()
            };
            stop.send(()).unwrap();
            served.await.unwrap().unwrap();
            tx.send((answer, metrics)).unwrap();
        });
    });
    let (answer, metrics) = rx
        .recv_timeout(Duration::from_secs(30))
        .expect("the agent's start hung on the socket nobody accepts on");
    let doc: serde_json::Value = serde_json::from_str(&answer).unwrap();
    assert_eq!(doc["status"], "ok", "{doc}");
    assert_eq!(doc["draPlugin"]["ready"], false, "{doc}");
    let message = doc["draPlugin"]["message"].as_str().unwrap();
    assert!(
        message.contains("does not accept connections") && message.contains("dra.sock"),
        "{message}"
    );
    assert!(
        metrics.contains("gpuslice_agent_dra_plugin_blocked 1"),
        "{metrics}"
    );
    assert!(
        endpoint.exists(),
        "the other process's socket was left alone"
    );
}

fn client(rt: &tokio::runtime::Runtime, server: &ApiServer, cap: u64) -> KubeClient {
    rt.block_on(KubeClient::connect(&ClientOptions {
        kubeconfig: Some(server.kubeconfig()),
        timeout: Duration::from_secs(30),
        max_answer: cap,
        ..ClientOptions::default()
    }))
    .unwrap()
}

#[test]
fn a_slice_list_past_the_cap_is_refused_while_read_naming_the_url_and_the_cap() {
    let server = ApiServer::start("v1.36.2");
    // 256 MiB, sent chunked (no length announced): the cap is met while reading.
    let sent = server.hostile("GET", apiserver::SLICES, 256 * MIB, false, true);
    let rt = runtime();
    let c = client(&rt, &server, 4 * MIB);
    let refused = c.refused_answers();
    let t0 = Instant::now();
    let e = rt
        .block_on(gpu_agent::kube::publish::list_pool(&c, DRIVER, "node-a"))
        .unwrap_err();
    assert!(
        matches!(e, KubeError::TooLarge { cap, .. } if cap == 4 * MIB),
        "{e:?}"
    );
    let m = e.to_string();
    assert!(
        m.contains(&server.url()) && m.contains("/apis/resource.k8s.io/v1/resourceslices"),
        "{m}"
    );
    assert!(m.contains("4194304 bytes"), "{m}");
    assert!(t0.elapsed() < Duration::from_secs(20), "{:?}", t0.elapsed());
    assert_eq!(refused.load(Ordering::Relaxed), 1);
    // The reading stopped at the cap: what the stand-in got out is the cap and the socket
    // buffers, not the list.
    std::thread::sleep(Duration::from_millis(300));
    let out = sent.load(Ordering::Relaxed);
    assert!(out < 64 * MIB, "{out} bytes were sent");
    // A length announced past the cap is refused before any of the body is read.
    let server = ApiServer::start("v1.36.2");
    server.hostile(
        "GET",
        "/apis/resource.k8s.io/v1/namespaces",
        1024 * MIB,
        true,
        false,
    );
    let c = client(&rt, &server, 4 * MIB);
    let e = rt
        .block_on(c.get("/apis/resource.k8s.io/v1/namespaces/default/resourceclaims/huge"))
        .unwrap_err();
    assert!(matches!(e, KubeError::TooLarge { .. }), "{e:?}");
    assert_eq!(c.refused_answers().load(Ordering::Relaxed), 1);
}

#[test]
fn a_conflict_that_never_clears_is_retried_a_bounded_number_of_times_with_back_off() {
    let server = ApiServer::start("v1.36.2");
    server.add_node("node-a", "uid-node-a");
    server.fail("POST", apiserver::SLICES, 409, 1000);
    let rt = runtime();
    let c = client(&rt, &server, gpu_agent::kube::MAX_ANSWER);
    let k = Arc::new(FakeKernel::a2_mdev_host().unwrap());
    let agent = Agent::open(k, AgentConfig::new("node-a")).unwrap();
    let node = agent.snapshot().topology.clone();
    let opts = gpu_agent::kube::SliceOptions {
        driver: DRIVER.to_owned(),
        size_for: std::collections::BTreeMap::new(),
        ..gpu_agent::kube::SliceOptions::default()
    };
    let t0 = Instant::now();
    let (_, reports) = rt
        .block_on(gpu_agent::kube::publish_nodes(
            &c,
            &[node],
            &opts,
            &std::collections::BTreeMap::new(),
            false,
            1,
        ))
        .unwrap();
    let took = t0.elapsed();
    let e = reports[0].result.as_ref().unwrap_err();
    assert_eq!(e.code(), Some(409), "{e}");
    let lists = server
        .requests()
        .iter()
        .filter(|r| r.method == "GET" && r.path == apiserver::SLICES)
        .count();
    assert!(
        lists <= gpu_agent::kube::publish::CONFLICT_RETRIES + 1,
        "{lists} lists"
    );
    // Every retry waited: 50 + 100 + 200 + 400 + 800 ms at least.
    assert!(took >= Duration::from_millis(1500), "{took:?}");
}

/// The kubelet plugin of an agent on the A2 fake kernel, reading claims from `server`, served
/// on its unix sockets.
struct Served {
    rt: tokio::runtime::Runtime,
    endpoint: PathBuf,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    _dir: tempfile::TempDir,
}

impl Drop for Served {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
    }
}

fn serve_plugin(server: &ApiServer) -> Served {
    let rt = runtime();
    let dir = tempfile::tempdir().unwrap();
    let k = Arc::new(FakeKernel::a2_mdev_host().unwrap());
    let agent = Agent::open(k, AgentConfig::new("node-a")).unwrap();
    let claims = Arc::new(client(&rt, server, gpu_agent::kube::MAX_ANSWER));
    let config = DraConfig {
        driver: DRIVER.to_owned(),
        kubelet_dir: dir.path().join("kubelet"),
        cdi_dir: dir.path().join("cdi"),
    };
    let endpoint = config.endpoint();
    let plugin = DraPlugin::new(agent, claims, config).unwrap();
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    rt.spawn(gpu_agent::dra::serve(plugin, async move {
        let _ = rx.await;
    }));
    let registration = endpoint
        .ancestors()
        .nth(3)
        .unwrap()
        .join("plugins_registry/gpu.gpuslice.dev-reg.sock");
    for _ in 0..3000 {
        if registration.exists() {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    Served {
        rt,
        endpoint,
        stop: Some(tx),
        _dir: dir,
    }
}

impl Served {
    fn prepare(
        &self,
        claims: Vec<dra_v1::Claim>,
        timeout: Option<Duration>,
    ) -> Result<dra_v1::NodePrepareResourcesResponse, tonic::Status> {
        self.rt.block_on(async {
            let channel = support::plugin_channel(self.endpoint.clone()).await;
            let mut c = dra_v1::dra_plugin_client::DraPluginClient::new(channel)
                .max_decoding_message_size(64 << 20);
            let mut req = tonic::Request::new(dra_v1::NodePrepareResourcesRequest { claims });
            if let Some(t) = timeout {
                req.set_timeout(t);
            }
            c.node_prepare_resources(req)
                .await
                .map(tonic::Response::into_inner)
        })
    }
}

fn unknown(i: usize) -> dra_v1::Claim {
    dra_v1::Claim {
        namespace: "default".into(),
        uid: format!("uid-{i}"),
        name: format!("nosuch-{i}"),
    }
}

#[test]
fn two_thousand_unknown_claims_with_a_short_deadline_are_answered_in_time_and_the_reads_stop() {
    let server = ApiServer::start("v1.36.2");
    // Each read takes 50 ms: the 2,000 one after the other would take 100 s, the first 256
    // (the most one call reads) eight at a time 1.6 s.
    server.delay_claims(Duration::from_millis(50));
    let p = serve_plugin(&server);
    let t0 = Instant::now();
    let answer = p
        .prepare(
            (0..2000).map(unknown).collect(),
            Some(Duration::from_secs(1)),
        )
        .expect("answered within the kubelet's deadline");
    let took = t0.elapsed();
    assert!(took < Duration::from_secs(3), "{took:?}");
    assert_eq!(answer.claims.len(), 2000, "every claim has an entry");
    let not_found = answer
        .claims
        .values()
        .filter(|c| c.error.contains("not found"))
        .count();
    let left: Vec<&String> = answer
        .claims
        .values()
        .map(|c| &c.error)
        .filter(|e| e.contains("deadline"))
        .collect();
    let too_many = answer
        .claims
        .values()
        .filter(|c| c.error.contains("one call prepares at most 256 claims"))
        .count();
    assert!(not_found > 0, "some claims were read");
    assert!(!left.is_empty(), "some claims were left for the deadline");
    assert_eq!(
        too_many,
        2000 - gpu_agent::dra::service::MAX_CLAIMS_PER_CALL
    );
    assert_eq!(not_found + left.len() + too_many, 2000);
    assert!(
        left[0].contains("kubelet's deadline for this call (1000 ms)"),
        "{}",
        left[0]
    );
    // Read at most FETCHES_IN_FLIGHT at a time, and no more once the answer went out.
    assert!(
        server.peak_in_flight() <= gpu_agent::dra::service::FETCHES_IN_FLIGHT,
        "{} reads at once",
        server.peak_in_flight()
    );
    let reads = server.claim_reads();
    assert!(reads < 2000, "{reads} reads");
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(
        server.claim_reads(),
        reads,
        "reading went on after the answer"
    );
    // More claims than one call prepares are answered without being read.
    server.delay_claims(Duration::ZERO);
    server.clear_requests();
    let answer = p.prepare((0..300).map(unknown).collect(), None).unwrap();
    let too_many = answer
        .claims
        .values()
        .filter(|c| c.error.contains("one call prepares at most 256 claims"))
        .count();
    assert_eq!(too_many, 300 - gpu_agent::dra::service::MAX_CLAIMS_PER_CALL);
    assert_eq!(
        server.claim_reads(),
        gpu_agent::dra::service::MAX_CLAIMS_PER_CALL
    );
}

#[test]
fn a_claim_name_of_3_9_mb_is_cut_in_the_answer() {
    let server = ApiServer::start("v1.36.2");
    let p = serve_plugin(&server);
    let name = "n".repeat(3_900_000);
    let answer = p
        .prepare(
            vec![dra_v1::Claim {
                namespace: "default".into(),
                uid: "uid-long".into(),
                name: name.clone(),
            }],
            None,
        )
        .unwrap();
    let error = &answer.claims["uid-long"].error;
    assert!(error.len() < 1024, "{} bytes of error", error.len());
    assert!(error.contains("… (3900000 bytes)"), "{error}");
    assert!(error.contains("not found"), "{error}");
    assert_eq!(
        server.claim_reads(),
        0,
        "a name no claim can have is not asked for"
    );
}

/// One HTTP/2 frame, written raw.
fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = payload.len();
    let mut out = vec![(len >> 16) as u8, (len >> 8) as u8, len as u8, kind, flags];
    out.extend_from_slice(&stream.to_be_bytes());
    out.extend_from_slice(payload);
    out
}

/// An HPACK literal without indexing of the static name `index` (4-bit prefix, below 15).
fn literal(index: u8, value: &[u8]) -> Vec<u8> {
    assert!(index < 15 && value.len() < 127);
    let mut out = vec![index, value.len() as u8];
    out.extend_from_slice(value);
    out
}

#[test]
fn a_client_sending_the_socket_path_as_authority_is_answered_not_reset() {
    let server = ApiServer::start("v1.36.2");
    let p = serve_plugin(&server);
    let registration = p
        .endpoint
        .parent()
        .unwrap()
        .parent()
        .unwrap()
        .parent()
        .unwrap()
        .join("plugins_registry/gpu.gpuslice.dev-reg.sock");
    for _ in 0..500 {
        if registration.exists() {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let path = registration.to_str().unwrap().as_bytes().to_vec();
    let mut s = UnixStream::connect(&registration).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    // As grpc-core sends it: `:authority` is the socket path.
    let mut block = vec![0x83, 0x86]; // :method POST, :scheme http
    block.extend(literal(4, b"/pluginregistration.Registration/GetInfo"));
    block.extend(literal(1, &path));
    block.extend_from_slice(&[0x0f, 0x10, 16]); // content-type (static 31)
    block.extend_from_slice(b"application/grpc");
    block.extend_from_slice(&[0x00, 2, b't', b'e', 8]);
    block.extend_from_slice(b"trailers");
    let mut out = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    out.extend(frame(0x4, 0, 0, &[]));
    out.extend(frame(0x1, 0x4, 1, &block));
    out.extend(frame(0x0, 0x1, 1, &[0, 0, 0, 0, 0])); // an empty InfoRequest
    s.write_all(&out).unwrap();
    let mut answered = Vec::new();
    loop {
        let mut head = [0u8; 9];
        s.read_exact(&mut head).unwrap();
        let len = usize::from(head[0]) << 16 | usize::from(head[1]) << 8 | usize::from(head[2]);
        let mut payload = vec![0u8; len];
        s.read_exact(&mut payload).unwrap();
        let (kind, flags) = (head[3], head[4]);
        let stream = u32::from_be_bytes([head[5], head[6], head[7], head[8]]);
        match kind {
            0x4 if flags & 1 == 0 => s.write_all(&frame(0x4, 1, 0, &[])).unwrap(),
            0x3 if stream == 1 => panic!("the stream was reset: error code {payload:?}"),
            0x0 if stream == 1 => answered.extend_from_slice(&payload),
            0x1 if stream == 1 && flags & 0x1 != 0 => break, // the trailers
            _ => {}
        }
    }
    let text = String::from_utf8_lossy(&answered);
    assert!(
        text.contains("DRAPlugin") && text.contains(DRIVER),
        "{text:?}"
    );
}
