#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! The agent's memory through hostile API server answers (`benches/RESULTS-agent.md`, "7 Dec:
//! hostile API-server answers"). Ignored by default (it streams gigabytes through loopback);
//! build the CLI first, then:
//!
//! ```text
//! cargo build -p gpuslice-cli
//! cargo test -p gpuslice-benches --test hostile_rss -- --ignored --nocapture
//! ```
//!
//! The agent runs as its own process, `gpuslice agent --dra` (publisher and kubelet plugin on,
//! the default 16 MiB answer cap) on a fake kernel's tree, against the API server stand-in of
//! `gpu-agent/tests/apiserver` in this process, which answers every ResourceSlice list with a
//! 256 MiB list and every ResourceClaim read with a 1 GiB claim, generated as they are sent
//! (chunked, no length announced, so the cap is met while reading). The publisher lists again
//! and again (with back-off) while this test, as the kubelet, asks `NodePrepareResources` for
//! the claim over and over for 15 s. The figure is the agent process's own peak resident set
//! (`VmHWM` in `/proc/PID/status`).

#[path = "../../gpu-agent/tests/apiserver/mod.rs"]
mod apiserver;

use std::process::{Child, Command, Stdio};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use apiserver::ApiServer;
use gpu_agent::dra::proto::dra_v1;
use gpu_sysfs::Host as _;
use gpu_sysfs::testing::FakeKernel;

const MIB: u64 = 1024 * 1024;

struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `VmRSS` and `VmHWM` of process `pid`, in KiB.
fn memory(pid: u32) -> (u64, u64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .unwrap()
    };
    (field("VmRSS:"), field("VmHWM:"))
}

/// The `gpuslice` binary of this build (next to `deps/`).
fn gpuslice() -> std::path::PathBuf {
    let exe = std::env::current_exe().unwrap();
    let bin = exe.parent().unwrap().parent().unwrap().join("gpuslice");
    assert!(
        bin.exists(),
        "build the CLI first: cargo build -p gpuslice-cli ({})",
        bin.display()
    );
    bin
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
    let kubelet = dir.path().join("kubelet");
    let agent = Running(
        Command::new(gpuslice())
            .env_remove("GPUSLICE_ROOT")
            .arg("--root")
            .arg(k.root_dir().unwrap())
            .args([
                "--node",
                "node-a",
                "agent",
                "--uevents",
                "off",
                "--resync",
                "0",
            ])
            .arg("--listen")
            .arg(format!("unix:{}", dir.path().join("a.sock").display()))
            .arg("--dra")
            .arg("--kubeconfig")
            .arg(server.kubeconfig())
            .arg("--kubelet-dir")
            .arg(&kubelet)
            .arg("--cdi-dir")
            .arg(dir.path().join("cdi"))
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.path().join("agent.log")).unwrap())
            .spawn()
            .unwrap(),
    );
    // `gpuslice agent` runs the agent in the same process (exec of gpuslice-agent).
    let pid = agent.0.id();
    let endpoint = kubelet.join("plugins/gpu.gpuslice.dev/dra.sock");
    let t0 = Instant::now();
    while !endpoint.exists() {
        assert!(
            t0.elapsed() < Duration::from_secs(120),
            "the plugin never served"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(500));
    let (started, _) = memory(pid);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let (prepares, last_error) = rt.block_on(async {
        let t0 = Instant::now();
        let mut prepares = 0;
        let mut last_error = String::new();
        while t0.elapsed() < Duration::from_secs(15) {
            let mut c = dra_v1::dra_plugin_client::DraPluginClient::new(
                gpu_agent::dra::socket::channel(endpoint.clone())
                    .await
                    .unwrap(),
            );
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
        (prepares, last_error)
    });
    let (after, peak) = memory(pid);
    let lists = server
        .requests()
        .iter()
        .filter(|r| r.path == apiserver::SLICES)
        .count();
    let log = std::fs::read_to_string(dir.path().join("agent.log")).unwrap();
    let refused = log.matches("larger than 16777216 bytes").count();
    println!(
        "cap 16 MiB; {lists} slice lists of 256 MiB and {prepares} claim reads of 1 GiB asked, \
         {refused} refusals logged; bytes the stand-in got out: lists {:.1} MiB, claims {:.1} MiB",
        list_sent.load(Ordering::Relaxed) as f64 / MIB as f64,
        claim_sent.load(Ordering::Relaxed) as f64 / MIB as f64,
    );
    println!(
        "agent VmRSS after start {:.1} MiB, after 15 s {:.1} MiB; VmHWM {:.1} MiB",
        started as f64 / 1024.0,
        after as f64 / 1024.0,
        peak as f64 / 1024.0
    );
    println!("the kubelet was answered: {last_error}");
    assert!(agent_alive(&agent), "the agent exited");
    assert!(last_error.contains("larger than"), "{last_error}");
    assert!(
        lists >= 2 && prepares >= 2,
        "{lists} lists, {prepares} prepares"
    );
    assert!(peak < 64 * 1024, "VmHWM {peak} KiB");
}

fn agent_alive(agent: &Running) -> bool {
    std::fs::metadata(format!("/proc/{}", agent.0.id())).is_ok()
}
