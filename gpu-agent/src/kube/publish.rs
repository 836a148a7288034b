//! Keeping a node's ResourceSlices true in the API server.
//!
//! A pool's wanted slices are the ones `gpuslice export dra` prints for the node
//! ([`gpu_integrations::dra::build::node_slices`]), owned by the Node object so they go when the
//! node goes. One round ([`sync_pool`]) lists the driver's slices of the node, plans
//! ([`plan`]) and applies: create what is missing, replace what changed, delete what is no
//! longer wanted. When anything of the pool's content changes, every slice is written with
//! `pool.generation` one higher (the scheduler only reads a pool's newest generation) and the
//! right `resourceSliceCount`; when nothing changed nothing is written. A conflict (409: someone
//! changed a slice between the list and the write) re-reads and applies again.
//!
//! In the agent ([`spawn_publisher`]) a round runs on start and after each new revision of the
//! topology or health: at once after a quiet spell, at most once per
//! [`PublishOptions::min_interval`] during a burst (the last round carries the last state), with
//! bounded back-off while the server fails. Nothing else in the agent waits on it.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use gpu_core::{NodeTopology, PciAddress};
use gpu_integrations::dra::build::node_slices;
use gpu_integrations::dra::model::ResourceSlice;
use gpu_integrations::dra::names::is_dns_subdomain;
use gpu_integrations::dra::{ClaimStore, DEFAULT_DRIVER, DraOptions, Encoding, K8sVersion};
use serde_json::{Value, json};

use super::{KubeClient, KubeError};
use crate::agent::Agent;

/// Where ResourceSlices live.
pub const SLICES_PATH: &str = "/apis/resource.k8s.io/v1/resourceslices";
/// How many times one round re-reads and applies again after a conflict.
pub const CONFLICT_RETRIES: usize = 5;
/// The oldest Kubernetes minor release with `resource.k8s.io/v1`.
pub const OLDEST_MINOR: u32 = 34;
/// The newest minor release whose rules are known; a newer server is published for as this one.
pub const NEWEST_MINOR: u32 = 37;

/// The API server as the publisher needs it.
#[derive(Debug, Clone)]
pub struct ServerInfo {
    /// `gitVersion` of `/version`, as the server said it.
    pub git_version: String,
    /// The release whose rules and encoding apply.
    pub version: K8sVersion,
}

impl ServerInfo {
    /// How time-sliced vGPUs are published for this server.
    pub fn encoding(&self) -> Encoding {
        self.version.encoding()
    }
}

/// The release of a `gitVersion` (`v1.35.3`, `v1.36.2-gke.100`, `v1.34.0+k3s1`); a minor newer
/// than [`NEWEST_MINOR`] is treated as that one.
///
/// # Errors
/// [`KubeError::Unsupported`] for a release older than 1.34 (no `resource.k8s.io/v1`);
/// [`KubeError::Invalid`] for text that is no version.
pub fn server_version(git_version: &str) -> Result<K8sVersion, KubeError> {
    let core = git_version
        .trim()
        .trim_start_matches('v')
        .split(['-', '+'])
        .next()
        .unwrap_or("");
    let mut parts = core.split('.');
    let num = |p: Option<&str>| p.and_then(|p| p.parse::<u32>().ok());
    let (Some(major), Some(minor)) = (num(parts.next()), num(parts.next())) else {
        return Err(KubeError::Invalid(format!(
            "/version gitVersion {git_version:?} is not a Kubernetes version"
        )));
    };
    let patch = num(parts.next()).unwrap_or(0);
    if major != 1 || minor < OLDEST_MINOR {
        return Err(KubeError::Unsupported(format!(
            "the API server is Kubernetes {git_version}; publishing ResourceSlices needs 1.34 or later (resource.k8s.io/v1)"
        )));
    }
    let text = if minor > NEWEST_MINOR {
        format!("1.{NEWEST_MINOR}")
    } else {
        format!("1.{minor}.{patch}")
    };
    text.parse::<K8sVersion>()
        .map_err(|e| KubeError::Invalid(format!("/version gitVersion {git_version:?}: {e}")))
}

/// Reads `/version` and checks that the server serves `resource.k8s.io/v1`.
///
/// # Errors
/// [`KubeError::Unsupported`] for a release older than 1.34 or a server without
/// `resource.k8s.io/v1`; what [`KubeClient::request`] returns when the server cannot be asked.
pub async fn server_info(client: &KubeClient) -> Result<ServerInfo, KubeError> {
    let v = client.get("/version").await?;
    let git_version = v
        .get("gitVersion")
        .and_then(Value::as_str)
        .ok_or_else(|| KubeError::Invalid("/version has no gitVersion".to_owned()))?
        .to_owned();
    let version = server_version(&git_version)?;
    let groups = client.get("/apis").await?;
    let served = groups
        .get("groups")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter(|g| g.get("name").and_then(Value::as_str) == Some("resource.k8s.io"))
        .flat_map(|g| {
            g.get("versions")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
        })
        .any(|v| v.get("version").and_then(Value::as_str) == Some("v1"));
    if !served {
        return Err(KubeError::Unsupported(format!(
            "the API server ({git_version}) does not serve resource.k8s.io/v1; enable the DRA API (it is on by default from 1.34)"
        )));
    }
    Ok(ServerInfo {
        git_version,
        version,
    })
}

/// The Node that owns a pool's slices.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeOwner {
    /// The node's name.
    pub name: String,
    /// Its `metadata.uid`.
    pub uid: String,
}

/// Reads the Node `name` for its UID.
///
/// # Errors
/// [`KubeError::Status`] 404 when the cluster has no such node; see [`KubeClient::request`].
pub async fn node_owner(client: &KubeClient, name: &str) -> Result<NodeOwner, KubeError> {
    if !is_dns_subdomain(name) {
        return Err(KubeError::Invalid(format!(
            "node name {name:?} is not a Kubernetes node name"
        )));
    }
    let node = client.get(&format!("/api/v1/nodes/{name}")).await?;
    let uid = node
        .pointer("/metadata/uid")
        .and_then(Value::as_str)
        .filter(|u| !u.is_empty())
        .ok_or_else(|| KubeError::Invalid(format!("node {name} has no metadata.uid")))?;
    Ok(NodeOwner {
        name: name.to_owned(),
        uid: uid.to_owned(),
    })
}

/// One pool as it should be: the node, the driver and the slices (their generation is set by
/// the plan).
#[derive(Debug, Clone)]
pub struct PoolTarget {
    /// The node (and pool) name.
    pub node: String,
    /// The driver name.
    pub driver: String,
    /// The wanted slices.
    pub slices: Vec<ResourceSlice>,
    /// The owner to name in `ownerReferences`; `None` only for a dry run.
    pub owner: Option<NodeOwner>,
}

/// What `gpuslice dra publish` and the agent pass to [`node_slices`] besides the topology.
#[derive(Debug, Clone)]
pub struct SliceOptions {
    /// The driver name.
    pub driver: String,
    /// `--size-for`: the profile an unlocked GPU offers under the one-size encoding.
    pub size_for: BTreeMap<PciAddress, String>,
}

impl Default for SliceOptions {
    fn default() -> Self {
        Self {
            driver: DEFAULT_DRIVER.to_owned(),
            size_for: BTreeMap::new(),
        }
    }
}

/// The slices of `node` for `version`, with what the driver's own claims hold (`prepared`, from
/// the claim store) left in: the scheduler counts that through the claims.
///
/// # Errors
/// [`KubeError::Invalid`] when [`node_slices`] refuses the node (a bad name, a GPU that does not
/// fit a slice under the version's rules).
pub fn wanted_slices(
    node: &NodeTopology,
    version: K8sVersion,
    opts: &SliceOptions,
    prepared: BTreeMap<String, gpu_integrations::dra::Prepared>,
) -> Result<(Vec<ResourceSlice>, Vec<String>), KubeError> {
    let dra = DraOptions {
        driver: opts.driver.clone(),
        version,
        generation: 0,
        prepared,
        size_for: opts.size_for.clone(),
    };
    let s = node_slices(node, &dra)
        .map_err(|e| KubeError::Invalid(format!("node {}: {e}", node.node)))?;
    Ok((s.slices, s.warnings))
}

/// One write of a plan.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PlanStep {
    /// Create the slice.
    Create {
        /// Its name.
        name: String,
    },
    /// Replace the slice (its content or generation changed).
    Update {
        /// Its name.
        name: String,
        /// The resourceVersion it replaces.
        resource_version: String,
    },
    /// Delete a slice of the pool that is no longer wanted.
    Delete {
        /// Its name.
        name: String,
    },
}

impl PlanStep {
    /// The slice the step writes.
    pub fn name(&self) -> &str {
        match self {
            PlanStep::Create { name }
            | PlanStep::Update { name, .. }
            | PlanStep::Delete { name } => name,
        }
    }
}

impl std::fmt::Display for PlanStep {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PlanStep::Create { name } => write!(f, "create {name}"),
            PlanStep::Update { name, .. } => write!(f, "update {name}"),
            PlanStep::Delete { name } => write!(f, "delete {name}"),
        }
    }
}

/// What one round writes for a pool.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    /// The node (and pool).
    pub node: String,
    /// `pool.generation` after the plan (the current one when nothing changes).
    pub generation: i64,
    /// The writes, creates and updates before deletes; empty when the pool is as wanted.
    pub steps: Vec<PlanStep>,
    /// The JSON bodies of the objects to create or replace, by name.
    pub objects: BTreeMap<String, Vec<u8>>,
}

impl Plan {
    /// Whether the pool is already as wanted.
    pub fn is_empty(&self) -> bool {
        self.steps.is_empty()
    }
}

/// What one round did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PublishOutcome {
    /// The pool's generation now.
    pub generation: i64,
    /// Writes made (0: the pool was already as wanted).
    pub writes: usize,
    /// The writes of the round that went through.
    pub steps: Vec<PlanStep>,
    /// Conflicts met and re-applied over.
    pub conflicts: usize,
}

/// A wanted slice as it is written: its generation set, owned by the Node, and (to replace
/// it) the `resourceVersion` it replaces. Serialized straight from the typed slice, so a write
/// never builds the document as a `serde_json::Value`.
struct SliceDoc<'a> {
    slice: &'a ResourceSlice,
    generation: i64,
    owner: Option<&'a NodeOwner>,
    resource_version: Option<&'a str>,
}

impl serde::Serialize for SliceDoc<'_> {
    fn serialize<S: serde::Serializer>(&self, ser: S) -> Result<S::Ok, S::Error> {
        use gpu_integrations::dra::model::{ObjectMeta, ResourcePool, ResourceSliceSpec};
        use serde::ser::SerializeMap as _;
        // Exhaustive patterns: a field added to the model does not compile until it is written
        // here too.
        let ResourceSlice {
            api_version,
            kind,
            metadata,
            spec,
        } = self.slice;
        let ObjectMeta { name, labels } = metadata;
        let ResourceSliceSpec {
            driver,
            pool,
            node_name,
            shared_counters,
            devices,
        } = spec;
        let ResourcePool {
            name: pool_name,
            generation: _,
            resource_slice_count,
        } = pool;
        struct Meta<'a>(&'a SliceDoc<'a>, &'a str, &'a BTreeMap<String, String>);
        impl serde::Serialize for Meta<'_> {
            fn serialize<S: serde::Serializer>(&self, ser: S) -> Result<S::Ok, S::Error> {
                let Meta(doc, name, labels) = self;
                let mut m = ser.serialize_map(None)?;
                m.serialize_entry("name", name)?;
                if !labels.is_empty() {
                    m.serialize_entry("labels", labels)?;
                }
                if let Some(rv) = doc.resource_version {
                    m.serialize_entry("resourceVersion", rv)?;
                }
                if let Some(o) = doc.owner {
                    m.serialize_entry(
                        "ownerReferences",
                        &[json!({"apiVersion": "v1", "kind": "Node", "name": o.name, "uid": o.uid, "controller": true})],
                    )?;
                }
                m.end()
            }
        }
        struct Spec<'a> {
            driver: &'a str,
            pool: ResourcePool,
            node_name: &'a Option<String>,
            shared_counters: &'a [gpu_integrations::dra::model::CounterSet],
            devices: &'a [gpu_integrations::dra::model::Device],
        }
        impl serde::Serialize for Spec<'_> {
            fn serialize<S: serde::Serializer>(&self, ser: S) -> Result<S::Ok, S::Error> {
                let mut m = ser.serialize_map(None)?;
                m.serialize_entry("driver", self.driver)?;
                m.serialize_entry("pool", &self.pool)?;
                if let Some(n) = self.node_name {
                    m.serialize_entry("nodeName", n)?;
                }
                if !self.shared_counters.is_empty() {
                    m.serialize_entry("sharedCounters", self.shared_counters)?;
                }
                if !self.devices.is_empty() {
                    m.serialize_entry("devices", self.devices)?;
                }
                m.end()
            }
        }
        let mut m = ser.serialize_map(None)?;
        m.serialize_entry("apiVersion", api_version)?;
        m.serialize_entry("kind", kind)?;
        m.serialize_entry("metadata", &Meta(self, name, labels))?;
        m.serialize_entry(
            "spec",
            &Spec {
                driver,
                pool: ResourcePool {
                    name: pool_name.clone(),
                    generation: self.generation,
                    resource_slice_count: *resource_slice_count,
                },
                node_name,
                shared_counters,
                devices,
            },
        )?;
        m.end()
    }
}

/// The JSON of a wanted slice with generation `generation`, owned by `owner` (to compare with
/// what the server holds).
fn slice_doc(s: &ResourceSlice, generation: i64, owner: Option<&NodeOwner>) -> Value {
    let doc = SliceDoc {
        slice: s,
        generation,
        owner,
        resource_version: None,
    };
    serde_json::to_value(&doc).unwrap_or(Value::Null)
}

/// Whether everything `want` says is in `have` (`have` may hold more: fields the server
/// defaulted or set, such as a taint's `timeAdded`). Lists must match element by element.
fn holds(want: &Value, have: &Value) -> bool {
    match (want, have) {
        (Value::Object(w), Value::Object(h)) => w
            .iter()
            .all(|(k, wv)| h.get(k).is_some_and(|hv| holds(wv, hv))),
        (Value::Array(w), Value::Array(h)) => {
            w.len() == h.len() && w.iter().zip(h).all(|(a, b)| holds(a, b))
        }
        (Value::Number(a), Value::Number(b)) => a.as_f64() == b.as_f64(),
        _ => want == have,
    }
}

fn generation_of(s: &Value) -> i64 {
    s.pointer("/spec/pool/generation")
        .and_then(Value::as_i64)
        .unwrap_or(0)
}

fn name_of(s: &Value) -> &str {
    s.pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or("")
}

/// The writes that make `existing` (the driver's slices of the node, as listed) hold exactly
/// `target`'s slices. The generation goes one above both the highest listed and `floor` (the
/// last one this publisher wrote) whenever anything changes.
pub fn plan(target: &PoolTarget, existing: &[Value], floor: i64) -> Plan {
    let ours: Vec<&Value> = existing
        .iter()
        .filter(|s| {
            s.pointer("/spec/driver").and_then(Value::as_str) == Some(target.driver.as_str())
                && s.pointer("/spec/pool/name").and_then(Value::as_str)
                    == Some(target.node.as_str())
        })
        .collect();
    let current = ours.iter().map(|s| generation_of(s)).max().unwrap_or(0);
    let by_name: BTreeMap<&str, &Value> = ours.iter().map(|s| (name_of(s), *s)).collect();
    let wanted: BTreeSet<&str> = target
        .slices
        .iter()
        .map(|s| s.metadata.name.as_str())
        .collect();
    let unchanged = !ours.is_empty()
        && ours.len() == target.slices.len()
        && by_name.len() == ours.len()
        && ours.iter().all(|s| generation_of(s) == current)
        && target.slices.iter().all(|s| {
            by_name
                .get(s.metadata.name.as_str())
                .is_some_and(|have| holds(&slice_doc(s, current, target.owner.as_ref()), have))
        });
    if unchanged {
        return Plan {
            node: target.node.clone(),
            generation: current,
            steps: vec![],
            objects: BTreeMap::new(),
        };
    }
    let generation = current.max(floor).saturating_add(1);
    let mut steps = Vec::new();
    let mut objects = BTreeMap::new();
    for s in &target.slices {
        let name = s.metadata.name.clone();
        let rv = by_name.get(name.as_str()).map(|have| {
            have.pointer("/metadata/resourceVersion")
                .and_then(Value::as_str)
                .unwrap_or("")
        });
        let doc = SliceDoc {
            slice: s,
            generation,
            owner: target.owner.as_ref(),
            resource_version: rv,
        };
        // A typed document always serializes; an empty body would be refused by the server.
        let body = serde_json::to_vec(&doc).unwrap_or_default();
        match rv {
            Some(rv) => steps.push(PlanStep::Update {
                name: name.clone(),
                resource_version: rv.to_owned(),
            }),
            None => steps.push(PlanStep::Create { name: name.clone() }),
        }
        objects.insert(name, body);
    }
    for name in by_name.keys().filter(|n| !wanted.contains(*n)) {
        steps.push(PlanStep::Delete {
            name: (*name).to_owned(),
        });
    }
    Plan {
        node: target.node.clone(),
        generation,
        steps,
        objects,
    }
}

/// The driver's slices on `node` (field selector on `spec.driver` and `spec.nodeName`).
///
/// # Errors
/// See [`KubeClient::request`]; [`KubeError::Invalid`] for a list without `items`.
pub async fn list_pool(
    client: &KubeClient,
    driver: &str,
    node: &str,
) -> Result<Vec<Value>, KubeError> {
    if !is_dns_subdomain(driver) || !is_dns_subdomain(node) {
        return Err(KubeError::Invalid(format!(
            "driver {driver:?} or node {node:?} is not a DNS subdomain"
        )));
    }
    let list = client
        .get(&format!(
            "{SLICES_PATH}?fieldSelector=spec.driver%3D{driver}%2Cspec.nodeName%3D{node}"
        ))
        .await?;
    match list.get("items") {
        Some(Value::Array(items)) => Ok(items.clone()),
        Some(Value::Null) | None if list.get("kind").is_some() => Ok(vec![]),
        _ => Err(KubeError::Invalid(
            "resourceslices list has no items".to_owned(),
        )),
    }
}

/// Carries out `plan`'s writes: the creates and updates first, then (once the new generation is
/// complete) the deletes, each phase [`WRITES_IN_FLIGHT`] writes at a time. A slice already gone
/// when deleted is fine.
///
/// # Errors
/// The first failing write (409 when a slice changed under it); the writes in flight with it are
/// dropped, and the next round lists again.
pub async fn apply(client: &KubeClient, plan: &Plan) -> Result<(), KubeError> {
    use futures_util::TryStreamExt as _;
    for step in &plan.steps {
        let name = step.name();
        if !is_dns_subdomain(name) {
            return Err(KubeError::Invalid(format!(
                "slice name {name:?} is not a DNS subdomain"
            )));
        }
    }
    let (deletes, writes): (Vec<&PlanStep>, Vec<&PlanStep>) = plan
        .steps
        .iter()
        .partition(|s| matches!(s, PlanStep::Delete { .. }));
    for phase in [writes, deletes] {
        futures_util::stream::iter(phase.into_iter().map(Ok))
            .try_for_each_concurrent(Some(WRITES_IN_FLIGHT), |step| {
                write_step(client, plan, step)
            })
            .await?;
    }
    Ok(())
}

/// How many writes of one pool are on the wire at a time (the client's own bound applies too).
pub const WRITES_IN_FLIGHT: usize = 8;

async fn write_step(client: &KubeClient, plan: &Plan, step: &PlanStep) -> Result<(), KubeError> {
    let name = step.name();
    let body = || {
        plan.objects
            .get(name)
            .cloned()
            .ok_or_else(|| KubeError::Invalid(format!("{step}: the plan has no object {name}")))
    };
    // The answers (the objects as stored) are not needed: the next round lists.
    let result = match step {
        PlanStep::Create { .. } => {
            client
                .write_json(http::Method::POST, SLICES_PATH, body()?)
                .await
        }
        PlanStep::Update { .. } => {
            client
                .write_json(http::Method::PUT, &format!("{SLICES_PATH}/{name}"), body()?)
                .await
        }
        PlanStep::Delete { .. } => {
            match client
                .write(http::Method::DELETE, &format!("{SLICES_PATH}/{name}"), None)
                .await
            {
                Err(KubeError::Status { code: 404, .. }) => Ok(()),
                other => other,
            }
        }
    };
    result.map_err(|e| match e {
        KubeError::Status {
            code,
            reason,
            message,
        } => KubeError::Status {
            code,
            reason,
            message: format!("{step}: {message}"),
        },
        other => other,
    })
}

/// One round for one pool: list, plan, apply; after a conflict (409, or a slice gone or already
/// there), list and apply again, up to [`CONFLICT_RETRIES`] times.
///
/// # Errors
/// The failing request's error; the last conflict when every retry met one.
pub async fn sync_pool(
    client: &KubeClient,
    target: &PoolTarget,
    floor: i64,
) -> Result<PublishOutcome, KubeError> {
    let mut conflicts = 0;
    loop {
        let existing = list_pool(client, &target.driver, &target.node).await?;
        let p = plan(target, &existing, floor);
        match apply(client, &p).await {
            Ok(()) => {
                return Ok(PublishOutcome {
                    generation: p.generation,
                    writes: p.steps.len(),
                    steps: p.steps,
                    conflicts,
                });
            }
            Err(
                e @ KubeError::Status {
                    code: 409 | 404, ..
                },
            ) if conflicts < CONFLICT_RETRIES => {
                conflicts += 1;
                crate::log!(
                    "gpuslice agent: slices of {}: {e}; reading them again",
                    target.node
                );
            }
            Err(e) => return Err(e),
        }
    }
}

/// What publishing one node's pool did (or, in a dry run, would do).
#[derive(Debug, Clone)]
pub struct NodeReport {
    /// The node (and pool).
    pub node: String,
    /// The generation after the writes and the writes, or why the pool was not published.
    pub result: Result<(i64, Vec<PlanStep>), KubeError>,
    /// What the slices leave out, and why.
    pub warnings: Vec<String>,
}

/// Publishes every node's pool once (`gpuslice dra publish`), `parallel` nodes at a time (the
/// client's [`KubeClient::max_in_flight`] bounds the requests); a dry run lists and plans without
/// writing. The server's version picks the encoding. Each node's outcome is reported on its own:
/// one failing node does not stop the others.
///
/// # Errors
/// What [`server_info`] returns: the server cannot be asked, or is too old.
pub async fn publish_nodes(
    client: &KubeClient,
    nodes: &[NodeTopology],
    opts: &SliceOptions,
    prepared: &BTreeMap<String, gpu_integrations::dra::Prepared>,
    dry_run: bool,
    parallel: usize,
) -> Result<(ServerInfo, Vec<NodeReport>), KubeError> {
    let server = server_info(client).await?;
    let version = server.version;
    let parallel = parallel.max(1);
    let opts = Arc::new(opts.clone());
    let prepared = Arc::new(prepared.clone());
    let mut tasks = tokio::task::JoinSet::new();
    let mut reports: Vec<Option<NodeReport>> = vec![None; nodes.len()];
    let mut next = 0;
    // Each node on its own task, so building and encoding the slices spreads over the cores; a
    // node is copied only when its turn comes, so at most `parallel` copies are alive.
    loop {
        while tasks.len() < parallel && next < nodes.len() {
            let (client, opts, prepared) =
                (client.clone(), Arc::clone(&opts), Arc::clone(&prepared));
            let node = nodes[next].clone();
            let i = next;
            next += 1;
            tasks.spawn(async move {
                let name = node.node.clone();
                let report = match wanted_slices(&node, version, &opts, (*prepared).clone()) {
                    Ok((slices, warnings)) => {
                        drop(node);
                        NodeReport {
                            result: publish_one(&client, &name, &opts.driver, slices, dry_run)
                                .await,
                            node: name,
                            warnings,
                        }
                    }
                    Err(e) => NodeReport {
                        node: name,
                        result: Err(e),
                        warnings: vec![],
                    },
                };
                (i, report)
            });
        }
        match tasks.join_next().await {
            None => break,
            Some(Ok((i, r))) => {
                if let Some(slot) = reports.get_mut(i) {
                    *slot = Some(r);
                }
            }
            Some(Err(e)) => {
                return Err(KubeError::Invalid(format!("a publishing task failed: {e}")));
            }
        }
    }
    Ok((server, reports.into_iter().flatten().collect()))
}

async fn publish_one(
    client: &KubeClient,
    node: &str,
    driver: &str,
    slices: Vec<ResourceSlice>,
    dry_run: bool,
) -> Result<(i64, Vec<PlanStep>), KubeError> {
    let owner = match node_owner(client, node).await {
        Ok(o) => Some(o),
        Err(_) if dry_run => None,
        Err(KubeError::Status { code: 404, .. }) => {
            return Err(KubeError::Invalid(format!(
                "the cluster has no Node {node} to own its slices"
            )));
        }
        Err(e) => return Err(e),
    };
    let target = PoolTarget {
        node: node.to_owned(),
        driver: driver.to_owned(),
        slices,
        owner,
    };
    if dry_run {
        let existing = list_pool(client, driver, node).await?;
        let p = plan(&target, &existing, 0);
        return Ok((p.generation, p.steps));
    }
    let done = sync_pool(client, &target, 0).await?;
    Ok((done.generation, done.steps))
}

/// How the agent's publisher behaves.
#[derive(Debug, Clone)]
pub struct PublishOptions {
    /// Driver name and `--size-for`.
    pub slices: SliceOptions,
    /// The driver's claim store: capacity its prepared claims hold is not subtracted.
    pub claims: Option<Arc<ClaimStore>>,
    /// The agent's `--layout`: before 1.36.2 each GPU offers the size the layout's config gives
    /// it ([`gpu_integrations::dra::layout_sizes`]); [`SliceOptions::size_for`] wins for the GPUs
    /// it names. The file is read again each round, so an edit applies with its revision.
    pub layout: Option<crate::WatchedLayout>,
    /// At most one round per this during a burst of changes.
    pub min_interval: Duration,
    /// A round even without a change (it lists and repairs slices changed by others).
    pub resync: Duration,
    /// The first retry after a failure; doubled per failure up to [`PublishOptions::max_backoff`].
    pub backoff: Duration,
    /// The longest wait between retries: once the server is back, the latest state is written
    /// within about this long.
    pub max_backoff: Duration,
}

impl Default for PublishOptions {
    fn default() -> Self {
        Self {
            slices: SliceOptions::default(),
            claims: None,
            layout: None,
            min_interval: Duration::from_millis(500),
            resync: Duration::from_secs(300),
            backoff: Duration::from_millis(250),
            max_backoff: Duration::from_secs(5),
        }
    }
}

/// The running publisher: stop it with [`PublisherHandle::stop`]. It also ends with the agent's
/// shutdown, and when the handle is dropped: keep the handle for as long as slices should be
/// published.
#[derive(Debug)]
pub struct PublisherHandle {
    task: tokio::task::JoinHandle<()>,
    stop: tokio::sync::watch::Sender<bool>,
    /// The server as read at start (`None` when it could not be reached yet).
    pub server: Option<ServerInfo>,
}

impl PublisherHandle {
    /// Stops the publisher and waits for it (at most the length of one request).
    pub async fn stop(self) {
        let _ = self.stop.send(true);
        let _ = self.task.await;
    }
}

/// Starts keeping `agent`'s node's slices true through `client`. The server is asked for its
/// version first: when it answers that it is older than 1.34 or lacks `resource.k8s.io/v1`,
/// nothing starts; when it cannot be reached, the publisher starts and keeps asking.
///
/// # Errors
/// [`KubeError::Unsupported`]; a refused request (401, 403) at start.
pub async fn spawn_publisher(
    agent: Arc<Agent>,
    client: KubeClient,
    opts: PublishOptions,
) -> Result<PublisherHandle, KubeError> {
    let server = match server_info(&client).await {
        Ok(info) => Some(info),
        Err(e @ (KubeError::Unsupported(_) | KubeError::Invalid(_) | KubeError::Config(_))) => {
            return Err(e);
        }
        Err(
            e @ KubeError::Status {
                code: 401 | 403, ..
            },
        ) => return Err(e),
        Err(e) => {
            crate::log!(
                "gpuslice agent: API server not reached yet ({e}); publishing slices once it answers"
            );
            None
        }
    };
    if let Some(s) = &server {
        crate::log!(
            "gpuslice agent: publishing ResourceSlices to {} (Kubernetes {}, {})",
            client.server(),
            s.git_version,
            s.encoding().as_str()
        );
    }
    let (stop, stop_rx) = tokio::sync::watch::channel(false);
    let publisher = Publisher {
        agent,
        client,
        opts,
        server: server.clone(),
        owner: None,
        floor: 0,
        last: None,
        layout: None,
    };
    let task = tokio::spawn(publisher.run(stop_rx));
    Ok(PublisherHandle { task, stop, server })
}

/// The agent-side loop's state.
struct Publisher {
    agent: Arc<Agent>,
    client: KubeClient,
    opts: PublishOptions,
    server: Option<ServerInfo>,
    owner: Option<NodeOwner>,
    /// The last generation written.
    floor: i64,
    /// The wanted slices of the last round that succeeded.
    last: Option<Vec<ResourceSlice>>,
    /// The layout file as last read, and its document when it parsed.
    layout: Option<(Vec<u8>, Option<gpu_core::layout::LayoutFile>)>,
}

impl Publisher {
    async fn run(mut self, mut stop: tokio::sync::watch::Receiver<bool>) {
        let bus = self.agent.events();
        let (_, mut rx) = bus.subscribe(bus.revision());
        let mut shutdown = self.agent.shutdown_signal();
        // The host change not yet written, and when it was heard of.
        let mut pending: Option<Instant> = Some(Instant::now());
        let mut last_round: Option<Instant> = None;
        let mut retry_at: Option<Instant> = None;
        let mut backoff = self.opts.backoff;
        let mut next_resync = Instant::now() + self.opts.resync;
        let mut resync_due = false;
        loop {
            let now = Instant::now();
            let due = if pending.is_some() || resync_due {
                let mut at = last_round.map_or(now, |t| t + self.opts.min_interval);
                if let Some(r) = retry_at {
                    at = at.max(r);
                }
                at
            } else {
                next_resync
            };
            tokio::select! {
                changed = stop.changed() => {
                    if changed.is_err() || *stop.borrow() { break; }
                }
                changed = shutdown.changed() => {
                    if changed.is_err() || *shutdown.borrow() { break; }
                }
                ev = rx.recv() => match ev {
                    Ok(_) | Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {
                        pending.get_or_insert_with(Instant::now);
                    }
                    Err(tokio::sync::broadcast::error::RecvError::Closed) => break,
                },
                _ = tokio::time::sleep_until(due.into()) => {
                    if pending.is_none() && !resync_due {
                        resync_due = true;
                        continue;
                    }
                    let force = resync_due || retry_at.is_some();
                    match self.round(force).await {
                        Ok(asked) => {
                            if asked.is_some() {
                                last_round = Some(Instant::now());
                            }
                            if let Some(since) = pending.take()
                                && asked.is_some_and(|writes| writes > 0)
                            {
                                self.agent.stats().record_slice_latency(since.elapsed());
                            }
                            resync_due = false;
                            retry_at = None;
                            backoff = self.opts.backoff;
                            next_resync = Instant::now() + self.opts.resync;
                        }
                        Err(e) => {
                            self.agent.stats().record_slice_failure();
                            crate::log!(
                                "gpuslice agent: publishing ResourceSlices failed: {e}; retrying in {} ms",
                                backoff.as_millis()
                            );
                            last_round = Some(Instant::now());
                            retry_at = Some(Instant::now() + backoff);
                            backoff = (backoff * 2).min(self.opts.max_backoff);
                            pending.get_or_insert_with(Instant::now);
                        }
                    }
                }
            }
        }
    }

    /// One round: the writes made, or `None` when the wanted slices are those of the last
    /// round and the server was not asked.
    async fn round(&mut self, force: bool) -> Result<Option<usize>, KubeError> {
        let server = match &self.server {
            Some(s) => s.clone(),
            None => {
                let s = server_info(&self.client).await?;
                crate::log!(
                    "gpuslice agent: publishing ResourceSlices to {} (Kubernetes {}, {})",
                    self.client.server(),
                    s.git_version,
                    s.encoding().as_str()
                );
                self.server = Some(s.clone());
                s
            }
        };
        let snap = self.agent.snapshot();
        let claims = self.opts.claims.clone();
        let prepared = match claims {
            Some(store) => tokio::task::spawn_blocking(move || store.read_prepared())
                .await
                .map_err(|e| KubeError::Invalid(format!("reading the claim store: {e}")))?
                .map_err(|e| KubeError::Invalid(format!("reading the claim store: {e}")))?,
            None => BTreeMap::new(),
        };
        let (slices, warnings) = match self.layout_sizes(&snap.topology, server.version) {
            Some((size_for, mut said)) => {
                let opts = SliceOptions {
                    driver: self.opts.slices.driver.clone(),
                    size_for,
                };
                let (slices, warnings) =
                    wanted_slices(&snap.topology, server.version, &opts, prepared)?;
                said.extend(warnings);
                (slices, said)
            }
            None => wanted_slices(&snap.topology, server.version, &self.opts.slices, prepared)?,
        };
        if !force && self.last.as_ref() == Some(&slices) {
            return Ok(None);
        }
        let node = snap.topology.node.clone();
        let owner = match &self.owner {
            Some(o) if o.name == node => o.clone(),
            _ => {
                let o = node_owner(&self.client, &node).await?;
                self.owner = Some(o.clone());
                o
            }
        };
        let target = PoolTarget {
            node,
            driver: self.opts.slices.driver.clone(),
            slices,
            owner: Some(owner),
        };
        let outcome = match sync_pool(&self.client, &target, self.floor).await {
            Err(e @ KubeError::Status { code: 404, .. }) => {
                // The Node may have been re-created with a new UID: read it again next time.
                self.owner = None;
                return Err(e);
            }
            other => other?,
        };
        if outcome.writes > 0 {
            for w in &warnings {
                crate::log!("gpuslice agent: {w}");
            }
        }
        self.floor = outcome.generation;
        self.agent
            .stats()
            .record_slices_published(outcome.writes, outcome.generation);
        self.last = Some(target.slices);
        Ok(Some(outcome.writes))
    }
}

impl Publisher {
    /// `--size-for` over the sizes the watched layout gives (before 1.36.2, with `--layout`);
    /// `None` when there is no layout to read. A file that cannot be read or does not parse
    /// keeps the last one that did (the layout watcher refuses it too); said once per version.
    fn layout_sizes(
        &mut self,
        node: &NodeTopology,
        version: K8sVersion,
    ) -> Option<(BTreeMap<PciAddress, String>, Vec<String>)> {
        let watched = self.opts.layout.as_ref()?;
        if version.encoding() == Encoding::SizeLock {
            return None;
        }
        match crate::watch::read_layout_file(&watched.path) {
            Ok(bytes) if self.layout.as_ref().is_some_and(|(b, _)| *b == bytes) => {}
            Ok(bytes) => {
                let limit = gpu_sysfs::DocumentLimit::from_env().unwrap_or_default();
                let parsed = std::str::from_utf8(&bytes)
                    .map_err(|e| e.to_string())
                    .and_then(|t| {
                        gpu_core::layout::LayoutFile::parse_max(t, limit.bytes())
                            .map_err(|e| e.to_string())
                    });
                let doc = match parsed {
                    Ok(f) => Some(f),
                    Err(e) => {
                        crate::log!(
                            "gpuslice agent: slices: --layout {}: {e}; the last layout that parsed still picks the sizes",
                            watched.path.display()
                        );
                        self.layout.take().and_then(|(_, d)| d)
                    }
                };
                self.layout = Some((bytes, doc));
            }
            Err(e) => {
                if self.layout.as_ref().is_none_or(|(b, _)| !b.is_empty()) {
                    crate::log!(
                        "gpuslice agent: slices: --layout {}: {e}; the last layout read still picks the sizes",
                        watched.path.display()
                    );
                }
                let doc = self.layout.take().and_then(|(_, d)| d);
                self.layout = Some((Vec::new(), doc));
            }
        }
        let mut size_for = BTreeMap::new();
        let mut warnings = Vec::new();
        let file = self.layout.as_ref().and_then(|(_, d)| d.as_ref());
        let sizes = file.map(|f| {
            f.select(watched.config.as_deref())
                .and_then(|config| gpu_integrations::dra::layout_sizes(config, node))
        });
        match sizes {
            Some(Ok(sizes)) => {
                warnings.extend(sizes.warnings.iter().map(|w| format!("--layout: {w}")));
                size_for = sizes.sizes;
            }
            Some(Err(e)) => warnings.push(format!(
                "--layout {}: {e}; no GPU offers a size from it",
                watched.path.display()
            )),
            None => {}
        }
        size_for.extend(
            self.opts
                .slices
                .size_for
                .iter()
                .map(|(k, v)| (*k, v.clone())),
        );
        Some((size_for, warnings))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_versions_parse_with_vendor_suffixes() {
        assert_eq!(
            server_version("v1.36.2-gke.100").unwrap().to_string(),
            "1.36.2"
        );
        assert_eq!(
            server_version("v1.35.0+k3s1").unwrap().to_string(),
            "1.35.0"
        );
        assert_eq!(server_version("v1.40.1").unwrap().to_string(), "1.37");
        assert!(matches!(
            server_version("v1.33.5"),
            Err(KubeError::Unsupported(m)) if m.contains("1.34")
        ));
        assert!(matches!(
            server_version("nonsense"),
            Err(KubeError::Invalid(_))
        ));
    }

    #[test]
    fn a_server_default_does_not_count_as_a_change_but_a_missing_field_does() {
        let want = json!({"a": [{"k": "x"}], "n": 1});
        assert!(holds(
            &want,
            &json!({"a": [{"k": "x", "timeAdded": "t"}], "n": 1, "extra": true})
        ));
        assert!(!holds(&want, &json!({"a": [{"k": "y"}], "n": 1})));
        assert!(!holds(
            &want,
            &json!({"a": [{"k": "x"}, {"k": "x"}], "n": 1})
        ));
        assert!(!holds(&want, &json!({"a": [{"k": "x"}]})));
    }
}
