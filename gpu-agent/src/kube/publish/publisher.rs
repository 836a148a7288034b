//! The agent's publisher: a debounced loop that keeps its node's slices true, a round on start
//! and after each new revision of the topology or health, with back-off while the server fails.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use gpu_core::{NodeTopology, PciAddress};
use gpu_integrations::dra::model::ResourceSlice;
use gpu_integrations::dra::{ClaimStore, Encoding, K8sVersion};

use super::apply::sync_pool;
use super::diff::{PoolTarget, SliceOptions, wanted_slices};
use super::server::{NodeOwner, ServerInfo, node_owner, server_info};
use crate::agent::{Agent, PublisherCondition};
use crate::kube::{KubeClient, KubeError};

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
    pub layout: Option<crate::watch::WatchedLayout>,
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
    Ok(start(agent, client, opts, server))
}

/// As [`spawn_publisher`], but nothing the API server answers stops it: a `/version` that is
/// garbage or too old, a server without `resource.k8s.io/v1`, refused credentials are said once
/// and then asked again with back-off like an outage, the publisher shown as not ready in the
/// agent's `/healthz` and `gpuslice_agent_slice_publisher_blocked` until a round goes through.
/// The daemon uses this one: the agent's HTTP API and kubelet plugin serve on meanwhile.
pub async fn spawn_publisher_degrading(
    agent: Arc<Agent>,
    client: KubeClient,
    opts: PublishOptions,
) -> PublisherHandle {
    let server = match server_info(&client).await {
        Ok(info) => Some(info),
        Err(e) => {
            crate::log!(
                "gpuslice agent: not publishing ResourceSlices yet ({e}); the agent serves on and asks the API server again with back-off"
            );
            agent.stats().set_publisher(PublisherCondition {
                ready: false,
                message: Some(e.to_string()),
            });
            None
        }
    };
    start(agent, client, opts, server)
}

fn start(
    agent: Arc<Agent>,
    client: KubeClient,
    opts: PublishOptions,
    server: Option<ServerInfo>,
) -> PublisherHandle {
    if let Some(s) = &server {
        crate::log!(
            "gpuslice agent: publishing ResourceSlices to {} (Kubernetes {}, {})",
            client.server(),
            s.git_version,
            s.encoding().as_str()
        );
    }
    if agent.stats().publisher().is_none() {
        agent.stats().set_publisher(PublisherCondition {
            ready: server.is_some(),
            message: None,
        });
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
    PublisherHandle { task, stop, server }
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
                            if retry_at.is_some() || asked.is_some() {
                                self.agent.stats().set_publisher(PublisherCondition {
                                    ready: true,
                                    message: None,
                                });
                            }
                            resync_due = false;
                            retry_at = None;
                            backoff = self.opts.backoff;
                            next_resync = Instant::now() + self.opts.resync;
                        }
                        Err(e) => {
                            self.agent.stats().record_slice_failure();
                            self.agent.stats().set_publisher(PublisherCondition {
                                ready: false,
                                message: Some(e.to_string()),
                            });
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
        // Mixed-size GPUs are published per placement slot, as the node's NVML lists them now.
        let mut base = self.opts.slices.clone();
        if let Some(nvml) = self.agent.config().mig.as_ref() {
            let gpus = snap.topology.gpus.iter().map(|g| g.address);
            base.mixed_placements = gpu_node::mixed_slots::placements(nvml.0.as_ref(), gpus).0;
        }
        let (slices, warnings) = match self.layout_sizes(&snap.topology, server.version) {
            Some((size_for, mut said)) => {
                let opts = SliceOptions { size_for, ..base };
                let (slices, warnings) =
                    wanted_slices(&snap.topology, server.version, &opts, prepared)?;
                said.extend(warnings);
                (slices, said)
            }
            None => wanted_slices(&snap.topology, server.version, &base, prepared)?,
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
