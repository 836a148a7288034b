//! Which of the model's error types an erased error is: the first link of every crate's
//! `as_classified`, which the front-ends use to classify an error chain whose types were erased
//! (an `anyhow` chain, a `Box<dyn Error>`). Kept apart from [`crate::error`] so that the error
//! vocabulary does not depend on the layers whose errors it classifies.

use crate::error::{ClassifiedError, ConfigDocError, CoreError};
use crate::layout::LayoutError;

/// The model's own error types (a [`CoreError`], [`ConfigDocError`] or [`LayoutError`]), when
/// `e` is one.
pub fn as_classified<'a>(
    e: &'a (dyn std::error::Error + 'static),
) -> Option<&'a dyn ClassifiedError> {
    if let Some(e) = e.downcast_ref::<CoreError>() {
        return Some(e);
    }
    if let Some(e) = e.downcast_ref::<ConfigDocError>() {
        return Some(e);
    }
    if let Some(e) = e.downcast_ref::<LayoutError>() {
        return Some(e);
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ErrorKind;

    #[test]
    fn the_model_recognises_its_own_errors_in_an_erased_chain() {
        let e = CoreError::InvalidRequest {
            request: "vm".into(),
            why: "clash".into(),
        };
        let found = as_classified(&e).map(ClassifiedError::kind);
        assert_eq!(found, Some(ErrorKind::InvalidRequest));
        assert!(as_classified(&std::io::Error::other("x")).is_none());
    }
}
