//! Prepare and unprepare, the same for every version of the kubelet's service: read the claim,
//! then hand it to the node's one DRA call ([`gpu_node::dra::prepare`] /
//! [`gpu_node::dra::unprepare`], the calls `gpuslice dra prepare|unprepare` make too) as one of
//! the agent's writes, under the host lock; the answer is mapped to the kubelet's.
//!
//! Every claim is answered on its own: a claim that cannot be read, whose UID is not the one the
//! kubelet named (it was deleted and made again), that is not allocated, holds no device of
//! this driver, names another node's pool or an unknown device, carries opaque parameters this
//! driver does not read, or whose device is in use, gets an error naming that, and nothing on
//! the host changes for it. A claim that was prepared before is answered from its record, with
//! no write.

use std::sync::Arc;

use gpu_core::ErrorKind;
use gpu_integrations::dra::prepare::PrepareAction;
use gpu_integrations::dra::{self, ClaimStore, DraNode};
use gpu_node::dra::{DraError, DraSetup};

pub use gpu_node::dra::{Checked, ClaimId, GivenDevice, check_claim};

use super::DraPlugin;
use crate::agent::Agent;
use crate::agent::writes::Touched;
use crate::claims::ClaimFetchError;
use crate::error::ApiError;

/// Why the plugin could not prepare or unprepare a claim: the kubelet's per-claim `error` is
/// its message.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ClaimError {
    /// The API server has no such claim (`not-found`).
    #[error("{claim}: not found")]
    NotFound {
        /// The claim as the kubelet named it.
        claim: String,
    },
    /// The claim could not be read from the API server (`host-error`).
    #[error("{claim}: {source}")]
    Fetch {
        /// The claim as the kubelet named it.
        claim: String,
        /// Why it could not be read.
        #[source]
        source: ClaimFetchError,
    },
    /// The node's DRA call refused or failed (its kind).
    #[error(transparent)]
    Dra(#[from] DraError),
    /// The agent's writer could not run the call (the host lock not taken in time, the
    /// blocking task lost) (its kind).
    #[error("{}", .0.message)]
    Writer(ApiError),
    /// The kubelet's deadline for the call passed before this claim was read or prepared: it
    /// was left alone, and the kubelet calls again (`timeout`).
    #[error(
        "{claim}: not prepared: the kubelet's deadline for this call ({} ms) passed before it was read; nothing was changed for it",
        .timeout.as_millis()
    )]
    Deadline {
        /// The claim as the kubelet named it (names cut at [`crate::shown::MAX_NAME`]).
        claim: String,
        /// The call's deadline, as the kubelet sent it.
        timeout: std::time::Duration,
    },
    /// The call named more claims than one call prepares (`too-large`); the kubelet calls
    /// again for the ones left.
    #[error("{claim}: not prepared: one call prepares at most {max} claims")]
    TooMany {
        /// The claim as the kubelet named it.
        claim: String,
        /// The most claims one call prepares.
        max: usize,
    },
}

impl ClaimError {
    /// The kind of this error, from gpuslice's one vocabulary of error kinds.
    pub fn kind(&self) -> ErrorKind {
        match self {
            ClaimError::NotFound { .. } => ErrorKind::NotFound,
            ClaimError::Fetch { .. } => ErrorKind::HostError,
            ClaimError::Dra(e) => e.kind(),
            ClaimError::Writer(e) => e.kind,
            ClaimError::Deadline { .. } => ErrorKind::Timeout,
            ClaimError::TooMany { .. } => ErrorKind::TooLarge,
        }
    }

    /// Whether the claim was left alone because of the call as a whole (its deadline, its
    /// size), not because of anything of its own: logged once per call, not per claim.
    pub fn is_call_bound(&self) -> bool {
        matches!(
            self,
            ClaimError::Deadline { .. } | ClaimError::TooMany { .. }
        )
    }
}

/// A claim as messages show it: `namespace/name`, each cut at [`crate::shown::MAX_NAME`].
pub fn shown(id: &ClaimId) -> String {
    format!(
        "{}/{}",
        crate::shown::name(&id.namespace),
        crate::shown::name(&id.name)
    )
}

/// The node's claim store, in the agent's root (the one `gpuslice dra prepare` keeps).
///
/// # Errors
/// A host without a root directory.
pub(super) fn store_of(agent: &Agent) -> Result<ClaimStore, DraError> {
    gpu_node::dra::claim_store(agent.host(), None)
}

/// What discovery reads again after a prepare or unprepare that changed `actions`.
fn touched(actions: &[PrepareAction]) -> Touched {
    if actions.is_empty() {
        Touched::Nothing
    } else {
        Touched::Devices(actions.iter().map(dra::node::change_of).collect())
    }
}

impl DraPlugin {
    /// The node's DRA setup of this plugin.
    fn setup(&self) -> DraSetup<'_> {
        DraSetup {
            driver: &self.config.driver,
            store: &self.store,
            cdi: Some(&self.cdi),
            dry_run: false,
        }
    }

    /// Prepares the claim `id`: reads it, then prepares it with the node's one call as one of
    /// the agent's writes.
    ///
    /// # Errors
    /// A [`ClaimError`] for the kubelet's per-claim `error` (see the module's list).
    pub async fn prepare(self: &Arc<Self>, id: &ClaimId) -> Result<Vec<GivenDevice>, ClaimError> {
        let out = match self.fetch(id).await {
            Ok(doc) => self.prepare_fetched(id, doc).await,
            Err(e) => Err(e),
        };
        self.tally_prepare(&out, id);
        out
    }

    /// Counts a prepare's result and logs its failure (one bound by the call as a whole is
    /// left to the caller, who says it once).
    pub(crate) fn tally_prepare<T>(&self, out: &Result<T, ClaimError>, id: &ClaimId) {
        let s = self.stats();
        tally(
            out,
            &s.prepared,
            &s.prepare_failed,
            "NodePrepareResources",
            id,
        );
    }

    /// Reads the claim `id` from the plugin's claim source.
    ///
    /// # Errors
    /// [`ClaimError::NotFound`], [`ClaimError::Fetch`].
    pub async fn fetch(&self, id: &ClaimId) -> Result<serde_json::Value, ClaimError> {
        self.claims
            .get(&id.namespace, &id.name)
            .await
            .map_err(|e| match e {
                ClaimFetchError::NotFound { .. } => ClaimError::NotFound { claim: shown(id) },
                source => ClaimError::Fetch {
                    claim: shown(id),
                    source,
                },
            })
    }

    /// Prepares the claim `id` read as `doc`: checks it, then prepares it with the node's one
    /// call as one of the agent's writes.
    ///
    /// # Errors
    /// A [`ClaimError`] for the kubelet's per-claim `error`.
    pub async fn prepare_fetched(
        self: &Arc<Self>,
        id: &ClaimId,
        doc: serde_json::Value,
    ) -> Result<Vec<GivenDevice>, ClaimError> {
        // Checked before the writer is waited for: a bad claim never queues behind a write.
        let checked = check_claim(&doc, id, &self.config.driver)?;
        let me = Arc::clone(self);
        self.agent
            .write_touching(true, move |agent| {
                let snapshot = agent.snapshot();
                let node = DraNode {
                    host: agent.host(),
                    topology: &snapshot.topology,
                    recording: false,
                };
                let fabric = &agent.config().fabric;
                match gpu_node::dra::prepare_checked_with_fabric(
                    &node,
                    &checked,
                    &me.setup(),
                    fabric,
                ) {
                    Ok(answer) => (Ok(Ok(answer.given)), touched(&answer.result.touched)),
                    // A refusal changed nothing; a failed write was undone, or not all of it:
                    // read all.
                    Err(e) => (Ok(Err(ClaimError::from(e))), Touched::Host),
                }
            })
            .await
            .map_err(ClaimError::Writer)?
    }

    /// Unprepares claim `id`: undoes what its prepare did and removes its CDI spec and
    /// metadata, with the node's one call. A claim never prepared is no error.
    ///
    /// # Errors
    /// A [`ClaimError`] for the kubelet's per-claim `error`: the undo failed (the record is
    /// kept, so the kubelet's retry finishes it).
    pub async fn unprepare(self: &Arc<Self>, id: &ClaimId) -> Result<(), ClaimError> {
        let me = Arc::clone(self);
        let uid = id.uid.clone();
        let out = self
            .agent
            .write_touching(true, move |agent| {
                let snapshot = agent.snapshot();
                match gpu_node::dra::unprepare_with_fabric(
                    agent.host(),
                    false,
                    &uid,
                    false,
                    &me.setup(),
                    &snapshot.topology,
                    &agent.config().fabric,
                ) {
                    Ok(undone) => (Ok(Ok(())), touched(&undone.touched)),
                    // Refused with nothing changed, or some undo failed: read all.
                    Err(e) => (Ok(Err(ClaimError::from(e))), Touched::Host),
                }
            })
            .await
            .map_err(ClaimError::Writer)
            .and_then(|r| r);
        let s = self.stats();
        tally(
            &out,
            &s.unprepared,
            &s.unprepare_failed,
            "NodeUnprepareResources",
            id,
        );
        out
    }
}

/// Counts a claim's result (`ok` or `failed`) and logs a failure, naming the call and the claim.
fn tally<T>(
    out: &Result<T, ClaimError>,
    ok: &std::sync::atomic::AtomicU64,
    failed: &std::sync::atomic::AtomicU64,
    call: &str,
    id: &ClaimId,
) {
    DraPlugin::count(if out.is_ok() { ok } else { failed });
    if let Err(e) = out
        && !e.is_call_bound()
    {
        // Names and the message cut: a claim's name is the kubelet's, its length unchecked.
        crate::log!(
            "gpuslice agent: {call} {} ({}): {}",
            shown(id),
            crate::shown::name(&id.uid),
            crate::shown::message(&e.to_string())
        );
    }
}
