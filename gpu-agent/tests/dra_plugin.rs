//! The kubelet plugin over its real unix sockets, on the fake kernel, with claims read from a
//! fake API server ([`MemoryClaims`]): registration, prepare and unprepare in v1 and v1beta1 (CDI
//! spec and KubeVirt metadata on disk), every bad claim answered with nothing changed, the
//! health stream, and both sockets gone after shutdown.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use gpu_agent::claims::MemoryClaims;
use gpu_agent::dra::proto::{dra_v1, dra_v1beta1, health_v1alpha1, registration};
use gpu_agent::dra::{DraConfig, DraPlugin};
use gpu_agent::{Agent, AgentConfig, EventKind};
use gpu_sysfs::Host as _;
use gpu_sysfs::testing::FakeKernel;
use serde_json::{Value, json};
use tonic::transport::Channel;

const DRIVER: &str = "gpu.gpuslice.dev";
const NODE: &str = "node-a";
const VGPU: &str = "vgpu-0000-08-00-0-4096mi";

fn claim(name: &str, uid: &str, pool: &str, device: &str, parameters: Value) -> Value {
    json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "default", "uid": uid},
        "spec": {"devices": {"requests": [{"name": "vgpu", "exactly": {"deviceClassName": "vgpu.gpuslice.dev"}}]}},
        "status": {"allocation": {"devices": {
            "results": [{"request": "vgpu", "driver": DRIVER, "pool": pool, "device": device}],
            "config": [{"source": "FromClaim", "requests": ["vgpu"],
                        "opaque": {"driver": DRIVER, "parameters": parameters}}],
        }}},
    })
}

fn a2_4q() -> Value {
    json!({"apiVersion": "gpu.gpuslice.dev/v1", "kind": "VgpuConfig", "profile": "A2-4Q"})
}

struct Plugin {
    kubelet: PathBuf,
    cdi: PathBuf,
    root: PathBuf,
    claims: Arc<MemoryClaims>,
    agent: Arc<Agent>,
    rt: tokio::runtime::Runtime,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    served: Option<tokio::task::JoinHandle<std::io::Result<()>>>,
    _dir: tempfile::TempDir,
}

fn start(kernel: FakeKernel) -> Plugin {
    let dir = tempfile::tempdir().unwrap();
    let root = kernel.root_dir().unwrap().to_path_buf();
    let kernel = Arc::new(kernel);
    let mut config = AgentConfig::new(NODE);
    config.lock_timeout = Duration::from_secs(20);
    let agent = Agent::open(kernel, config).unwrap();
    let claims = Arc::new(MemoryClaims::default());
    let dra = DraConfig {
        driver: DRIVER.to_owned(),
        kubelet_dir: dir.path().join("kubelet"),
        cdi_dir: dir.path().join("cdi"),
    };
    let plugin = DraPlugin::new(Arc::clone(&agent), claims.clone(), dra).unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let served = rt.spawn(gpu_agent::dra::serve(plugin, async move {
        let _ = rx.await;
    }));
    let reg = dir
        .path()
        .join("kubelet/plugins_registry/gpu.gpuslice.dev-reg.sock");
    for _ in 0..200 {
        if reg.exists() {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    Plugin {
        kubelet: dir.path().join("kubelet"),
        cdi: dir.path().join("cdi"),
        root,
        claims,
        agent,
        rt,
        stop: Some(tx),
        served: Some(served),
        _dir: dir,
    }
}

impl Plugin {
    fn registration_socket(&self) -> PathBuf {
        self.kubelet
            .join("plugins_registry/gpu.gpuslice.dev-reg.sock")
    }
    fn endpoint(&self) -> PathBuf {
        self.kubelet.join("plugins/gpu.gpuslice.dev/dra.sock")
    }
    fn channel(&self, path: &Path) -> Channel {
        self.rt
            .block_on(support::plugin_channel(path.to_path_buf()))
    }
    fn prepare_v1(&self, claims: &[(&str, &str)]) -> dra_v1::NodePrepareResourcesResponse {
        let mut c = dra_v1::dra_plugin_client::DraPluginClient::new(self.channel(&self.endpoint()));
        let req = dra_v1::NodePrepareResourcesRequest {
            claims: claims
                .iter()
                .map(|(name, uid)| dra_v1::Claim {
                    namespace: "default".into(),
                    uid: (*uid).into(),
                    name: (*name).into(),
                })
                .collect(),
        };
        self.rt
            .block_on(c.node_prepare_resources(req))
            .unwrap()
            .into_inner()
    }
    fn unprepare_v1(&self, name: &str, uid: &str) -> String {
        let mut c = dra_v1::dra_plugin_client::DraPluginClient::new(self.channel(&self.endpoint()));
        let req = dra_v1::NodeUnprepareResourcesRequest {
            claims: vec![dra_v1::Claim {
                namespace: "default".into(),
                uid: uid.into(),
                name: name.into(),
            }],
        };
        let out = self
            .rt
            .block_on(c.node_unprepare_resources(req))
            .unwrap()
            .into_inner();
        out.claims[uid].error.clone()
    }
    fn mdevs(&self) -> Vec<String> {
        match std::fs::read_dir(self.root.join("sys/bus/mdev/devices")) {
            Ok(d) => d
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect(),
            Err(_) => vec![],
        }
    }
    fn cdi_specs(&self) -> Vec<PathBuf> {
        match std::fs::read_dir(&self.cdi) {
            Ok(d) => d.map(|e| e.unwrap().path()).collect(),
            Err(_) => vec![],
        }
    }
    fn shutdown(mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(h) = self.served.take() {
            self.rt.block_on(h).unwrap().unwrap();
        }
        assert!(
            !self.registration_socket().exists(),
            "registration socket left"
        );
        assert!(!self.endpoint().exists(), "DRA socket left");
    }
}

#[test]
fn the_kubelet_registers_the_plugin_and_is_told_the_endpoint_and_versions() {
    let p = start(FakeKernel::a2_mdev_host().unwrap());
    let mut c = registration::registration_client::RegistrationClient::new(
        p.channel(&p.registration_socket()),
    );
    let info =
        p.rt.block_on(c.get_info(registration::InfoRequest {}))
            .unwrap()
            .into_inner();
    assert_eq!(info.r#type, "DRAPlugin");
    assert_eq!(info.name, DRIVER);
    assert_eq!(info.endpoint, p.endpoint().display().to_string());
    assert_eq!(
        info.supported_versions,
        [
            "v1.DRAPlugin",
            "v1beta1.DRAPlugin",
            "v1alpha1.DRAResourceHealth"
        ]
    );
    p.rt.block_on(
        c.notify_registration_status(registration::RegistrationStatus {
            plugin_registered: true,
            error: String::new(),
        }),
    )
    .unwrap();
    p.shutdown();
}

#[test]
fn a_vgpu_claim_is_prepared_once_with_its_cdi_spec_and_unprepared_to_nothing() {
    let p = start(FakeKernel::a2_mdev_host().unwrap());
    let uid = "6f1c2d3e-0000-4000-8000-00000000a001";
    p.claims
        .put(claim("vm-1-gpu", uid, NODE, VGPU, a2_4q()))
        .unwrap();
    let before = p.mdevs();
    let out = p.prepare_v1(&[("vm-1-gpu", uid)]);
    let answer = &out.claims[uid];
    assert_eq!(answer.error, "");
    let d = &answer.devices[0];
    assert_eq!(d.request_names, ["vgpu"]);
    assert_eq!(d.pool_name, NODE);
    assert_eq!(d.device_name, VGPU);
    assert_eq!(d.cdi_device_ids, [format!("{DRIVER}/vfio={uid}-0")]);
    let made: Vec<_> = p
        .mdevs()
        .into_iter()
        .filter(|m| !before.contains(m))
        .collect();
    assert_eq!(made.len(), 1, "one mdev made");

    let specs = p.cdi_specs();
    assert_eq!(specs.len(), 1);
    let spec: Value = serde_json::from_str(&std::fs::read_to_string(&specs[0]).unwrap()).unwrap();
    assert_eq!(spec["kind"], "gpu.gpuslice.dev/vfio");
    let edits = &spec["devices"][0]["containerEdits"];
    assert_eq!(edits["deviceNodes"][0]["path"], "/dev/vfio/vfio");
    let host = edits["mounts"][0]["hostPath"].as_str().unwrap();
    let meta: Value = serde_json::from_str(&std::fs::read_to_string(host).unwrap()).unwrap();
    assert_eq!(meta["metadata"]["name"], "vm-1-gpu");
    assert_eq!(
        meta["requests"][0]["devices"][0]["attributes"]["mdevUUID"]["string"],
        made[0]
    );

    // A repeat answers the same and writes nothing.
    let modified = std::fs::metadata(&specs[0]).unwrap().modified().unwrap();
    let again = p.prepare_v1(&[("vm-1-gpu", uid)]);
    assert_eq!(again.claims[uid], *answer);
    assert_eq!(p.mdevs().len(), before.len() + 1);
    assert_eq!(
        std::fs::metadata(&specs[0]).unwrap().modified().unwrap(),
        modified
    );

    assert_eq!(p.unprepare_v1("vm-1-gpu", uid), "");
    assert_eq!(p.mdevs(), before);
    assert!(p.cdi_specs().is_empty());
    assert!(!Path::new(host).exists());
    // An unknown claim unprepares without error.
    assert_eq!(p.unprepare_v1("never", "0000-never"), "");
    // The plugin's counters are among the agent's figures (the end of `/metrics`).
    let figures = p.agent.stats().render(0, 0);
    for line in [
        "gpuslice_dra_prepares_total{result=\"ok\"} 2",
        "gpuslice_dra_prepares_total{result=\"error\"} 0",
        "gpuslice_dra_unprepares_total{result=\"ok\"} 2",
    ] {
        assert!(figures.contains(line), "{line} in:\n{figures}");
    }
    p.shutdown();
}

#[test]
fn after_a_prepare_only_the_touched_pool_is_read_again_and_the_snapshot_is_the_hosts() {
    let p = start(FakeKernel::a2_mdev_host().unwrap());
    let uid = "6f1c2d3e-0000-4000-8000-00000000a002";
    p.claims
        .put(claim("vm-2-gpu", uid, NODE, VGPU, a2_4q()))
        .unwrap();
    let narrow = p.agent.stats().narrow_rereads();
    assert_eq!(p.prepare_v1(&[("vm-2-gpu", uid)]).claims[uid].error, "");
    // The mdev's parent and the pool it shares were read again, not the whole host, and the
    // snapshot served is what a full read of the host gives now.
    assert_eq!(p.agent.stats().narrow_rereads(), narrow + 1);
    let served = p.agent.snapshot();
    let (topology, health) =
        gpu_agent::agent::compose_topology(p.agent.host(), p.agent.config()).unwrap();
    assert_eq!(served.topology, topology);
    assert_eq!(served.health, health);
    assert_eq!(
        served
            .topology
            .mediated_devices
            .parents
            .iter()
            .map(|p| p.instances.len())
            .sum::<usize>(),
        1
    );
    // A repeat is answered from the record: nothing is read again, the revision stays.
    assert_eq!(p.prepare_v1(&[("vm-2-gpu", uid)]).claims[uid].error, "");
    assert_eq!(p.agent.stats().narrow_rereads(), narrow + 1);
    assert_eq!(p.agent.snapshot().revision, served.revision);
    // The unprepare reads the pool again too.
    assert_eq!(p.unprepare_v1("vm-2-gpu", uid), "");
    assert_eq!(p.agent.stats().narrow_rereads(), narrow + 2);
    let (topology, _) =
        gpu_agent::agent::compose_topology(p.agent.host(), p.agent.config()).unwrap();
    assert_eq!(p.agent.snapshot().topology, topology);
    p.shutdown();
}

#[test]
fn an_agent_without_the_plugin_serves_no_dra_figures() {
    let agent = Agent::open(
        Arc::new(FakeKernel::a2_mdev_host().unwrap()),
        AgentConfig::new(NODE),
    )
    .unwrap();
    assert!(!agent.stats().render(0, 0).contains("gpuslice_dra_"));
}

#[test]
fn every_bad_claim_of_a_request_is_answered_with_its_error_and_nothing_written() {
    let p = start(FakeKernel::a2_mdev_host().unwrap());
    p.claims
        .put(claim("moved", "uid-new", NODE, VGPU, a2_4q()))
        .unwrap();
    let mut unallocated = claim("pending", "uid-p", NODE, VGPU, a2_4q());
    unallocated.as_object_mut().unwrap().remove("status");
    p.claims.put(unallocated).unwrap();
    p.claims
        .put(claim("far", "uid-f", "node-b", VGPU, a2_4q()))
        .unwrap();
    p.claims
        .put(claim(
            "ghost",
            "uid-g",
            NODE,
            "vgpu-0000-99-00-0-4096mi",
            a2_4q(),
        ))
        .unwrap();
    p.claims
        .put(claim(
            "odd",
            "uid-o",
            NODE,
            VGPU,
            json!({"profile": "A2-4Q", "color": "red"}),
        ))
        .unwrap();
    let before = p.mdevs();
    let out = p.prepare_v1(&[
        ("absent", "uid-a"),
        ("moved", "uid-old"),
        ("pending", "uid-p"),
        ("far", "uid-f"),
        ("ghost", "uid-g"),
        ("odd", "uid-o"),
    ]);
    let expect = [
        ("uid-a", "not found"),
        ("uid-old", "UID changed"),
        ("uid-p", "not allocated"),
        ("uid-f", "is in pool node-b, this node is node-a"),
        ("uid-g", "is not published by any GPU"),
        ("uid-o", "bad opaque parameters"),
    ];
    assert_eq!(out.claims.len(), expect.len(), "every claim answered");
    for (uid, why) in expect {
        let e = &out.claims[uid];
        assert!(e.devices.is_empty());
        assert!(
            e.error.contains(why),
            "{uid}: expected {why:?} in {:?}",
            e.error
        );
    }
    assert_eq!(p.mdevs(), before);
    assert!(p.cdi_specs().is_empty());
    p.shutdown();
}

#[test]
fn a_whole_gpu_claim_over_v1beta1_gets_its_vfio_group_and_pci_bus_id() {
    let p = start(FakeKernel::passthrough_host().unwrap());
    let uid = "6f1c2d3e-0000-4000-8000-00000000b001";
    let mut c = claim("vm-2-gpu", uid, NODE, "gpu-0000-01-00-0", json!({}));
    c["status"]["allocation"]["devices"]["config"] = json!([]);
    p.claims.put(c).unwrap();
    let mut client = dra_v1beta1::dra_plugin_client::DraPluginClient::new(p.channel(&p.endpoint()));
    let out =
        p.rt.block_on(
            client.node_prepare_resources(dra_v1beta1::NodePrepareResourcesRequest {
                claims: vec![dra_v1beta1::Claim {
                    namespace: "default".into(),
                    uid: uid.into(),
                    name: "vm-2-gpu".into(),
                }],
            }),
        )
        .unwrap()
        .into_inner();
    let answer = &out.claims[uid];
    assert_eq!(answer.error, "");
    assert_eq!(answer.devices[0].device_name, "gpu-0000-01-00-0");
    let spec: Value =
        serde_json::from_str(&std::fs::read_to_string(&p.cdi_specs()[0]).unwrap()).unwrap();
    let edits = &spec["devices"][0]["containerEdits"];
    assert_eq!(edits["deviceNodes"][1]["path"], "/dev/vfio/1");
    let host = edits["mounts"][0]["hostPath"].as_str().unwrap();
    let meta: Value = serde_json::from_str(&std::fs::read_to_string(host).unwrap()).unwrap();
    assert_eq!(
        meta["requests"][0]["devices"][0]["attributes"]["resource.kubernetes.io/pciBusID"]["string"],
        "0000:01:00.0"
    );
    let driver =
        std::fs::read_link(p.root.join("sys/bus/pci/devices/0000:01:00.0/driver")).unwrap();
    assert!(driver.ends_with("vfio-pci"), "{}", driver.display());
    let out =
        p.rt.block_on(client.node_unprepare_resources(
            dra_v1beta1::NodeUnprepareResourcesRequest {
                claims: vec![dra_v1beta1::Claim {
                    namespace: "default".into(),
                    uid: uid.into(),
                    name: "vm-2-gpu".into(),
                }],
            },
        ))
        .unwrap()
        .into_inner();
    assert_eq!(out.claims[uid].error, "");
    assert!(p.cdi_specs().is_empty());
    p.shutdown();
}

#[test]
fn the_health_stream_lists_every_device_and_is_sent_again_on_an_agent_event() {
    let p = start(FakeKernel::a2_mdev_host().unwrap());
    let mut c = health_v1alpha1::dra_resource_health_client::DraResourceHealthClient::new(
        p.channel(&p.endpoint()),
    );
    let mut stream =
        p.rt.block_on(c.node_watch_resources(health_v1alpha1::NodeWatchResourcesRequest {}))
            .unwrap()
            .into_inner();
    let first = p
        .rt
        .block_on(async { tokio::time::timeout(Duration::from_secs(5), stream.message()).await })
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(
        first
            .devices
            .iter()
            .any(|d| d.device.as_ref().unwrap().device_name == VGPU),
        "{first:?}"
    );
    for d in &first.devices {
        assert_eq!(d.device.as_ref().unwrap().pool_name, NODE);
        assert!(!d.message.is_empty() && d.message.len() <= 1024);
        assert!(d.health_check_timeout_seconds > 0);
    }
    let started = std::time::Instant::now();
    p.agent
        .events()
        .publish(EventKind::HealthChanged, json!({"gpu": "0000:08:00.0"}));
    let next = p
        .rt
        .block_on(async { tokio::time::timeout(Duration::from_secs(1), stream.message()).await })
        .expect("resent within 1 s")
        .unwrap()
        .unwrap();
    assert!(started.elapsed() < Duration::from_secs(1));
    assert_eq!(next.devices.len(), first.devices.len());
    drop(stream);
    p.shutdown();
}

#[test]
fn a_stale_socket_from_a_crashed_run_is_replaced() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("plugins_registry/x-reg.sock");
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    // A socket nobody serves any more.
    drop(std::os::unix::net::UnixListener::bind(&path).unwrap());
    assert!(path.exists());
    let rt = tokio::runtime::Runtime::new().unwrap();
    let bound = rt
        .block_on(async { gpu_agent::dra::socket::bind(&path) })
        .unwrap();
    // One still served is refused.
    let e = rt
        .block_on(async { gpu_agent::dra::socket::bind(&path) })
        .unwrap_err();
    assert!(e.to_string().contains("another process"), "{e}");
    drop(bound);
    assert!(!path.exists());
    // A file that is not a socket is left alone.
    std::fs::write(&path, "x").unwrap();
    let e = rt
        .block_on(async { gpu_agent::dra::socket::bind(&path) })
        .unwrap_err();
    assert!(e.to_string().contains("not a socket"), "{e}");
}

#[test]
fn an_unprepare_while_a_vm_holds_the_device_is_refused_and_changes_nothing() {
    let p = start(FakeKernel::passthrough_host().unwrap());
    let uid = "6f1c2d3e-0000-4000-8000-00000000c001";
    let mut c = claim("vm-3-gpu", uid, NODE, "gpu-0000-01-00-0", json!({}));
    c["status"]["allocation"]["devices"]["config"] = json!([]);
    p.claims.put(c).unwrap();
    assert_eq!(p.prepare_v1(&[("vm-3-gpu", uid)]).claims[uid].error, "");
    // A VM (a process of the fake host) opens the group's node.
    let fd = p.root.join("proc/4242/fd");
    std::fs::create_dir_all(&fd).unwrap();
    std::fs::write(p.root.join("proc/4242/comm"), "qemu-kvm\n").unwrap();
    std::os::unix::fs::symlink("/dev/vfio/1", fd.join("7")).unwrap();
    let e = p.unprepare_v1("vm-3-gpu", uid);
    assert!(e.contains("in use") && e.contains("qemu-kvm"), "{e}");
    let driver =
        std::fs::read_link(p.root.join("sys/bus/pci/devices/0000:01:00.0/driver")).unwrap();
    assert!(driver.ends_with("vfio-pci"), "still handed over");
    assert_eq!(p.cdi_specs().len(), 1, "its CDI spec kept");
    // Once the VM is gone, the kubelet's retry finishes it.
    std::fs::remove_dir_all(p.root.join("proc/4242")).unwrap();
    assert_eq!(p.unprepare_v1("vm-3-gpu", uid), "");
    assert!(p.cdi_specs().is_empty());
    p.shutdown();
}
