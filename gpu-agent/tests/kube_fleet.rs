//! `gpuslice dra publish --inventory FLEET`'s library call: every node's pool published once,
//! a dry run that plans without writing, a node without a Node object reported on its own, the
//! requests a fleet costs and how many are in flight, and 1,000 8-GPU H200 nodes against the
//! stand-in.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod apiserver;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use apiserver::ApiServer;
use gpu_agent::kube::{
    ClientOptions, KubeClient, KubeError, PlanStep, SliceOptions, publish_nodes,
};
use gpu_agent::{Agent, AgentConfig};
use gpu_core::NodeTopology;
use gpu_integrations::dra::{K8sVersion, model, rules};
use gpu_sysfs::testing::FakeKernel;

fn h200_node() -> NodeTopology {
    let tree = gpu_sysfs::testing::fixtures::h200_host(&[]).unwrap();
    let k = Arc::new(FakeKernel::new(tree).unwrap());
    let a = Agent::open(k, AgentConfig::new("template")).unwrap();
    a.snapshot().topology.clone()
}

fn fleet(n: usize) -> Vec<NodeTopology> {
    let t = h200_node();
    (0..n)
        .map(|i| {
            let mut node = t.clone();
            node.node = format!("gpu-node-{i:04}");
            node
        })
        .collect()
}

async fn client(server: &ApiServer) -> KubeClient {
    KubeClient::connect(&ClientOptions {
        kubeconfig: Some(server.kubeconfig()),
        timeout: Duration::from_secs(10),
        ..ClientOptions::default()
    })
    .await
    .unwrap()
}

fn check_all(server: &ApiServer, version: K8sVersion) {
    let slices = server.slices();
    let list = serde_json::json!({"kind": "List", "items": slices.values().collect::<Vec<_>>()});
    let parsed = model::parse_slices(&list.to_string()).unwrap();
    let v = rules::check(&parsed, version);
    assert!(v.is_empty(), "{v:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fleet_is_planned_dry_then_published_and_then_unchanged() {
    let server = ApiServer::start("v1.36.2");
    let nodes = fleet(3);
    for (i, n) in nodes.iter().enumerate() {
        server.add_node(&n.node, &format!("uid-{i}"));
    }
    let c = client(&server).await;
    let opts = SliceOptions::default();
    let (_, dry) = publish_nodes(&c, &nodes, &opts, &BTreeMap::new(), true, 4)
        .await
        .unwrap();
    assert!(server.writes().is_empty());
    assert_eq!(dry.len(), 3);
    for r in &dry {
        let (generation, steps) = r.result.as_ref().unwrap();
        assert_eq!(*generation, 1);
        assert!(!steps.is_empty());
        assert!(steps.iter().all(|s| matches!(s, PlanStep::Create { .. })));
    }
    let (server_info, done) = publish_nodes(&c, &nodes, &opts, &BTreeMap::new(), false, 4)
        .await
        .unwrap();
    assert_eq!(server_info.version.to_string(), "1.36.2");
    let written: usize = done
        .iter()
        .map(|r| r.result.as_ref().unwrap().1.len())
        .sum();
    assert_eq!(server.writes().len(), written);
    assert_eq!(server.slices().len(), written);
    check_all(&server, K8sVersion::V1_36_2);
    for (i, n) in nodes.iter().enumerate() {
        let owned = server
            .slices()
            .values()
            .filter(|s| s["spec"]["nodeName"] == n.node.as_str())
            .all(|s| s["metadata"]["ownerReferences"][0]["uid"] == format!("uid-{i}"));
        assert!(owned);
    }
    server.clear_requests();
    let (_, again) = publish_nodes(&c, &nodes, &opts, &BTreeMap::new(), false, 4)
        .await
        .unwrap();
    assert!(
        again
            .iter()
            .all(|r| r.result.as_ref().unwrap().1.is_empty())
    );
    assert!(server.writes().is_empty());

    // One node's GPU goes: a dry run plans exactly that pool's new generation.
    let mut changed = nodes.clone();
    changed[1].gpus.pop();
    let (_, dry) = publish_nodes(&c, &changed, &opts, &BTreeMap::new(), true, 4)
        .await
        .unwrap();
    assert!(dry[0].result.as_ref().unwrap().1.is_empty());
    assert!(dry[2].result.as_ref().unwrap().1.is_empty());
    let (generation, steps) = dry[1].result.as_ref().unwrap();
    assert_eq!(*generation, 2);
    assert!(
        steps.iter().any(|s| matches!(s, PlanStep::Update { .. })),
        "{steps:?}"
    );
    assert!(server.writes().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_the_cluster_does_not_know_fails_alone() {
    let server = ApiServer::start("v1.35.0");
    let nodes = fleet(2);
    server.add_node(&nodes[0].node, "uid-0");
    let c = client(&server).await;
    let (_, done) = publish_nodes(
        &c,
        &nodes,
        &SliceOptions::default(),
        &BTreeMap::new(),
        false,
        2,
    )
    .await
    .unwrap();
    assert!(done[0].result.is_ok());
    assert!(
        matches!(&done[1].result, Err(KubeError::Invalid(m)) if m.contains("no Node gpu-node-0001")),
        "{:?}",
        done[1].result
    );
    assert!(
        server
            .slices()
            .values()
            .all(|s| s["spec"]["nodeName"] == "gpu-node-0000")
    );
    check_all(&server, K8sVersion::V1_35);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fleet_is_published_with_one_list_per_pool_and_a_bounded_number_of_requests_in_flight() {
    let server = ApiServer::start("v1.36.2");
    let nodes = fleet(12);
    for (i, n) in nodes.iter().enumerate() {
        server.add_node(&n.node, &format!("uid-{i}"));
    }
    let c = KubeClient::connect(&ClientOptions {
        kubeconfig: Some(server.kubeconfig()),
        timeout: Duration::from_secs(20),
        max_in_flight: 4,
        ..ClientOptions::default()
    })
    .await
    .unwrap();
    assert_eq!(c.max_in_flight(), 4);
    let (_, done) = publish_nodes(
        &c,
        &nodes,
        &SliceOptions::default(),
        &BTreeMap::new(),
        false,
        6,
    )
    .await
    .unwrap();
    assert!(done.iter().all(|r| r.result.is_ok()));
    let pools = server.pools();
    assert_eq!(pools.len(), 12);
    assert!(pools.values().all(|g| g.len() == 1 && g.contains(&1)));
    // Per node: its Node read, one list of its pool, one create per slice; nothing else.
    let asked = server.requests();
    let per_node = server.slice_count() / 12;
    for n in &nodes {
        let mine: Vec<_> = asked
            .iter()
            .filter(|r| r.path.ends_with(&n.node) || r.query.contains(&n.node))
            .collect();
        assert_eq!(mine.len(), 2, "{}: {mine:?}", n.node);
    }
    let creates = asked.iter().filter(|r| r.method == "POST").count();
    assert_eq!(creates, 12 * per_node);
    assert_eq!(
        asked.len(),
        2 + 12 * (2 + per_node),
        "/version and /apis once"
    );
    // The writes overlap, and never more than the client's bound.
    let peak = server.peak_in_flight();
    assert!((2..=4).contains(&peak), "peak {peak}");
}

/// 1,000 nodes' pools from a fleet file are 5,000 slices, 143 MB of JSON. The 10 s target holds for an optimized
/// build (`cargo test --release -p gpu-agent --test kube_fleet`; the `publish` bench measures the
/// same); a debug build, where serde is some ten times slower, gets 120 s (about 20 s on a quiet
/// 2-core machine, 36 s on one loaded by five builds).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_thousand_h200_nodes_are_published_in_time() {
    let server = ApiServer::start("v1.36.2");
    // The fleet file as `Fleet::to_text` writes it (the compact form: the H200 host's shape once,
    // referenced by every node), read back inside the clock as `dra publish --inventory` reads it.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("fleet.json");
    let written = gpu_core::Fleet {
        nodes: fleet(1000),
        ..gpu_core::Fleet::default()
    };
    std::fs::write(&path, written.to_text(true).unwrap()).unwrap();
    for (i, n) in written.nodes.iter().enumerate() {
        server.add_node(&n.node, &format!("uid-{i}"));
    }
    let c = client(&server).await;
    let t = Instant::now();
    let file = std::io::BufReader::new(std::fs::File::open(&path).unwrap());
    let (read, _) =
        gpu_core::Fleet::from_reader_max(file, gpu_core::limits::MAX_DOCUMENT_BYTES).unwrap();
    let nodes = read.nodes;
    assert_eq!(nodes, written.nodes);
    let (_, done) = publish_nodes(
        &c,
        &nodes,
        &SliceOptions::default(),
        &BTreeMap::new(),
        false,
        16,
    )
    .await
    .unwrap();
    let took = t.elapsed();
    let failed: Vec<_> = done
        .iter()
        .filter_map(|r| r.result.as_ref().err())
        .collect();
    assert!(
        failed.is_empty(),
        "{} failed, first {:?}",
        failed.len(),
        failed.first()
    );
    let pools = server.pools();
    assert_eq!(pools.len(), 1000);
    assert!(pools.values().all(|g| g.len() == 1));
    eprintln!(
        "1,000 H200 nodes' pools ({} slices) published in {:.2} s (the stand-in under its lock {:?}, at most {} requests at once)",
        server.slice_count(),
        took.as_secs_f64(),
        server.busy(),
        server.peak_in_flight(),
    );
    let limit = Duration::from_secs(if cfg!(debug_assertions) { 120 } else { 10 });
    assert!(took < limit, "{took:?}");
}
