//! The layout config named by a node label (`--config-label nvidia.com/vgpu.config`), against
//! the API-server stand-in: a label that is set is applied, a changed label is applied again,
//! and a label naming a config the layout file lacks is refused with an event, nothing changed.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod apiserver;
mod support;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use apiserver::ApiServer;
use gpu_agent::EventKind;
use gpu_agent::kube::node_label::{self, ConfigLabel, NVIDIA_CONFIG_LABEL};
use gpu_agent::kube::{ClientOptions, KubeClient};
use gpu_sysfs::testing::FakeKernel;
use support::{get, start, wait_event};

const SOON: Duration = Duration::from_secs(10);

fn mdevs(socket: &Path) -> usize {
    get(socket, "/v1/vgpus").json()["mdevs"]
        .as_array()
        .map_or(0, Vec::len)
}

fn label(server: &ApiServer, value: Option<&str>) {
    let mut s = server.state.lock().unwrap();
    let node = s.nodes.get_mut("node-a").unwrap();
    node["metadata"]["labels"] = match value {
        Some(v) => serde_json::json!({ NVIDIA_CONFIG_LABEL: v, "kubernetes.io/os": "linux" }),
        None => serde_json::json!({ "kubernetes.io/os": "linux" }),
    };
}

const LAYOUT: &str = "version: v1\nvgpu-configs:\n  two:\n    mbochs: {mbochs-small: 2}\n  three:\n    mbochs: {mbochs-small: 3}\n";

fn applied_after(a: &support::Running, after: u64) -> gpu_agent::Event {
    wait_event(&a.agent, SOON, |e| {
        e.kind == EventKind::LayoutApplied && e.revision > after
    })
    .expect("a layout-applied event")
}

#[test]
fn the_config_the_node_label_names_is_applied_and_applied_again_when_the_label_changes() {
    let server = ApiServer::start("v1.35.0");
    server.add_node("node-a", "0a1b2c3d-0000-4000-8000-000000000001");
    label(&server, Some("two"));
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("layout.yaml");
    std::fs::write(&file, LAYOUT).unwrap();
    let k = Arc::new(FakeKernel::sample_mdev_drivers().unwrap());
    let a = start(Arc::clone(&k));

    let rt = tokio::runtime::Runtime::new().unwrap();
    let client = rt
        .block_on(KubeClient::connect(&ClientOptions {
            kubeconfig: Some(server.kubeconfig()),
            ..ClientOptions::default()
        }))
        .unwrap();
    let mut watch = ConfigLabel::new(NVIDIA_CONFIG_LABEL);
    watch.poll = Duration::from_millis(50);
    let _task = {
        let _in = rt.enter();
        node_label::spawn(
            Arc::clone(&a.agent),
            client,
            "node-a".into(),
            file.clone(),
            watch,
        )
    };

    let first = applied_after(&a, 0);
    assert_eq!(first.data["status"], "applied", "{}", first.data);
    assert!(
        first.data["source"]
            .as_str()
            .unwrap()
            .contains("nvidia.com/vgpu.config=two"),
        "{}",
        first.data
    );
    assert_eq!(mdevs(&a.socket), 2);
    assert!(
        server
            .requests()
            .iter()
            .any(|r| r.method == "GET" && r.path == "/api/v1/nodes/node-a"),
        "the Node is read"
    );

    label(&server, Some("three"));
    let second = applied_after(&a, first.revision);
    assert_eq!(second.data["status"], "applied", "{}", second.data);
    assert_eq!(mdevs(&a.socket), 3);

    // A config the file lacks: refused with an event naming it, the host unchanged.
    let before = gpu_sysfs::testing::snapshot(k.root()).unwrap();
    label(&server, Some("seven"));
    let refused = wait_event(&a.agent, SOON, |e| {
        e.kind == EventKind::LayoutRefused && e.revision > second.revision
    })
    .expect("a layout-refused event");
    let m = refused.data["message"].as_str().unwrap();
    assert!(
        m.contains("\"seven\"") && m.contains(NVIDIA_CONFIG_LABEL),
        "{m}"
    );
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(mdevs(&a.socket), 3);
    assert_eq!(
        gpu_sysfs::testing::snapshot(k.root()).unwrap(),
        before,
        "nothing written"
    );
    assert!(
        wait_event(&a.agent, Duration::from_millis(1), |e| {
            e.kind == EventKind::LayoutApplied && e.revision > second.revision
        })
        .is_none()
    );

    // The label taken away: refused again, still nothing changed.
    label(&server, None);
    let gone = wait_event(&a.agent, SOON, |e| {
        e.kind == EventKind::LayoutRefused && e.revision > refused.revision
    })
    .expect("a layout-refused event for the missing label");
    assert!(
        gone.data["message"]
            .as_str()
            .unwrap()
            .contains("has no label"),
        "{}",
        gone.data
    );
    assert_eq!(mdevs(&a.socket), 3);
    drop(rt);
    a.stop();
}

#[test]
fn a_config_label_without_a_layout_file_or_not_a_label_key_is_refused_before_anything_starts() {
    let k = FakeKernel::sample_mdev_drivers().unwrap();
    let mut config = gpu_agent::DaemonConfig::new("node-a", k.root());
    config.config_label = Some(ConfigLabel::new(NVIDIA_CONFIG_LABEL));
    let e = gpu_agent::Daemon::open(config.clone()).unwrap_err();
    assert!(
        matches!(e, gpu_agent::DaemonError::ConfigLabelWithoutLayout(_)),
        "{e}"
    );
    assert!(e.to_string().contains("--layout"), "{e}");
    config.config_label = Some(ConfigLabel::new("nvidia.com/vgpu config"));
    let e = gpu_agent::Daemon::open(config).unwrap_err();
    assert!(
        gpu_core::error_chain(&e).contains("not a Kubernetes label key"),
        "{e}"
    );
}
