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
    /// A policy value serde accepts and gpuslice does not: a board's width is no PCIe lane count.
    #[error(
        "link.boards: {model} width {width} is not a PCIe lane count (1, 2, 4, 8, 12, 16 or 32)"
    )]
    PolicyLaneCount {
        /// The board's model as the policy names it.
        model: String,
        /// The width given.
        width: u32,
    },
    /// A temperature margin of the policy is over 50 °C.
    #[error("{key} {value} is more than 50 °C")]
    PolicyMargin {
        /// The key (`temperature.slowdownMarginC`).
        key: &'static str,
        /// The margin given.
        value: u32,
    },
    /// An XID is given two verdicts.
    #[error("xid: XID {xid} is in both xid.unhealthy and xid.degraded; give it one verdict")]
    PolicyXidTwice {
        /// The XID.
        xid: u64,
    },
    /// The baseline file could not be read.
    #[error("{}: {source}", path.display())]
    BaselineRead {
        /// The file (root-relative).
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The baseline file (or text) is not a baseline.
    #[error("{}{source}", path.as_ref().map(|p| format!("{}: ", p.display())).unwrap_or_default())]
    BaselineDecode {
        /// The file (root-relative); `None` for text given directly.
        path: Option<PathBuf>,
        /// The decoder's error.
        #[source]
        source: serde_json::Error,
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
    /// The kind of this error: `invalid-config` for a malformed policy or baseline, `host-error`
    /// for a policy or baseline file that cannot be read or written, discovery's kind otherwise.
    pub fn kind(&self) -> gpu_core::ErrorKind {
        match self {
            HealthError::Policy { .. }
            | HealthError::PolicyLaneCount { .. }
            | HealthError::PolicyMargin { .. }
            | HealthError::PolicyXidTwice { .. }
            | HealthError::BaselineDecode { .. } => gpu_core::ErrorKind::InvalidConfig,
            HealthError::PolicyRead { .. }
            | HealthError::BaselineRead { .. }
            | HealthError::BaselineWrite { .. }
            | HealthError::NvmlLibrary { .. } => gpu_core::ErrorKind::HostError,
            HealthError::Root(d) => d.kind(),
            HealthError::Discovery(d) => d.kind(),
        }
    }
}

impl gpu_core::ClassifiedError for HealthError {
    fn kind(&self) -> gpu_core::ErrorKind {
        self.kind()
    }

    /// Discovery's errno, or that of a policy or baseline file that cannot be read or written.
    fn errno(&self) -> Option<i32> {
        match self {
            HealthError::Root(d) => d.errno(),
            HealthError::Discovery(d) => d.errno(),
            HealthError::PolicyRead { source, .. }
            | HealthError::BaselineRead { source, .. }
            | HealthError::BaselineWrite { source, .. } => source.raw_os_error(),
            _ => None,
        }
    }

    /// Discovery's detail, or the file concerned.
    fn detail(&self) -> gpu_core::ErrorDetail {
        use gpu_core::ErrorDetail;
        match self {
            HealthError::Root(d) => d.detail(),
            HealthError::Discovery(d) => d.detail(),
            HealthError::BaselineDecode { path, .. } => ErrorDetail::Host {
                path: path.as_ref().map(|p| p.display().to_string()),
                errno: None,
            },
            HealthError::PolicyRead { path, .. }
            | HealthError::BaselineRead { path, .. }
            | HealthError::BaselineWrite { path, .. }
            | HealthError::NvmlLibrary { path, .. } => ErrorDetail::Host {
                path: Some(path.display().to_string()),
                errno: self.errno(),
            },
            _ => ErrorDetail::None,
        }
    }
}

/// This crate's error type (or discovery's, or the model's), when `e` is one: see
/// [`gpu_core::classify::as_classified`].
pub fn as_classified<'a>(
    e: &'a (dyn std::error::Error + 'static),
) -> Option<&'a dyn gpu_core::ClassifiedError> {
    match e.downcast_ref::<HealthError>() {
        Some(h) => Some(h),
        None => gpu_sysfs::classify::as_classified(e),
    }
}

impl gpu_core::ClassifiedError for crate::aer::AerParseError {
    /// An AER counter file the kernel wrote in a form gpuslice does not read.
    fn kind(&self) -> gpu_core::ErrorKind {
        gpu_core::ErrorKind::HostError
    }
}
