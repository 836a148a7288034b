//! The agent's core, independent of HTTP: the cached topology, the event bus, the promises and
//! the serialized writes. Every write runs on a blocking thread holding the agent's writer lock
//! and the host's layout lock (`run/gpuslice/vgpu.lock`, the one `gpuslice vgpu apply` takes);
//! reads are answered from the cached snapshot and never wait for a write.
//!
//! One owner, [`Agent`] (here), and a module per concern around it: [`config`] (options, the
//! hand-off target, the token rule), [`snapshot`] (what is served), [`refresh`] (reading the
//! host again), [`stall`] (reads that do not answer), [`stats`] (the agent's figures),
//! [`writes`] (the one writer and its records), [`reconcile`] (promises at start), [`heal`]
//! (the watched layout kept in place on each resync), the routes'
//! operations ([`vgpus`], [`gpus`], [`layout`]), [`request`] (what a caller may ask) and
//! [`machines`] (promises as allocations). None of them imports the watchers or the server.

use std::sync::{Arc, RwLock};

use gpu_core::ErrorKind;
use gpu_sysfs::Host;

use crate::error::ApiError;
use crate::events::{EventBus, EventKind};
use crate::state::StateStore;
use snapshot::rendered;

pub mod config;
pub mod gpus;
pub mod handoff;
pub mod heal;
pub mod interrupted;
pub mod keep;
pub mod layout;
pub mod machines;
pub mod metrics;
pub mod realize;
pub mod reconcile;
pub mod refresh;
pub mod request;
pub mod snapshot;
pub mod stall;
pub mod stats;
pub mod vgpus;
pub mod writes;

pub use config::{
    AgentConfig, Hooks, MIN_TOKEN_LEN, MetricsHook, MigNvml, TokenError, config_for_root,
    parse_token,
};
pub use gpus::SetRequest;
pub use handoff::HandoffTarget;
pub use reconcile::{Outcome, Reconciled};
pub use request::CreateRequest;
pub use snapshot::{NarrowRead, Snapshot, compose_topology};
pub use stall::{InFlightReads, TrackedHost};
pub use stats::{PublisherCondition, Stats};

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
    tracked: Arc<TrackedHost>,
    stats: Stats,
    refresh_gate: std::sync::Mutex<()>,
    interrupted: Option<gpu_node::recover::Recovery>,
}

impl Agent {
    /// Opens the agent on `host`: reads the promises, reconciles them (re-creating what is
    /// missing) and reads the topology. Blocking; call it before serving.
    ///
    /// # Errors
    /// A host without a root directory, a malformed state file, a host that cannot be discovered.
    pub fn open(host: Arc<dyn Host>, config: AgentConfig) -> Result<Arc<Self>, ApiError> {
        let store = Self::state_store(&host, &config)?;
        store.check()?;
        // Every read goes through the tracker, so a file that does not answer is named.
        let tracked = Arc::new(TrackedHost::wrap(host, InFlightReads::default()));
        let host: Arc<dyn Host> = Arc::clone(&tracked) as Arc<dyn Host>;
        let interrupted = Self::recover_interrupted(host.as_ref(), &config);
        let (topology, health) = compose_topology(host.as_ref(), &config)?;
        let (shutdown, _) = tokio::sync::watch::channel(false);
        let agent = Arc::new(Agent {
            tracked,
            stats: Stats::default(),
            refresh_gate: std::sync::Mutex::new(()),
            interrupted,
            host,
            config,
            store,
            bus: EventBus::new(),
            cache: RwLock::new(rendered(0, topology, health)),
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

    /// The agent's own counters (`/metrics`).
    pub fn stats(&self) -> &Stats {
        &self.stats
    }

    /// Checks what the agent would keep its promises in, without changing anything: the state
    /// directory reached without a link (one leading out of the root is named) and its state
    /// file readable. [`Agent::open`] runs the same check first; a front-end runs it before it
    /// binds its listeners.
    ///
    /// # Errors
    /// A host without a root directory; a state directory reached through a link; a state file
    /// that cannot be read, is too large or malformed.
    pub fn check_state(host: &Arc<dyn Host>, config: &AgentConfig) -> Result<(), ApiError> {
        Self::state_store(host, config)?.check()
    }

    /// The promise store `config` names: `--state-dir` as given, else the default directory
    /// inside the host's root, reached through the host like every host file.
    fn state_store(host: &Arc<dyn Host>, config: &AgentConfig) -> Result<StateStore, ApiError> {
        if host.root_dir().is_none() {
            return Err(ApiError::new(
                ErrorKind::HostError,
                "the host has no root directory",
            ));
        }
        Ok(match &config.state_dir {
            None => StateStore::in_root(Arc::clone(host), crate::state::DEFAULT_STATE_DIR)?,
            Some(dir) => StateStore::new(dir.clone()),
        })
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
}
