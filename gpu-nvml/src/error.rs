//! The crate's errors: why NVML could not be opened ([`NvmlUnavailable`]), and why one call
//! failed ([`NvmlError`], with its [`NvmlErrorKind`] translated from NVML's return code in one
//! place, [`NvmlErrorKind::from_code`]).

/// Why NVML could not be opened. Each is an expected state of a host, not a fault of gpuslice.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NvmlUnavailable {
    /// The library could not be loaded (no NVIDIA driver installed, or a wrong path).
    #[error("{library} could not be loaded: {message}")]
    LibraryNotFound {
        /// The name or path tried.
        library: String,
        /// The loader's message.
        message: String,
    },
    /// The library loaded but the NVIDIA kernel driver is not running.
    #[error("the NVIDIA driver is not loaded")]
    DriverNotLoaded,
    /// The library loaded but may not talk to the driver.
    #[error("no permission to talk to the NVIDIA driver")]
    NoPermission,
    /// `nvmlInit` failed for another reason.
    #[error("NVML initialization failed: {0}")]
    InitFailed(String),
}

/// What an NVML call answered instead of `NVML_SUCCESS` (`nvmlReturn_t`, NVML API reference,
/// "Error reporting"), plus the two failures that happen before a call: the loaded library lacks
/// the function, or NVML is not open at all.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NvmlErrorKind {
    /// `NVML_ERROR_UNINITIALIZED`.
    #[error("NVML was not initialized")]
    Uninitialized,
    /// `NVML_ERROR_INVALID_ARGUMENT`: a bad device, profile, placement or mode.
    #[error("invalid argument")]
    InvalidArgument,
    /// `NVML_ERROR_NOT_SUPPORTED`: this device or mode does not offer the call.
    #[error("not supported")]
    NotSupported,
    /// `NVML_ERROR_NO_PERMISSION`: the call needs root (MIG and vGPU writes do).
    #[error("no permission")]
    NoPermission,
    /// `NVML_ERROR_NOT_FOUND`: no such device, GPU instance or vGPU.
    #[error("not found")]
    NotFound,
    /// `NVML_ERROR_INSUFFICIENT_SIZE`: the answer did not fit the buffer given.
    #[error("insufficient size")]
    InsufficientSize,
    /// `NVML_ERROR_DRIVER_NOT_LOADED`.
    #[error("the NVIDIA driver is not loaded")]
    DriverNotLoaded,
    /// `NVML_ERROR_TIMEOUT`.
    #[error("timeout")]
    Timeout,
    /// `NVML_ERROR_FUNCTION_NOT_FOUND`, or a symbol the loaded library does not export (an
    /// older driver).
    #[error("the loaded NVML lacks this function")]
    FunctionNotFound,
    /// `NVML_ERROR_GPU_IS_LOST`: the GPU fell off the bus.
    #[error("the GPU has fallen off the bus")]
    GpuLost,
    /// `NVML_ERROR_RESET_REQUIRED`: the change takes effect only after a GPU reset (or a VM
    /// reboot where the reset is not exposed).
    #[error("a GPU reset is required")]
    ResetRequired,
    /// `NVML_ERROR_OPERATING_SYSTEM`.
    #[error("the operating system refused")]
    OperatingSystem,
    /// `NVML_ERROR_IN_USE`: processes, vGPUs or instances use what the call would change.
    #[error("in use")]
    InUse,
    /// `NVML_ERROR_MEMORY`.
    #[error("insufficient memory")]
    Memory,
    /// `NVML_ERROR_NO_DATA`.
    #[error("no data")]
    NoData,
    /// `NVML_ERROR_INSUFFICIENT_RESOURCES`: no room for the GPU instance or placement asked for.
    #[error("insufficient resources")]
    InsufficientResources,
    /// `NVML_ERROR_ARGUMENT_VERSION_MISMATCH`: the struct version is not one this driver knows.
    #[error("argument version mismatch")]
    ArgumentVersionMismatch,
    /// `NVML_ERROR_NOT_READY`.
    #[error("not ready")]
    NotReady,
    /// `NVML_ERROR_INVALID_STATE`.
    #[error("invalid state")]
    InvalidState,
    /// `NVML_ERROR_UNKNOWN`.
    #[error("Unknown Error")]
    Unknown,
    /// A return code this crate does not know (a newer driver).
    #[error("unexpected NVML return code {0}")]
    Unexpected(u32),
    /// NVML could not be opened, so nothing was asked.
    #[error("no NVML: {0}")]
    Unavailable(NvmlUnavailable),
}

impl NvmlErrorKind {
    /// The kind of NVML return code `code`, `None` for `NVML_SUCCESS` (0). The one place codes
    /// are translated (values: `nvmlReturn_enum` in nvml.h).
    pub fn from_code(code: u32) -> Option<Self> {
        Some(match code {
            0 => return None,
            1 => Self::Uninitialized,
            2 => Self::InvalidArgument,
            3 => Self::NotSupported,
            4 => Self::NoPermission,
            6 => Self::NotFound,
            7 => Self::InsufficientSize,
            9 => Self::DriverNotLoaded,
            10 => Self::Timeout,
            13 => Self::FunctionNotFound,
            15 => Self::GpuLost,
            16 => Self::ResetRequired,
            17 => Self::OperatingSystem,
            19 => Self::InUse,
            20 => Self::Memory,
            21 => Self::NoData,
            23 => Self::InsufficientResources,
            25 => Self::ArgumentVersionMismatch,
            27 => Self::NotReady,
            29 => Self::InvalidState,
            999 => Self::Unknown,
            other => Self::Unexpected(other),
        })
    }

    /// NVML's return code for this kind (`None` for the two kinds no call returns:
    /// [`NvmlErrorKind::Unavailable`], and [`NvmlErrorKind::FunctionNotFound`] gives 13).
    pub fn code(&self) -> Option<u32> {
        Some(match self {
            Self::Uninitialized => 1,
            Self::InvalidArgument => 2,
            Self::NotSupported => 3,
            Self::NoPermission => 4,
            Self::NotFound => 6,
            Self::InsufficientSize => 7,
            Self::DriverNotLoaded => 9,
            Self::Timeout => 10,
            Self::FunctionNotFound => 13,
            Self::GpuLost => 15,
            Self::ResetRequired => 16,
            Self::OperatingSystem => 17,
            Self::InUse => 19,
            Self::Memory => 20,
            Self::NoData => 21,
            Self::InsufficientResources => 23,
            Self::ArgumentVersionMismatch => 25,
            Self::NotReady => 27,
            Self::InvalidState => 29,
            Self::Unknown => 999,
            Self::Unexpected(c) => *c,
            Self::Unavailable(_) => return None,
        })
    }

    /// True for a signal or call the device, driver or library does not offer
    /// (`NOT_SUPPORTED`, or a function the library lacks): "unsupported", not a failure.
    pub fn is_unsupported(&self) -> bool {
        matches!(self, Self::NotSupported | Self::FunctionNotFound)
    }
}

/// One NVML call that failed: which call, and what it answered.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{call}: NVML: {kind}")]
pub struct NvmlError {
    /// The NVML function (`nvmlDeviceCreateGpuInstanceWithPlacement`).
    pub call: &'static str,
    /// What it answered.
    pub kind: NvmlErrorKind,
}

impl NvmlError {
    /// `call` failed with `kind`.
    pub fn new(call: &'static str, kind: NvmlErrorKind) -> Self {
        NvmlError { call, kind }
    }

    /// `call` returned `code`: `Ok` for `NVML_SUCCESS`, the translated error otherwise.
    ///
    /// # Errors
    /// The error of every code but 0.
    pub fn check(call: &'static str, code: u32) -> Result<(), Self> {
        match NvmlErrorKind::from_code(code) {
            None => Ok(()),
            Some(kind) => Err(NvmlError { call, kind }),
        }
    }

    /// True when this is NVML saying `kind`.
    pub fn is(&self, kind: &NvmlErrorKind) -> bool {
        &self.kind == kind
    }

    /// True when NVML says the GPU has no such feature or object (`NOT_SUPPORTED`, `NOT_FOUND`):
    /// the question does not apply to it, which is not a failure.
    pub fn is_not_applicable(&self) -> bool {
        matches!(
            self.kind,
            NvmlErrorKind::NotSupported | NvmlErrorKind::NotFound
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_known_code_translates_back_to_itself() {
        for code in [
            1, 2, 3, 4, 6, 7, 9, 10, 13, 15, 16, 17, 19, 20, 21, 23, 25, 27, 29, 999,
        ] {
            let kind = NvmlErrorKind::from_code(code).unwrap_or(NvmlErrorKind::Unknown);
            assert_eq!(kind.code(), Some(code), "{kind:?}");
            assert!(!matches!(kind, NvmlErrorKind::Unexpected(_)), "{code}");
        }
    }

    #[test]
    fn success_is_no_error_and_a_new_code_is_unexpected_not_unknown() {
        assert_eq!(NvmlErrorKind::from_code(0), None);
        assert_eq!(
            NvmlErrorKind::from_code(31),
            Some(NvmlErrorKind::Unexpected(31))
        );
        assert_eq!(
            NvmlError::check("nvmlDeviceSetMigMode", 19),
            Err(NvmlError::new("nvmlDeviceSetMigMode", NvmlErrorKind::InUse))
        );
    }

    #[test]
    fn an_error_names_its_call() {
        let e = NvmlError::new(
            "nvmlDeviceCreateGpuInstanceWithPlacement",
            NvmlErrorKind::InsufficientResources,
        );
        assert_eq!(
            e.to_string(),
            "nvmlDeviceCreateGpuInstanceWithPlacement: NVML: insufficient resources"
        );
    }
}
