//! JavaScript values to model values.
//!
//! Every document argument is accepted either as the parsed shape (a plain object, as
//! `JSON.parse` gives it) or as JSON/YAML text. Text goes through the model's own `from_text` so
//! both forms are checked by the same code.

use gpu_core::CoreError;
use serde::de::DeserializeOwned;

use crate::errors::{Failure, Input};

/// A document type the binding accepts as an argument.
pub trait Document: DeserializeOwned {
    /// What it is called in messages (`machine`, `fleet`, `node topology`).
    const WHAT: &'static str;
    /// Whether a bad one is the caller's request or a configuration document.
    const INPUT: Input;
    /// Parses and checks text, as the model does.
    ///
    /// # Errors
    /// The model's decode or validation error.
    fn from_text(text: &str) -> Result<Self, CoreError>;
    /// Checks a decoded value, as `from_text` would.
    ///
    /// # Errors
    /// The model's validation error.
    fn validate(&self) -> Result<(), CoreError>;
}

impl Document for gpu_core::Machine {
    const WHAT: &'static str = "machine";
    const INPUT: Input = Input::Request;
    fn from_text(text: &str) -> Result<Self, CoreError> {
        gpu_core::Machine::from_text(text)
    }
    fn validate(&self) -> Result<(), CoreError> {
        gpu_core::Machine::validate(self)
    }
}

/// A fleet is read with its shapes kept shared: nodes of one `shapes` entry are indexed once.
impl Document for gpu_core::SharedFleet {
    const WHAT: &'static str = "fleet";
    const INPUT: Input = Input::Config;
    fn from_text(text: &str) -> Result<Self, CoreError> {
        gpu_core::SharedFleet::from_text_max(text, gpu_core::limits::MAX_DOCUMENT_BYTES)
    }
    fn validate(&self) -> Result<(), CoreError> {
        gpu_core::SharedFleet::validate(self)
    }
}

impl Document for gpu_core::Allocation {
    const WHAT: &'static str = "allocation";
    const INPUT: Input = Input::Config;
    fn from_text(text: &str) -> Result<Self, CoreError> {
        gpu_core::decode_text("allocation", text)
    }
    fn validate(&self) -> Result<(), CoreError> {
        Ok(())
    }
}

impl Document for gpu_core::NodeTopology {
    const WHAT: &'static str = "node topology";
    const INPUT: Input = Input::Config;
    fn from_text(text: &str) -> Result<Self, CoreError> {
        gpu_core::NodeTopology::from_text(text)
    }
    fn validate(&self) -> Result<(), CoreError> {
        Ok(())
    }
}

/// Reads a document argument given as an object or as JSON/YAML text.
///
/// # Errors
/// `INVALID_REQUEST` or `CONFIG_ERROR` (by [`Document::INPUT`]) naming what could not be decoded.
pub fn document<T: Document>(value: serde_json::Value) -> Result<T, Failure> {
    if let serde_json::Value::String(text) = &value {
        return T::from_text(text).map_err(|e| Failure::core(&e, T::INPUT));
    }
    let decoded: T = serde_json::from_value(value).map_err(|e| {
        let e = CoreError::Decode {
            what: T::WHAT.to_owned(),
            message: e.to_string(),
        };
        Failure::core(&e, T::INPUT)
    })?;
    decoded
        .validate()
        .map_err(|e| Failure::core(&e, T::INPUT))?;
    Ok(decoded)
}

/// Converts a result to JSON for the JS side.
///
/// # Errors
/// `INTERNAL` if serialization fails, which the model's types never do.
pub fn to_json<T: serde::Serialize>(value: &T) -> Result<serde_json::Value, Failure> {
    serde_json::to_value(value).map_err(|e| Failure::Other(format!("cannot convert result: {e}")))
}
