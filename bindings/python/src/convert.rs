//! Python values to model values and back.
//!
//! Every document argument is accepted either as the parsed shape (a `dict`, as `json.load` or
//! `yaml.safe_load` give it) or as JSON/YAML text. Text goes through the model's own `from_text`
//! so both forms are checked by the same code.

use gpu_core::CoreError;
use pyo3::prelude::*;
use pyo3::types::PyString;
use serde::Serialize;
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

/// Reads a document argument given as a mapping or as JSON/YAML text.
///
/// # Errors
/// `InvalidRequest` or `ConfigError` (by [`Document::INPUT`]) naming what could not be decoded.
pub fn document<T: Document>(obj: &Bound<'_, PyAny>) -> Result<T, Failure> {
    if let Ok(text) = obj.cast::<PyString>() {
        let text = text
            .to_cow()
            .map_err(|e| Failure::core(&decode_error::<T>(e.to_string()), T::INPUT))?;
        return T::from_text(&text).map_err(|e| Failure::core(&e, T::INPUT));
    }
    let value: T = crate::pyde::from_py(obj)
        .map_err(|e| Failure::core(&decode_error::<T>(e.to_string()), T::INPUT))?;
    value.validate().map_err(|e| Failure::core(&e, T::INPUT))?;
    Ok(value)
}

fn decode_error<T: Document>(message: String) -> CoreError {
    CoreError::Decode {
        what: T::WHAT.to_owned(),
        message,
    }
}

/// Converts a model value to plain Python data (`dict`, `list`, `str`, `int`, ...), with the same
/// camelCase keys as the JSON form.
///
/// # Errors
/// The base `Error` if serialization fails, which the model's types never do.
pub fn to_py<'py, T: Serialize>(py: Python<'py>, value: &T) -> PyResult<Bound<'py, PyAny>> {
    crate::pyserde::to_py(py, value)
        .map_err(|e| Failure::Other(format!("cannot convert result: {e}")).into_pyerr(py))
}
