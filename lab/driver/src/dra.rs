//! `gpuslice agent --dra` in the guest, driven the way the kubelet drives a DRA driver: an API
//! server stand-in on loopback serves the ResourceClaims ([`crate::apiserver`]), and a kubelet
//! stand-in ([`crate::wire`]: hand-encoded protobuf, gRPC over HTTP/2 on the plugin's real unix
//! sockets) registers the plugin and prepares and unprepares a whole-GPU claim on the real
//! kernel's vfio-pci; the check then opens the `/dev/vfio` nodes the CDI spec names.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::apiserver::ApiServer;
use crate::checks::{Lab, Outcome, pick};
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

fn ensure(ok: bool, why: impl FnOnce() -> String) -> Result<(), String> {
    if ok { Ok(()) } else { Err(why()) }
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
    let _ = fs::remove_dir_all(DIR);
    fs::create_dir_all(DIR).map_err(|e| format!("mkdir {DIR}: {e}"))?;
    let api = ApiServer::start()?;
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
    json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "default", "uid": uid,
                     "resourceVersion": "1", "generation": 1,
                     "creationTimestamp": "2026-12-01T10:00:00Z"},
        "spec": {"devices": {"requests": [
            {"name": request, "exactly": {"deviceClassName": "gpu"}}]}},
        "status": {
            "allocation": {"devices": {"results": [
                {"request": request, "driver": DRIVER, "pool": NODE, "device": device}]}},
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
    let bound = sys::pci_function(&f.address)?;
    ensure(bound.driver.as_deref() == Some("vfio-pci"), || {
        format!("after prepare {} is bound to {:?}", f.address, bound.driver)
    })?;

    // The CDI spec and the nodes it names.
    let spec_path = cdi_dir().join(format!("{DRIVER}-{uid}.json"));
    let spec: Value = serde_json::from_str(&sys::read(&spec_path)?)
        .map_err(|e| format!("{}: {e}", spec_path.display()))?;
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
    let nodes: Vec<&str> = dev
        .pointer("/containerEdits/deviceNodes")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|n| n.get("path").and_then(Value::as_str))
        .collect();
    let group_node = format!("/dev/vfio/{group}");
    ensure(
        nodes.contains(&"/dev/vfio/vfio") && nodes.contains(&group_node.as_str()),
        || format!("the CDI spec names {nodes:?}, expected /dev/vfio/vfio and {group_node}"),
    )?;
    let open = |p: &str| {
        fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(p)
            .map_err(|e| format!("open {p} O_RDWR: {e}"))
    };
    let container = open("/dev/vfio/vfio")?;
    let held = open(&group_node)?;

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
    let back = sys::pci_function(&f.address)?;
    ensure(back.driver.as_deref() == Some(host_driver.as_str()), || {
        format!(
            "after unprepare {} is bound to {:?}, was {host_driver}",
            f.address, back.driver
        )
    })?;
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

/// This node's slices of the driver: (pool generation, device names), the highest generation's.
fn pool(api: &ApiServer) -> Option<(i64, Vec<String>)> {
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
    let mut devices: Vec<String> = slices
        .iter()
        .filter(|s| s.pointer("/spec/pool/generation").and_then(Value::as_i64) == Some(generation))
        .flat_map(|s| {
            s.pointer("/spec/devices")
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default()
        })
        .filter_map(|d| d.get("name").and_then(Value::as_str).map(str::to_owned))
        .collect();
    devices.sort();
    Some((generation, devices))
}

/// Waits up to `within` for `want` to hold of the pool; the pool and the seconds it took.
fn wait_pool(
    api: &ApiServer,
    within: Duration,
    want: impl Fn(&(i64, Vec<String>)) -> bool,
) -> Result<((i64, Vec<String>), f64), String> {
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

/// The agent with `--dra` publishes this node's ResourceSlices to the stand-in and follows a
/// change made by hand: a free GPU bound to vfio-pci with plain sysfs writes leaves the pool (its
/// `gpu-<address>` device goes, `pool.generation` rises), and comes back when released by hand.
pub fn dra_slices_follow_hand_changes(_lab: &mut Lab) -> Outcome {
    let all = sys::pci_functions()?;
    let f = pick(&all, |s| *s == ExpectedState::Free).ok_or("no free display device")?;
    let device = gpu_device(&f.address);
    let (api, _agent) = start_with(&["--uevents", "on"])?;
    let within = Duration::from_secs(30);
    let (first, first_s) = wait_pool(&api, Duration::from_secs(60), |(_, d)| d.contains(&device))
        .map_err(|e| format!("no slice with {device}: {e}"))?;

    let dev = format!("{}/bus/pci/devices/{}", sys::SYS, f.address);
    sys::write(format!("{dev}/driver_override"), "vfio-pci")?;
    sys::write(format!("{dev}/driver/unbind"), &f.address)?;
    sys::write(format!("{}/bus/pci/drivers_probe", sys::SYS), &f.address)?;
    let ((gen_bound, _), bound_s) =
        wait_pool(&api, within, |(g, d)| *g > first.0 && !d.contains(&device))
            .map_err(|e| format!("{device} bound to vfio-pci by hand: {e}"))?;

    sys::write(format!("{dev}/driver_override"), "\n")?;
    sys::write(format!("{dev}/driver/unbind"), &f.address)?;
    sys::write(format!("{}/bus/pci/drivers_probe", sys::SYS), &f.address)?;
    let ((gen_back, _), back_s) =
        wait_pool(&api, within, |(g, d)| *g > gen_bound && d.contains(&device))
            .map_err(|e| format!("{device} released by hand: {e}"))?;
    Ok(format!(
        "published in {first_s:.1}s (generation {}, {} devices); {device} bound by hand: gone at generation {gen_bound} in {bound_s:.2}s; released: back at generation {gen_back} in {back_s:.2}s",
        first.0,
        first.1.len()
    ))
}
