//! Writing a plan to the API server: listing a pool, carrying out the creates, updates and
//! deletes, a whole round with its conflict retries ([`sync_pool`]), and `gpuslice dra publish`'s
//! one pass over a fleet ([`publish_nodes`]).

use std::collections::BTreeMap;
use std::sync::Arc;

use gpu_core::NodeTopology;
use gpu_integrations::dra::model::ResourceSlice;
use gpu_integrations::dra::names::is_dns_subdomain;
use serde_json::Value;

use super::diff::{Plan, PlanStep, PoolTarget, SliceOptions, plan, wanted_slices};
use super::server::{ServerInfo, node_owner, server_info};
use crate::kube::{KubeClient, KubeError};

/// Where ResourceSlices live.
pub const SLICES_PATH: &str = "/apis/resource.k8s.io/v1/resourceslices";
/// How many times one round re-reads and applies again after a conflict.
pub const CONFLICT_RETRIES: usize = 5;
/// The wait before the first re-read after a conflict; each next one waits twice as long, so a
/// round's retries wait at most 31 times this in all.
pub const CONFLICT_BACKOFF: std::time::Duration = std::time::Duration::from_millis(50);

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
/// there), list and apply again, up to [`CONFLICT_RETRIES`] times, waiting
/// [`CONFLICT_BACKOFF`] before the first and twice as long before each next one (a list the
/// client refuses for its size ends the round at once: it is not read again).
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
                let wait = CONFLICT_BACKOFF * (1 << conflicts);
                conflicts += 1;
                crate::log!(
                    "gpuslice agent: slices of {}: {}; reading them again in {} ms",
                    target.node,
                    crate::shown::message(&e.to_string()),
                    wait.as_millis()
                );
                tokio::time::sleep(wait).await;
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
