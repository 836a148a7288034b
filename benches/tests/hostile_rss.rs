#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! The agent's memory through hostile API server answers (`benches/RESULTS-agent.md`, "7 Dec:
//! hostile API-server answers"). Ignored by default (it streams gigabytes through loopback):
//!
//! ```text
//! cargo test --release -p gpuslice-benches --test hostile_rss -- --ignored --nocapture
//! ```
//!
//! The agent runs as `gpuslice agent --dra` does (the library's `Daemon`, publisher and kubelet
//! plugin on), in this process, against the API server stand-in of `gpu-agent/tests/apiserver`,
//! which answers every ResourceSlice list with a 256 MiB list and every ResourceClaim read with
//! a 1 GiB claim, generated as they are sent (chunked, no length announced, so the cap is met
//! while reading). The publisher lists again and again (with back-off), and the kubelet's
//! `NodePrepareResources` asks for the claim repeatedly. The figure is this whole process's
//! peak resident set (`VmHWM`): the agent, the stand-in and the test harness together, so an
//! upper bound of the agent's own.

#[path = "../../gpu-agent/tests/apiserver/mod.rs"]
mod apiserver;

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use apiserver::ApiServer;
use gpu_agent::dra::proto::dra_v1;
use gpu_agent::{Daemon, DaemonConfig, DaemonDra, Listen, UeventMode};
use gpu_sysfs::Host as _;
use gpu_sysfs::testing::FakeKernel;

const MIB: u64 = 1024 * 1024;

/// `VmRSS` and `VmHWM` of this process, in KiB.
fn memory() -> (u64, u64) {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .unwrap()
    };
    (field("VmRSS:"), field("VmHWM:"))
}

async fn channel(path: std::path::PathBuf) -> tonic::transport::Channel {
    tonic::transport::Endpoint::try_from("http://plugin.invalid")
        .unwrap()
        .connect_with_connector(tower::service_fn(move |_: tonic::transport::Uri| {
            let path = path.clone();
            async move {
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(
                    tokio::net::UnixStream::connect(path).await?,
                ))
            }
        }))
        .await
        .unwrap()
}

#[test]
#[ignore = "streams gigabytes through loopback; run by hand for benches/RESULTS-agent.md"]
fn the_agent_stays_under_64_mib_through_a_256_mib_slice_list_and_a_1_gib_claim() {
    let server = ApiServer::start("v1.36.2");
    server.add_node("node-a", "uid-node-a");
    let list_sent = server.hostile("GET", apiserver::SLICES, 256 * MIB, false, true);
    let claim_sent = server.hostile(
        "GET",
        "/apis/resource.k8s.io/v1/namespaces/",
        1024 * MIB,
        false,
        false,
    );
    let k = FakeKernel::a2_mdev_host().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut dra = DaemonDra::new("gpu.gpuslice.dev");
    dra.plugin.kubelet_dir = dir.path().join("kubelet");
    dra.plugin.cdi_dir = dir.path().join("cdi");
    dra.kubeconfig = Some(server.kubeconfig());
    let endpoint = dra.plugin.endpoint();
    let cap = dra.max_answer;
    let daemon = Daemon::open(DaemonConfig {
        listen: vec![Listen::Unix(dir.path().join("a.sock"))],
        uevents: UeventMode::Off,
        nvml: false,
        resync: None,
        dra: Some(dra),
        ..DaemonConfig::new("node-a", k.root_dir().unwrap())
    })
    .unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let (before, _) = memory();
    let report = rt.block_on(async {
        let running = daemon.start().await.unwrap();
        let agent = std::sync::Arc::clone(running.agent());
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let served = tokio::spawn(running.serve_until(async {
            let _ = stopped.await;
        }));
        while !endpoint.exists() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let (started, _) = memory();
        let t0 = Instant::now();
        let mut prepares = 0;
        let mut last_error = String::new();
        // The publisher lists on its own, with back-off; the kubelet asks for the claim.
        while t0.elapsed() < Duration::from_secs(15) {
            let mut c =
                dra_v1::dra_plugin_client::DraPluginClient::new(channel(endpoint.clone()).await);
            let answer = c
                .node_prepare_resources(dra_v1::NodePrepareResourcesRequest {
                    claims: vec![dra_v1::Claim {
                        namespace: "default".into(),
                        uid: "uid-huge".into(),
                        name: "huge".into(),
                    }],
                })
                .await
                .unwrap()
                .into_inner();
            last_error = answer.claims["uid-huge"].error.clone();
            prepares += 1;
        }
        let (after, peak) = memory();
        let refused = agent.stats().apiserver_answers_refused();
        let healthz_ok = agent.snapshot().topology.node == "node-a";
        stop.send(()).unwrap();
        served.await.unwrap().unwrap();
        (
            started, after, peak, prepares, refused, last_error, healthz_ok,
        )
    });
    let (started, after, peak, prepares, refused, last_error, alive) = report;
    let lists = server
        .requests()
        .iter()
        .filter(|r| r.path == apiserver::SLICES)
        .count();
    println!(
        "cap {} MiB; {lists} slice lists of 256 MiB and {prepares} claim reads of 1 GiB asked, \
         {refused} answers refused; bytes the stand-in got out: lists {:.1} MiB, claims {:.1} MiB",
        cap / MIB,
        list_sent.load(Ordering::Relaxed) as f64 / MIB as f64,
        claim_sent.load(Ordering::Relaxed) as f64 / MIB as f64,
    );
    println!(
        "VmRSS before start {:.1} MiB, after start {:.1} MiB, after 15 s {:.1} MiB; VmHWM {:.1} MiB",
        before as f64 / 1024.0,
        started as f64 / 1024.0,
        after as f64 / 1024.0,
        peak as f64 / 1024.0
    );
    println!("the kubelet was answered: {last_error}");
    assert!(alive);
    assert!(last_error.contains("larger than"), "{last_error}");
    assert!(refused >= 2, "{refused}");
    assert!(peak < 64 * 1024, "VmHWM {peak} KiB");
}
