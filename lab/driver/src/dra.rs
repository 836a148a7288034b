//! `gpuslice agent --dra` in the guest, driven the way the kubelet drives a DRA driver: an API
//! server stand-in on loopback serves the ResourceClaims ([`crate::apiserver`]), and a kubelet
//! stand-in ([`crate::wire`]: hand-encoded protobuf, gRPC over HTTP/2 on the plugin's real unix
//! sockets) registers the plugin and prepares and unprepares a whole-GPU claim on the real
//! kernel's vfio-pci and an mdev claim on the sample mbochs parent; the checks then open the
//! `/dev/vfio` nodes the CDI spec names.

use crate::sys::ensure;
use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::apiserver::ApiServer;
use crate::checks::{Lab, Outcome, SKIPPED, pick};
use crate::cli::{GPUSLICE, NODE};
use crate::sys::{self, ExpectedState};
use crate::wire;

const DRIVER: &str = "gpu.gpuslice.dev";
const DIR: &str = "/tmp/lab-dra";
const LOG: &str = "/tmp/lab-dra/agent.log";
const CALL: Duration = Duration::from_secs(120);

struct Agent(Child);

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn kubelet_dir() -> PathBuf {
    Path::new(DIR).join("kubelet")
}

fn cdi_dir() -> PathBuf {
    Path::new(DIR).join("cdi")
}

fn registration_socket() -> PathBuf {
    kubelet_dir().join(format!("plugins_registry/{DRIVER}-reg.sock"))
}

fn endpoint() -> PathBuf {
    kubelet_dir().join(format!("plugins/{DRIVER}/dra.sock"))
}

/// The tail of the agent's log, for a failure's detail.
fn log_tail() -> String {
    let text = fs::read_to_string(LOG).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(6)..].join(" | ")
}

/// Starts the API server stand-in and the agent with `--dra` on guest temp dirs; waits for the
/// registration socket.
fn start() -> Result<(ApiServer, Agent), String> {
    start_with(&["--uevents", "off"])
}

fn start_with(extra: &[&str]) -> Result<(ApiServer, Agent), String> {
    start_on(ApiServer::start()?, extra)
}

/// As [`start_with`], against a given stand-in (another Kubernetes release).
fn start_on(api: ApiServer, extra: &[&str]) -> Result<(ApiServer, Agent), String> {
    let _ = fs::remove_dir_all(DIR);
    fs::create_dir_all(DIR).map_err(|e| format!("mkdir {DIR}: {e}"))?;
    let kubeconfig = Path::new(DIR).join("kubeconfig");
    fs::write(&kubeconfig, api.kubeconfig()).map_err(|e| format!("write kubeconfig: {e}"))?;
    let log = fs::File::create(LOG).map_err(|e| format!("create {LOG}: {e}"))?;
    let child = Command::new(GPUSLICE)
        .args(["--node", NODE, "agent", "--listen"])
        .arg(format!("unix:{DIR}/agent.sock"))
        .args([
            "--state-dir",
            &format!("{DIR}/state"),
            "--resync",
            "0",
            "--no-nvml",
        ])
        .args(["--dra", "--dra-driver", DRIVER, "--kubelet-dir"])
        .arg(kubelet_dir())
        .arg("--cdi-dir")
        .arg(cdi_dir())
        .arg("--kubeconfig")
        .arg(&kubeconfig)
        .args(extra)
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .map_err(|e| format!("cannot start {GPUSLICE} agent --dra: {e}"))?;
    let mut agent = Agent(child);
    let deadline = Instant::now() + Duration::from_secs(60);
    while !(registration_socket().exists() && endpoint().exists()) {
        if let Ok(Some(st)) = agent.0.try_wait() {
            return Err(format!(
                "the agent exited before registering ({st}): {}",
                log_tail()
            ));
        }
        if Instant::now() > deadline {
            return Err(format!(
                "no {} within 60 s: {}",
                registration_socket().display(),
                log_tail()
            ));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok((api, agent))
}

/// Registration as the kubelet's plugin watcher does it: GetInfo, then NotifyRegistrationStatus.
fn register() -> Result<String, String> {
    let info = wire::fields(&wire::unary(
        &registration_socket(),
        wire::GET_INFO,
        Vec::new(),
        CALL,
    )?)?;
    let (kind, name, ep) = (
        wire::string(&info, 1)?,
        wire::string(&info, 2)?,
        wire::string(&info, 3)?,
    );
    let versions = wire::strings(&info, 4)?;
    ensure(kind == "DRAPlugin" && name == DRIVER, || {
        format!("GetInfo: type {kind:?} name {name:?}")
    })?;
    ensure(Path::new(&ep) == endpoint(), || {
        format!(
            "GetInfo: endpoint {ep:?}, expected {}",
            endpoint().display()
        )
    })?;
    ensure(versions.iter().any(|v| v == "v1.DRAPlugin"), || {
        format!("GetInfo: supported versions {versions:?} lack v1.DRAPlugin")
    })?;
    let mut status = Vec::new();
    wire::field_varint(&mut status, 1, 1);
    wire::unary(&registration_socket(), wire::NOTIFY, status, CALL)?;
    Ok(versions.join(","))
}

/// A ResourceClaim allocated to one device of this node's pool, as the API server returns it.
fn claim(name: &str, uid: &str, request: &str, device: &str) -> Value {
    claim_of(
        name,
        uid,
        request,
        json!({"request": request, "driver": DRIVER, "pool": NODE, "device": device}),
    )
}

/// A ResourceClaim whose allocation holds `result` (for `request`).
fn claim_of(name: &str, uid: &str, request: &str, result: Value) -> Value {
    json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "default", "uid": uid,
                     "resourceVersion": "1", "generation": 1,
                     "creationTimestamp": "2026-12-01T10:00:00Z"},
        "spec": {"devices": {"requests": [
            {"name": request, "exactly": {"deviceClassName": "gpu"}}]}},
        "status": {
            "allocation": {"devices": {"results": [result]}},
            "reservedFor": [{"resource": "pods", "name": format!("virt-launcher-{name}"),
                             "uid": format!("pod-{uid}")}]
        }
    })
}

fn prepare(name: &str, uid: &str) -> Result<wire::Prepared, String> {
    let req = wire::claims_request(&[("default", uid, name)]);
    let answer = wire::prepare_response(&wire::unary(&endpoint(), wire::PREPARE, req, CALL)?)?;
    ensure(answer.len() == 1 && answer[0].0 == uid, || {
        format!(
            "NodePrepareResources answered claims {:?}, asked for {uid}",
            answer.iter().map(|(u, _)| u).collect::<Vec<_>>()
        )
    })?;
    answer
        .into_iter()
        .next()
        .map(|(_, p)| p)
        .ok_or_else(|| "no answer".to_owned())
}

fn unprepare(name: &str, uid: &str) -> Result<String, String> {
    let req = wire::claims_request(&[("default", uid, name)]);
    let answer = wire::unprepare_response(&wire::unary(&endpoint(), wire::UNPREPARE, req, CALL)?)?;
    answer
        .into_iter()
        .find(|(u, _)| u == uid)
        .map(|(_, e)| e)
        .ok_or_else(|| format!("NodeUnprepareResources gave no answer for {uid}"))
}

/// The plugin read the claim from the stand-in (so an answer is about the claim, not the wire).
fn claim_served(api: &ApiServer, name: &str) -> Result<(), String> {
    let want = format!("GET /apis/resource.k8s.io/v1/namespaces/default/resourceclaims/{name} 200");
    let reqs = api.requests();
    ensure(reqs.contains(&want), || {
        format!("the stand-in never answered {want:?}; it saw {reqs:?}")
    })
}

/// The device name gpuslice publishes a whole GPU under: `gpu-<dddd-bb-dd-f>`.
fn gpu_device(address: &str) -> String {
    format!("gpu-{}", address.replace([':', '.'], "-"))
}

fn cdi_specs() -> Vec<String> {
    sys::list(cdi_dir())
}

/// A whole-GPU claim through the kubelet plugin: registration, NodePrepareResources binds a free
/// GPU to vfio-pci and names its CDI device; the CDI spec names `/dev/vfio/vfio` and the GPU's
/// group node and both open O_RDWR; an unprepare while the group is held open is refused with the
/// GPU left bound; NodeUnprepareResources returns it to its host driver and removes the spec.
pub fn dra_whole_gpu(_lab: &mut Lab) -> Outcome {
    let all = sys::pci_functions()?;
    let f = pick(&all, |s| *s == ExpectedState::Free).ok_or("no free display device")?;
    let host_driver = f
        .driver
        .clone()
        .ok_or_else(|| format!("{} has no host driver", f.address))?;
    let group = f
        .group
        .ok_or_else(|| format!("{} has no IOMMU group", f.address))?;
    let (api, _agent) = start()?;
    let versions = register()?;

    let (name, uid) = ("vm-whole", "5a1e0000-0000-4000-8000-000000000001");
    let device = gpu_device(&f.address);
    api.put_claim("default", name, claim(name, uid, "gpu", &device));
    let t = Instant::now();
    let p = prepare(name, uid).map_err(|e| format!("{e}; agent: {}", log_tail()))?;
    let prepare_s = t.elapsed().as_secs_f64();
    claim_served(&api, name)?;
    ensure(p.error.is_empty(), || {
        format!("prepare of {device}: {}", p.error)
    })?;
    let want_cdi = format!("{DRIVER}/vfio={uid}-0");
    ensure(
        p.devices
            == vec![wire::Device {
                requests: vec!["gpu".to_owned()],
                pool: NODE.to_owned(),
                device: device.clone(),
                cdi_ids: vec![want_cdi.clone()],
            }],
        || {
            format!(
                "prepare answered {:?}, expected {device} with CDI ID {want_cdi}",
                p.devices
            )
        },
    )?;
    sys::bound_to(&f.address, "vfio-pci", "prepare")?;

    // The CDI spec and the nodes it names.
    let (spec_path, spec) = read_spec(uid)?;
    ensure(
        spec.pointer("/kind").and_then(Value::as_str) == Some(&format!("{DRIVER}/vfio")),
        || format!("CDI spec kind {:?}", spec.pointer("/kind")),
    )?;
    let dev = spec
        .pointer("/devices/0")
        .ok_or("the CDI spec has no device")?;
    let cdi_name = dev.get("name").and_then(Value::as_str).unwrap_or("");
    ensure(want_cdi.ends_with(&format!("={cdi_name}")), || {
        format!("the CDI spec's device is {cdi_name:?}, the answer names {want_cdi}")
    })?;
    let (group_node, container, held) = open_group_nodes(dev, group)?;

    // Held open: refused, nothing undone.
    let refused = unprepare(name, uid)?;
    let still = sys::pci_function(&f.address)?;
    ensure(
        !refused.is_empty() && still.driver.as_deref() == Some("vfio-pci"),
        || {
            format!(
                "unprepare while {group_node} is held answered {refused:?}, {} is on {:?}",
                f.address, still.driver
            )
        },
    )?;
    ensure(spec_path.exists(), || {
        "a refused unprepare removed the CDI spec".to_owned()
    })?;
    drop(held);
    drop(container);

    let t = Instant::now();
    let e = unprepare(name, uid)?;
    let unprepare_s = t.elapsed().as_secs_f64();
    ensure(e.is_empty(), || format!("unprepare: {e}"))?;
    sys::bound_to(&f.address, &host_driver, "unprepare")?;
    ensure(cdi_specs().is_empty(), || {
        format!("CDI specs left after unprepare: {:?}", cdi_specs())
    })?;
    let claim_reads = api
        .requests()
        .iter()
        .filter(|r| r.contains("/resourceclaims/"))
        .count();
    Ok(format!(
        "GetInfo {versions}; {device}: {host_driver} -> vfio-pci (group {group}, CDI {want_cdi}, /dev/vfio/vfio and {group_node} opened O_RDWR; unprepare while held refused: {}) -> {host_driver}; prepare {prepare_s:.2}s, unprepare {unprepare_s:.2}s, {claim_reads} claim reads",
        first_words(&refused),
    ))
}

fn first_words(s: &str) -> String {
    s.split_whitespace().take(8).collect::<Vec<_>>().join(" ")
}

/// Without an IOMMU the same claim is answered with an error and nothing changes: the GPU stays
/// on its host driver and no CDI spec is written (no `/dev/vfio/<group>` could be given).
pub fn dra_whole_gpu_refused(_lab: &mut Lab) -> Outcome {
    let all = sys::pci_functions()?;
    let f =
        pick(&all, |s| *s == ExpectedState::NoIommu).ok_or("no display device without a group")?;
    let host_driver = f.driver.clone();
    let (api, _agent) = start()?;
    register()?;
    let (name, uid) = ("vm-whole", "5a1e0000-0000-4000-8000-000000000002");
    let device = gpu_device(&f.address);
    api.put_claim("default", name, claim(name, uid, "gpu", &device));
    let p = prepare(name, uid).map_err(|e| format!("{e}; agent: {}", log_tail()))?;
    claim_served(&api, name)?;
    ensure(!p.error.is_empty() && p.devices.is_empty(), || {
        format!("prepare of {device} without an IOMMU answered {p:?}")
    })?;
    let after = sys::pci_function(&f.address)?;
    ensure(after.driver == host_driver, || {
        format!(
            "{} moved from {host_driver:?} to {:?}",
            f.address, after.driver
        )
    })?;
    ensure(cdi_specs().is_empty(), || {
        format!("CDI specs written: {:?}", cdi_specs())
    })?;
    Ok(format!("{device} refused: {}", p.error))
}

/// This node's pool of the driver at its highest generation.
#[derive(Debug, Clone, PartialEq)]
struct Pool {
    generation: i64,
    /// Device names, sorted.
    devices: Vec<String>,
    /// Counter set name → its `framebuffer`.
    framebuffer: BTreeMap<String, String>,
}

/// This node's slices of the driver, the highest generation's.
fn pool(api: &ApiServer) -> Option<Pool> {
    let slices: Vec<Value> = api
        .slices()
        .into_values()
        .filter(|s| {
            s.pointer("/spec/driver").and_then(Value::as_str) == Some(DRIVER)
                && s.pointer("/spec/nodeName").and_then(Value::as_str) == Some(NODE)
        })
        .collect();
    let generation = slices
        .iter()
        .filter_map(|s| s.pointer("/spec/pool/generation").and_then(Value::as_i64))
        .max()?;
    let current: Vec<&Value> = slices
        .iter()
        .filter(|s| s.pointer("/spec/pool/generation").and_then(Value::as_i64) == Some(generation))
        .collect();
    let framebuffer = current
        .iter()
        .flat_map(|s| {
            s.pointer("/spec/sharedCounters")
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default()
        })
        .filter_map(|set| {
            Some((
                set.get("name")?.as_str()?.to_owned(),
                set.pointer("/counters/framebuffer/value")?
                    .as_str()?
                    .to_owned(),
            ))
        })
        .collect();
    let mut devices: Vec<String> = current
        .iter()
        .flat_map(|s| {
            s.pointer("/spec/devices")
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default()
        })
        .filter_map(|d| d.get("name").and_then(Value::as_str).map(str::to_owned))
        .collect();
    devices.sort();
    Some(Pool {
        generation,
        devices,
        framebuffer,
    })
}

/// Waits up to `within` for `want` to hold of the pool; the pool and the seconds it took.
fn wait_pool(
    api: &ApiServer,
    within: Duration,
    want: impl Fn(&Pool) -> bool,
) -> Result<(Pool, f64), String> {
    let t = Instant::now();
    loop {
        if let Some(p) = pool(api) {
            if want(&p) {
                return Ok((p, t.elapsed().as_secs_f64()));
            }
        }
        if t.elapsed() > within {
            let reqs = api.requests();
            return Err(format!(
                "after {within:?} the pool is {:?}; {} requests to the stand-in, last: {:?}; agent: {}",
                pool(api),
                reqs.len(),
                &reqs[reqs.len().saturating_sub(4)..],
                log_tail()
            ));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The agent with `--dra` publishes this node's ResourceSlices to the stand-in and follows
/// changes made by hand: a free GPU bound to vfio-pci with plain sysfs writes leaves the pool (its
/// `gpu-<address>` device goes, `pool.generation` rises), and comes back when released by hand;
/// an `echo UUID > .../mbochs-small/create` shrinks the mbochs counter set (and its devices) at a
/// higher generation, and `echo 1 > .../remove` gives it back at a higher one still.
pub fn dra_slices_follow_hand_changes(_lab: &mut Lab) -> Outcome {
    let all = sys::pci_functions()?;
    let f = pick(&all, |s| *s == ExpectedState::Free).ok_or("no free display device")?;
    let device = gpu_device(&f.address);
    let (api, _agent) = start_with(&["--uevents", "on"])?;
    let within = Duration::from_secs(30);
    let (first, first_s) = wait_pool(&api, Duration::from_secs(60), |p| {
        p.devices.contains(&device)
    })
    .map_err(|e| format!("no slice with {device}: {e}"))?;

    let dev = format!("{}/bus/pci/devices/{}", sys::SYS, f.address);
    sys::write(format!("{dev}/driver_override"), "vfio-pci")?;
    sys::write(format!("{dev}/driver/unbind"), &f.address)?;
    sys::write(format!("{}/bus/pci/drivers_probe", sys::SYS), &f.address)?;
    let (bound, bound_s) = wait_pool(&api, within, |p| {
        p.generation > first.generation && !p.devices.contains(&device)
    })
    .map_err(|e| format!("{device} bound to vfio-pci by hand: {e}"))?;

    sys::write(format!("{dev}/driver_override"), "\n")?;
    sys::write(format!("{dev}/driver/unbind"), &f.address)?;
    sys::write(format!("{}/bus/pci/drivers_probe", sys::SYS), &f.address)?;
    let (back, back_s) = wait_pool(&api, within, |p| {
        p.generation > bound.generation && p.devices.contains(&device)
    })
    .map_err(|e| format!("{device} released by hand: {e}"))?;

    // An mdev made and removed by hand on the virtual mbochs parent.
    let set = "mdev-mbochs";
    let mbochs = |p: &Pool| {
        p.devices
            .iter()
            .filter(|d| d.starts_with("vgpu-mdev-mbochs-"))
            .count()
    };
    let full = back
        .framebuffer
        .get(set)
        .cloned()
        .ok_or_else(|| format!("no counter set {set} in the pool: {back:?}"))?;
    let full_devices = mbochs(&back);
    let uuid = "5a1e0000-0000-4000-8000-0000000000bb";
    let types = format!("{}/class/mdev_bus/mbochs/mdev_supported_types", sys::SYS);
    sys::write(format!("{types}/mbochs-small/create"), uuid)?;
    let made = wait_pool(&api, within, |p| {
        p.generation > back.generation && p.framebuffer.get(set) != Some(&full)
    })
    .map_err(|e| format!("mbochs-small {uuid} created by hand: {e}"));
    let removed = sys::write(format!("{}/bus/mdev/devices/{uuid}/remove", sys::SYS), "1");
    let (made, made_s) = made?;
    removed?;
    let (gone, gone_s) = wait_pool(&api, within, |p| {
        p.generation > made.generation && p.framebuffer.get(set) == Some(&full)
    })
    .map_err(|e| format!("mbochs-small {uuid} removed by hand: {e}"))?;
    ensure(
        mbochs(&made) < full_devices && mbochs(&gone) == full_devices,
        || {
            format!(
                "mbochs devices {full_devices} -> {} -> {}",
                mbochs(&made),
                mbochs(&gone)
            )
        },
    )?;
    Ok(format!(
        "published in {first_s:.1}s (generation {}, {} devices); {device} bound by hand: gone at generation {} in {bound_s:.2}s; released: back at generation {} in {back_s:.2}s; mbochs-small created by hand: {set} framebuffer {full} -> {} ({full_devices} -> {} devices) at generation {} in {made_s:.2}s; removed: {} at generation {} in {gone_s:.2}s",
        first.generation,
        first.devices.len(),
        bound.generation,
        back.generation,
        made.framebuffer.get(set).map_or("-", String::as_str),
        mbochs(&made),
        made.generation,
        gone.framebuffer.get(set).map_or("-", String::as_str),
        gone.generation,
    ))
}

/// Every value under key `key` anywhere in `v`.
fn values_of<'v>(v: &'v Value, key: &str, out: &mut Vec<&'v Value>) {
    match v {
        Value::Object(m) => {
            for (k, x) in m {
                if k == key {
                    out.push(x);
                }
                values_of(x, key, out);
            }
        }
        Value::Array(a) => a.iter().for_each(|x| values_of(x, key, out)),
        _ => {}
    }
}

/// An mdev claim through the kubelet plugin, against a Kubernetes 1.36.2 stand-in (the agent
/// publishes the mbochs parent as one multi-allocatable `vgpu-mdev-mbochs-mixed` device):
/// `NodePrepareResources` of a share of it with 64 MiB reserved makes an `mbochs-large` mdev with
/// the share ID as its UUID; the CDI spec names `/dev/vfio/vfio` and the mdev's group node (read
/// from `/sys`), both opened O_RDWR; the KubeVirt metadata file it mounts carries `mdevUUID`;
/// `NodeUnprepareResources` removes the mdev, the spec and the metadata.
pub fn dra_prepare_mdev(_lab: &mut Lab) -> Outcome {
    let mdevs = || sys::list(format!("{}/bus/mdev/devices", sys::SYS));
    let before = mdevs();
    let (api, _agent) = start_on(ApiServer::start_as(36, 2)?, &["--uevents", "off"])?;
    let versions = register()?;
    let device = "vgpu-mdev-mbochs-mixed";
    let (published, _) = wait_pool(&api, Duration::from_secs(60), |p| {
        p.devices.iter().any(|d| d == device)
    })
    .map_err(|e| format!("no slice with {device}: {e}"))?;

    let (name, uid, request) = (
        "vm-display",
        "5a1e0000-0000-4000-8000-000000000003",
        "display",
    );
    let share = "5a1e0000-0000-4000-8000-0000000000aa";
    let result = json!({"request": request, "driver": DRIVER, "pool": NODE, "device": device,
                        "shareID": share, "consumedCapacity": {"framebuffer": "64Mi"}});
    api.put_claim("default", name, claim_of(name, uid, request, result));
    let t = Instant::now();
    let p = prepare(name, uid).map_err(|e| format!("{e}; agent: {}", log_tail()))?;
    let prepare_s = t.elapsed().as_secs_f64();
    claim_served(&api, name)?;
    ensure(p.error.is_empty(), || {
        format!("prepare of {device}: {}", p.error)
    })?;
    let want_cdi = format!("{DRIVER}/vfio={uid}-0");
    ensure(
        p.devices
            == vec![wire::Device {
                requests: vec![request.to_owned()],
                pool: NODE.to_owned(),
                device: device.to_owned(),
                cdi_ids: vec![want_cdi.clone()],
            }],
        || {
            format!(
                "prepare answered {:?}, expected {device} with CDI ID {want_cdi}",
                p.devices
            )
        },
    )?;
    let mdev = format!("{}/bus/mdev/devices/{share}", sys::SYS);
    let ty = sys::link_name(format!("{mdev}/mdev_type"));
    ensure(
        !before.contains(&share.to_owned()) && ty.as_deref() == Some("mbochs-large"),
        || {
            format!(
                "after prepare {mdev} has type {ty:?} (mdevs before: {before:?}, now {:?})",
                mdevs()
            )
        },
    )?;
    let group = sys::link_name(format!("{mdev}/iommu_group"))
        .ok_or_else(|| format!("{mdev} has no iommu_group"))?;

    let (_, spec) = read_spec(uid)?;
    let dev = spec
        .pointer("/devices/0")
        .ok_or("the CDI spec has no device")?;
    let (group_node, container, held) = open_group_nodes(dev, &group)?;
    drop(held);
    drop(container);

    // The KubeVirt device metadata the spec mounts.
    let mount = dev
        .pointer("/containerEdits/mounts/0")
        .ok_or("the CDI spec mounts no device metadata")?;
    let host_path = mount.get("hostPath").and_then(Value::as_str).unwrap_or("");
    let container_path = mount
        .get("containerPath")
        .and_then(Value::as_str)
        .unwrap_or("");
    let want_tail = format!("/{name}/{request}/{DRIVER}-metadata.json");
    ensure(container_path.ends_with(&want_tail), || {
        format!(
            "the metadata is mounted at {container_path:?}, expected .../resourceclaims{want_tail}"
        )
    })?;
    let text = sys::read(host_path)?;
    let mut found = Vec::new();
    let docs: Vec<Value> = serde_json::Deserializer::from_str(&text)
        .into_iter::<Value>()
        .collect::<Result<_, _>>()
        .map_err(|e| format!("{host_path}: {e}"))?;
    for d in &docs {
        values_of(d, "mdevUUID", &mut found);
    }
    ensure(
        found
            .iter()
            .any(|v| v.get("string").and_then(Value::as_str) == Some(share)),
        || format!("{host_path} carries mdevUUID {found:?}, expected {share}"),
    )?;

    let t = Instant::now();
    let e = unprepare(name, uid)?;
    let unprepare_s = t.elapsed().as_secs_f64();
    ensure(e.is_empty(), || format!("unprepare: {e}"))?;
    ensure(!Path::new(&mdev).exists(), || {
        format!("{mdev} is still there after unprepare")
    })?;
    ensure(cdi_specs().is_empty(), || {
        format!("CDI specs left after unprepare: {:?}", cdi_specs())
    })?;
    ensure(!Path::new(host_path).exists(), || {
        format!("{host_path} left after unprepare")
    })?;
    Ok(format!(
        "GetInfo {versions}; published {device} (mdev-mbochs framebuffer {}, generation {}); prepare: mbochs-large {share} (group {group}, CDI {want_cdi}, /dev/vfio/vfio and {group_node} opened O_RDWR, metadata mdevUUID {share}) in {prepare_s:.2}s; unprepare removed the mdev, the spec and the metadata in {unprepare_s:.2}s",
        published
            .framebuffer
            .get("mdev-mbochs")
            .map_or("-", String::as_str),
        published.generation,
    ))
}

/// What `lab/run` put in the initramfs for [`dra_grpc_stand_in`]: `key=value` lines (`python`,
/// `script`, `stubs`, `grpc`), or `skip=<reason>` when the host has no grpcio.
const GRPC_CONFIG: &str = "/etc/lab-grpc";
/// Where the host's root is mounted (read-only, virtio-9p tag `hostroot`).
const HOST: &str = "/host";

fn run_ok(program: &str, args: &[&str]) -> Result<(), String> {
    let out = Command::new(program)
        .args(args)
        .output()
        .map_err(|e| format!("{program} {args:?}: {e}"))?;
    ensure(out.status.success(), || {
        format!(
            "{program} {args:?}: {} {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        )
    })
}

/// Loads the virtio and 9p modules `lab/run` packed, mounts the host's root at [`HOST`] and
/// binds the guest's /proc, /dev, /sys and /tmp into it (once per boot).
fn mount_host() -> Result<(), String> {
    if Path::new(HOST).join("proc/self").exists() {
        return Ok(());
    }
    let order = sys::read("/lib/modules/grpc/load.order")?;
    for m in order.lines().filter(|l| !l.trim().is_empty()) {
        let path = format!("/lib/modules/grpc/{m}");
        // Already loaded (a module another one pulled in) answers EEXIST: not an error here.
        let _ = run_ok("/bin/insmod", &[&path]);
    }
    fs::create_dir_all(HOST).map_err(|e| format!("mkdir {HOST}: {e}"))?;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match run_ok(
            "/bin/mount",
            &[
                "-t",
                "9p",
                "-o",
                "trans=virtio,version=9p2000.L,ro,msize=262144",
                "hostroot",
                HOST,
            ],
        ) {
            Ok(()) => break,
            // The virtio device may still be probing right after the modules load.
            Err(_) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(200)),
            Err(e) => return Err(format!("mount the host's root over virtio-9p: {e}")),
        }
    }
    for d in ["proc", "dev", "sys", "tmp"] {
        run_ok(
            "/bin/mount",
            &["-o", "bind", &format!("/{d}"), &format!("{HOST}/{d}")],
        )?;
    }
    Ok(())
}

/// The `/dev` nodes the CDI spec of claim `uid` names, all opened O_RDWR by this process (as a
/// VM's launcher would); the spec's path, the nodes and the open files.
fn open_spec_nodes(uid: &str) -> Result<(PathBuf, Vec<String>, Vec<fs::File>), String> {
    let (spec_path, spec) = read_spec(uid)?;
    let nodes = spec
        .pointer("/devices/0")
        .map(device_nodes)
        .unwrap_or_default();
    let files = nodes
        .iter()
        .map(|p| open_rdwr(p).map_err(|e| format!("{e} (named by {})", spec_path.display())))
        .collect::<Result<Vec<_>, _>>()?;
    Ok((spec_path, nodes, files))
}

/// The CDI spec `prepare` wrote for claim `uid`: its path and its JSON.
fn read_spec(uid: &str) -> Result<(PathBuf, Value), String> {
    let spec_path = cdi_dir().join(format!("{DRIVER}-{uid}.json"));
    let spec: Value = serde_json::from_str(&sys::read(&spec_path)?)
        .map_err(|e| format!("{}: {e}", spec_path.display()))?;
    Ok((spec_path, spec))
}

/// The `/dev` paths a CDI device's `containerEdits.deviceNodes` name.
fn device_nodes(dev: &Value) -> Vec<String> {
    dev.pointer("/containerEdits/deviceNodes")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|n| n.get("path").and_then(Value::as_str).map(str::to_owned))
        .collect()
}

/// A device node opened O_RDWR, as a VM's launcher opens it.
fn open_rdwr(p: &str) -> Result<fs::File, String> {
    fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(p)
        .map_err(|e| format!("open {p} O_RDWR: {e}"))
}

/// Checks that CDI device `dev` names `/dev/vfio/vfio` and `/dev/vfio/<group>` and opens both
/// O_RDWR: the group's node path, the container and the group.
fn open_group_nodes(
    dev: &Value,
    group: impl std::fmt::Display,
) -> Result<(String, fs::File, fs::File), String> {
    let nodes = device_nodes(dev);
    let group_node = format!("/dev/vfio/{group}");
    ensure(
        nodes.iter().any(|n| n == "/dev/vfio/vfio") && nodes.contains(&group_node),
        || format!("the CDI spec names {nodes:?}, expected /dev/vfio/vfio and {group_node}"),
    )?;
    let container = open_rdwr("/dev/vfio/vfio")?;
    let held = open_rdwr(&group_node)?;
    Ok((group_node, container, held))
}

/// The kubelet stand-in of `tests/dra/` in kind, in the guest: the host's python3 with grpcio
/// (stubs generated from `proto/`), chrooted into the host's root mounted over virtio-9p, drives
/// registration, one v1 `NodePrepareResources` of two claims (a whole free GPU, a share of the
/// mbochs parent) and one v1beta1 `NodeUnprepareResources` of both over the plugin's real unix
/// sockets. Between the two the check reads the host (the GPU on vfio-pci, the mdev with the
/// share ID) and opens every `/dev/vfio` node the two CDI specs name; after, the GPU is back on its
/// host driver and the mdev and specs are gone. Where the host has no grpcio `lab/run` says so and
/// the check is skipped.
pub fn dra_grpc_stand_in(_lab: &mut Lab) -> Outcome {
    let conf =
        sys::read(GRPC_CONFIG).unwrap_or_else(|_| "skip=no /etc/lab-grpc in the initramfs".into());
    let conf: BTreeMap<&str, &str> = conf.lines().filter_map(|l| l.split_once('=')).collect();
    if let Some(why) = conf.get("skip") {
        return Ok(format!("{SKIPPED}{why}"));
    }
    let get = |k: &str| {
        conf.get(k)
            .copied()
            .ok_or_else(|| format!("{GRPC_CONFIG} has no {k}="))
    };
    let (python, script, stubs) = (get("python")?, get("script")?, get("stubs")?);
    let all = sys::pci_functions()?;
    let f = pick(&all, |s| *s == ExpectedState::Free).ok_or("no free display device")?;
    let host_driver = f
        .driver
        .clone()
        .ok_or_else(|| format!("{} has no host driver", f.address))?;
    let t = Instant::now();
    mount_host()?;
    let mount_s = t.elapsed().as_secs_f64();

    let (api, _agent) = start_on(ApiServer::start_as(36, 2)?, &["--uevents", "off"])?;
    let vgpu = "vgpu-mdev-mbochs-mixed";
    let gpu = gpu_device(&f.address);
    wait_pool(&api, Duration::from_secs(60), |p| {
        p.devices.iter().any(|d| d == vgpu) && p.devices.contains(&gpu)
    })
    .map_err(|e| format!("no slice with {vgpu} and {gpu}: {e}"))?;
    let share = "5a1e0000-0000-4000-8000-0000000000cc";
    let claims = [
        (
            "vm-grpc-display",
            "5a1e0000-0000-4000-8000-000000000004",
            "display",
            json!({"request": "display", "driver": DRIVER, "pool": NODE, "device": vgpu,
                   "shareID": share, "consumedCapacity": {"framebuffer": "16Mi"}}),
        ),
        (
            "vm-grpc-gpu",
            "5a1e0000-0000-4000-8000-000000000005",
            "gpu",
            json!({"request": "gpu", "driver": DRIVER, "pool": NODE, "device": gpu}),
        ),
    ];
    for (name, uid, request, result) in &claims {
        api.put_claim(
            "default",
            name,
            claim_of(name, uid, request, result.clone()),
        );
    }

    let out = Path::new(DIR).join("grpc-answer.json");
    let go = Path::new(DIR).join("grpc-go");
    let log = fs::File::create(Path::new(DIR).join("grpc.log")).map_err(|e| e.to_string())?;
    let mut cmd = Command::new("/bin/busybox");
    cmd.args([
        "chroot",
        HOST,
        python,
        script,
        "--stubs",
        stubs,
        "--registration",
    ])
    .arg(registration_socket())
    .arg("--endpoint")
    .arg(endpoint());
    for (name, uid, _, _) in &claims {
        cmd.arg("--claim").arg(format!("default/{name}/{uid}"));
    }
    let t = Instant::now();
    let mut child = Agent(
        cmd.arg("--out")
            .arg(&out)
            .arg("--go")
            .arg(&go)
            .args(["--timeout", "300"])
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .map_err(|e| format!("chroot {HOST} {python}: {e}"))?,
    );
    let grpc_log = || {
        let text = fs::read_to_string(Path::new(DIR).join("grpc.log")).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(4)..].join(" | ")
    };
    let deadline = Instant::now() + Duration::from_secs(400);
    while !out.exists() {
        if let Ok(Some(st)) = child.0.try_wait() {
            return Err(format!(
                "the grpcio stand-in exited ({st}) before answering: {}",
                grpc_log()
            ));
        }
        ensure(Instant::now() < deadline, || {
            format!(
                "no answer from the grpcio stand-in within 400 s: {}",
                grpc_log()
            )
        })?;
        std::thread::sleep(Duration::from_millis(100));
    }
    let first_s = t.elapsed().as_secs_f64();
    let a: Value =
        serde_json::from_str(&sys::read(&out)?).map_err(|e| format!("{}: {e}", out.display()))?;
    ensure(
        a.pointer("/info/type").and_then(Value::as_str) == Some("DRAPlugin")
            && a.pointer("/info/name").and_then(Value::as_str) == Some(DRIVER),
        || format!("GetInfo through grpcio: {:?}", a.get("info")),
    )?;
    for (_, uid, request, result) in &claims {
        let device = result.get("device").cloned().unwrap_or_default();
        let want = json!({"error": "", "devices": [{"requests": [request], "pool": NODE,
                          "device": device, "cdi": [format!("{DRIVER}/vfio={uid}-0")]}]});
        let got = a.pointer(&format!("/claims/{uid}"));
        ensure(got == Some(&want), || {
            format!("prepare through grpcio answered {got:?} for {uid}, expected {want}")
        })?;
    }
    let mdev = format!("{}/bus/mdev/devices/{share}", sys::SYS);
    let ty = sys::link_name(format!("{mdev}/mdev_type"));
    ensure(ty.as_deref() == Some("mbochs-medium"), || {
        format!("after the grpcio prepare {mdev} has type {ty:?}")
    })?;
    sys::bound_to(&f.address, "vfio-pci", "the grpcio prepare")?;
    let mut opened = Vec::new();
    for (_, uid, _, _) in &claims {
        let (_, nodes, files) = open_spec_nodes(uid)?;
        ensure(
            nodes.iter().any(|n| n == "/dev/vfio/vfio") && nodes.len() == 2,
            || format!("the CDI spec of {uid} names {nodes:?}"),
        )?;
        drop(files);
        opened.extend(nodes.into_iter().filter(|n| n != "/dev/vfio/vfio"));
    }

    fs::write(&go, "").map_err(|e| format!("write {}: {e}", go.display()))?;
    let done = Path::new(DIR).join("grpc-answer.json.unprepare");
    let deadline = Instant::now() + Duration::from_secs(120);
    let status = loop {
        if let Ok(Some(st)) = child.0.try_wait() {
            break st;
        }
        ensure(Instant::now() < deadline, || {
            format!(
                "the grpcio stand-in did not finish within 120 s: {}",
                grpc_log()
            )
        })?;
        std::thread::sleep(Duration::from_millis(100));
    };
    ensure(status.success() && done.exists(), || {
        format!("the grpcio stand-in exited {status}: {}", grpc_log())
    })?;
    let u: Value =
        serde_json::from_str(&sys::read(&done)?).map_err(|e| format!("{}: {e}", done.display()))?;
    let want: Value = claims
        .iter()
        .map(|(_, uid, _, _)| ((*uid).to_owned(), json!("")))
        .collect::<serde_json::Map<_, _>>()
        .into();
    ensure(u.get("claims") == Some(&want), || {
        format!("unprepare through grpcio (v1beta1): {u}")
    })?;
    ensure(!Path::new(&mdev).exists(), || {
        format!("{mdev} is still there after unprepare")
    })?;
    sys::bound_to(&f.address, &host_driver, "unprepare")?;
    ensure(cdi_specs().is_empty(), || {
        format!("CDI specs left after unprepare: {:?}", cdi_specs())
    })?;
    Ok(format!(
        "python {} grpcio {} chrooted into the host's root over virtio-9p (mounted in {mount_s:.1}s, imports {}s): GetInfo, one v1 prepare of {gpu} ({host_driver} -> vfio-pci) and {vgpu} (mbochs-medium {share}) answered {first_s:.1}s after start, /dev/vfio/vfio and {} opened O_RDWR; one v1beta1 unprepare: {gpu} back on {host_driver}, the mdev and both specs gone",
        a.get("python").and_then(Value::as_str).unwrap_or("?"),
        a.get("grpc").and_then(Value::as_str).unwrap_or("?"),
        a.get("importS").map(Value::to_string).unwrap_or_default(),
        opened.join(" and "),
    ))
}
