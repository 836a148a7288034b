//! The one error type of this crate.

use gpu_core::ErrorKind;

/// Why an export, a hand-off or a DRA prepare could not be made. Each message names what was
/// wrong and, where there is one, what to do instead.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum IntegrationError {
    /// An input document, option or token is malformed (`invalid-argument`).
    #[error("{0}")]
    Invalid(String),
    /// The input names a device, GPU or VF the node does not have (`not-found`).
    #[error("{0}")]
    NotFound(String),
    /// The node cannot do what was asked: a blocked GPU, no free parent, an API limit
    /// (`invalid-request`).
    #[error("{0}")]
    Refused(String),
    /// The host refused a change (a DRA prepare or unprepare step): the actuation layer's kind
    /// (`exhausted`, `in-use`, ...) and message.
    #[error("{message}")]
    Host {
        /// The actuation layer's kind.
        kind: ErrorKind,
        /// What failed.
        message: String,
    },
    /// The node's DRA claim store cannot be read or written (`host-error`).
    #[error("{0}")]
    State(String),
    /// Rendering the output failed, or gpuslice produced objects that break the API's rules
    /// (a gpuslice bug) (`error`).
    #[error("{0}")]
    Internal(String),
}

impl IntegrationError {
    /// The kind of this error, from gpuslice's one vocabulary of error kinds.
    pub fn kind(&self) -> ErrorKind {
        match self {
            IntegrationError::Invalid(_) => ErrorKind::InvalidArgument,
            IntegrationError::NotFound(_) => ErrorKind::NotFound,
            IntegrationError::Refused(_) => ErrorKind::InvalidRequest,
            IntegrationError::Host { kind, .. } => *kind,
            IntegrationError::State(_) => ErrorKind::HostError,
            IntegrationError::Internal(_) => ErrorKind::Other,
        }
    }

    /// The same error with `context: ` in front of its message.
    #[must_use]
    pub fn context(self, context: impl std::fmt::Display) -> Self {
        self.map_message(|m| format!("{context}: {m}"))
    }

    /// The same error with `suffix` after its message.
    #[must_use]
    pub fn suffix(self, suffix: impl std::fmt::Display) -> Self {
        self.map_message(|m| format!("{m}{suffix}"))
    }

    fn map_message(self, wrap: impl FnOnce(String) -> String) -> Self {
        match self {
            IntegrationError::Invalid(m) => IntegrationError::Invalid(wrap(m)),
            IntegrationError::NotFound(m) => IntegrationError::NotFound(wrap(m)),
            IntegrationError::Refused(m) => IntegrationError::Refused(wrap(m)),
            IntegrationError::Host { kind, message } => IntegrationError::Host {
                kind,
                message: wrap(message),
            },
            IntegrationError::State(m) => IntegrationError::State(wrap(m)),
            IntegrationError::Internal(m) => IntegrationError::Internal(wrap(m)),
        }
    }
}

/// Result type of this crate.
pub type Result<T, E = IntegrationError> = std::result::Result<T, E>;

/// Returns early with an [`IntegrationError`] of the given variant and a formatted message.
macro_rules! fail {
    ($variant:ident, $($arg:tt)+) => {
        return Err($crate::error::IntegrationError::$variant(format!($($arg)+)))
    };
}
pub(crate) use fail;
