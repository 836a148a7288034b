//! Which of this crate's error types (or the model's) an erased error is: a link of the chain
//! every front-end uses to classify an error whose types were erased. Kept apart from
//! [`crate::error`] so that the error type does not depend on the modules whose errors it names.

use crate::SysfsError;
use crate::actuate::ActuateError;
use crate::apply::ApplyError;

/// This crate's error types (or the model's), when `e` is one: see
/// [`gpu_core::classify::as_classified`].
pub fn as_classified<'a>(
    e: &'a (dyn std::error::Error + 'static),
) -> Option<&'a dyn gpu_core::ClassifiedError> {
    if let Some(e) = e.downcast_ref::<ActuateError>() {
        return Some(e);
    }
    if let Some(e) = e.downcast_ref::<SysfsError>() {
        return Some(e);
    }
    if let Some(e) = e.downcast_ref::<ApplyError>() {
        return Some(e);
    }
    gpu_core::classify::as_classified(e)
}

/// The machine-readable form of an error, the one front-ends print (the CLI on stderr with
/// `-o json|yaml`) so that programs can tell failures apart without parsing messages:
/// `{"kind": "exhausted", "message": "...", "errno": 28, "errnoName": "ENOSPC"}`.
#[derive(serde::Serialize, Debug, Clone, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct ErrorReport {
    /// Stable kind from [`gpu_core::ErrorKind::as_str`]: an actuation kind (`exists`, `exhausted`,
    /// `in-use`, ...), a layout kind (`does-not-fit`, ...), `unsatisfiable`, `invalid-request`,
    /// `invalid-config`, `not-found`, `host-error`, `invalid-argument` or `error`.
    pub kind: String,
    /// The one-line message also printed for people.
    pub message: String,
    /// The kernel errno, when the failure came from a sysfs write.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub errno: Option<i32>,
    /// The errno's symbolic name (`ENOSPC`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub errno_name: Option<String>,
}

impl ErrorReport {
    /// Classifies an error chain: the first error in it that `find` knows gives the kind and
    /// errno ([`gpu_core::Classified::of_chain`]); the message is the whole chain's.
    pub fn of_chain<'a>(
        e: &'a (dyn std::error::Error + 'static),
        find: impl Fn(
            &'a (dyn std::error::Error + 'static),
        ) -> Option<&'a dyn gpu_core::ClassifiedError>,
    ) -> Self {
        let c = gpu_core::Classified::of_chain(e, find);
        ErrorReport {
            kind: c.kind.as_str().to_owned(),
            message: c.message,
            errno: c.errno,
            errno_name: c.errno.map(crate::actuate::error::errno::name),
        }
    }
}
