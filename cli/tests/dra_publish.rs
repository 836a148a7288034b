//! `gpuslice dra publish --inventory FLEET` against the API server stand-in on loopback: the
//! dry run prints the plan and writes nothing, the run creates every node's pool, a second run
//! writes nothing, and a node the cluster does not know fails alone with exit 1.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[path = "../../gpu-agent/tests/apiserver/mod.rs"]
mod apiserver;

use std::process::{Command, Output};
use std::sync::Arc;

use apiserver::ApiServer;
use gpu_sysfs::testing::FakeKernel;

fn gpuslice(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_gpuslice"))
        .args(args)
        .output()
        .unwrap()
}

fn fleet_file(dir: &std::path::Path, names: &[&str]) -> std::path::PathBuf {
    let k = Arc::new(FakeKernel::a2_mdev_host().unwrap());
    let agent = gpu_agent::Agent::open(k, gpu_agent::AgentConfig::new("template")).unwrap();
    let t = agent.snapshot().topology.clone();
    let nodes: Vec<gpu_core::NodeTopology> = names
        .iter()
        .map(|n| {
            let mut node = t.clone();
            node.node = (*n).to_owned();
            node
        })
        .collect();
    let fleet = gpu_core::Fleet {
        nodes,
        ..gpu_core::Fleet::default()
    };
    let path = dir.join("fleet.json");
    std::fs::write(&path, serde_json::to_string(&fleet).unwrap()).unwrap();
    path
}

#[test]
fn a_fleet_is_planned_published_and_then_left_alone() {
    let server = ApiServer::start("v1.36.2");
    server.add_node("node-a", "uid-a");
    server.add_node("node-b", "uid-b");
    let dir = tempfile::tempdir().unwrap();
    let fleet = fleet_file(dir.path(), &["node-a", "node-b"]);
    let kc = server.kubeconfig();
    let (fleet, kc) = (fleet.to_str().unwrap(), kc.to_str().unwrap());

    let dry = gpuslice(&[
        "dra",
        "publish",
        "--kubeconfig",
        kc,
        "--inventory",
        fleet,
        "--dry-run",
    ]);
    let out = String::from_utf8_lossy(&dry.stdout);
    assert!(
        dry.status.success(),
        "{out}{}",
        String::from_utf8_lossy(&dry.stderr)
    );
    assert!(out.starts_with("NODE"), "{out}");
    assert!(
        out.contains("node-a  1") && out.contains("create node-a-gpu.gpuslice.dev-0"),
        "{out}"
    );
    assert!(server.writes().is_empty());

    let run = gpuslice(&[
        "dra",
        "publish",
        "--kubeconfig",
        kc,
        "--inventory",
        fleet,
        "-o",
        "json",
    ]);
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let doc: serde_json::Value = serde_json::from_slice(&run.stdout).unwrap();
    assert_eq!(doc["encoding"], "size-lock");
    assert_eq!(doc["nodes"].as_array().unwrap().len(), 2);
    assert_eq!(doc["nodes"][1]["generation"], 1);
    let written = server.writes().len();
    assert!(written >= 2);
    assert_eq!(server.slices().len(), written);

    server.clear_requests();
    let again = gpuslice(&["dra", "publish", "--kubeconfig", kc, "--inventory", fleet]);
    assert!(again.status.success());
    assert!(String::from_utf8_lossy(&again.stdout).contains("unchanged"));
    assert!(server.writes().is_empty());
}

#[test]
fn a_node_the_cluster_does_not_know_fails_alone_with_exit_1() {
    let server = ApiServer::start("v1.35.0");
    server.add_node("node-a", "uid-a");
    let dir = tempfile::tempdir().unwrap();
    let fleet = fleet_file(dir.path(), &["node-a", "node-x"]);
    let kc = server.kubeconfig();
    let run = gpuslice(&[
        "dra",
        "publish",
        "--kubeconfig",
        kc.to_str().unwrap(),
        "--inventory",
        fleet.to_str().unwrap(),
    ]);
    assert_eq!(run.status.code(), Some(1));
    let out = String::from_utf8_lossy(&run.stdout);
    assert!(
        out.contains("node-x  -") && out.contains("no Node node-x"),
        "{out}"
    );
    assert!(String::from_utf8_lossy(&run.stderr).contains("1 of 2 nodes not published"));
    assert!(
        server
            .slices()
            .values()
            .all(|s| s["spec"]["nodeName"] == "node-a")
    );
}

#[test]
fn an_old_server_is_a_clear_error() {
    let server = ApiServer::start("v1.33.2");
    let dir = tempfile::tempdir().unwrap();
    let fleet = fleet_file(dir.path(), &["node-a"]);
    let kc = server.kubeconfig();
    let run = gpuslice(&[
        "dra",
        "publish",
        "--kubeconfig",
        kc.to_str().unwrap(),
        "--inventory",
        fleet.to_str().unwrap(),
    ]);
    assert!(!run.status.success());
    let err = String::from_utf8_lossy(&run.stderr);
    assert!(err.contains("needs 1.34 or later"), "{err}");
    assert!(server.writes().is_empty());
}
