//! The one error type of this crate.

use std::path::PathBuf;

use gpu_core::{ClassifiedError, ErrorDetail, ErrorKind};
use gpu_sysfs::actuate::ActuateError;

/// The error a decoder, a renderer or a file operation gave, kept as the `#[source]`.
pub type Cause = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Why an export, a hand-off or a DRA prepare could not be made. Each variant names what it
/// concerns (`what`: the input, request, device or file) and, where there is one, what to do
/// instead; an underlying failure (the actuation layer's, a decoder's, an I/O error) is kept as
/// the `#[source]`, so its kind and errno reach every front-end. Messages quote the source's own
/// text once, as they always did; [`gpu_core::error_chain`] does not repeat it.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum IntegrationError {
    /// An input document, option, name or token is malformed (`invalid-argument`).
    #[error("{why}")]
    Invalid {
        /// The input concerned (`license token`, `claim UID`, `request gpu-0`).
        what: String,
        /// What is wrong, naming the input, for people.
        why: String,
    },
    /// An input document cannot be decoded (`invalid-argument`).
    #[error("{what}: {source}")]
    Decode {
        /// Which document (`document 2`, `ResourceSlice 1`).
        what: String,
        /// The decoder's error.
        #[source]
        source: Cause,
    },
    /// The input names a device, GPU or VF the node does not have (`not-found`).
    #[error("{why}")]
    NotFound {
        /// The device, GPU or name concerned.
        what: String,
        /// What is missing, for people.
        why: String,
    },
    /// The node cannot do what was asked: a blocked GPU, no free parent, an API limit
    /// (`invalid-request`).
    #[error("{why}")]
    Refused {
        /// The request, GPU or object concerned.
        what: String,
        /// Why it is refused, for people.
        why: String,
    },
    /// The device is held by another owner (a VM has its VFIO node open) (`in-use`).
    #[error("{why}")]
    InUse {
        /// The device concerned (an mdev UUID, a PCI address).
        what: String,
        /// Who holds it, for people.
        why: String,
    },
    /// The host refused a change (a DRA prepare or unprepare step): the actuation layer's kind
    /// (`exhausted`, `in-use`, ...) and errno.
    #[error("{context}{source}{also}")]
    Host {
        /// The device the change was for (a GPU's address, an mdev UUID, a VF).
        what: String,
        /// What the change was part of (`claim <uid>: `), or empty.
        context: String,
        /// The actuation layer's error.
        #[source]
        source: Box<ActuateError>,
        /// What else failed with it (`; undoing the earlier steps also failed: ...`), or empty.
        also: String,
    },
    /// The node's DRA claim store cannot be read or written (`host-error`).
    #[error("{what} {}{}", path.display(), cause_text(source.as_ref()))]
    State {
        /// What was being done (`cannot read prepared claim`).
        what: String,
        /// The file or directory.
        path: PathBuf,
        /// The I/O or decoding error, when there is one.
        #[source]
        source: Option<Cause>,
    },
    /// Rendering the output failed (a gpuslice bug) (`error`).
    #[error("cannot render {what}: {source}")]
    Render {
        /// What was rendered (`metrics`, `YAML`, `the claim`).
        what: &'static str,
        /// The renderer's error.
        #[source]
        source: Cause,
    },
    /// gpuslice produced objects that break the API's rules (a gpuslice bug) (`error`).
    #[error("the generated {what} break Kubernetes {version} rules (a gpuslice bug): {}", violations.join("; "))]
    RulesBroken {
        /// The objects (`slices`).
        what: &'static str,
        /// The Kubernetes version whose rules they break.
        version: String,
        /// Each rule broken.
        violations: Vec<String>,
    },
}

/// `: <cause>` after a message (the cause stays the `#[source]` too), or nothing.
fn cause_text(cause: Option<&Cause>) -> String {
    cause.map(|c| format!(": {c}")).unwrap_or_default()
}

impl IntegrationError {
    /// The kind of this error, from gpuslice's one vocabulary of error kinds.
    pub fn kind(&self) -> ErrorKind {
        match self {
            IntegrationError::Invalid { .. } | IntegrationError::Decode { .. } => {
                ErrorKind::InvalidArgument
            }
            IntegrationError::NotFound { .. } => ErrorKind::NotFound,
            IntegrationError::Refused { .. } => ErrorKind::InvalidRequest,
            IntegrationError::InUse { .. } => ErrorKind::InUse,
            IntegrationError::Host { source, .. } => source.kind(),
            IntegrationError::State { .. } => ErrorKind::HostError,
            IntegrationError::Render { .. } | IntegrationError::RulesBroken { .. } => {
                ErrorKind::Other
            }
        }
    }

    /// A failed change on the host, for device `what`.
    pub fn host(what: impl std::fmt::Display, source: ActuateError) -> Self {
        IntegrationError::Host {
            what: what.to_string(),
            context: String::new(),
            source: Box::new(source),
            also: String::new(),
        }
    }

    /// A claim store operation `what` on `path` that failed with `source`.
    pub fn state(
        what: impl Into<String>,
        path: impl Into<PathBuf>,
        source: impl Into<Cause>,
    ) -> Self {
        IntegrationError::State {
            what: what.into(),
            path: path.into(),
            source: Some(source.into()),
        }
    }

    /// A failed rendering of `what`.
    pub fn render(what: &'static str, source: impl Into<Cause>) -> Self {
        IntegrationError::Render {
            what,
            source: source.into(),
        }
    }

    /// The same error with `context: ` in front of its message (and of what it concerns).
    #[must_use]
    pub fn context(self, context: impl std::fmt::Display) -> Self {
        let wrap = |m: String| format!("{context}: {m}");
        match self {
            IntegrationError::Invalid { what, why } => IntegrationError::Invalid {
                what: wrap(what),
                why: wrap(why),
            },
            IntegrationError::NotFound { what, why } => IntegrationError::NotFound {
                what: wrap(what),
                why: wrap(why),
            },
            IntegrationError::Refused { what, why } => IntegrationError::Refused {
                what: wrap(what),
                why: wrap(why),
            },
            IntegrationError::InUse { what, why } => IntegrationError::InUse {
                what: wrap(what),
                why: wrap(why),
            },
            IntegrationError::Decode { what, source } => IntegrationError::Decode {
                what: wrap(what),
                source,
            },
            IntegrationError::Host {
                what,
                context: inner,
                source,
                also,
            } => IntegrationError::Host {
                what,
                context: format!("{context}: {inner}"),
                source,
                also,
            },
            IntegrationError::State { what, path, source } => IntegrationError::State {
                what: wrap(what),
                path,
                source,
            },
            other @ (IntegrationError::Render { .. } | IntegrationError::RulesBroken { .. }) => {
                other
            }
        }
    }
}

impl ClassifiedError for IntegrationError {
    fn kind(&self) -> ErrorKind {
        self.kind()
    }

    /// The actuation layer's errno, for a failed change on the host.
    fn errno(&self) -> Option<i32> {
        match self {
            IntegrationError::Host { source, .. } => source.errno(),
            _ => None,
        }
    }

    /// The claim store's path.
    fn detail(&self) -> ErrorDetail {
        match self {
            IntegrationError::State { path, .. } => ErrorDetail::Host {
                path: Some(path.display().to_string()),
                errno: None,
            },
            _ => ErrorDetail::None,
        }
    }
}

/// This crate's error type (or the host's, or the model's), when `e` is one: see
/// [`gpu_core::classify::as_classified`].
pub fn as_classified<'a>(
    e: &'a (dyn std::error::Error + 'static),
) -> Option<&'a dyn ClassifiedError> {
    match e.downcast_ref::<IntegrationError>() {
        Some(i) => Some(i),
        None => gpu_sysfs::classify::as_classified(e),
    }
}

/// Result type of this crate.
pub type Result<T, E = IntegrationError> = std::result::Result<T, E>;

/// Returns early with an [`IntegrationError`] of a `what`/`why` variant: what it concerns, then
/// the formatted message.
macro_rules! fail {
    ($variant:ident, $what:expr; $($arg:tt)+) => {
        return Err($crate::error::IntegrationError::$variant {
            what: ($what).to_string(),
            why: format!($($arg)+),
        })
    };
}
pub(crate) use fail;

/// An [`IntegrationError`] of a `what`/`why` variant, for `ok_or_else` and `map_err`.
macro_rules! error {
    ($variant:ident, $what:expr; $($arg:tt)+) => {
        $crate::error::IntegrationError::$variant {
            what: ($what).to_string(),
            why: format!($($arg)+),
        }
    };
}
pub(crate) use error;

#[cfg(test)]
mod tests {
    use super::*;
    use gpu_sysfs::actuate::error::errno;

    #[test]
    fn a_failed_host_change_keeps_the_actuation_error_as_its_source() {
        let e = IntegrationError::host(
            "0000:01:00.4",
            ActuateError::from_write(
                "sys/x/create",
                b"u",
                std::io::Error::from_raw_os_error(errno::ENOSPC),
            ),
        );
        let e = e.context("claim c-1");
        let c = gpu_core::Classified::of(&e);
        assert_eq!(c.kind, ErrorKind::Exhausted);
        assert_eq!(c.errno, Some(errno::ENOSPC));
        assert_eq!(
            c.message,
            "claim c-1: /sys/x/create: no capacity left for this type (ENOSPC)"
        );
        let source = std::error::Error::source(&e).map(ToString::to_string);
        assert_eq!(
            source.as_deref(),
            Some("/sys/x/create: no capacity left for this type (ENOSPC)")
        );
    }

    #[test]
    fn a_claim_store_failure_names_the_file_and_keeps_the_io_error() {
        let e = IntegrationError::state(
            "cannot read prepared claim",
            "/var/lib/gpuslice/dra/claims/c.json",
            std::io::Error::from_raw_os_error(errno::EACCES),
        );
        let c = gpu_core::Classified::of(&e);
        assert_eq!(c.kind, ErrorKind::HostError);
        assert!(
            c.message.starts_with(
                "cannot read prepared claim /var/lib/gpuslice/dra/claims/c.json: Permission denied"
            ),
            "{}",
            c.message
        );
        assert!(std::error::Error::source(&e).is_some());
    }
}
