//! The agent keeps its node's ResourceSlices true in an API server stand-in on loopback: the
//! first publish, changes made behind its back (an mdev by hand, a GPU turning Unhealthy, a GPU
//! removed), an unchanged revision, a conflict, an outage, and the encodings of 1.35 and 1.36.2.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod apiserver;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use apiserver::{ApiServer, SLICES};
use gpu_agent::kube::{ClientOptions, KubeClient, KubeError, PublishOptions, spawn_publisher};
use gpu_agent::{Agent, AgentConfig, EventKind};
use gpu_integrations::dra::build::node_slices;
use gpu_integrations::dra::{DraOptions, K8sVersion, model, rules};
use gpu_sysfs::Host as _;
use gpu_sysfs::testing::FakeKernel;
use serde_json::{Value, json};

const NODE_UID: &str = "0b3c8f4e-1111-4222-8333-444455556666";
const DRIVER: &str = "gpu.gpuslice.dev";
const U1: &str = "6f1a2b3c-0000-4000-8000-000000000001";
const SOON: Duration = Duration::from_secs(10);
const FATAL: &str = "Undefined 0\nDLP 0\nSDES 0\nTLP 0\nFCP 0\nCmpltTO 0\nCmpltAbrt 0\nUnxCmplt 0\nRxOF 0\nMalfTLP 1\nECRC 0\nUnsupReq 0\nACSViol 0\nTOTAL_ERR_FATAL 1\n";

fn fast() -> PublishOptions {
    PublishOptions {
        min_interval: Duration::from_millis(100),
        backoff: Duration::from_millis(50),
        max_backoff: Duration::from_millis(400),
        ..PublishOptions::default()
    }
}

async fn client(server: &ApiServer) -> KubeClient {
    KubeClient::connect(&ClientOptions {
        kubeconfig: Some(server.kubeconfig()),
        timeout: Duration::from_secs(2),
    })
    .await
    .unwrap()
}

fn agent(kernel: Arc<FakeKernel>) -> Arc<Agent> {
    let mut config = AgentConfig::new("node-a");
    config.metrics = true;
    Agent::open(kernel, config).unwrap()
}

async fn refresh(agent: &Arc<Agent>) {
    let a = Arc::clone(agent);
    tokio::task::spawn_blocking(move || a.refresh().unwrap())
        .await
        .unwrap();
}

async fn wait_for(what: &str, mut f: impl FnMut() -> bool) {
    let t = Instant::now();
    while !f() {
        assert!(t.elapsed() < SOON, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

fn generation(slices: &BTreeMap<String, Value>) -> i64 {
    let gens: Vec<i64> = slices
        .values()
        .map(|s| s["spec"]["pool"]["generation"].as_i64().unwrap())
        .collect();
    assert!(gens.windows(2).all(|w| w[0] == w[1]), "{gens:?}");
    gens.first().copied().unwrap_or(0)
}

/// Every stored slice is consistent (one generation, the right count, owned by the node) and
/// passes `gpuslice dra check` for `version`.
fn assert_valid(slices: &BTreeMap<String, Value>, version: K8sVersion) {
    assert!(!slices.is_empty());
    let count = slices.len() as i64;
    for s in slices.values() {
        assert_eq!(s["spec"]["pool"]["resourceSliceCount"], count, "{s}");
        assert_eq!(s["spec"]["pool"]["name"], "node-a");
        assert_eq!(s["spec"]["nodeName"], "node-a");
        assert_eq!(s["spec"]["driver"], DRIVER);
        assert_eq!(
            s["metadata"]["ownerReferences"],
            json!([{"apiVersion": "v1", "kind": "Node", "name": "node-a", "uid": NODE_UID, "controller": true}])
        );
    }
    generation(slices);
    let list =
        json!({"kind": "List", "apiVersion": "v1", "items": slices.values().collect::<Vec<_>>()});
    let parsed = model::parse_slices(&list.to_string()).unwrap();
    let violations = rules::check(&parsed, version);
    assert!(violations.is_empty(), "{violations:#?}");
}

/// What the same library call as `export dra` gives for the agent's host (generation aside).
fn expected_specs(agent: &Agent, version: K8sVersion) -> BTreeMap<String, Value> {
    let snap = agent.snapshot();
    let opts = DraOptions {
        version,
        ..DraOptions::default()
    };
    node_slices(&snap.topology, &opts)
        .unwrap()
        .slices
        .into_iter()
        .map(|s| {
            let mut spec = serde_json::to_value(&s.spec).unwrap();
            spec["pool"]["generation"] = json!(0);
            (s.metadata.name, spec)
        })
        .collect()
}

fn stored_specs(server: &ApiServer) -> BTreeMap<String, Value> {
    server
        .slices()
        .into_iter()
        .map(|(n, s)| {
            let mut spec = s["spec"].clone();
            spec["pool"]["generation"] = json!(0);
            (n, spec)
        })
        .collect()
}

fn framebuffer(slices: &BTreeMap<String, Value>) -> String {
    slices
        .values()
        .flat_map(|s| {
            s["spec"]["sharedCounters"]
                .as_array()
                .cloned()
                .unwrap_or_default()
        })
        .map(|c| {
            c["counters"]["framebuffer"]["value"]
                .as_str()
                .unwrap()
                .to_owned()
        })
        .next()
        .expect("a framebuffer counter")
}

fn taints(slices: &BTreeMap<String, Value>) -> Vec<String> {
    slices
        .values()
        .flat_map(|s| s["spec"]["devices"].as_array().cloned().unwrap_or_default())
        .flat_map(|d| d["taints"].as_array().cloned().unwrap_or_default())
        .map(|t| {
            format!(
                "{}:{}",
                t["key"].as_str().unwrap(),
                t["effect"].as_str().unwrap()
            )
        })
        .collect()
}

fn make_mdev_by_hand(k: &FakeKernel) {
    // Behind the agent's back, as `echo UUID > create` would: capacity taken outside Kubernetes.
    k.write(
        "sys/class/mdev_bus/0000:08:00.4/mdev_supported_types/nvidia-746/create",
        U1.as_bytes(),
    )
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_first_publish_creates_the_pool_owned_by_the_node_and_passes_the_checks() {
    let server = ApiServer::start("v1.36.2");
    server.add_node("node-a", NODE_UID);
    let a = agent(Arc::new(FakeKernel::a2_mdev_host().unwrap()));
    let p = spawn_publisher(Arc::clone(&a), client(&server).await, fast())
        .await
        .unwrap();
    assert_eq!(p.server.as_ref().unwrap().version.to_string(), "1.36.2");
    wait_for("the first slices", || a.stats().slice_generation() == 1).await;
    let slices = server.slices();
    assert_valid(&slices, K8sVersion::V1_36_2);
    assert_eq!(generation(&slices), 1);
    assert_eq!(
        stored_specs(&server),
        expected_specs(&a, K8sVersion::V1_36_2)
    );
    let writes = server.writes();
    assert_eq!(
        writes.len(),
        slices.len(),
        "one create per slice: {writes:?}"
    );
    assert!(
        writes
            .iter()
            .all(|w| w.method == "POST" && w.path == SLICES)
    );
    // The list asked for this driver's slices of this node only.
    let list = server
        .requests()
        .into_iter()
        .find(|r| r.method == "GET" && r.path == SLICES)
        .unwrap();
    assert!(
        list.query.contains("spec.driver%3Dgpu.gpuslice.dev"),
        "{}",
        list.query
    );
    assert!(
        list.query.contains("spec.nodeName%3Dnode-a"),
        "{}",
        list.query
    );
    let (text, _) = a.metrics_text().unwrap().unwrap();
    assert!(
        text.contains(&format!(
            "gpuslice_agent_slices_published_total {}",
            slices.len()
        )),
        "{text}"
    );
    assert!(text.contains("gpuslice_agent_slice_generation 1"));
    assert!(text.contains("gpuslice_agent_slice_publish_failures_total 0"));
    assert!(text.contains("gpuslice_agent_slice_publish_latency_seconds_count 1"));
    p.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_mdev_made_by_hand_shrinks_the_counters_in_a_new_generation() {
    let server = ApiServer::start("v1.36.2");
    server.add_node("node-a", NODE_UID);
    let k = Arc::new(FakeKernel::a2_mdev_host().unwrap());
    let a = agent(Arc::clone(&k));
    let p = spawn_publisher(Arc::clone(&a), client(&server).await, fast())
        .await
        .unwrap();
    wait_for("the first slices", || a.stats().slice_generation() == 1).await;
    let before = framebuffer(&server.slices());
    make_mdev_by_hand(&k);
    refresh(&a).await;
    wait_for("generation 2", || a.stats().slice_generation() == 2).await;
    let after = server.slices();
    assert_eq!(generation(&after), 2);
    assert_valid(&after, K8sVersion::V1_36_2);
    assert_ne!(framebuffer(&after), before, "the counters shrink");
    assert_eq!(
        stored_specs(&server),
        expected_specs(&a, K8sVersion::V1_36_2)
    );
    p.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gpu_turning_unhealthy_is_tainted() {
    let server = ApiServer::start("v1.36.2");
    server.add_node("node-a", NODE_UID);
    let k = Arc::new(FakeKernel::a2_mdev_host().unwrap());
    let a = agent(Arc::clone(&k));
    let p = spawn_publisher(Arc::clone(&a), client(&server).await, fast())
        .await
        .unwrap();
    wait_for("the first slices", || a.stats().slice_generation() == 1).await;
    assert!(taints(&server.slices()).is_empty());
    std::fs::write(
        k.root()
            .join("sys/bus/pci/devices/0000:08:00.0/aer_dev_fatal"),
        FATAL,
    )
    .unwrap();
    refresh(&a).await;
    wait_for("generation 2", || a.stats().slice_generation() == 2).await;
    let slices = server.slices();
    assert_valid(&slices, K8sVersion::V1_36_2);
    let t = taints(&slices);
    assert!(!t.is_empty());
    assert!(
        t.iter()
            .all(|t| t == "gpu.gpuslice.dev/unhealthy:NoSchedule"),
        "{t:?}"
    );
    p.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gpu_removed_takes_its_devices_out_and_an_unchanged_revision_writes_nothing() {
    let server = ApiServer::start("v1.36.2");
    server.add_node("node-a", NODE_UID);
    let tree = gpu_sysfs::testing::fixtures::h200_host(&[]).unwrap();
    let k = Arc::new(FakeKernel::new(tree).unwrap());
    let a = agent(Arc::clone(&k));
    let p = spawn_publisher(Arc::clone(&a), client(&server).await, fast())
        .await
        .unwrap();
    wait_for("the first slices", || a.stats().slice_generation() == 1).await;
    assert_valid(&server.slices(), K8sVersion::V1_36_2);
    let gone = gpu_sysfs::testing::fixtures::h200_pf(7);
    let has_gone = |server: &ApiServer| {
        server
            .slices()
            .values()
            .any(|s| s.to_string().contains(&gone))
    };
    assert!(has_gone(&server));

    // A revision that changes nothing in the slices: no request at all.
    server.clear_requests();
    a.events().publish(EventKind::LayoutApplied, json!({}));
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(server.requests().is_empty(), "{:?}", server.requests());

    // The GPU and its VFs leave the bus.
    let devices = k.root().join("sys/bus/pci/devices");
    for n in 0..16 {
        std::fs::remove_file(devices.join(gpu_sysfs::testing::fixtures::h200_vf(7, n))).unwrap();
    }
    std::fs::remove_file(devices.join(&gone)).unwrap();
    refresh(&a).await;
    wait_for("generation 2", || a.stats().slice_generation() == 2).await;
    assert!(!has_gone(&server));
    assert_valid(&server.slices(), K8sVersion::V1_36_2);
    assert_eq!(
        stored_specs(&server),
        expected_specs(&a, K8sVersion::V1_36_2)
    );
    p.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resync_with_nothing_changed_lists_and_writes_nothing() {
    let server = ApiServer::start("v1.36.2");
    server.add_node("node-a", NODE_UID);
    let a = agent(Arc::new(FakeKernel::a2_mdev_host().unwrap()));
    let opts = PublishOptions {
        resync: Duration::from_millis(150),
        ..fast()
    };
    let p = spawn_publisher(Arc::clone(&a), client(&server).await, opts)
        .await
        .unwrap();
    wait_for("the first slices", || a.stats().slice_generation() == 1).await;
    server.clear_requests();
    wait_for("two resyncs", || {
        server
            .requests()
            .iter()
            .filter(|r| r.method == "GET" && r.path == SLICES)
            .count()
            >= 2
    })
    .await;
    assert!(server.writes().is_empty(), "{:?}", server.writes());
    assert_eq!(generation(&server.slices()), 1);

    // A slice deleted by someone else is put back on the next resync.
    let victim = server.slices().keys().next().unwrap().clone();
    server.state.lock().unwrap().slices.remove(&victim);
    wait_for("the slice back in generation 2", || {
        let s = server.slices();
        s.contains_key(&victim) && s.values().all(|v| v["spec"]["pool"]["generation"] == 2)
    })
    .await;
    let slices = server.slices();
    assert_eq!(generation(&slices), 2);
    assert_valid(&slices, K8sVersion::V1_36_2);
    p.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_conflict_on_update_re_reads_and_wins() {
    let server = ApiServer::start("v1.36.2");
    server.add_node("node-a", NODE_UID);
    let k = Arc::new(FakeKernel::a2_mdev_host().unwrap());
    let a = agent(Arc::clone(&k));
    let p = spawn_publisher(Arc::clone(&a), client(&server).await, fast())
        .await
        .unwrap();
    wait_for("the first slices", || a.stats().slice_generation() == 1).await;
    // Someone else writes the slice between the publisher's list and its update.
    server.state.lock().unwrap().before_put = Some(Box::new(|slices, rv| {
        for s in slices.values_mut() {
            *rv += 1;
            s["metadata"]["labels"] = json!({"someone": "else"});
            s["metadata"]["resourceVersion"] = json!(rv.to_string());
        }
    }));
    server.clear_requests();
    make_mdev_by_hand(&k);
    refresh(&a).await;
    wait_for("generation 2", || a.stats().slice_generation() == 2).await;
    let asked: Vec<String> = server
        .requests()
        .iter()
        .map(|r| format!("{} {}", r.method, r.path))
        .collect();
    let lists = asked
        .iter()
        .filter(|r| *r == &format!("GET {SLICES}"))
        .count();
    assert!(lists >= 2, "listed again after the conflict: {asked:?}");
    let slices = server.slices();
    assert_valid(&slices, K8sVersion::V1_36_2);
    assert!(
        slices
            .values()
            .all(|s| s["metadata"].get("labels").is_none()),
        "ours won"
    );
    assert_eq!(
        stored_specs(&server),
        expected_specs(&a, K8sVersion::V1_36_2)
    );
    p.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forbidden_write_is_retried_and_counted_as_a_failure() {
    let server = ApiServer::start("v1.36.2");
    server.add_node("node-a", NODE_UID);
    server.fail("POST", SLICES, 403, 2);
    let a = agent(Arc::new(FakeKernel::a2_mdev_host().unwrap()));
    let p = spawn_publisher(Arc::clone(&a), client(&server).await, fast())
        .await
        .unwrap();
    wait_for("the slices after the refusals", || {
        a.stats().slice_generation() >= 1
    })
    .await;
    assert_eq!(a.stats().slice_publish_failures(), 2);
    assert_valid(&server.slices(), K8sVersion::V1_36_2);
    p.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_latest_state_is_published_when_the_server_comes_back() {
    let server = ApiServer::start("v1.35.2");
    server.add_node("node-a", NODE_UID);
    let k = Arc::new(FakeKernel::a2_mdev_host().unwrap());
    let a = agent(Arc::clone(&k));
    let p = spawn_publisher(Arc::clone(&a), client(&server).await, fast())
        .await
        .unwrap();
    wait_for("the first slices", || a.stats().slice_generation() == 1).await;
    server.take_down();
    make_mdev_by_hand(&k);
    refresh(&a).await;
    // The agent keeps serving while the server is away.
    let t = Instant::now();
    assert!(a.metrics_text().is_some());
    assert!(t.elapsed() < Duration::from_millis(50));
    wait_for("failed rounds", || a.stats().slice_publish_failures() >= 3).await;
    std::fs::write(
        k.root()
            .join("sys/bus/pci/devices/0000:08:00.0/aer_dev_fatal"),
        FATAL,
    )
    .unwrap();
    refresh(&a).await;
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(
        generation(&server.slices()),
        1,
        "nothing written while away"
    );
    server.bring_up();
    wait_for("generation 2", || a.stats().slice_generation() == 2).await;
    let slices = server.slices();
    assert_valid(&slices, K8sVersion::V1_35);
    assert!(!taints(&slices).is_empty(), "the last change is in");
    assert_eq!(
        stored_specs(&server),
        expected_specs(&a, "1.35.2".parse().unwrap())
    );
    p.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_1_35_and_a_1_36_2_server_get_their_own_encodings() {
    let old = ApiServer::start("v1.35.0");
    let new = ApiServer::start("v1.36.2");
    let mut specs = Vec::new();
    for server in [&old, &new] {
        server.add_node("node-a", NODE_UID);
        let a = agent(Arc::new(FakeKernel::a2_mdev_host().unwrap()));
        let p = spawn_publisher(Arc::clone(&a), client(server).await, fast())
            .await
            .unwrap();
        wait_for("the first slices", || a.stats().slice_generation() == 1).await;
        let version = p.server.as_ref().unwrap().version;
        assert_valid(&server.slices(), version);
        assert_eq!(stored_specs(server), expected_specs(&a, version));
        specs.push((version.encoding(), stored_specs(server)));
        p.stop().await;
    }
    assert_eq!(specs[0].0.as_str(), "one-size-per-instance");
    assert_eq!(specs[1].0.as_str(), "size-lock");
    assert_ne!(specs[0].1, specs[1].1);
    let multi = |s: &BTreeMap<String, Value>| {
        s.values()
            .any(|v| v.to_string().contains("allowMultipleAllocations"))
    };
    assert!(multi(&specs[1].1), "size-lock devices from 1.36.2");
}

#[tokio::test]
async fn an_old_server_or_one_without_resource_v1_is_refused_at_start() {
    let a = agent(Arc::new(FakeKernel::a2_mdev_host().unwrap()));
    let old = ApiServer::start("v1.33.4");
    let err = spawn_publisher(Arc::clone(&a), client(&old).await, fast())
        .await
        .unwrap_err();
    assert!(
        matches!(err, KubeError::Unsupported(ref m) if m.contains("1.34")),
        "{err}"
    );
    let off = ApiServer::start_with("v1.34.1", false);
    let err = spawn_publisher(Arc::clone(&a), client(&off).await, fast())
        .await
        .unwrap_err();
    assert!(
        matches!(err, KubeError::Unsupported(ref m) if m.contains("resource.k8s.io/v1")),
        "{err}"
    );
    assert!(old.writes().is_empty() && off.writes().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_after_a_quiet_spell_on_an_8_gpu_h200_host_is_written_at_once() {
    let server = ApiServer::start("v1.36.2");
    server.add_node("node-a", NODE_UID);
    let tree = gpu_sysfs::testing::fixtures::h200_host(&[]).unwrap();
    let k = Arc::new(FakeKernel::new(tree).unwrap());
    let a = agent(Arc::clone(&k));
    let p = spawn_publisher(
        Arc::clone(&a),
        client(&server).await,
        PublishOptions::default(),
    )
    .await
    .unwrap();
    wait_for("the first slices", || a.stats().slice_generation() == 1).await;
    let mut took = Vec::new();
    for i in 0..5 {
        // A quiet spell longer than the burst interval, then one GPU turns Unhealthy.
        tokio::time::sleep(Duration::from_millis(600)).await;
        let pf = gpu_sysfs::testing::fixtures::h200_pf(i);
        std::fs::write(
            k.root()
                .join(format!("sys/bus/pci/devices/{pf}/aer_dev_fatal")),
            FATAL,
        )
        .unwrap();
        refresh(&a).await;
        let want = 2 + i as u64;
        wait_for("the next generation", || {
            a.stats().slice_generation() == want
        })
        .await;
        took.push(a.stats().slice_latency_last().0);
    }
    took.sort();
    let median = took[took.len() / 2];
    eprintln!(
        "host change to slices written on an 8-GPU H200 host: median {median:?}, all {took:?}"
    );
    assert_valid(&server.slices(), K8sVersion::V1_36_2);
    assert!(!taints(&server.slices()).is_empty());
    // The target is 100 ms; a debug build on a shared 2-core machine gets slack.
    assert!(median < Duration::from_millis(500), "{took:?}");
    p.stop().await;
}
