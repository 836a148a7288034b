//! Why a MIG operation did not happen: each refusal names the GPU and what is in the way,
//! before anything was written.

use gpu_core::{ErrorKind, PciAddress};
use gpu_nvml::{NvmlError, NvmlErrorKind};

/// A MIG operation refused or failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum MigError {
    /// NVML answered an error.
    #[error("{gpu}: {source}")]
    Nvml {
        /// The GPU.
        gpu: PciAddress,
        /// NVML's answer.
        #[source]
        source: NvmlError,
    },
    /// No NVML to ask (a recording, `--no-nvml`, a host without the driver's library).
    #[error("MIG needs NVML, and this node has none ({why})")]
    NoNvml {
        /// Why there is none.
        why: String,
    },
    /// The GPU does not support MIG.
    #[error("{gpu} does not support MIG")]
    NotMigCapable {
        /// The GPU.
        gpu: PciAddress,
    },
    /// Something uses the GPU, so its MIG mode cannot change.
    #[error("{gpu}: MIG mode cannot change while {what} (NVIDIA: the GPU must be idle)")]
    InUse {
        /// The GPU.
        gpu: PciAddress,
        /// What uses it (`2 vGPUs`, `VF 0000:41:00.4 holds a vGPU type`).
        what: String,
    },
    /// A MIG mode change is pending a GPU reset: gpuslice does not reset GPUs.
    #[error(
        "{gpu}: MIG mode {pending} is pending a GPU reset (run `nvidia-smi -r -i` on the GPU, or \
         `gpuslice sandbox reset` in a sandbox, then ask again)"
    )]
    PendingReset {
        /// The GPU.
        gpu: PciAddress,
        /// The mode waiting (`enabled`).
        pending: &'static str,
    },
    /// The GPU is not in MIG mode where GPU instances are asked for.
    #[error("{gpu} is not in MIG mode")]
    MigOff {
        /// The GPU.
        gpu: PciAddress,
    },
    /// gpuslice does not know the GPU's MIG geometry and NVML did not give it.
    #[error("{gpu}: MIG geometry unknown ({why}); gpuslice plans no GPU instance it cannot place")]
    UnknownGeometry {
        /// The GPU.
        gpu: PciAddress,
        /// What was missing.
        why: String,
    },
    /// The GPU has no profile of that name.
    #[error("{gpu} has no GPU-instance profile {name:?} (it has: {known})")]
    UnknownProfile {
        /// The GPU.
        gpu: PciAddress,
        /// The name asked.
        name: String,
        /// The names it has.
        known: String,
    },
    /// No free legal start for the profile.
    #[error("{gpu}: no room for a {profile} GPU instance (held memory slices: {held})")]
    NoRoom {
        /// The GPU.
        gpu: PciAddress,
        /// The profile.
        profile: String,
        /// Which memory slices are held.
        held: String,
    },
    /// The start asked for (an allocation's `gpuInstanceStart`) is not a legal start of the
    /// profile.
    #[error("{gpu}: {start} is not a legal start of a {profile} GPU instance (legal: {legal})")]
    BadStart {
        /// The GPU.
        gpu: PciAddress,
        /// The profile.
        profile: String,
        /// The start asked for.
        start: u8,
        /// The legal starts.
        legal: String,
    },
    /// The start asked for overlaps memory slices another GPU instance holds.
    #[error(
        "{gpu}: start {start} of a {profile} GPU instance is taken (held memory slices: {held})"
    )]
    StartTaken {
        /// The GPU.
        gpu: PciAddress,
        /// The profile.
        profile: String,
        /// The start asked for.
        start: u8,
        /// Which memory slices are held.
        held: String,
    },
    /// A GPU instance gpuslice did not make (or that a vGPU uses) was asked to go.
    #[error("{gpu}: GPU instance {id} {why}; left alone")]
    NotOurs {
        /// The GPU.
        gpu: PciAddress,
        /// The instance.
        id: u32,
        /// Why it stays (`was made by someone else (use --all)`, `holds a vGPU`).
        why: String,
    },
    /// The node could not be discovered (to see which VFs hold MIG-backed vGPUs).
    #[error("cannot discover the node")]
    Discover(#[source] gpu_sysfs::SysfsError),
    /// The ownership record could not be written.
    #[error("cannot record the GPU instances gpuslice made")]
    Record(#[source] std::io::Error),
    /// The host-wide lock or intent record failed.
    #[error(transparent)]
    Node(#[from] Box<crate::NodeError>),
}

impl From<crate::NodeError> for MigError {
    fn from(e: crate::NodeError) -> Self {
        MigError::Node(Box::new(e))
    }
}

impl MigError {
    pub(crate) fn nvml(gpu: PciAddress) -> impl FnOnce(NvmlError) -> MigError {
        move |source| MigError::Nvml { gpu, source }
    }
}

impl gpu_core::ClassifiedError for MigError {
    fn kind(&self) -> ErrorKind {
        match self {
            MigError::Nvml { source, .. } => match source.kind {
                NvmlErrorKind::InUse => ErrorKind::InUse,
                NvmlErrorKind::NotFound => ErrorKind::NotFound,
                NvmlErrorKind::NoPermission => ErrorKind::NotPermitted,
                NvmlErrorKind::NotSupported => ErrorKind::Unsupported,
                NvmlErrorKind::InsufficientResources => ErrorKind::Exhausted,
                NvmlErrorKind::InvalidArgument => ErrorKind::InvalidArgument,
                _ => ErrorKind::HostError,
            },
            MigError::NoNvml { .. } | MigError::NotMigCapable { .. } => ErrorKind::Unsupported,
            MigError::UnknownGeometry { .. } => ErrorKind::Unsupported,
            MigError::InUse { .. } | MigError::NotOurs { .. } => ErrorKind::InUse,
            MigError::PendingReset { .. } | MigError::MigOff { .. } => ErrorKind::Busy,
            MigError::UnknownProfile { .. } => ErrorKind::UnknownProfile,
            MigError::NoRoom { .. } => ErrorKind::Exhausted,
            MigError::BadStart { .. } => ErrorKind::InvalidArgument,
            MigError::StartTaken { .. } => ErrorKind::InUse,
            MigError::Record(_) | MigError::Discover(_) => ErrorKind::HostError,
            MigError::Node(n) => gpu_core::ClassifiedError::kind(n.as_ref()),
        }
    }
}
