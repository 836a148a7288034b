//! One vocabulary of error kinds for every gpuslice crate and front-end.
//!
//! Each library error type answers `kind()` with an [`ErrorKind`]; the CLI prints
//! [`ErrorKind::as_str`] as `kind` in `-o json`/`-o yaml` errors, and the Python and Node bindings
//! choose their exception class or `code` from [`ErrorKind::family`]. The strings are a contract:
//! programs driving the CLI match on them.

use std::fmt;

/// What went wrong, independent of which crate noticed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ErrorKind {
    /// No node can hold the Machine (`unsatisfiable`).
    Unsatisfiable,
    /// A Machine, placement policy or other request clashes or is malformed (`invalid-request`).
    InvalidRequest,
    /// A configuration document (fleet, topology, health policy) is malformed or inconsistent
    /// (`invalid-config`).
    InvalidConfig,
    /// A value given on the command line or to a call is malformed (`invalid-argument`).
    InvalidArgument,
    /// The Machine, node or device asked for does not exist (`not-found`).
    NotFound,
    /// Reading the host failed: the root, a sysfs file, a recording (`host-error`).
    HostError,
    /// The vGPU type is not offered by the parent (`unknown-profile`).
    UnknownProfile,
    /// A sysfs read before or after a write failed (`read-failed`).
    ReadFailed,
    /// The instance already exists (`exists`, EEXIST).
    Exists,
    /// No capacity is left for the instance (`exhausted`, ENOSPC/EUSERS).
    Exhausted,
    /// The device is busy (`busy`, EBUSY).
    Busy,
    /// The kernel refused the write for permissions (`not-permitted`, EPERM/EACCES).
    NotPermitted,
    /// The device vanished (`no-device`, ENODEV).
    NoDevice,
    /// The driver refused the request (`driver-refused`, EIO).
    DriverRefused,
    /// The kernel answered something gpuslice does not know (`unexpected`).
    Unexpected,
    /// An instance of another type already occupies the slot (`exists-other-type`).
    ExistsOtherType,
    /// The profile cannot be created on this parent now (`not-creatable`).
    NotCreatable,
    /// A VM or process uses the device (`in-use`).
    InUse,
    /// Probing a driver failed (`probe-failed`).
    ProbeFailed,
    /// The IOMMU group cannot be handed over whole (`group-not-viable`).
    GroupNotViable,
    /// The host has no IOMMU enabled (`no-iommu`).
    NoIommu,
    /// The device or driver does not support the operation (`unsupported`).
    Unsupported,
    /// The operation did not finish in time (`timeout`).
    Timeout,
    /// An external command failed (`command-failed`).
    CommandFailed,
    /// SR-IOV virtual functions are not enabled (`sriov-not-enabled`).
    SriovNotEnabled,
    /// The host was left as it was: nothing was applied (`not-applied`).
    NotApplied,
    /// Undoing a partial change failed part-way (`rollback-incomplete`).
    RollbackIncomplete,
    /// A vGPU layout file cannot be decoded (`decode`).
    LayoutDecode,
    /// A vGPU layout file is invalid (`invalid`).
    LayoutInvalid,
    /// A layout config names a vGPU type twice (`duplicate-type`).
    DuplicateType,
    /// The layout config asked for is not in the file (`unknown-config`).
    UnknownConfig,
    /// The layout file holds several configs and none was chosen (`config-not-chosen`).
    ConfigNotChosen,
    /// A layout names a vGPU type no GPU offers (`unknown-type`).
    UnknownType,
    /// A layout names a vGPU type of another board than the GPU's (`wrong-board`).
    WrongBoard,
    /// Several layout entries select the same GPU (`ambiguous-entries`).
    AmbiguousEntries,
    /// A layout selects a GPU that cannot host vGPUs (`not-vgpu-capable`).
    NotVgpuCapable,
    /// A layout names a device that is not on the host (`unknown-device`).
    UnknownDevice,
    /// A layout conflicts with instances in use (`conflict`).
    Conflict,
    /// A layout does not fit the GPU (`does-not-fit`).
    DoesNotFit,
    /// The agent's listener needs a bearer token the request did not carry (`unauthorized`).
    Unauthorized,
    /// The agent's listener serves reads only (`read-only`).
    ReadOnly,
    /// The agent has no such route (`unknown-route`).
    UnknownRoute,
    /// The route does not take this HTTP method (`method-not-allowed`).
    MethodNotAllowed,
    /// The request body is larger than the agent takes (`too-large`).
    TooLarge,
    /// A GPU graded Unhealthy was not handed to a VM (`unhealthy`); forcing it does.
    Unhealthy,
    /// Anything else (`error`).
    Other,
}

/// The coarse families the bindings turn into exception classes (Python) or `code`s (Node).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorFamily {
    /// `Unsatisfiable` / `UNSATISFIABLE`.
    Unsatisfiable,
    /// `InvalidRequest` / `INVALID_REQUEST`.
    InvalidRequest,
    /// `NotFound` / `NOT_FOUND`.
    NotFound,
    /// `HostError` / `HOST_ERROR`: reading or changing the host failed.
    Host,
    /// `ConfigError` / `CONFIG_ERROR`: a configuration document or layout file.
    Config,
    /// The base `Error` / `INTERNAL`.
    Other,
}

impl ErrorKind {
    /// Every kind, in declaration order.
    pub const ALL: [ErrorKind; 46] = [
        ErrorKind::Unsatisfiable,
        ErrorKind::InvalidRequest,
        ErrorKind::InvalidConfig,
        ErrorKind::InvalidArgument,
        ErrorKind::NotFound,
        ErrorKind::HostError,
        ErrorKind::UnknownProfile,
        ErrorKind::ReadFailed,
        ErrorKind::Exists,
        ErrorKind::Exhausted,
        ErrorKind::Busy,
        ErrorKind::NotPermitted,
        ErrorKind::NoDevice,
        ErrorKind::DriverRefused,
        ErrorKind::Unexpected,
        ErrorKind::ExistsOtherType,
        ErrorKind::NotCreatable,
        ErrorKind::InUse,
        ErrorKind::ProbeFailed,
        ErrorKind::GroupNotViable,
        ErrorKind::NoIommu,
        ErrorKind::Unsupported,
        ErrorKind::Timeout,
        ErrorKind::CommandFailed,
        ErrorKind::SriovNotEnabled,
        ErrorKind::NotApplied,
        ErrorKind::RollbackIncomplete,
        ErrorKind::LayoutDecode,
        ErrorKind::LayoutInvalid,
        ErrorKind::DuplicateType,
        ErrorKind::UnknownConfig,
        ErrorKind::ConfigNotChosen,
        ErrorKind::UnknownType,
        ErrorKind::WrongBoard,
        ErrorKind::AmbiguousEntries,
        ErrorKind::NotVgpuCapable,
        ErrorKind::UnknownDevice,
        ErrorKind::Conflict,
        ErrorKind::DoesNotFit,
        ErrorKind::Unauthorized,
        ErrorKind::ReadOnly,
        ErrorKind::UnknownRoute,
        ErrorKind::MethodNotAllowed,
        ErrorKind::TooLarge,
        ErrorKind::Unhealthy,
        ErrorKind::Other,
    ];

    /// The stable kebab-case name printed by the CLI (`exhausted`, `invalid-request`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorKind::Unsatisfiable => "unsatisfiable",
            ErrorKind::InvalidRequest => "invalid-request",
            ErrorKind::InvalidConfig => "invalid-config",
            ErrorKind::InvalidArgument => "invalid-argument",
            ErrorKind::NotFound => "not-found",
            ErrorKind::HostError => "host-error",
            ErrorKind::UnknownProfile => "unknown-profile",
            ErrorKind::ReadFailed => "read-failed",
            ErrorKind::Exists => "exists",
            ErrorKind::Exhausted => "exhausted",
            ErrorKind::Busy => "busy",
            ErrorKind::NotPermitted => "not-permitted",
            ErrorKind::NoDevice => "no-device",
            ErrorKind::DriverRefused => "driver-refused",
            ErrorKind::Unexpected => "unexpected",
            ErrorKind::ExistsOtherType => "exists-other-type",
            ErrorKind::NotCreatable => "not-creatable",
            ErrorKind::InUse => "in-use",
            ErrorKind::ProbeFailed => "probe-failed",
            ErrorKind::GroupNotViable => "group-not-viable",
            ErrorKind::NoIommu => "no-iommu",
            ErrorKind::Unsupported => "unsupported",
            ErrorKind::Timeout => "timeout",
            ErrorKind::CommandFailed => "command-failed",
            ErrorKind::SriovNotEnabled => "sriov-not-enabled",
            ErrorKind::NotApplied => "not-applied",
            ErrorKind::RollbackIncomplete => "rollback-incomplete",
            ErrorKind::LayoutDecode => "decode",
            ErrorKind::LayoutInvalid => "invalid",
            ErrorKind::DuplicateType => "duplicate-type",
            ErrorKind::UnknownConfig => "unknown-config",
            ErrorKind::ConfigNotChosen => "config-not-chosen",
            ErrorKind::UnknownType => "unknown-type",
            ErrorKind::WrongBoard => "wrong-board",
            ErrorKind::AmbiguousEntries => "ambiguous-entries",
            ErrorKind::NotVgpuCapable => "not-vgpu-capable",
            ErrorKind::UnknownDevice => "unknown-device",
            ErrorKind::Conflict => "conflict",
            ErrorKind::DoesNotFit => "does-not-fit",
            ErrorKind::Unauthorized => "unauthorized",
            ErrorKind::ReadOnly => "read-only",
            ErrorKind::UnknownRoute => "unknown-route",
            ErrorKind::MethodNotAllowed => "method-not-allowed",
            ErrorKind::TooLarge => "too-large",
            ErrorKind::Unhealthy => "unhealthy",
            ErrorKind::Other => "error",
        }
    }

    /// The family a binding raises this kind as.
    pub fn family(self) -> ErrorFamily {
        use ErrorKind as K;
        match self {
            K::Unsatisfiable => ErrorFamily::Unsatisfiable,
            K::InvalidRequest
            | K::InvalidArgument
            | K::Unauthorized
            | K::ReadOnly
            | K::UnknownRoute
            | K::MethodNotAllowed
            | K::TooLarge => ErrorFamily::InvalidRequest,
            K::NotFound => ErrorFamily::NotFound,
            K::InvalidConfig
            | K::LayoutDecode
            | K::LayoutInvalid
            | K::DuplicateType
            | K::UnknownConfig
            | K::ConfigNotChosen
            | K::UnknownType
            | K::WrongBoard
            | K::AmbiguousEntries
            | K::NotVgpuCapable
            | K::UnknownDevice
            | K::Conflict
            | K::DoesNotFit => ErrorFamily::Config,
            K::HostError
            | K::UnknownProfile
            | K::ReadFailed
            | K::Exists
            | K::Exhausted
            | K::Busy
            | K::NotPermitted
            | K::NoDevice
            | K::DriverRefused
            | K::Unexpected
            | K::ExistsOtherType
            | K::NotCreatable
            | K::InUse
            | K::Unhealthy
            | K::ProbeFailed
            | K::GroupNotViable
            | K::NoIommu
            | K::Unsupported
            | K::Timeout
            | K::CommandFailed
            | K::SriovNotEnabled
            | K::NotApplied
            | K::RollbackIncomplete => ErrorFamily::Host,
            K::Other => ErrorFamily::Other,
        }
    }

    /// The kind of a name printed by [`ErrorKind::as_str`] (`exhausted` → `Exhausted`).
    pub fn from_name(name: &str) -> Option<Self> {
        ErrorKind::ALL.into_iter().find(|k| k.as_str() == name)
    }

    /// Whether this kind comes from a vGPU layout file (the bindings expose it as `kind`).
    pub fn is_layout(self) -> bool {
        self.family() == ErrorFamily::Config && self != ErrorKind::InvalidConfig
    }
}

/// Serialized as its name (`"exhausted"`), the string every front-end prints.
impl serde::Serialize for ErrorKind {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_has_a_distinct_name() {
        let mut names: Vec<&str> = ErrorKind::ALL.iter().map(|k| k.as_str()).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), ErrorKind::ALL.len());
        for k in ErrorKind::ALL {
            assert_eq!(ErrorKind::from_name(k.as_str()), Some(k));
        }
        assert_eq!(ErrorKind::from_name("no-such-kind"), None);
    }

    #[test]
    fn layout_kinds_are_configuration_and_the_rest_are_not() {
        assert!(ErrorKind::DoesNotFit.is_layout());
        assert!(!ErrorKind::InvalidConfig.is_layout());
        assert_eq!(ErrorKind::InvalidConfig.family(), ErrorFamily::Config);
        assert_eq!(ErrorKind::Exhausted.family(), ErrorFamily::Host);
    }
}
