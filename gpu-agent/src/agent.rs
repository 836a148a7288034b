//! The agent's core, independent of HTTP: the cached topology, the event bus, the promises and
//! the serialized writes. Every write runs on a blocking thread holding the agent's writer lock
//! and the host's layout lock (`run/gpuslice/vgpu.lock`, the one `gpuslice vgpu apply` takes);
//! reads are answered from the cached snapshot and never wait for a write.

use gpu_core::ErrorKind;
use std::path::PathBuf;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use gpu_core::{GpuRef, MdevUuid, NodeTopology, ParentId, PciAddress};
use gpu_health::{GpuHealthReport, HealthOptions};
use gpu_sysfs::Host;
use gpu_sysfs::actuate::{self, CreateTarget, Created, MdevCreate};
use gpu_sysfs::apply::{ApplyOptions, LayoutLock};
use gpu_sysfs::discover::DiscoverOptions;
use serde::{Deserialize, Serialize};

use crate::doc::Rendered;
use crate::error::{ApiError, chain};
use crate::events::{EventBus, EventKind};
use crate::state::{Device, Owner, Phase, Promise, StateFile, StateStore};

/// Renders Prometheus text for a topology (the CLI's metrics renderer): the body or a message.
pub type MetricsHook = Arc<dyn Fn(&NodeTopology) -> Result<String, String> + Send + Sync>;

/// Builds the VM hand-off (QEMU arguments, libvirt XML) of a device on a topology.
pub type HandoffHook =
    Arc<dyn Fn(&NodeTopology, &HandoffTarget) -> Result<serde_json::Value, String> + Send + Sync>;

/// A device to hand to a VM.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HandoffTarget {
    /// An mdev instance.
    Mdev(MdevUuid),
    /// A PCI function (a whole GPU, a vendor-VFIO VF).
    Pci(PciAddress),
}

/// What the front-end plugs in: pieces that live outside the agent's crate.
#[derive(Clone, Default)]
pub struct Hooks {
    /// `GET /metrics`; without it the route answers `not-found`.
    pub metrics: Option<MetricsHook>,
    /// The content type of the metrics text.
    pub metrics_content_type: Option<String>,
    /// The `vmHandoff` of created instances and bound GPUs; without it only the per-device
    /// `handoff` of the actuation layer is returned.
    pub handoff: Option<HandoffHook>,
}

impl std::fmt::Debug for Hooks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Hooks")
            .field("metrics", &self.metrics.is_some())
            .field("handoff", &self.handoff.is_some())
            .finish()
    }
}

/// How the agent runs.
#[derive(Debug, Clone)]
pub struct AgentConfig {
    /// Discovery options (node name, resolver, parent filter).
    pub discover: DiscoverOptions,
    /// Health options (policy, telemetry).
    pub health: HealthOptions,
    /// Where promises are kept; `None`: `<root>/var/lib/gpuslice/agent`.
    pub state_dir: Option<PathBuf>,
    /// How long a write waits for the layout lock before answering `busy`.
    pub lock_timeout: Duration,
    /// Injected pieces.
    pub hooks: Hooks,
}

impl AgentConfig {
    /// Node `node`, no telemetry, default state directory, 30 s lock timeout, no hooks.
    pub fn new(node: impl Into<String>) -> Self {
        AgentConfig {
            discover: DiscoverOptions::new(node),
            health: HealthOptions::without_telemetry(gpu_health::Policy::default()),
            state_dir: None,
            lock_timeout: Duration::from_secs(30),
            hooks: Hooks::default(),
        }
    }
}

/// Opens `root` through the one composition ([`gpu_health::open_node_host`]: NVML and the vGPU
/// type-name resolver on the local `/` only) and returns its host with a config holding the
/// options it decided (default state directory, lock timeout and hooks).
///
/// # Errors
/// A root that cannot be opened, or a named NVML library that does not open.
pub fn config_for_root(
    root: &std::path::Path,
    req: &gpu_health::NodeRequest,
) -> Result<(Arc<dyn Host>, AgentConfig), gpu_health::HealthError> {
    let opened = gpu_health::open_node_host(root, req)?;
    let mut config = AgentConfig::new(req.node.clone());
    config.discover = opened.discover;
    config.health = opened.health;
    let host: Arc<dyn Host> = Arc::new(opened.host);
    Ok((host, config))
}

/// The host as the agent last read it, with the revision it reflects.
#[derive(Debug)]
pub struct Snapshot {
    /// The revision of the last change this snapshot includes.
    pub revision: u64,
    /// The topology.
    pub topology: NodeTopology,
    /// Each GPU's health report.
    pub health: Vec<GpuHealthReport>,
    /// `GET /v1/topology`'s body, rendered once (JSON, gzip and entity tag).
    pub topology_doc: Rendered,
    /// `GET /v1/health`'s body, rendered once.
    pub health_doc: Rendered,
}

/// A narrow re-read for [`Agent::refresh_with`]: the new topology and health reports composed
/// from the cached snapshot, or `None` to read the whole host.
pub type NarrowRead<'a> =
    dyn Fn(&dyn Host, &AgentConfig, &Snapshot) -> Option<(NodeTopology, Vec<GpuHealthReport>)> + 'a;

/// The one composition of a node's topology the agent serves: discovery with every GPU's health
/// graded (the same call as `gpuslice topology`).
///
/// # Errors
/// Discovery failing (a root without `sys/bus/pci/devices`).
pub fn compose_topology(
    host: &dyn Host,
    config: &AgentConfig,
) -> Result<(NodeTopology, Vec<GpuHealthReport>), ApiError> {
    gpu_health::node_topology_with_reports(host, &config.discover, &config.health)
        .map_err(|e| ApiError::from_health(&e))
}

fn with_revision<T: Serialize>(value: &T, revision: u64) -> String {
    let mut v = serde_json::to_value(value).unwrap_or(serde_json::Value::Null);
    if let Some(o) = v.as_object_mut() {
        o.insert("revision".to_owned(), revision.into());
    }
    v.to_string()
}

fn snapshot(revision: u64, topology: NodeTopology, health: Vec<GpuHealthReport>) -> Arc<Snapshot> {
    let topology_doc = Rendered::new(with_revision(&topology, revision), revision);
    let health_doc = Rendered::new(
        with_revision(
            &serde_json::json!({ "node": topology.node, "gpus": health }),
            revision,
        ),
        revision,
    );
    Arc::new(Snapshot {
        revision,
        topology,
        health,
        topology_doc,
        health_doc,
    })
}

/// What reconcile found for one promise.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Outcome {
    /// The device was there as recorded.
    Present,
    /// It was missing and was created again with the same identity.
    Recreated,
    /// It was missing and cannot be created again (the message says why); the promise is kept.
    Failed,
    /// The identity is used by another device; the promise is kept, nothing was changed.
    Conflict,
    /// An interrupted create that could not be finished; the promise was dropped.
    Dropped,
}

impl Outcome {
    /// The outcome as the JSON spells it (`present`, `recreated`, ...).
    pub fn as_str(&self) -> &'static str {
        match self {
            Outcome::Present => "present",
            Outcome::Recreated => "recreated",
            Outcome::Failed => "failed",
            Outcome::Conflict => "conflict",
            Outcome::Dropped => "dropped",
        }
    }
}

/// A bearer token as a token file holds it: the text without surrounding whitespace, at least
/// 16 characters (a short token is refused: it can be guessed).
///
/// # Errors
/// A token shorter than 16 characters.
pub fn parse_token(text: &str) -> Result<Arc<[u8]>, String> {
    let token = text.trim();
    if token.len() < 16 {
        return Err("the token is shorter than 16 characters".to_owned());
    }
    Ok(Arc::from(token.as_bytes()))
}

/// One promise and what reconcile did about it.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Reconciled {
    /// The promise.
    pub promise: Promise,
    /// What was found or done.
    pub outcome: Outcome,
    /// Why, for `failed`, `conflict` and `dropped`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// `POST /v1/vgpus`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CreateRequest {
    /// An mdev parent, an NVIDIA vendor-VFIO VF, or a physical GPU (address or name).
    pub parent: String,
    /// The vGPU type: ID or name.
    pub profile: String,
    /// The Machine it is for (the UUID is derived from machine, request and index).
    #[serde(default)]
    pub machine: Option<String>,
    /// An explicit mdev UUID (instead of `machine`).
    #[serde(default)]
    pub uuid: Option<String>,
    /// With `machine`: the device request's name (default `gpu`).
    #[serde(default)]
    pub request: Option<String>,
    /// With `machine`: the device's index within the request (default 0).
    #[serde(default)]
    pub index: Option<u32>,
    /// Re-type a vendor-VFIO VF even when a process holds it open.
    #[serde(default)]
    pub force: bool,
}

/// Refuses a field that could name a path outside the device it should name.
fn no_path(field: &str, value: &str) -> Result<(), ApiError> {
    if value.contains('/') || value.contains('\\') || value.contains('\0') || value == ".." {
        return Err(ApiError::invalid(format!(
            "{field} {value:?} contains a path separator; give a device name, address or UUID"
        )));
    }
    Ok(())
}

/// The node agent: one per host.
#[derive(Debug)]
pub struct Agent {
    host: Arc<dyn Host>,
    config: AgentConfig,
    store: StateStore,
    bus: EventBus,
    cache: RwLock<Arc<Snapshot>>,
    writer: tokio::sync::Mutex<()>,
    reconciled: RwLock<Vec<Reconciled>>,
    shutdown: tokio::sync::watch::Sender<bool>,
    tracked: Arc<crate::watch::TrackedHost>,
    stats: crate::watch::Stats,
    refresh_gate: std::sync::Mutex<()>,
}

impl Agent {
    /// Opens the agent on `host`: reads the promises, reconciles them (re-creating what is
    /// missing) and reads the topology. Blocking; call it before serving.
    ///
    /// # Errors
    /// A host without a root directory, a malformed state file, a host that cannot be discovered.
    pub fn open(host: Arc<dyn Host>, config: AgentConfig) -> Result<Arc<Self>, ApiError> {
        let root = host
            .root_dir()
            .ok_or_else(|| ApiError::new(ErrorKind::HostError, "the host has no root directory"))?
            .to_path_buf();
        let dir = config
            .state_dir
            .clone()
            .unwrap_or_else(|| root.join(crate::state::DEFAULT_STATE_DIR));
        let store = StateStore::new(dir);
        store.load()?;
        // Every read goes through the tracker, so a file that does not answer is named.
        let tracked = Arc::new(crate::watch::TrackedHost::wrap(
            host,
            crate::watch::InFlightReads::default(),
        ));
        let host: Arc<dyn Host> = Arc::clone(&tracked) as Arc<dyn Host>;
        let (topology, health) = compose_topology(host.as_ref(), &config)?;
        let (shutdown, _) = tokio::sync::watch::channel(false);
        let agent = Arc::new(Agent {
            tracked,
            stats: crate::watch::Stats::default(),
            refresh_gate: std::sync::Mutex::new(()),
            host,
            config,
            store,
            bus: EventBus::new(),
            cache: RwLock::new(snapshot(0, topology, health)),
            writer: tokio::sync::Mutex::new(()),
            reconciled: RwLock::new(vec![]),
            shutdown,
        });
        let report = agent.reconcile_blocking()?;
        if !report.is_empty() {
            let rev = agent.bus.publish(
                EventKind::Reconciled,
                serde_json::to_value(&report).unwrap_or_default(),
            );
            agent.store_snapshot(rev)?;
        }
        *agent
            .reconciled
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = report;
        Ok(agent)
    }

    /// The host.
    pub fn host(&self) -> &dyn Host {
        self.host.as_ref()
    }

    /// The configuration.
    pub fn config(&self) -> &AgentConfig {
        &self.config
    }

    /// The event bus: sources of changes publish here.
    pub fn events(&self) -> &EventBus {
        &self.bus
    }

    /// The promise store.
    pub fn store(&self) -> &StateStore {
        &self.store
    }

    /// What the last reconcile found.
    pub fn reconciled(&self) -> Vec<Reconciled> {
        self.reconciled
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// The cached snapshot: never waits for a write.
    pub fn snapshot(&self) -> Arc<Snapshot> {
        self.cache
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// A receiver that turns true when the agent shuts down.
    pub fn shutdown_signal(&self) -> tokio::sync::watch::Receiver<bool> {
        self.shutdown.subscribe()
    }

    /// Tells long-lived answers (event streams) to end.
    pub fn begin_shutdown(&self) {
        self.shutdown.send_replace(true);
    }

    /// Waits for the write in flight, if any, and keeps further writes out while the guard lives.
    pub async fn quiesce(&self) -> tokio::sync::MutexGuard<'_, ()> {
        self.writer.lock().await
    }

    fn store_snapshot(&self, revision: u64) -> Result<(), ApiError> {
        let (topology, health) = compose_topology(self.host.as_ref(), &self.config)?;
        *self
            .cache
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) =
            snapshot(revision, topology, health);
        Ok(())
    }

    /// Reads the host again; when the topology or a GPU's health differs from the cached one,
    /// publishes `health-changed` per GPU (with the reasons, and the evacuation plan of the
    /// Machines on a GPU that turned Unhealthy) and `topology-changed`, and serves the new
    /// snapshot with that revision. Blocking. Returns the revision served. Refreshes run one at
    /// a time; the cached snapshot is served throughout.
    ///
    /// # Errors
    /// Discovery failing; the cached snapshot is kept.
    pub fn refresh(&self) -> Result<u64, ApiError> {
        self.refresh_with(&|_, _, _| None)
    }

    /// As [`Agent::refresh`], but `narrow` may compose the new topology from the cached
    /// snapshot by re-reading only what changed (a uevent's device); when it gives `None` the
    /// whole host is read.
    ///
    /// # Errors
    /// Discovery failing; the cached snapshot is kept.
    pub fn refresh_with(&self, narrow: &NarrowRead<'_>) -> Result<u64, ApiError> {
        let _one = self
            .refresh_gate
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let started = std::time::Instant::now();
        let before = self.snapshot();
        let composed = match narrow(self.host.as_ref(), &self.config, &before) {
            Some(done) => Ok(done),
            None => compose_topology(self.host.as_ref(), &self.config),
        };
        self.stats
            .record_resync(started.elapsed(), composed.is_ok());
        let (topology, health) = composed?;
        if before.topology == topology && before.health == health {
            return Ok(before.revision);
        }
        let mut evacuation: Option<gpu_sched::EvacuationPlan> = None;
        let mut events = Vec::new();
        for g in &topology.gpus {
            let old = before.topology.gpus.iter().find(|o| o.address == g.address);
            if old.is_none_or(|b| b.health != g.health) {
                let mut data = serde_json::json!({
                    "gpu": g.name,
                    "address": g.address,
                    "health": g.health,
                    "previous": old.map(|b| &b.health),
                    "reason": if g.health.reasons.is_empty() {
                        "every signal that could be read is fine".to_owned()
                    } else {
                        g.health.reasons.join("; ")
                    },
                });
                let turned_unhealthy = g.health.state == gpu_core::HealthState::Unhealthy
                    && old.is_none_or(|b| b.health.state != gpu_core::HealthState::Unhealthy);
                if turned_unhealthy {
                    let plan = evacuation.get_or_insert_with(|| self.evacuation_for(&topology));
                    let machines = evacuation_of(plan, &g.name);
                    if let Some(o) = data.as_object_mut() {
                        o.insert("evacuation".to_owned(), machines);
                    }
                }
                events.push((EventKind::HealthChanged, data));
            }
        }
        events.push((
            EventKind::TopologyChanged,
            serde_json::json!({ "node": topology.node }),
        ));
        // The snapshot is served before any subscriber hears of its revision.
        let rev = self.bus.publish_all(events, |rev| {
            let next = snapshot(rev, topology, health);
            *self
                .cache
                .write()
                .unwrap_or_else(std::sync::PoisonError::into_inner) = next;
        });
        Ok(rev)
    }

    /// The evacuation plan (`gpuslice plan evacuate`) of the Machines the agent's promises
    /// record on this node, planned on `topology` alone: destinations are other GPUs of the node.
    pub fn evacuation_for(&self, topology: &NodeTopology) -> gpu_sched::EvacuationPlan {
        let promises = self.load().map(|s| s.promises).unwrap_or_default();
        let allocations = crate::watch::allocations_of(topology, &promises);
        let fleet = gpu_core::Fleet {
            nodes: vec![topology.clone()],
            allocations,
            templates: Default::default(),
        };
        match gpu_sched::FleetState::new(fleet) {
            Ok(state) => state.plan_evacuation(),
            Err(e) => {
                crate::log!("gpuslice agent: cannot plan an evacuation: {e}");
                gpu_sched::EvacuationPlan::default()
            }
        }
    }

    /// The agent's own counters (`/metrics`).
    pub fn stats(&self) -> &crate::watch::Stats {
        &self.stats
    }

    /// The reads in flight longer than `deadline`, not reported before (each once).
    pub(crate) fn tracked(&self) -> &crate::watch::TrackedHost {
        &self.tracked
    }

    /// Marks the GPU a stalled read belongs to Unknown in the served snapshot (the rest of the
    /// host is served as last read), and publishes that.
    pub(crate) fn mark_stalled(&self, path: &str, waited: Duration) {
        let addr = path.split('/').find_map(|c| c.parse::<PciAddress>().ok());
        let reason = format!(
            "sysfs file {path} did not answer within {} ms",
            waited.as_millis()
        );
        self.stats.read_timed_out();
        let served = self.snapshot();
        let mut topology = served.topology.clone();
        let gpu = addr.and_then(|a| {
            topology.gpus.iter_mut().find(|g| {
                g.address == a
                    || g.functions.iter().any(|f| f.address == a)
                    || g.sriov.as_ref().is_some_and(|s| s.vfs.contains(&a))
            })
        });
        let mut data = serde_json::json!({
            "path": path,
            "address": addr,
            "waitedMs": u64::try_from(waited.as_millis()).unwrap_or(u64::MAX),
        });
        let Some(g) = gpu else {
            self.bus.publish(EventKind::ReadTimedOut, data);
            return;
        };
        let previous = g.health.clone();
        g.health = gpu_core::Health {
            state: gpu_core::HealthState::Unknown,
            reasons: vec![reason.clone()],
        };
        let (name, address, health) = (g.name.clone(), g.address, g.health.clone());
        if let Some(o) = data.as_object_mut() {
            o.insert("gpu".to_owned(), name.clone().into());
        }
        let changed = serde_json::json!({
            "gpu": name,
            "address": address,
            "health": health,
            "previous": previous,
            "reason": reason,
        });
        let reports = served.health.clone();
        self.bus.publish_all(
            vec![
                (EventKind::ReadTimedOut, data),
                (EventKind::HealthChanged, changed),
            ],
            |rev| {
                let next = snapshot(rev, topology, reports);
                *self
                    .cache
                    .write()
                    .unwrap_or_else(std::sync::PoisonError::into_inner) = next;
            },
        );
    }

    /// Runs `f` as the one writer: after the agent's writer lock (async) and, when `host_lock`,
    /// the host's layout lock (on the blocking thread), then refreshes the snapshot.
    async fn write<T, F>(self: &Arc<Self>, host_lock: bool, f: F) -> Result<T, ApiError>
    where
        T: Send + 'static,
        F: FnOnce(&Agent) -> Result<T, ApiError> + Send + 'static,
    {
        let _w = self.writer.lock().await;
        let me = Arc::clone(self);
        tokio::task::spawn_blocking(move || {
            let _lock = if host_lock {
                Some(me.layout_lock()?)
            } else {
                None
            };
            let out = f(&me);
            if let Err(e) = me.refresh() {
                crate::log!("gpuslice agent: cannot read the host after a write: {e}");
            }
            out
        })
        .await
        .map_err(|e| ApiError::new(ErrorKind::Other, format!("the write did not finish: {e}")))?
    }

    fn layout_lock(&self) -> Result<LayoutLock, ApiError> {
        let root = self
            .host
            .root_dir()
            .ok_or_else(|| ApiError::new(ErrorKind::HostError, "the host has no root directory"))?;
        LayoutLock::acquire(root, Some(self.config.lock_timeout), &mut |p| {
            crate::log!(
                "gpuslice agent: waiting for {} (another gpuslice vgpu apply)",
                p.display()
            );
        })
        .map_err(|e| ApiError::from_apply(&e))
    }

    fn load(&self) -> Result<StateFile, ApiError> {
        self.store.load()
    }

    fn handoff(&self, target: &HandoffTarget) -> Option<serde_json::Value> {
        let hook = self.config.hooks.handoff.as_ref()?;
        let snap = self.snapshot();
        Some(match hook(&snap.topology, target) {
            Ok(v) => v,
            Err(e) => serde_json::json!({ "error": e }),
        })
    }

    /// `POST /v1/vgpus`.
    ///
    /// # Errors
    /// Invalid requests (nothing written), conflicts, exhausted pools, host errors.
    pub async fn create(
        self: &Arc<Self>,
        req: CreateRequest,
    ) -> Result<serde_json::Value, ApiError> {
        no_path("parent", &req.parent)?;
        no_path("profile", &req.profile)?;
        let parent: ParentId = req
            .parent
            .parse()
            .map_err(|e| ApiError::from_core("parent", &e))?;
        let owner = Owner {
            machine: req.machine.clone(),
            request: req
                .machine
                .as_ref()
                .map(|_| req.request.clone().unwrap_or_else(|| "gpu".to_owned())),
            index: req.machine.as_ref().map(|_| req.index.unwrap_or(0)),
        };
        let uuid = match (&req.uuid, &req.machine) {
            (Some(_), Some(_)) => {
                return Err(ApiError::invalid("give either uuid or machine, not both"));
            }
            (Some(u), None) => {
                no_path("uuid", u)?;
                if req.request.is_some() || req.index.is_some() {
                    return Err(ApiError::invalid("request and index go with machine"));
                }
                Some(
                    u.parse::<MdevUuid>()
                        .map_err(|e| ApiError::from_core("uuid", &e))?,
                )
            }
            (None, Some(m)) => {
                let r = owner.request.as_deref().unwrap_or("gpu");
                let u = actuate::machine_uuid(m, r, owner.index.unwrap_or(0))
                    .map_err(|(field, e)| ApiError::from_core(field, &e))?;
                Some(u)
            }
            (None, None) => None,
        };
        let me = Arc::clone(self);
        let out = self
            .write(true, move |a| a.create_locked(&req, parent, uuid, owner))
            .await?;
        let (kind, id, body) = out;
        let rev = me
            .bus
            .publish(kind_created(), serde_json::json!({ "id": id }));
        let mut body = body;
        if let Some(o) = body.as_object_mut() {
            o.insert("revision".to_owned(), rev.into());
        }
        let _ = kind;
        Ok(body)
    }

    fn create_locked(
        &self,
        req: &CreateRequest,
        parent: ParentId,
        uuid: Option<MdevUuid>,
        owner: Owner,
    ) -> Result<(&'static str, String, serde_json::Value), ApiError> {
        let host = self.host.as_ref();
        let target = actuate::create_target(host, &parent, &req.profile, |n| {
            self.snapshot()
                .topology
                .gpu_by_name(n)
                .map(|g| g.address)
                .ok_or_else(|| {
                    ApiError::not_found(format!(
                        "{n:?} is neither an mdev parent nor a GPU of this host"
                    ))
                })
        })?;
        let (device, context, handoff, kind) = match &target {
            CreateTarget::Mdev { type_id, .. } | CreateTarget::MdevOnGpu { type_id, .. } => {
                let uuid = uuid.ok_or_else(|| {
                    ApiError::invalid("an mdev instance needs a name: give uuid or machine")
                })?;
                let device = Device::Mdev {
                    uuid,
                    parent: parent.clone(),
                    type_id: type_id.clone(),
                };
                let context = format!("cannot create mdev {uuid}");
                (device, context, HandoffTarget::Mdev(uuid), "mdev")
            }
            CreateTarget::VendorVfio { vf, type_num } => {
                if uuid.is_some() && req.machine.is_none() {
                    return Err(ApiError::invalid(
                        "uuid names mdev instances; a vendor-VFIO vGPU is named by its VF",
                    ));
                }
                let device = Device::VendorVfio {
                    vf: *vf,
                    type_num: *type_num,
                };
                let context = format!("cannot give VF {vf} type {type_num}");
                (device, context, HandoffTarget::Pci(*vf), "vendorVfio")
            }
        };
        let id = device.id();
        let made = self.with_promise(device.clone(), owner, &req.profile, || {
            let made = actuate::create_vgpu(host, &target, uuid, &req.profile, req.force)
                .map_err(|e| ApiError::from_actuate(&e).context(&context))?;
            let actual = match &made {
                Created::Mdev(m) => Device::Mdev {
                    uuid: m.uuid,
                    parent: m.parent.clone(),
                    type_id: m.type_id.clone(),
                },
                Created::VendorVfio(_) => device.clone(),
            };
            Ok((made, actual))
        })?;
        let mut body = serde_json::to_value(&made).unwrap_or_default();
        if let (Some(o), Some(h)) = (body.as_object_mut(), self.handoff(&handoff)) {
            o.insert("vmHandoff".to_owned(), h);
        }
        Ok((kind, id, body))
    }

    /// Records `device` as pending, runs `create`, then records what was made as created; a
    /// failed create takes its pending record back out. A recorded device of the same identity
    /// but another parent or type is refused before anything is written.
    fn with_promise<T>(
        &self,
        device: Device,
        owner: Owner,
        profile: &str,
        create: impl FnOnce() -> Result<(T, Device), ApiError>,
    ) -> Result<T, ApiError> {
        let mut state = self.load()?;
        let id = device.id();
        let existing = state.promises.iter().position(|p| p.device.id() == id);
        if let Some(i) = existing {
            let p = &state.promises[i];
            if !same_target(&p.device, &device) && !self.picked_on_gpu(&p.device, &device) {
                return Err(ApiError::new(
                    ErrorKind::ExistsOtherType,
                    format!(
                        "{id} is already promised as {} (profile {}); remove it first",
                        describe(&p.device),
                        p.profile
                    ),
                ));
            }
        } else {
            state.promises.push(Promise {
                device,
                owner,
                profile: profile.to_owned(),
                phase: Phase::Pending,
            });
            self.store.save(&state)?;
        }
        match create() {
            Ok((made, actual)) => {
                if let Some(p) = state.promises.iter_mut().find(|p| p.device.id() == id) {
                    p.device = actual;
                    p.phase = Phase::Created;
                }
                self.store.save(&state)?;
                Ok(made)
            }
            Err(e) => {
                if existing.is_none() {
                    state.promises.retain(|p| p.device.id() != id);
                    self.store.save(&state)?;
                }
                Err(e)
            }
        }
    }

    /// `DELETE /v1/vgpus/{uuid|vf}`: removes the instance (refused while a VM holds it, unless
    /// `force`) and forgets its promise.
    ///
    /// # Errors
    /// A target that is neither a UUID nor an address, `in-use`, host errors.
    pub async fn remove(
        self: &Arc<Self>,
        target: String,
        force: bool,
    ) -> Result<serde_json::Value, ApiError> {
        no_path("target", &target)?;
        let me = Arc::clone(self);
        let body = self
            .write(true, move |a| {
                let host = a.host.as_ref();
                let (id, value) = if let Ok(u) = target.parse::<MdevUuid>() {
                    let r = actuate::remove_mdev(host, &u, force).map_err(|e| {
                        ApiError::from_actuate(&e).context(format!("cannot remove mdev {u}"))
                    })?;
                    (u.to_string(), serde_json::to_value(&r).unwrap_or_default())
                } else if let Ok(vf) = target.parse::<PciAddress>() {
                    let r = actuate::clear_vf(host, &vf, force).map_err(|e| {
                        ApiError::from_actuate(&e).context(format!("cannot clear VF {vf}"))
                    })?;
                    (vf.to_string(), serde_json::to_value(&r).unwrap_or_default())
                } else {
                    return Err(ApiError::invalid(format!(
                        "{target:?} is neither an mdev UUID nor a PCI address"
                    )));
                };
                let mut state = a.load()?;
                let before = state.promises.len();
                state.promises.retain(|p| p.device.id() != id);
                if state.promises.len() != before {
                    a.store.save(&state)?;
                }
                Ok((id, value))
            })
            .await?;
        let (id, mut value) = body;
        let rev = me
            .bus
            .publish(EventKind::VgpuRemoved, serde_json::json!({ "id": id }));
        if let Some(o) = value.as_object_mut() {
            o.insert("revision".to_owned(), rev.into());
        }
        Ok(value)
    }

    fn resolve_gpu(&self, gpu: &str) -> Result<PciAddress, ApiError> {
        no_path("gpu", gpu)?;
        let name = match GpuRef::parse_one(gpu).map_err(|e| ApiError::from_core("gpu", &e))? {
            GpuRef::Address(a) => return Ok(a),
            named => named.to_string(),
        };
        let snap = self.snapshot();
        snap.topology
            .gpu_address_by_name(&name)
            .map_err(ApiError::not_found)
    }

    /// `POST /v1/gpus/{name|bdf}/bind` and `/release`. A bind of a GPU the served topology
    /// grades Unhealthy is refused unless `force` (`?force=true`), as `gpuslice gpu bind` does
    /// ([`gpu_core::Health::check_handout`]); a Degraded one is bound with a warning in the
    /// answer's `warnings`. For a release, `force` releases a GPU a process holds.
    ///
    /// # Errors
    /// Unknown GPUs, an Unhealthy GPU (`unhealthy`, 409), refusals of the actuation layer.
    pub async fn bind(
        self: &Arc<Self>,
        gpu: String,
        bind: bool,
        force: bool,
    ) -> Result<serde_json::Value, ApiError> {
        let addr = self.resolve_gpu(&gpu)?;
        let health_warning = if bind {
            let snap = self.snapshot();
            match snap.topology.gpu_by_address(&addr) {
                Some(g) => g
                    .health
                    .check_handout(&addr.to_string(), force, "?force=true")
                    .map_err(|e| ApiError::new(e.kind(), e.to_string()))?,
                None => None,
            }
        } else {
            None
        };
        let me = Arc::clone(self);
        let mut value = self
            .write(true, move |a| {
                let r = if bind {
                    actuate::bind_gpu(a.host.as_ref(), &addr)
                } else {
                    actuate::release_gpu(a.host.as_ref(), &addr, force)
                }
                .map_err(|e| ApiError::from_actuate(&e).context(addr))?;
                Ok(serde_json::to_value(&r).unwrap_or_default())
            })
            .await?;
        let kind = if bind {
            EventKind::GpuBound
        } else {
            EventKind::GpuReleased
        };
        let rev = me
            .bus
            .publish(kind, serde_json::json!({ "gpu": addr.to_string() }));
        if let Some(o) = value.as_object_mut() {
            o.insert("revision".to_owned(), rev.into());
            if let Some(w) = health_warning {
                match o
                    .get_mut("warnings")
                    .and_then(serde_json::Value::as_array_mut)
                {
                    Some(list) => list.push(w.into()),
                    None => {
                        o.insert("warnings".to_owned(), vec![w].into());
                    }
                }
            }
            if bind {
                if let Some(h) = me.handoff(&HandoffTarget::Pci(addr)) {
                    o.insert("vmHandoff".to_owned(), h);
                }
            }
        }
        Ok(value)
    }

    /// `PUT /v1/layout`: applies a layout document (`gpuslice vgpu apply`'s file).
    ///
    /// # Errors
    /// A malformed layout or unknown config (nothing written), a failed apply (rolled back).
    pub async fn apply_layout(
        self: &Arc<Self>,
        text: String,
        config: Option<String>,
        dry_run: bool,
        force: bool,
    ) -> Result<serde_json::Value, ApiError> {
        self.apply_layout_from(text, config, dry_run, force, None)
            .await
    }

    /// [`Agent::apply_layout`] of a document read from `source` (the watched layout file),
    /// named in the `layout-applied` event.
    ///
    /// # Errors
    /// As [`Agent::apply_layout`].
    pub async fn apply_layout_from(
        self: &Arc<Self>,
        text: String,
        config: Option<String>,
        dry_run: bool,
        force: bool,
        source: Option<String>,
    ) -> Result<serde_json::Value, ApiError> {
        if let Some(c) = &config {
            no_path("config", c)?;
        }
        let file = gpu_core::layout::LayoutFile::parse(&text)
            .map_err(|e| ApiError::new(e.kind(), chain(&e)).with_status(400))?;
        file.select(config.as_deref())
            .map_err(|e| ApiError::new(e.kind(), chain(&e)).with_status(400))?;
        let me = Arc::clone(self);
        // apply_layout takes the host's layout lock itself.
        let report = self
            .write(false, move |a| {
                let cfg = file
                    .select(config.as_deref())
                    .map_err(|e| ApiError::new(e.kind(), chain(&e)).with_status(400))?;
                let mut opts = ApplyOptions::new(a.config.discover.node.clone());
                opts.discover = a.config.discover.clone();
                opts.dry_run = dry_run;
                opts.force = force;
                opts.lock_timeout = Some(a.config.lock_timeout);
                gpu_sysfs::apply::apply_layout(a.host.as_ref(), cfg, &opts, &mut |_| {})
                    .map_err(|e| ApiError::from_apply(&e))
            })
            .await?;
        let mut value = serde_json::to_value(&report).unwrap_or_default();
        if !dry_run {
            let left_alone: Vec<_> = report.plan.refused().collect();
            let rev = me.bus.publish(
                EventKind::LayoutApplied,
                serde_json::json!({
                    "status": report.status,
                    "source": source,
                    "config": report.plan.config,
                    "changes": report.changes.len(),
                    "failure": report.failure,
                    "leftAlone": left_alone,
                }),
            );
            if let Some(o) = value.as_object_mut() {
                o.insert("revision".to_owned(), rev.into());
            }
        }
        Ok(value)
    }

    /// `GET /v1/vgpus`: the instances on the host now, and the agent's promises.
    ///
    /// # Errors
    /// An unreadable host.
    pub fn list_blocking(&self) -> Result<serde_json::Value, ApiError> {
        let host = self.host.as_ref();
        let listing = actuate::list_vgpus(host)?;
        let state = self.load()?;
        Ok(serde_json::json!({
            "revision": self.bus.revision(),
            "mdevs": listing.mdevs,
            "vendorVfio": listing.vendor_vfio,
            "promises": state.promises,
        }))
    }

    /// Re-creates the recorded devices that are missing, under the layout lock. Blocking.
    ///
    /// # Errors
    /// The lock or the state file failing; each promise's own failure is in the report.
    pub fn reconcile_blocking(&self) -> Result<Vec<Reconciled>, ApiError> {
        let _lock = self.layout_lock()?;
        let mut state = self.load()?;
        let host = self.host.as_ref();
        let mut report = Vec::new();
        let mut keep = Vec::new();
        for mut p in std::mem::take(&mut state.promises) {
            let (outcome, message) = match &p.device {
                Device::Mdev {
                    uuid,
                    parent,
                    type_id,
                } => {
                    let existing = actuate::list_instances(host)
                        .ok()
                        .and_then(|l| l.into_iter().find(|i| i.uuid == *uuid));
                    match existing {
                        Some(i) if i.parent == *parent && i.type_id == *type_id => {
                            (Outcome::Present, None)
                        }
                        Some(i) if p.phase == Phase::Pending && i.type_id == *type_id => {
                            // An interrupted create on a GPU picked this VF.
                            p.device = Device::Mdev {
                                uuid: *uuid,
                                parent: i.parent,
                                type_id: i.type_id,
                            };
                            (Outcome::Present, None)
                        }
                        Some(i) => (
                            Outcome::Conflict,
                            Some(format!(
                                "mdev {uuid} exists as {} on {}, not {type_id} on {parent}",
                                i.type_id, i.parent
                            )),
                        ),
                        None => {
                            let r = if host.exists(&format!("sys/class/mdev_bus/{parent}")) {
                                actuate::create_mdev(
                                    host,
                                    &MdevCreate {
                                        parent: parent.clone(),
                                        type_id: type_id.clone(),
                                        uuid: *uuid,
                                    },
                                )
                            } else if let ParentId::Pci(gpu) = parent {
                                actuate::create_mdev_on_gpu(host, gpu, type_id.as_str(), *uuid)
                            } else {
                                actuate::create_mdev(
                                    host,
                                    &MdevCreate {
                                        parent: parent.clone(),
                                        type_id: type_id.clone(),
                                        uuid: *uuid,
                                    },
                                )
                            };
                            match r {
                                Ok(_) => (Outcome::Recreated, None),
                                Err(e) => (Outcome::Failed, Some(chain(&e))),
                            }
                        }
                    }
                }
                Device::VendorVfio { vf, type_num } => match actuate::current_type(host, vf) {
                    Ok(t) if t == *type_num => (Outcome::Present, None),
                    Ok(0) => match actuate::set_vf_type(host, vf, *type_num, false) {
                        Ok(_) => (Outcome::Recreated, None),
                        Err(e) => (Outcome::Failed, Some(chain(&e))),
                    },
                    Ok(t) => (
                        Outcome::Conflict,
                        Some(format!("VF {vf} has type {t}, not {type_num}")),
                    ),
                    Err(e) => (Outcome::Failed, Some(chain(&e))),
                },
            };
            let outcome = match outcome {
                Outcome::Failed | Outcome::Conflict if p.phase == Phase::Pending => {
                    Outcome::Dropped
                }
                o => o,
            };
            if outcome != Outcome::Dropped {
                if matches!(outcome, Outcome::Present | Outcome::Recreated) {
                    p.phase = Phase::Created;
                }
                keep.push(p.clone());
            }
            if let Some(m) = &message {
                crate::log!(
                    "gpuslice agent: reconcile {}: {:?}: {m}",
                    p.device.id(),
                    outcome
                );
            }
            report.push(Reconciled {
                promise: p,
                outcome,
                message,
            });
        }
        state.promises = keep;
        self.store.save(&state)?;
        Ok(report)
    }
}

impl Agent {
    /// A create on a GPU whose VFs are mdev parents records the VF it picked: a retry naming the
    /// GPU is the same promise when the recorded VF is one of that GPU's.
    fn picked_on_gpu(&self, recorded: &Device, requested: &Device) -> bool {
        match (recorded, requested) {
            (
                Device::Mdev {
                    parent: ParentId::Pci(vf),
                    type_id: t1,
                    ..
                },
                Device::Mdev {
                    parent: ParentId::Pci(gpu),
                    type_id: t2,
                    ..
                },
            ) => t1 == t2 && actuate::vfs_of(self.host.as_ref(), gpu).contains(vf),
            _ => false,
        }
    }
}

/// The Machines of `plan` with a device on the GPU named `gpu`.
fn evacuation_of(plan: &gpu_sched::EvacuationPlan, gpu: &str) -> serde_json::Value {
    let via = format!("{gpu} via ");
    let machines: Vec<&gpu_sched::Evacuation> = plan
        .machines
        .iter()
        .filter(|m| {
            m.affected
                .iter()
                .any(|d| d.device == gpu || d.device.starts_with(&via))
        })
        .collect();
    serde_json::json!({
        "scope": "node",
        "machines": machines,
    })
}

fn kind_created() -> EventKind {
    EventKind::VgpuCreated
}

fn same_target(a: &Device, b: &Device) -> bool {
    match (a, b) {
        (
            Device::Mdev {
                type_id: t1,
                parent: p1,
                ..
            },
            Device::Mdev {
                type_id: t2,
                parent: p2,
                ..
            },
        ) => t1 == t2 && p1 == p2,
        (Device::VendorVfio { type_num: a, .. }, Device::VendorVfio { type_num: b, .. }) => a == b,
        _ => false,
    }
}

fn describe(d: &Device) -> String {
    match d {
        Device::Mdev {
            parent, type_id, ..
        } => format!("{type_id} on {parent}"),
        Device::VendorVfio { vf, type_num } => format!("type {type_num} on VF {vf}"),
    }
}

impl ApiError {
    /// The same error with another HTTP status.
    pub fn with_status(mut self, status: u16) -> Self {
        self.status = status;
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_outcome_is_named_as_its_json_spells_it() {
        for o in [
            Outcome::Present,
            Outcome::Recreated,
            Outcome::Failed,
            Outcome::Conflict,
            Outcome::Dropped,
        ] {
            assert_eq!(serde_json::to_value(&o).ok(), Some(o.as_str().into()));
        }
    }

    #[test]
    fn a_token_is_trimmed_and_a_short_one_refused() {
        assert_eq!(
            parse_token("  0123456789abcdef\n").ok().as_deref(),
            Some(&b"0123456789abcdef"[..])
        );
        assert!(parse_token("short\n").is_err());
    }
}
