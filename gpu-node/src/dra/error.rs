//! Why a claim could not be prepared or unprepared: the claim's own faults (checked before
//! anything is planned), the library's planning, checkpoint and host refusals, and the CDI
//! files that could not be written after the devices were made.

use gpu_core::{ClassifiedError, ErrorDetail, ErrorKind};
use gpu_integrations::IntegrationError;
use gpu_sysfs::apply::ApplyError;

/// Why a DRA prepare or unprepare failed. A claim fault names the claim (`resourceclaim
/// <namespace>/<name>`, or `claim <uid>` when it has no name) and changed nothing.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DraError {
    /// The claim's UID is not the one named: it was deleted and made again under the same
    /// name (`invalid-argument`).
    #[error(
        "{claim}: UID changed: the claim holds UID {found:?}, {named:?} was asked for (the \
         claim was deleted and made again)"
    )]
    UidChanged {
        /// The claim as named.
        claim: String,
        /// The UID the document holds.
        found: String,
        /// The UID asked for.
        named: String,
    },
    /// No UID is known: the document has no `metadata.uid` and none was given
    /// (`invalid-argument`).
    #[error("the claim has no metadata.uid; pass --claim-uid")]
    NoUid,
    /// The document is not a ResourceClaim (`invalid-argument`).
    #[error("{claim}: not a ResourceClaim: {source}")]
    NotAClaim {
        /// The claim as named.
        claim: String,
        /// The decoder's error.
        #[source]
        source: serde_json::Error,
    },
    /// The claim holds no allocation (`invalid-argument`).
    #[error(
        "{claim}: not allocated: the input holds no allocation: expected a ResourceClaim with \
         status.allocation, or an AllocationResult with devices.results"
    )]
    NotAllocated {
        /// The claim as named.
        claim: String,
    },
    /// The allocation holds no device of this driver (`invalid-request`).
    #[error("{claim}: the allocation holds no device of driver {driver}")]
    NoDeviceOfDriver {
        /// The claim as named.
        claim: String,
        /// This driver.
        driver: String,
    },
    /// The opaque parameters for this driver are not its `VgpuConfig` (`invalid-argument`).
    #[error("{claim}: bad opaque parameters: {why}")]
    BadOpaque {
        /// The claim as named.
        claim: String,
        /// What is wrong with them.
        why: String,
    },
    /// The CDI spec and KubeVirt's metadata name the claim, and the input does not
    /// (`invalid-argument`).
    #[error(
        "claim {uid}: a CDI spec needs the claim's metadata.name and metadata.namespace (KubeVirt's \
         device metadata names the claim); give the whole ResourceClaim"
    )]
    Unnamed {
        /// The claim's UID.
        uid: String,
    },
    /// Planning, the claim store, or a change on the host refused or failed (the library's
    /// kind: `not-found`, `invalid-request`, `exhausted`, `in-use`, `host-error`, ...).
    #[error(transparent)]
    Claim(Box<IntegrationError>),
    /// The devices were made, but the CDI spec or the metadata could not be written; the
    /// prepare was undone (`undo` says when even that failed). The CDI writer's kind.
    #[error("claim {uid}: {source}{undo}")]
    Cdi {
        /// The claim's UID.
        uid: String,
        /// The CDI writer's error.
        #[source]
        source: Box<IntegrationError>,
        /// `; the prepare was undone`, or what the undo failed on.
        undo: String,
    },
    /// The host-wide lock could not be taken (`host-error`, `timeout`).
    #[error(transparent)]
    Lock(Box<ApplyError>),
    /// The host has no root directory to keep the claim store and the lock in (`host-error`).
    #[error("the host has no root directory")]
    NoRoot,
    /// The claim's fabric partition could not be activated or deactivated (the kind is the
    /// fabric's: Fabric Manager's answer, a member in use).
    #[error("claim {uid}: {source}")]
    Fabric {
        /// The claim's UID.
        uid: String,
        /// The fabric's refusal.
        #[source]
        source: Box<crate::fabric::FabricError>,
    },
}

impl From<IntegrationError> for DraError {
    fn from(e: IntegrationError) -> Self {
        DraError::Claim(Box::new(e))
    }
}

impl From<ApplyError> for DraError {
    fn from(e: ApplyError) -> Self {
        DraError::Lock(Box::new(e))
    }
}

impl DraError {
    /// The kind of this error, from gpuslice's one vocabulary of error kinds.
    pub fn kind(&self) -> ErrorKind {
        match self {
            DraError::UidChanged { .. }
            | DraError::NoUid
            | DraError::NotAClaim { .. }
            | DraError::NotAllocated { .. }
            | DraError::BadOpaque { .. }
            | DraError::Unnamed { .. } => ErrorKind::InvalidArgument,
            DraError::NoDeviceOfDriver { .. } => ErrorKind::InvalidRequest,
            DraError::Claim(e) | DraError::Cdi { source: e, .. } => e.kind(),
            DraError::Lock(e) => e.kind(),
            DraError::NoRoot => ErrorKind::HostError,
            DraError::Fabric { source, .. } => ClassifiedError::kind(source.as_ref()),
        }
    }
}

impl ClassifiedError for DraError {
    fn kind(&self) -> ErrorKind {
        self.kind()
    }

    fn errno(&self) -> Option<i32> {
        match self {
            DraError::Claim(e) | DraError::Cdi { source: e, .. } => e.errno(),
            DraError::Lock(e) => e.errno(),
            _ => None,
        }
    }

    fn detail(&self) -> ErrorDetail {
        match self {
            DraError::Claim(e) | DraError::Cdi { source: e, .. } => e.detail(),
            DraError::Lock(e) => e.detail(),
            _ => ErrorDetail::None,
        }
    }
}

/// This module's error type (or the integrations' or the host's), when `e` is one: the CLI's
/// funnel from an `anyhow` chain to a kind and an exit code.
pub fn as_classified<'a>(
    e: &'a (dyn std::error::Error + 'static),
) -> Option<&'a dyn ClassifiedError> {
    match e.downcast_ref::<DraError>() {
        Some(d) => Some(d),
        None => gpu_integrations::error::as_classified(e),
    }
}
