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
