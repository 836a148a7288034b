//! A [`Host`] that counts the reads made through it, for tests that promise a file is read once.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use crate::host::Host;
use crate::observed::{HostOp, Observed, Observer};

/// Counts each path read (`read`, `read_bounded`, `read_string`, and the reads the default
/// methods make through them); listings are not counted.
#[derive(Debug, Default)]
pub struct ReadCounter {
    reads: Mutex<BTreeMap<String, usize>>,
}

impl Observer for ReadCounter {
    type Guard<'a> = ();

    fn before(&self, op: HostOp, path: &str) {
        if op == HostOp::Read {
            *self
                .reads
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .entry(path.to_owned())
                .or_default() += 1;
        }
    }
}

/// Passes every call to the host it wraps and counts each path read.
pub type CountingHost = Observed<ReadCounter>;

impl Observed<ReadCounter> {
    /// Counts the reads made of `inner`.
    pub fn new(inner: impl Host + 'static) -> Self {
        Observed::wrap(Arc::new(inner), ReadCounter::default())
    }

    /// How often each path was read, by path.
    pub fn reads(&self) -> BTreeMap<String, usize> {
        self.observer()
            .reads
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// How often `path` was read.
    pub fn reads_of(&self, path: &str) -> usize {
        self.reads().get(path).copied().unwrap_or(0)
    }
}
