//! The errors of the node's writer: one variant per operation that failed, carrying what it
//! concerns and the failure of the step below as its source.
//!
//! Kinds, errnos and details are those of the source (an [`ActuateError`] or an
//! [`ApplyError`]), so that a refusal reads and classifies the same through every front-end:
//! the CLI's exit code and `{"error": {"kind", ...}}`, the agent's HTTP status.

use gpu_core::{ClassifiedError, ErrorDetail, ErrorKind, MdevUuid, ParentId, PciAddress};
use gpu_sysfs::actuate::ActuateError;
use gpu_sysfs::apply::ApplyError;

/// Why an operation on the node did not happen or did not finish.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum NodeError {
    /// The host-wide write lock (`run/gpuslice/vgpu.lock`) could not be taken: no root
    /// directory, a lock file that cannot be made, or another writer holding it past the timeout.
    #[error(transparent)]
    Lock(Box<ApplyError>),
    /// No parent or VF can take the profile: an unknown profile, a parent that is none, no room.
    #[error(transparent)]
    Choose(Box<ActuateError>),
    /// The mdev instance could not be created.
    #[error("cannot create mdev {uuid} on {}", place(.parent, .on_gpu))]
    CreateMdev {
        /// The instance UUID.
        uuid: MdevUuid,
        /// The parent chosen.
        parent: ParentId,
        /// The GPU asked for, when the parent was chosen among its VFs.
        on_gpu: Option<PciAddress>,
        /// The failed step.
        #[source]
        source: Box<ActuateError>,
    },
    /// An mdev target was given no UUID to create under.
    #[error("cannot create an mdev instance on {parent} without a UUID")]
    Unnamed {
        /// The parent chosen.
        parent: ParentId,
    },
    /// The vendor-VFIO VF could not take the type.
    #[error("cannot give VF {vf} vGPU type {type_num}")]
    SetVfType {
        /// The VF.
        vf: PciAddress,
        /// The type number.
        type_num: u32,
        /// The failed step.
        #[source]
        source: Box<ActuateError>,
    },
    /// The mdev instance could not be removed (in use without force, a refused write).
    #[error("cannot remove mdev {uuid}")]
    RemoveMdev {
        /// The instance UUID.
        uuid: MdevUuid,
        /// The failed step.
        #[source]
        source: Box<ActuateError>,
    },
    /// The VF's type could not be cleared.
    #[error("cannot clear VF {vf}")]
    ClearVf {
        /// The VF.
        vf: PciAddress,
        /// The failed step.
        #[source]
        source: Box<ActuateError>,
    },
    /// The GPU could not be bound to vfio-pci (rolled back).
    #[error("cannot bind {gpu} to vfio-pci")]
    Bind {
        /// The GPU.
        gpu: PciAddress,
        /// The failed step.
        #[source]
        source: Box<ActuateError>,
    },
    /// The GPU could not be given back to its host driver (rolled back).
    #[error("cannot release {gpu} to its host driver")]
    Release {
        /// The GPU.
        gpu: PciAddress,
        /// The failed step.
        #[source]
        source: Box<ActuateError>,
    },
    /// SR-IOV could not be enabled.
    #[error("cannot enable SR-IOV on {pf}")]
    EnableSriov {
        /// The physical function.
        pf: PciAddress,
        /// The failed step.
        #[source]
        source: Box<ActuateError>,
    },
    /// SR-IOV could not be disabled (a VF in use, a refused write).
    #[error("cannot disable SR-IOV on {pf}")]
    DisableSriov {
        /// The physical function.
        pf: PciAddress,
        /// The failed step.
        #[source]
        source: Box<ActuateError>,
    },
    /// The vGPUs of some GPUs (or of the host) were not cleared: one is in use. Nothing was
    /// removed.
    #[error("cannot clear the vGPUs of {scope}")]
    Clear {
        /// What was to be cleared: GPU addresses, or `the host`.
        scope: String,
        /// The refusal of the vGPU in use.
        #[source]
        source: Box<ActuateError>,
    },
    /// A create refused for want of room (`exhausted`), led by what gpuslice's model of the
    /// GPU's pool says it holds; the refusal itself (the kernel's errno) is the source.
    #[error("{why}")]
    Full {
        /// The pool's account (`nvidia0's 16384 MiB pool holds 4 × 4096 MiB ...`).
        why: String,
        /// The refusal.
        #[source]
        source: Box<NodeError>,
    },
    /// The vGPUs of the host could not be listed.
    #[error(transparent)]
    List(Box<ActuateError>),
    /// A layout could not be planned, applied or asserted (the report says what was undone).
    #[error(transparent)]
    Layout(Box<ApplyError>),
    /// The intent record of a write could not be written (the write was refused, nothing
    /// changed) or read (`host-error`).
    #[error(
        "cannot record or read the node's write intent ({})",
        crate::intent::INTENT_FILE
    )]
    Intent {
        /// The state directory's error.
        #[source]
        source: std::io::Error,
    },
    /// A vGPU of another size than the GPU's vGPUs could not be placed, or the GPU's
    /// mixed-size mode could not be read or turned on ([`crate::mixed`]).
    #[error(transparent)]
    Mixed(Box<crate::mixed::MixedError>),
    /// A layout's MIG needs (mode, GPU instances) refused or failed ([`crate::mig::layout`]).
    #[error(transparent)]
    Mig(Box<crate::mig::MigError>),
}

/// Where an mdev was to go, as messages name it: the parent, or `a VF of <gpu>` when the parent
/// was chosen among a GPU's VFs.
fn place(parent: &ParentId, on_gpu: &Option<PciAddress>) -> String {
    match on_gpu {
        Some(g) => format!("a VF of {g}"),
        None => parent.to_string(),
    }
}

impl NodeError {
    /// The actuation failure behind this error, when there is one.
    pub fn actuation(&self) -> Option<&ActuateError> {
        match self {
            NodeError::Full { source, .. } => source.actuation(),
            NodeError::Choose(e) | NodeError::List(e) => Some(e),
            NodeError::CreateMdev { source, .. }
            | NodeError::SetVfType { source, .. }
            | NodeError::RemoveMdev { source, .. }
            | NodeError::ClearVf { source, .. }
            | NodeError::Bind { source, .. }
            | NodeError::Release { source, .. }
            | NodeError::EnableSriov { source, .. }
            | NodeError::DisableSriov { source, .. }
            | NodeError::Clear { source, .. } => Some(source),
            NodeError::Lock(_)
            | NodeError::Layout(_)
            | NodeError::Unnamed { .. }
            | NodeError::Intent { .. }
            | NodeError::Mig(_) => None,
            NodeError::Mixed(m) => match m.as_ref() {
                crate::mixed::MixedError::OneSize { refusal, .. } => refusal.actuation(),
                _ => None,
            },
        }
    }

    /// The layout or lock failure behind this error, when there is one.
    pub fn apply(&self) -> Option<&ApplyError> {
        match self {
            NodeError::Full { source, .. } => source.apply(),
            NodeError::Lock(e) | NodeError::Layout(e) => Some(e),
            _ => None,
        }
    }
}

impl ClassifiedError for NodeError {
    /// The kind of the failure below: the same kind the step has on its own.
    fn kind(&self) -> ErrorKind {
        if let NodeError::Mixed(m) = self {
            return m.kind();
        }
        if let NodeError::Mig(m) = self {
            return m.kind();
        }
        match (self.actuation(), self.apply()) {
            (Some(a), _) => a.kind(),
            (_, Some(e)) => e.kind(),
            _ if matches!(self, NodeError::Intent { .. }) => ErrorKind::HostError,
            _ => ErrorKind::InvalidArgument,
        }
    }

    fn errno(&self) -> Option<i32> {
        match (self.actuation(), self.apply()) {
            (Some(a), _) => a.errno(),
            (_, Some(e)) => ClassifiedError::errno(e),
            _ => match self {
                NodeError::Intent { source } => gpu_sysfs::state_dir::errno_of(source),
                _ => None,
            },
        }
    }

    fn detail(&self) -> ErrorDetail {
        match (self.actuation(), self.apply()) {
            (Some(a), _) => ClassifiedError::detail(a),
            (_, Some(e)) => ClassifiedError::detail(e),
            _ => ErrorDetail::None,
        }
    }
}

/// This crate's error (or a library's below it), when `e` is one: a link of the chain every
/// front-end uses to classify an error whose type was erased.
pub fn as_classified<'a>(
    e: &'a (dyn std::error::Error + 'static),
) -> Option<&'a dyn ClassifiedError> {
    if let Some(n) = e.downcast_ref::<NodeError>() {
        return Some(n);
    }
    if let Some(r) = e.downcast_ref::<crate::realize::RealizeError>() {
        return Some(r);
    }
    if let Some(f) = e.downcast_ref::<crate::fabric::FabricError>() {
        return Some(f);
    }
    if let Some(m) = e.downcast_ref::<crate::mig::MigError>() {
        return Some(m);
    }
    match e.downcast_ref::<crate::handoff::HandoffError>() {
        Some(h) => Some(h),
        None => gpu_health::error::as_classified(e),
    }
}
