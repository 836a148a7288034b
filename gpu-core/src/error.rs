//! The one error type of the pure model.

/// Errors from parsing or validating model values.
///
/// Every variant names the input that was wrong, so a message can be shown to an operator as is.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CoreError {
    /// A PCI address did not have the form `DOMAIN:BUS:DEVICE.FUNCTION`.
    #[error("invalid PCI address {input:?}: {why}")]
    InvalidPciAddress {
        /// The text that was given.
        input: String,
        /// What is wrong with it.
        why: &'static str,
    },
    /// An mdev UUID was malformed.
    #[error("invalid mdev UUID {input:?}: expected 8-4-4-4-12 hexadecimal digits")]
    InvalidUuid {
        /// The text that was given.
        input: String,
    },
    /// A vGPU type ID was empty or held characters that could escape a sysfs path.
    #[error("invalid vGPU type ID {input:?}: {why}")]
    InvalidTypeId {
        /// The text that was given.
        input: String,
        /// What is wrong with it.
        why: &'static str,
    },
    /// A memory size could not be parsed.
    #[error("invalid memory size {input:?}: {why}")]
    InvalidSize {
        /// The text that was given.
        input: String,
        /// What is wrong with it.
        why: &'static str,
    },
    /// A vGPU parent ID was neither a PCI address nor a plain device name.
    #[error("invalid vGPU parent {input:?}: {why}")]
    InvalidParent {
        /// The text that was given.
        input: String,
        /// What is wrong with it.
        why: &'static str,
    },
    /// An NVIDIA vGPU type name did not follow NVIDIA's naming grammar.
    #[error("invalid NVIDIA vGPU type name {input:?}: {why}")]
    InvalidTypeName {
        /// The text that was given.
        input: String,
        /// What is wrong with it.
        why: &'static str,
    },
    /// A node or machine name was not acceptable.
    #[error("invalid name {input:?}: {why}")]
    InvalidName {
        /// The text that was given.
        input: String,
        /// What is wrong with it.
        why: &'static str,
    },
    /// A request was inconsistent (for example `profile` together with `gpus`).
    #[error("invalid request {request:?}: {why}")]
    InvalidRequest {
        /// The request (machine or device request) concerned.
        request: String,
        /// What is wrong with it.
        why: String,
    },
    /// A GPU graded Unhealthy was asked for a VM without forcing it ([`crate::Health::check_handout`]).
    #[error(
        "{gpu} is Unhealthy ({reasons}); a VM would get a failing GPU; nothing was changed ({force} binds it anyway)"
    )]
    Unhealthy {
        /// The GPU (its PCI address).
        gpu: String,
        /// The verdict's reasons, comma-separated.
        reasons: String,
        /// How this front-end forces it (`--force`, `?force=true`).
        force: &'static str,
    },
    /// A JSON or YAML document could not be decoded into the model.
    #[error("cannot decode {what}: {message}")]
    Decode {
        /// What was being decoded (`fleet`, `machine`, ...).
        what: String,
        /// The decoder's message, with line and column where known.
        message: String,
    },
}

impl CoreError {
    /// The kind of this error: `invalid-request` for an inconsistent request, `invalid-argument`
    /// for any other malformed value. A front-end decoding a configuration document (a fleet, a
    /// topology) reports [`CoreError::kind_in_config`] instead.
    pub fn kind(&self) -> crate::ErrorKind {
        match self {
            CoreError::InvalidRequest { .. } => crate::ErrorKind::InvalidRequest,
            CoreError::Unhealthy { .. } => crate::ErrorKind::Unhealthy,
            _ => crate::ErrorKind::InvalidArgument,
        }
    }

    /// The kind of this error when it came from a configuration document rather than a request:
    /// `invalid-config`, except for an inconsistent request, which stays `invalid-request`.
    pub fn kind_in_config(&self) -> crate::ErrorKind {
        match self {
            CoreError::InvalidRequest { .. } => crate::ErrorKind::InvalidRequest,
            CoreError::Unhealthy { .. } => crate::ErrorKind::Unhealthy,
            _ => crate::ErrorKind::InvalidConfig,
        }
    }
}

/// A [`CoreError`] met while decoding a configuration document (a fleet, a topology) rather than
/// a request: its kind is [`CoreError::kind_in_config`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(transparent)]
pub struct ConfigDocError(pub CoreError);

impl ConfigDocError {
    /// The kind: `invalid-config` (or `invalid-request` for an inconsistent request).
    pub fn kind(&self) -> crate::ErrorKind {
        self.0.kind_in_config()
    }
}

/// Result type of this crate.
pub type Result<T, E = CoreError> = std::result::Result<T, E>;
