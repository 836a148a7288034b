//! The outcome of reading one signal.

use serde::{Deserialize, Serialize};

/// One signal as read from the host or the driver: a value, a signal this device or driver does
/// not offer, or a signal that could not be read this time (with why).
///
/// JSON: `{"value": 3}`, `"unsupported"`, `{"unknown": "NVML not loaded"}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Reading<T> {
    /// The value read.
    Value(T),
    /// The device, kernel or driver does not offer this signal (no AER capability, ECC off,
    /// `NVML_ERROR_NOT_SUPPORTED`, a symbol the loaded NVML lacks).
    Unsupported,
    /// The signal exists but could not be read (library absent, driver not loaded, garbage in a
    /// file, an I/O error); the text says why.
    Unknown(String),
}

impl<T> Reading<T> {
    /// The value, when one was read.
    pub fn value(&self) -> Option<&T> {
        match self {
            Reading::Value(v) => Some(v),
            _ => None,
        }
    }

    /// True when a value was read.
    pub fn is_value(&self) -> bool {
        matches!(self, Reading::Value(_))
    }

    /// Maps the value, keeping Unsupported and Unknown.
    pub fn map<U>(self, f: impl FnOnce(T) -> U) -> Reading<U> {
        match self {
            Reading::Value(v) => Reading::Value(f(v)),
            Reading::Unsupported => Reading::Unsupported,
            Reading::Unknown(why) => Reading::Unknown(why),
        }
    }

    /// An Unknown reading with this reason.
    pub fn unknown(why: impl Into<String>) -> Self {
        Reading::Unknown(why.into())
    }
}

impl<T: Copy> Reading<T> {
    /// The value, copied, when one was read.
    pub fn get(&self) -> Option<T> {
        self.value().copied()
    }
}

impl<T> Default for Reading<T> {
    fn default() -> Self {
        Reading::Unknown("not read".to_owned())
    }
}
