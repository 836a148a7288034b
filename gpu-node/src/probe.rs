//! Checking before the first write: an operation runs first on a [`Probe`] of the host, which
//! answers every read and refuses every change. An operation that gets through without trying
//! to change anything has its answer already (a refusal, or nothing to do), and neither the lock
//! nor the host is touched; one that tries runs again for real under the host-wide lock.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use gpu_sysfs::Host;
use gpu_sysfs::host::CommandOutput;

/// A host that reads through to `inner` and refuses every change, remembering that one was
/// tried.
#[derive(Debug)]
pub(crate) struct Probe<'h> {
    inner: &'h dyn Host,
    tried: AtomicBool,
    /// The first write tried: its path and data.
    first: Mutex<Option<(String, Vec<u8>)>>,
}

impl<'h> Probe<'h> {
    pub(crate) fn new(inner: &'h dyn Host) -> Self {
        Probe {
            inner,
            tried: AtomicBool::new(false),
            first: Mutex::new(None),
        }
    }

    /// The first write the operation tried: its path and data.
    pub(crate) fn first_write(&self) -> Option<(String, Vec<u8>)> {
        self.first
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Whether the operation tried to change the host.
    pub(crate) fn tried_to_write(&self) -> bool {
        self.tried.load(Ordering::SeqCst)
    }

    fn refuse(&self, what: &str) -> io::Error {
        self.tried.store(true, Ordering::SeqCst);
        io::Error::other(format!("{what}: not changed while checking"))
    }
}

impl Host for Probe<'_> {
    fn read(&self, path: &str) -> io::Result<Vec<u8>> {
        self.inner.read(path)
    }

    fn write(&self, path: &str, data: &[u8]) -> io::Result<()> {
        let mut first = self
            .first
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        first.get_or_insert_with(|| (path.to_owned(), data.to_vec()));
        Err(self.refuse(path))
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

    fn run(
        &self,
        program: &str,
        _args: &[String],
        _timeout: Duration,
    ) -> io::Result<CommandOutput> {
        Err(self.refuse(program))
    }

    fn root_dir(&self) -> Option<&Path> {
        self.inner.root_dir()
    }

    fn recorded_vgpu_types(&self, gpu: &gpu_core::PciAddress) -> Option<Vec<(u32, String)>> {
        self.inner.recorded_vgpu_types(gpu)
    }

    fn parallel_reads(&self) -> bool {
        self.inner.parallel_reads()
    }

    fn read_bounded(&self, path: &str, max: usize) -> io::Result<Vec<u8>> {
        self.inner.read_bounded(path, max)
    }

    fn write_atomic(&self, path: &str, _data: &[u8]) -> io::Result<()> {
        Err(self.refuse(path))
    }

    fn create_dir_all(&self, path: &str) -> io::Result<()> {
        Err(self.refuse(path))
    }

    fn read_string(&self, path: &str) -> io::Result<String> {
        self.inner.read_string(path)
    }

    fn resolve_link(&self, path: &str) -> io::Result<String> {
        self.inner.resolve_link(path)
    }

    fn canonicalize(&self, path: &str) -> io::Result<String> {
        self.inner.canonicalize(path)
    }
}
