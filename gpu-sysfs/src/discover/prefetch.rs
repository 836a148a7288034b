//! Reading the vGPU parents' files while the PCI scan runs.
//!
//! Discovery is a few hundred small reads, each a handful of system calls, and on the A2 they
//! fall in two halves that do not depend on each other: the PCI functions (one `class` each,
//! a GPU's attributes) and the mdev parents (every type's `available_instances`, the facts of
//! each type once). On a host whose reads are system calls ([`Host::parallel_reads`]) a second
//! thread reads the parents' files while the first scans PCI, and the mdev scan then takes them
//! from [`Prefetch`] instead of the kernel: the same reads with the same bounds, each answer
//! used once, the same order of parsing, so the topology is the one a serial scan gives. Any
//! file the prefetch did not read (or a second read of one) goes to the host as before.

use std::collections::{BTreeSet, HashMap};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};
use std::thread::{Scope, ScopedJoinHandle};
use std::time::Duration;

use super::vgpu::MDEV_BUS;
use crate::host::{CommandOutput, Host};

/// What the second thread read: each file's answer and each directory's listing, by path.
#[derive(Debug, Default)]
pub(crate) struct Read {
    files: HashMap<String, io::Result<Vec<u8>>>,
    lists: HashMap<String, io::Result<Vec<String>>>,
}

/// A host whose mdev parents' files may have been read already; see the module docs.
#[derive(Debug)]
pub(crate) struct Prefetch<'h> {
    host: &'h dyn Host,
    read: OnceLock<Mutex<Read>>,
}

impl<'h> Prefetch<'h> {
    /// Nothing read yet: every call goes to `host`.
    pub(crate) fn new(host: &'h dyn Host) -> Self {
        Prefetch {
            host,
            read: OnceLock::new(),
        }
    }

    /// Starts reading the mdev parents on a thread of `scope`, when the host gains from it and
    /// a thread can be started.
    pub(crate) fn start<'s>(
        &'s self,
        scope: &'s Scope<'s, '_>,
    ) -> Option<ScopedJoinHandle<'s, Read>>
    where
        'h: 's,
    {
        if !self.host.parallel_reads() {
            return None;
        }
        let host = self.host;
        std::thread::Builder::new()
            .name("gpuslice-prefetch".into())
            .spawn_scoped(scope, move || read_mdev_parents(host))
            .ok()
    }

    /// Takes what the thread read, for the calls after this one.
    pub(crate) fn finish(&self, worker: Option<ScopedJoinHandle<'_, Read>>) {
        // A thread that panicked read nothing usable: the host answers instead.
        if let Some(Ok(read)) = worker.map(ScopedJoinHandle::join) {
            let _ = self.read.set(Mutex::new(read));
        }
    }

    fn taken<T>(&self, pick: impl FnOnce(&mut Read) -> Option<T>) -> Option<T> {
        let mut read = self.read.get()?.lock().ok()?;
        pick(&mut read)
    }
}

/// What the mdev scan reads of each parent (`super::vgpu::read_mdev_parent`): its types, each
/// type's `available_instances`, and the facts of each type name the first time it is seen.
fn read_mdev_parents(host: &dyn Host) -> Read {
    let mut read = Read::default();
    let entries = host.list(MDEV_BUS);
    let mut seen: BTreeSet<String> = BTreeSet::new();
    for entry in entries.iter().flatten() {
        let types_dir = format!("{MDEV_BUS}/{entry}/mdev_supported_types");
        let types = host.list(&types_dir);
        for t in types.iter().flatten() {
            let tdir = format!("{types_dir}/{t}");
            let mut files = vec!["available_instances"];
            if seen.insert(t.clone()) {
                files.splice(0..0, ["name", "description", "device_api"]);
            }
            for f in files {
                let path = format!("{tdir}/{f}");
                let answer = host.read(&path);
                read.files.insert(path, answer);
            }
        }
        read.lists.insert(types_dir, types);
    }
    read.lists.insert(MDEV_BUS.to_owned(), entries);
    read
}

impl Host for Prefetch<'_> {
    fn read(&self, path: &str) -> io::Result<Vec<u8>> {
        self.taken(|r| r.files.remove(path))
            .unwrap_or_else(|| self.host.read(path))
    }

    fn read_bounded(&self, path: &str, max: usize) -> io::Result<Vec<u8>> {
        self.host.read_bounded(path, max)
    }

    fn write(&self, path: &str, data: &[u8]) -> io::Result<()> {
        self.host.write(path, data)
    }

    fn list(&self, dir: &str) -> io::Result<Vec<String>> {
        self.taken(|r| r.lists.remove(dir))
            .unwrap_or_else(|| self.host.list(dir))
    }

    fn read_link(&self, path: &str) -> io::Result<PathBuf> {
        self.host.read_link(path)
    }

    fn resolve_link(&self, path: &str) -> io::Result<String> {
        self.host.resolve_link(path)
    }

    fn canonicalize(&self, path: &str) -> io::Result<String> {
        self.host.canonicalize(path)
    }

    fn exists(&self, path: &str) -> bool {
        self.host.exists(path)
    }

    fn run(&self, program: &str, args: &[String], timeout: Duration) -> io::Result<CommandOutput> {
        self.host.run(program, args, timeout)
    }

    fn root_dir(&self) -> Option<&Path> {
        self.host.root_dir()
    }

    fn write_atomic(&self, path: &str, data: &[u8]) -> io::Result<()> {
        self.host.write_atomic(path, data)
    }

    fn create_dir_all(&self, path: &str) -> io::Result<()> {
        self.host.create_dir_all(path)
    }

    fn parallel_reads(&self) -> bool {
        self.host.parallel_reads()
    }
}
