//! A [`Host`] that counts the reads made through it, for tests that promise a file is read once.

use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use crate::host::{CommandOutput, Host};

/// Passes every call to the host it wraps and counts each path read (`read`, `read_bounded`,
/// and the reads the default methods make through them).
pub struct CountingHost<H> {
    inner: H,
    reads: Mutex<BTreeMap<String, usize>>,
}

impl<H: Host> CountingHost<H> {
    /// Counts the reads made of `inner`.
    pub fn new(inner: H) -> Self {
        CountingHost {
            inner,
            reads: Mutex::new(BTreeMap::new()),
        }
    }

    /// How often each path was read, by path.
    pub fn reads(&self) -> BTreeMap<String, usize> {
        self.reads
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// How often `path` was read.
    pub fn reads_of(&self, path: &str) -> usize {
        self.reads().get(path).copied().unwrap_or(0)
    }
}

impl<H: Host> std::fmt::Debug for CountingHost<H> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CountingHost")
            .field("reads", &self.reads())
            .finish()
    }
}

impl<H> CountingHost<H> {
    fn count(&self, path: &str) {
        *self
            .reads
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .entry(path.to_owned())
            .or_default() += 1;
    }
}

impl<H: Host> Host for CountingHost<H> {
    fn read(&self, path: &str) -> io::Result<Vec<u8>> {
        self.count(path);
        self.inner.read(path)
    }

    fn read_bounded(&self, path: &str, max: usize) -> io::Result<Vec<u8>> {
        self.count(path);
        self.inner.read_bounded(path, max)
    }

    fn write(&self, path: &str, data: &[u8]) -> io::Result<()> {
        self.inner.write(path, data)
    }

    fn list(&self, dir: &str) -> io::Result<Vec<String>> {
        self.inner.list(dir)
    }

    fn read_link(&self, path: &str) -> io::Result<PathBuf> {
        self.inner.read_link(path)
    }

    fn exists(&self, path: &str) -> bool {
        self.inner.exists(path)
    }

    fn run(&self, program: &str, args: &[String], timeout: Duration) -> io::Result<CommandOutput> {
        self.inner.run(program, args, timeout)
    }

    fn root_dir(&self) -> Option<&Path> {
        self.inner.root_dir()
    }

    fn write_atomic(&self, path: &str, data: &[u8]) -> io::Result<()> {
        self.inner.write_atomic(path, data)
    }

    fn create_dir_all(&self, path: &str) -> io::Result<()> {
        self.inner.create_dir_all(path)
    }
}
