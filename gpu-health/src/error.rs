//! The crate's error type.

use std::path::PathBuf;

/// What can go wrong in gpu-health. Reading signals never fails (a signal that cannot be read is
/// Unknown); errors come from files the operator gives and from discovery.
#[derive(Debug, thiserror::Error)]
pub enum HealthError {
    /// A policy file could not be read.
    #[error("policy file {}", path.display())]
    PolicyRead {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// A policy is malformed: syntax, an unknown key, a value out of range.
    #[error("policy {source_name}: {message}")]
    Policy {
        /// The file (or `<string>`).
        source_name: String,
        /// What is wrong, with the key or line.
        message: String,
    },
    /// The baseline file could not be written.
    #[error("baseline {}", path.display())]
    BaselineWrite {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// An NVML library named by the caller does not open.
    #[error("NVML library {}: {message}", path.display())]
    NvmlLibrary {
        /// The library.
        path: PathBuf,
        /// NVML's error.
        message: String,
    },
    /// The root cannot be opened (missing, not a directory, a malformed recording).
    #[error(transparent)]
    Root(Box<gpu_sysfs::SysfsError>),
    /// Discovery failed.
    #[error("discovery")]
    Discovery(#[from] gpu_sysfs::SysfsError),
}

impl HealthError {
    /// The kind of this error: `invalid-config` for a malformed policy, `host-error` for a policy
    /// or baseline file that cannot be read or written, discovery's kind otherwise.
    pub fn kind(&self) -> gpu_core::ErrorKind {
        match self {
            HealthError::Policy { .. } => gpu_core::ErrorKind::InvalidConfig,
            HealthError::PolicyRead { .. }
            | HealthError::BaselineWrite { .. }
            | HealthError::NvmlLibrary { .. } => gpu_core::ErrorKind::HostError,
            HealthError::Root(d) => d.kind(),
            HealthError::Discovery(d) => d.kind(),
        }
    }
}
