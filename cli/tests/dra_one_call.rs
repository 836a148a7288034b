//! `gpuslice dra prepare|unprepare` and the kubelet plugin are one call: the same allocated
//! claim prepared through the plugin's gRPC socket and through the CLI with `--cdi-dir`, each on
//! its own sandbox made from the same recording, gives the same devices, the same CDI spec
//! bytes, the same KubeVirt metadata files and the same record; a bad claim gets the same
//! refusal (kind and message) through both; and both work on `--root sandbox:DIR`.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use gpu_agent::claims::{BoxFuture, ClaimFetchError, ClaimSource};
use gpu_agent::dra::prepare::ClaimId;
use gpu_agent::dra::proto::dra_v1;
use gpu_agent::dra::{DraConfig, DraPlugin};
use gpu_agent::{Agent, AgentConfig};
use serde_json::{Value, json};

const DRIVER: &str = "gpu.gpuslice.dev";
const NODE: &str = "demo";
const VGPU: &str = "vgpu-0000-08-00-0-4096mi";
const UID: &str = "6f1c2d3e-0000-4000-8000-00000000d001";

fn gpuslice(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_gpuslice"))
        .env_remove("GPUSLICE_ROOT")
        .args(args)
        .output()
        .unwrap()
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// A sandbox host made from the bundled A2 recording.
fn sandbox(dir: &Path) -> String {
    let recording =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/hosts/a2-sriov-mdev.umockdev");
    let o = gpuslice(&[
        "sandbox",
        "init",
        "--from",
        recording.to_str().unwrap(),
        dir.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    format!("sandbox:{}", dir.display())
}

/// The mdevs of a sandbox's host.
fn mdevs(dir: &Path) -> Vec<String> {
    let mut out: Vec<String> = std::fs::read_dir(dir.join("host/sys/bus/mdev/devices"))
        .map(|d| {
            d.map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    out.sort();
    out
}

/// Every file under `dir` (relative path, bytes).
fn files(dir: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    let mut out = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else {
                let rel = p.strip_prefix(dir).unwrap().to_path_buf();
                out.insert(rel, std::fs::read(&p).unwrap());
            }
        }
    }
    out
}

fn claim(name: &str, uid: &str, pool: &str, parameters: Value) -> Value {
    json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "default", "uid": uid},
        "spec": {"devices": {"requests": [{"name": "vgpu", "exactly": {"deviceClassName": "vgpu.gpuslice.dev"}}]}},
        "status": {"allocation": {"devices": {
            "results": [{"request": "vgpu", "driver": DRIVER, "pool": pool, "device": VGPU}],
            "config": [{"source": "FromClaim", "requests": ["vgpu"],
                        "opaque": {"driver": DRIVER, "parameters": parameters}}],
        }}},
    })
}

fn a2_4q() -> Value {
    json!({"apiVersion": "gpu.gpuslice.dev/v1", "kind": "VgpuConfig", "profile": "A2-4Q"})
}

/// Claims by namespace/name, as an API server would return them.
#[derive(Default)]
struct FakeClaims(Mutex<HashMap<(String, String), Value>>);

impl FakeClaims {
    fn put(&self, doc: &Value) {
        let ns = doc["metadata"]["namespace"].as_str().unwrap().to_owned();
        let name = doc["metadata"]["name"].as_str().unwrap().to_owned();
        self.0.lock().unwrap().insert((ns, name), doc.clone());
    }
}

impl ClaimSource for FakeClaims {
    fn get<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
    ) -> BoxFuture<'a, Result<Value, ClaimFetchError>> {
        let found = self
            .0
            .lock()
            .unwrap()
            .get(&(namespace.to_owned(), name.to_owned()))
            .cloned();
        Box::pin(async move {
            found.ok_or_else(|| ClaimFetchError::NotFound {
                namespace: namespace.to_owned(),
                name: name.to_owned(),
            })
        })
    }
}

/// The kubelet plugin of an agent on `root`, served on its unix socket.
struct Plugin {
    plugin: Arc<DraPlugin>,
    claims: Arc<FakeClaims>,
    endpoint: PathBuf,
    rt: tokio::runtime::Runtime,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

impl Plugin {
    fn start(root: &str, kubelet: &Path, cdi: &Path) -> Self {
        let host = gpu_sysfs::open_root(Path::new(root)).unwrap();
        let mut config = AgentConfig::new(NODE);
        config.lock_timeout = Duration::from_secs(20);
        let agent = Agent::open(Arc::new(host), config).unwrap();
        let claims = Arc::new(FakeClaims::default());
        let dra = DraConfig {
            driver: DRIVER.to_owned(),
            kubelet_dir: kubelet.to_path_buf(),
            cdi_dir: cdi.to_path_buf(),
        };
        let endpoint = dra.endpoint();
        let plugin = DraPlugin::new(agent, claims.clone(), dra).unwrap();
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        rt.spawn(gpu_agent::dra::serve(Arc::clone(&plugin), async move {
            let _ = rx.await;
        }));
        let reg = kubelet.join("plugins_registry/gpu.gpuslice.dev-reg.sock");
        for _ in 0..500 {
            if reg.exists() {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        Plugin {
            plugin,
            claims,
            endpoint,
            rt,
            stop: Some(tx),
        }
    }

    fn client(&self) -> dra_v1::dra_plugin_client::DraPluginClient<tonic::transport::Channel> {
        let path = self.endpoint.clone();
        let channel = self
            .rt
            .block_on(gpu_agent::dra::socket::channel(path))
            .unwrap();
        dra_v1::dra_plugin_client::DraPluginClient::new(channel)
    }

    fn prepare(&self, name: &str, uid: &str) -> dra_v1::NodePrepareResourceResponse {
        let mut c = self.client();
        let req = dra_v1::NodePrepareResourcesRequest {
            claims: vec![dra_v1::Claim {
                namespace: "default".into(),
                uid: uid.into(),
                name: name.into(),
            }],
        };
        let mut out = self
            .rt
            .block_on(c.node_prepare_resources(req))
            .unwrap()
            .into_inner();
        out.claims.remove(uid).unwrap()
    }

    fn unprepare(&self, name: &str, uid: &str) -> String {
        let mut c = self.client();
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

    /// The kind of the plugin's refusal of claim `name`/`uid` (the gRPC answer has only the
    /// message).
    fn refusal_kind(&self, name: &str, uid: &str) -> String {
        let id = ClaimId {
            namespace: "default".into(),
            uid: uid.into(),
            name: name.into(),
        };
        let e = self
            .rt
            .block_on(self.plugin.prepare(&id))
            .expect_err("refused");
        e.kind().as_str().to_owned()
    }
}

impl Drop for Plugin {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
    }
}

fn write_claim(dir: &Path, doc: &Value) -> String {
    let f = dir.join(format!(
        "{}.json",
        doc["metadata"]["name"].as_str().unwrap()
    ));
    std::fs::write(&f, serde_json::to_string_pretty(doc).unwrap()).unwrap();
    f.to_str().unwrap().to_owned()
}

#[test]
fn the_same_claim_through_the_plugin_and_the_cli_gives_the_same_devices_cdi_spec_and_metadata() {
    let t = tempfile::tempdir().unwrap();
    let (s1, s2) = (t.path().join("s1"), t.path().join("s2"));
    let (root1, root2) = (sandbox(&s1), sandbox(&s2));
    let kubelet = t.path().join("kubelet");
    let metadata = kubelet.join("plugins/gpu.gpuslice.dev/metadata");
    let (cdi1, cdi2) = (t.path().join("cdi1"), t.path().join("cdi2"));
    let before = mdevs(&s1);
    assert_eq!(before, mdevs(&s2), "identical sandboxes");
    let doc = claim("vm-1-gpu", UID, NODE, a2_4q());

    // Through the kubelet plugin, on the first sandbox.
    let p = Plugin::start(&root1, &kubelet, &cdi1);
    p.claims.put(&doc);
    let answer = p.prepare("vm-1-gpu", UID);
    assert_eq!(answer.error, "");
    let spec1 = files(&cdi1);
    let meta1 = files(&metadata);
    assert_eq!(spec1.len(), 1, "one spec");
    assert_eq!(meta1.len(), 1, "one metadata file");
    // The CLI writes its own metadata files where the plugin does.
    std::fs::remove_dir_all(&metadata).unwrap();

    // Through `gpuslice dra prepare --cdi-dir`, on the second.
    let f = write_claim(t.path(), &doc);
    let o = gpuslice(&[
        "--root",
        &root2,
        "--node",
        NODE,
        "dra",
        "prepare",
        "--claim",
        &f,
        "--cdi-dir",
        cdi2.to_str().unwrap(),
        "--kubelet-dir",
        kubelet.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();

    // The same devices ...
    let made = mdevs(&s1);
    assert_eq!(made.len(), before.len() + 1, "one vGPU made");
    assert_eq!(made, mdevs(&s2));
    let cli_devices = v["cdi"]["devices"].as_array().unwrap();
    assert_eq!(cli_devices.len(), answer.devices.len());
    for (d, c) in answer.devices.iter().zip(cli_devices) {
        assert_eq!(c["requestNames"], json!(d.request_names));
        assert_eq!(c["pool"], d.pool_name);
        assert_eq!(c["device"], d.device_name);
        assert_eq!(c["cdiDeviceIds"], json!(d.cdi_device_ids));
    }
    // ... the same CDI spec, byte for byte, and the same metadata files ...
    assert_eq!(files(&cdi2), spec1);
    assert_eq!(files(&metadata), meta1);
    assert_eq!(
        v["cdi"]["spec"],
        cdi2.join(format!("{DRIVER}-{UID}.json"))
            .display()
            .to_string()
    );
    // ... and the same record, each kept under its sandbox's host tree.
    let record = format!("host/var/lib/gpuslice/dra/claims/{UID}.json");
    assert_eq!(
        std::fs::read(s1.join(&record)).unwrap(),
        std::fs::read(s2.join(&record)).unwrap()
    );

    // Both unprepare to nothing: the vGPU, the spec and the metadata gone.
    assert_eq!(p.unprepare("vm-1-gpu", UID), "");
    let o = gpuslice(&[
        "--root",
        &root2,
        "--node",
        NODE,
        "dra",
        "unprepare",
        "--claim-uid",
        UID,
        "--cdi-dir",
        cdi2.to_str().unwrap(),
        "--kubelet-dir",
        kubelet.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    assert_eq!(mdevs(&s1), before);
    assert_eq!(mdevs(&s2), before);
    assert!(files(&cdi1).is_empty() && files(&cdi2).is_empty());
    assert!(files(&metadata).is_empty());
}

#[test]
fn a_bad_claim_gets_the_same_refusal_through_the_plugin_and_the_cli() {
    let t = tempfile::tempdir().unwrap();
    let (s1, s2) = (t.path().join("s1"), t.path().join("s2"));
    let (root1, root2) = (sandbox(&s1), sandbox(&s2));
    let kubelet = t.path().join("kubelet");
    let (cdi1, cdi2) = (t.path().join("cdi1"), t.path().join("cdi2"));
    let before = mdevs(&s2);
    let p = Plugin::start(&root1, &kubelet, &cdi1);
    // (the claim the kubelet names, the document the API server has, the kind)
    let cases = [
        (
            ("moved", "uid-old"),
            claim("moved", "uid-new", NODE, a2_4q()),
            "invalid-argument",
        ),
        (
            ("far", "uid-far"),
            claim("far", "uid-far", "node-b", a2_4q()),
            "invalid-argument",
        ),
        (
            ("odd", "uid-odd"),
            claim(
                "odd",
                "uid-odd",
                NODE,
                json!({"profile": "A2-4Q", "color": "red"}),
            ),
            "invalid-argument",
        ),
    ];
    for ((name, uid), doc, kind) in cases {
        p.claims.put(&doc);
        let plugin_error = p.prepare(name, uid).error;
        assert!(!plugin_error.is_empty(), "{name}: refused by the plugin");
        assert_eq!(p.refusal_kind(name, uid), kind, "{name}: {plugin_error}");

        let f = write_claim(t.path(), &doc);
        let o = gpuslice(&[
            "--root",
            &root2,
            "--node",
            NODE,
            "-o",
            "json",
            "dra",
            "prepare",
            "--claim",
            &f,
            "--claim-uid",
            uid,
            "--cdi-dir",
            cdi2.to_str().unwrap(),
            "--kubelet-dir",
            kubelet.to_str().unwrap(),
        ]);
        assert!(!o.status.success(), "{name}: refused by the CLI");
        // The last line: a sandbox is announced on stderr first.
        let stderr = text(&o.stderr);
        let e: Value = serde_json::from_str(stderr.lines().last().unwrap_or_default())
            .unwrap_or_else(|_| panic!("{name}: {stderr}"));
        assert_eq!(e["error"]["message"], plugin_error, "{name}");
        assert_eq!(e["error"]["kind"], kind, "{name}");
    }
    assert_eq!(mdevs(&s1), before, "the plugin changed nothing");
    assert_eq!(mdevs(&s2), before, "the CLI changed nothing");
    assert!(files(&cdi1).is_empty() && files(&cdi2).is_empty());
}

#[test]
fn dra_prepare_then_unprepare_work_on_a_sandbox_host() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("sbx");
    let root = sandbox(&dir);
    let before = mdevs(&dir);
    let f = write_claim(t.path(), &claim("vm-1-gpu", UID, NODE, a2_4q()));
    let o = gpuslice(&[
        "--root", &root, "--node", NODE, "dra", "prepare", "--claim", &f,
    ]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    let uuid = v["actions"][0]["uuid"].as_str().unwrap().to_owned();
    assert_eq!(v["actions"][0]["action"], "create-mdev");
    assert!(
        mdevs(&dir).contains(&uuid),
        "the vGPU is on the sandbox host"
    );
    // Without --cdi-dir no CDI files are written, as before.
    assert!(v.get("cdi").is_none(), "{v}");
    // The record is kept under the sandbox's host tree, not beside `sandbox:DIR`.
    let record = dir.join(format!("host/var/lib/gpuslice/dra/claims/{UID}.json"));
    assert!(record.is_file());
    // A second process sees the vGPU taken (the sandbox keeps its state).
    let o = gpuslice(&[
        "--root", &root, "--node", NODE, "dra", "prepare", "--claim", &f,
    ]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let again: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(again["unchanged"], true);

    let o = gpuslice(&[
        "--root",
        &root,
        "--node",
        NODE,
        "dra",
        "unprepare",
        "--claim-uid",
        UID,
    ]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let u: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(u["removed"], json!([uuid]));
    assert_eq!(mdevs(&dir), before);
    assert!(!record.exists());
}
