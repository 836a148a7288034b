//! Publishing ResourceSlices: `cargo bench --bench publish`.
//!
//! Both run against the API server stand-in of the gpu-agent tests (loopback HTTP, the real wire
//! protocol: `/version`, discovery, Nodes, ResourceSlice list/create/replace/delete), included
//! from `gpu-agent/tests/apiserver/mod.rs` as the CLI tests include it.
//!
//! - `publish/host_change_to_slice_8gpu_h200`: the agent's publisher on the 8-GPU H200 fake host
//!   (vendor-specific VFIO, 16 VFs per GPU), Kubernetes 1.36.2. After a quiet spell longer than
//!   the burst interval one GPU's AER fatal counter changes (Unhealthy, then Healthy again); the
//!   time runs from the change on the host, through the agent's refresh and the publisher's
//!   round, to the new pool generation being written. Target: 100 ms median.
//! - `publish/fleet_1000_h200_nodes`: `gpuslice dra publish --inventory`'s library call
//!   (`publish_nodes`) for 1,000 8-GPU H200 nodes (5,000 slices) into an empty stand-in, 16
//!   requests in flight, from a fleet file: the compact form `Fleet::to_text` writes (the host's
//!   shape once, referenced by every node), read and decoded inside the clock as
//!   `dra publish --inventory` reads it (in full form the same fleet is some 380 MB of JSON).
//!   Target: 10 s.

#[path = "../../gpu-agent/tests/apiserver/mod.rs"]
mod apiserver;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use apiserver::ApiServer;
use criterion::{Criterion, SamplingMode, criterion_group, criterion_main};
use gpu_agent::kube::{ClientOptions, KubeClient, PublishOptions, SliceOptions};
use gpu_agent::{Agent, AgentConfig};
use gpu_core::NodeTopology;
use gpu_sysfs::testing::FakeKernel;

const FATAL: &str = "Undefined 0\nDLP 0\nSDES 0\nTLP 0\nFCP 0\nCmpltTO 0\nCmpltAbrt 0\nUnxCmplt 0\nRxOF 0\nMalfTLP 1\nECRC 0\nUnsupReq 0\nACSViol 0\nTOTAL_ERR_FATAL 1\n";
const CLEAN: &str = "Undefined 0\nDLP 0\nSDES 0\nTLP 0\nFCP 0\nCmpltTO 0\nCmpltAbrt 0\nUnxCmplt 0\nRxOF 0\nMalfTLP 0\nECRC 0\nUnsupReq 0\nACSViol 0\nTOTAL_ERR_FATAL 0\n";
/// The burst interval of the bench's publisher; the quiet spell before each change is longer.
const MIN_INTERVAL: Duration = Duration::from_millis(100);
const QUIET: Duration = Duration::from_millis(150);
/// How long one change may take to be written before the bench gives up.
const DEADLINE: Duration = Duration::from_secs(10);

fn fail(what: &str, e: impl std::fmt::Display) -> ! {
    eprintln!("publish bench: {what}: {e}");
    std::process::exit(1)
}

fn h200_kernel() -> Arc<FakeKernel> {
    let tree = gpu_sysfs::testing::fixtures::h200_host(&[]).unwrap_or_else(|e| fail("tree", e));
    Arc::new(FakeKernel::new(tree).unwrap_or_else(|e| fail("fake kernel", e)))
}

fn connect(rt: &tokio::runtime::Runtime, server: &ApiServer) -> KubeClient {
    rt.block_on(KubeClient::connect(&ClientOptions {
        kubeconfig: Some(server.kubeconfig()),
        timeout: Duration::from_secs(10),
        ..ClientOptions::default()
    }))
    .unwrap_or_else(|e| fail("client", e))
}

fn wait_generation(agent: &Agent, want: u64) {
    let t = Instant::now();
    while agent.stats().slice_generation() != want {
        if t.elapsed() > DEADLINE {
            fail(
                "waiting for the slices",
                format!(
                    "generation {} after {DEADLINE:?}, wanted {want}",
                    agent.stats().slice_generation()
                ),
            );
        }
        std::thread::sleep(Duration::from_micros(200));
    }
}

fn host_change_to_slice(c: &mut Criterion) {
    let rt = gpu_agent::runtime().unwrap_or_else(|e| fail("runtime", e));
    let server = ApiServer::start("v1.36.2");
    server.add_node("node-a", "0b3c8f4e-1111-4222-8333-444455556666");
    let kernel = h200_kernel();
    let aer = kernel.root().join(format!(
        "sys/bus/pci/devices/{}/aer_dev_fatal",
        gpu_sysfs::testing::fixtures::h200_pf(0)
    ));
    let agent = Agent::open(
        Arc::clone(&kernel) as Arc<dyn gpu_sysfs::Host>,
        AgentConfig::new("node-a"),
    )
    .unwrap_or_else(|e| fail("agent", e.message));
    let client = connect(&rt, &server);
    let opts = PublishOptions {
        min_interval: MIN_INTERVAL,
        ..PublishOptions::default()
    };
    let publisher = rt
        .block_on(gpu_agent::kube::spawn_publisher(
            Arc::clone(&agent),
            client,
            opts,
        ))
        .unwrap_or_else(|e| fail("publisher", e));
    wait_generation(&agent, 1);
    let mut sick = false;
    let mut group = c.benchmark_group("publish");
    group
        .sample_size(10)
        .sampling_mode(SamplingMode::Flat)
        .measurement_time(Duration::from_secs(8));
    group.bench_function("host_change_to_slice_8gpu_h200", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                std::thread::sleep(QUIET);
                let want = agent.stats().slice_generation() + 1;
                sick = !sick;
                let t = Instant::now();
                std::fs::write(&aer, if sick { FATAL } else { CLEAN })
                    .unwrap_or_else(|e| fail("AER counter", e));
                agent
                    .refresh()
                    .unwrap_or_else(|e| fail("refresh", e.message));
                wait_generation(&agent, want);
                total += t.elapsed();
            }
            total
        });
    });
    group.finish();
    rt.block_on(publisher.stop());
}

fn fleet_of_1000(c: &mut Criterion) {
    let rt = gpu_agent::runtime().unwrap_or_else(|e| fail("runtime", e));
    let agent = Agent::open(
        h200_kernel() as Arc<dyn gpu_sysfs::Host>,
        AgentConfig::new("template"),
    )
    .unwrap_or_else(|e| fail("agent", e.message));
    let template = agent.snapshot().topology.clone();
    let nodes: Vec<NodeTopology> = (0..1000)
        .map(|i| {
            let mut n = template.clone();
            n.node = format!("gpu-node-{i:04}");
            n
        })
        .collect();
    // The fleet file as `Fleet::to_text` writes it: the compact form, the host's shape once.
    let dir = tempfile::tempdir().unwrap_or_else(|e| fail("temp dir", e));
    let path = dir.path().join("fleet.json");
    let fleet = gpu_core::Fleet {
        nodes,
        ..gpu_core::Fleet::default()
    };
    let text = fleet
        .to_text(true)
        .unwrap_or_else(|e| fail("fleet text", e));
    std::fs::write(&path, text).unwrap_or_else(|e| fail("fleet file", e));
    let nodes = fleet.nodes;
    let mut group = c.benchmark_group("publish");
    group
        .sample_size(10)
        .sampling_mode(SamplingMode::Flat)
        .measurement_time(Duration::from_secs(60));
    group.bench_function("fleet_1000_h200_nodes", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                // A fresh, empty cluster each time: every pool is created.
                let server = ApiServer::start("v1.36.2");
                for (i, n) in nodes.iter().enumerate() {
                    server.add_node(&n.node, &format!("uid-{i}"));
                }
                let client = connect(&rt, &server);
                let t = Instant::now();
                let file = std::fs::File::open(&path).unwrap_or_else(|e| fail("fleet file", e));
                let (read, _) = gpu_core::Fleet::from_reader_max(
                    std::io::BufReader::new(file),
                    gpu_core::limits::MAX_DOCUMENT_BYTES,
                )
                .unwrap_or_else(|e| fail("fleet file", e));
                let (_, reports) = rt
                    .block_on(gpu_agent::kube::publish_nodes(
                        &client,
                        &read.nodes,
                        &SliceOptions::default(),
                        &BTreeMap::new(),
                        false,
                        16,
                    ))
                    .unwrap_or_else(|e| fail("publish", e));
                total += t.elapsed();
                if let Some(r) = reports.iter().find(|r| r.result.is_err()) {
                    fail("publish", format!("{}: {:?}", r.node, r.result));
                }
                let pools = server.pools();
                if pools.len() != nodes.len() || pools.values().any(|g| g.len() != 1) {
                    fail("publish", format!("{} pools stored", pools.len()));
                }
            }
            total
        });
    });
    group.finish();
}

criterion_group!(benches, host_change_to_slice, fleet_of_1000);
criterion_main!(benches);
