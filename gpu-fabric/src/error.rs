//! Why a Fabric Manager call failed: the call's name and an [`FmErrorKind`], translated from
//! FM's `fmReturn_t` in one place ([`FmErrorKind::from_code`]).

use gpu_core::{ClassifiedError, ErrorKind};

/// What a Fabric Manager call answered instead of `FM_ST_SUCCESS` (`fmReturn_t` in NVIDIA's
/// public `nv_fm_types.h`), plus what fails before a call: the library is missing or lacks the
/// function, FM cannot be reached, or the fake could not keep its state.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FmErrorKind {
    /// `FM_ST_BADPARAM` (-1): a bad argument, e.g. a partition ID FM does not offer.
    #[error("bad parameter (no such partition, or a malformed argument)")]
    BadParam,
    /// `FM_ST_GENERIC_ERROR` (-2).
    #[error("unspecified error")]
    Generic,
    /// `FM_ST_NOT_SUPPORTED` (-3): not offered in the mode FM runs in.
    #[error("not supported in the mode Fabric Manager runs in")]
    NotSupported,
    /// `FM_ST_UNINITIALIZED` (-4): the library was not initialized, or (deactivation) the
    /// partition is not active.
    #[error("not initialized, or the partition is not active")]
    Uninitialized,
    /// `FM_ST_TIMEOUT` (-5).
    #[error("timed out")]
    Timeout,
    /// `FM_ST_VERSION_MISMATCH` (-6): FM and this client disagree on a struct's version.
    #[error("version mismatch between Fabric Manager and its client library")]
    VersionMismatch,
    /// `FM_ST_IN_USE` (-7): the partition is already active (or one of its GPUs is).
    #[error("in use: the partition (or one of its GPUs) is already active")]
    InUse,
    /// `FM_ST_NOT_CONFIGURED` (-8): FM is still initializing.
    #[error("Fabric Manager is initializing and has no data yet")]
    NotConfigured,
    /// `FM_ST_CONNECTION_NOT_VALID` (-9): FM could not be reached.
    #[error("Fabric Manager cannot be reached")]
    ConnectionNotValid,
    /// `FM_ST_NVLINK_ERROR` (-10): NVLink training failed while (de)activating.
    #[error("NVLink error or training failure")]
    NvlinkError,
    /// The loaded `libnvfm` does not export the function (an older Fabric Manager).
    #[error("the loaded libnvfm lacks this function")]
    FunctionNotFound,
    /// The library could not be loaded (not installed, wrong path): the message says why.
    #[error("{0}")]
    Unavailable(String),
    /// The fake Fabric Manager could not keep its state (the sandbox's `fabric.json`).
    #[error("the fake Fabric Manager's state could not be kept: {0}")]
    State(String),
    /// A return code this version does not know (a newer Fabric Manager).
    #[error("unexpected return code {0}")]
    Unexpected(i32),
}

impl FmErrorKind {
    /// The kind of FM return code `code`, `None` for `FM_ST_SUCCESS`.
    pub fn from_code(code: i32) -> Option<Self> {
        Some(match code {
            0 => return None,
            -1 => Self::BadParam,
            -2 => Self::Generic,
            -3 => Self::NotSupported,
            -4 => Self::Uninitialized,
            -5 => Self::Timeout,
            -6 => Self::VersionMismatch,
            -7 => Self::InUse,
            -8 => Self::NotConfigured,
            -9 => Self::ConnectionNotValid,
            -10 => Self::NvlinkError,
            other => Self::Unexpected(other),
        })
    }

    /// The return code FM uses for this kind (`None` for the failures before a call).
    pub fn code(&self) -> Option<i32> {
        Some(match self {
            Self::BadParam => -1,
            Self::Generic => -2,
            Self::NotSupported => -3,
            Self::Uninitialized => -4,
            Self::Timeout => -5,
            Self::VersionMismatch => -6,
            Self::InUse => -7,
            Self::NotConfigured => -8,
            Self::ConnectionNotValid => -9,
            Self::NvlinkError => -10,
            Self::Unexpected(c) => *c,
            Self::FunctionNotFound | Self::Unavailable(_) | Self::State(_) => return None,
        })
    }

    /// True when Fabric Manager could not be talked to at all (library missing, connection
    /// refused): the fabric exists but its partitions are unknown.
    pub fn is_unreachable(&self) -> bool {
        matches!(self, Self::Unavailable(_) | Self::ConnectionNotValid)
    }
}

/// One Fabric Manager call that failed: which call, and what it answered.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{call}: Fabric Manager: {kind}")]
pub struct FmError {
    /// The FM function (`fmActivateFabricPartition`), or `dlopen` for loading the library.
    pub call: &'static str,
    /// What it answered.
    pub kind: FmErrorKind,
}

impl FmError {
    /// `call` failed with `kind`.
    pub fn new(call: &'static str, kind: FmErrorKind) -> Self {
        FmError { call, kind }
    }

    /// `call` returned `code`: `Ok` for `FM_ST_SUCCESS`, the translated error otherwise.
    ///
    /// # Errors
    /// The error of every code but 0.
    pub fn check(call: &'static str, code: i32) -> Result<(), Self> {
        match FmErrorKind::from_code(code) {
            None => Ok(()),
            Some(kind) => Err(FmError { call, kind }),
        }
    }
}

impl ClassifiedError for FmError {
    fn kind(&self) -> ErrorKind {
        match &self.kind {
            FmErrorKind::BadParam => ErrorKind::InvalidArgument,
            FmErrorKind::InUse => ErrorKind::InUse,
            FmErrorKind::NotSupported | FmErrorKind::FunctionNotFound => ErrorKind::DriverRefused,
            FmErrorKind::Unavailable(_) | FmErrorKind::ConnectionNotValid => ErrorKind::NoDevice,
            FmErrorKind::Timeout | FmErrorKind::NotConfigured => ErrorKind::Busy,
            _ => ErrorKind::HostError,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_known_code_translates_back_to_itself_and_a_new_one_is_unexpected() {
        for code in -10..=-1 {
            let kind = FmErrorKind::from_code(code).unwrap_or(FmErrorKind::Generic);
            assert_eq!(kind.code(), Some(code), "{kind:?}");
            assert!(!matches!(kind, FmErrorKind::Unexpected(_)), "{code}");
        }
        assert_eq!(FmErrorKind::from_code(0), None);
        assert_eq!(
            FmErrorKind::from_code(-11),
            Some(FmErrorKind::Unexpected(-11))
        );
    }

    #[test]
    fn an_error_names_its_call_and_classifies() {
        let e = FmError::check("fmActivateFabricPartition", -7).unwrap_err();
        assert_eq!(
            e.to_string(),
            "fmActivateFabricPartition: Fabric Manager: in use: the partition (or one of its GPUs) is already active"
        );
        assert_eq!(ClassifiedError::kind(&e), ErrorKind::InUse);
        assert!(FmErrorKind::ConnectionNotValid.is_unreachable());
        assert!(!FmErrorKind::InUse.is_unreachable());
    }
}
