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
//!
//! The parents are shared out: the second thread reads them from the first one on, and the
//! scan, once its PCI part is over, from the last one back, until they meet. (The second thread
//! once also took PCI functions' `class` files from the far end of the address list when it
//! ran out of parents; measured side by side on the A2 recording it gained nothing, so the PCI
//! scan reads its own.)

use std::collections::{BTreeSet, HashMap};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
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

impl Read {
    /// Adds what `other` read.
    fn merge(&mut self, other: Read) {
        absorb(&mut self.files, other.files);
        absorb(&mut self.lists, other.lists);
    }
}

/// Adds `theirs` to `ours`, the smaller map into the larger (most often one thread read every
/// parent and the other none: then nothing is hashed again).
fn absorb<V>(ours: &mut HashMap<String, V>, mut theirs: HashMap<String, V>) {
    if ours.len() < theirs.len() {
        std::mem::swap(ours, &mut theirs);
    }
    ours.extend(theirs);
}

/// A host whose mdev parents' files may have been read already; see the module docs.
#[derive(Debug)]
pub(crate) struct Prefetch<'h> {
    host: &'h dyn Host,
    read: OnceLock<Mutex<Read>>,
    parents: OnceLock<Parents>,
}

impl<'h> Prefetch<'h> {
    /// Nothing read yet: every call goes to `host`.
    pub(crate) fn new(host: &'h dyn Host) -> Self {
        Prefetch {
            host,
            read: OnceLock::new(),
            parents: OnceLock::new(),
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
        let parents = &self.parents;
        std::thread::Builder::new()
            .name("gpuslice-prefetch".into())
            .spawn_scoped(scope, move || {
                let mut read = Read::default();
                let listed = host.list(MDEV_BUS);
                let entries = listed.as_ref().map_or_else(|_| Vec::new(), Clone::clone);
                read.lists.insert(MDEV_BUS.to_owned(), listed);
                let parents = parents.get_or_init(|| Parents::new(entries));
                parents.read_while_free(host, 0..parents.entries.len(), &mut read);
                read
            })
            .ok()
    }

    /// Ends the second thread's part (the scan is over) and takes what it read, for the calls
    /// after this one.
    pub(crate) fn finish(&self, worker: Option<ScopedJoinHandle<'_, Read>>) {
        // The parents the second thread has not reached yet are read here, from the last.
        let mut read = Read::default();
        if let Some(p) = self.parents.get() {
            p.read_while_free(self.host, (0..p.entries.len()).rev(), &mut read);
        }
        // A thread that panicked read nothing usable: the host answers for its part.
        if let Some(Ok(theirs)) = worker.map(ScopedJoinHandle::join) {
            read.merge(theirs);
        }
        let _ = self.read.set(Mutex::new(read));
    }

    fn taken<T>(&self, pick: impl FnOnce(&mut Read) -> Option<T>) -> Option<T> {
        let mut read = self.read.get()?.lock().ok()?;
        pick(&mut read)
    }
}

/// The mdev parents, shared out between the two threads: the second takes them from the first
/// one on, the scan (once its PCI part is over) from the last one back, each parent claimed by
/// one of them.
#[derive(Debug)]
struct Parents {
    entries: Vec<String>,
    claimed: Vec<AtomicBool>,
    /// The type names whose facts were read (by either thread).
    seen: Mutex<BTreeSet<String>>,
}

impl Parents {
    fn new(entries: Vec<String>) -> Self {
        let claimed = entries.iter().map(|_| AtomicBool::new(false)).collect();
        Parents {
            entries,
            claimed,
            seen: Mutex::default(),
        }
    }

    /// Claims parent `i` when nobody has.
    fn claim(&self, i: usize) -> bool {
        !self.claimed[i].swap(true, Ordering::AcqRel)
    }

    /// What the mdev scan reads of parent `i` (`super::vgpu::read_mdev_parent`): its types,
    /// each type's `available_instances`, and the facts of each type name the first time it is
    /// seen.
    fn read(&self, host: &dyn Host, i: usize, into: &mut Read) {
        let types_dir = format!("{MDEV_BUS}/{}/mdev_supported_types", self.entries[i]);
        let types = host.list(&types_dir);
        if let (Ok(t), true) = (&types, into.files.capacity() == 0) {
            // Room for every parent's counts and each type's facts once, as parents of one GPU
            // list the same types: the map is not grown (and copied) a handful of times.
            into.files.reserve(t.len() * (self.entries.len() + 3));
        }
        for t in types.iter().flatten() {
            let tdir = format!("{types_dir}/{t}");
            let first = self
                .seen
                .lock()
                .is_ok_and(|mut seen| !seen.contains(t) && seen.insert(t.clone()));
            let facts: &[&str] = if first {
                &["name", "description", "device_api", "available_instances"]
            } else {
                &["available_instances"]
            };
            for f in facts {
                let path = format!("{tdir}/{f}");
                let answer = host.read(&path);
                into.files.insert(path, answer);
            }
        }
        into.lists.insert(types_dir, types);
    }

    /// Reads the parents not claimed yet, in `order`, until one was claimed by the other thread.
    fn read_while_free(
        &self,
        host: &dyn Host,
        order: impl Iterator<Item = usize>,
        into: &mut Read,
    ) {
        for i in order {
            if !self.claim(i) {
                break;
            }
            self.read(host, i, into);
        }
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_parents_are_shared_out_and_each_types_facts_read_once() {
        let dir = tempfile::tempdir().unwrap();
        let entries: Vec<String> = ["0000:08:00.4", "0000:08:00.5", "0000:08:00.6"]
            .iter()
            .map(|e| (*e).to_owned())
            .collect();
        for e in &entries {
            for t in ["nvidia-742", "nvidia-743"] {
                let d = dir
                    .path()
                    .join(MDEV_BUS)
                    .join(e)
                    .join("mdev_supported_types")
                    .join(t);
                std::fs::create_dir_all(&d).unwrap();
                for f in ["name", "description", "device_api", "available_instances"] {
                    std::fs::write(d.join(f), "1\n").unwrap();
                }
            }
        }
        let host = crate::RealHost::new(dir.path()).unwrap();
        let p = Parents::new(entries);
        // The scan has claimed the last parent; the second thread stops there.
        assert!(p.claim(2));
        let mut theirs = Read::default();
        p.read_while_free(&host, 0..3, &mut theirs);
        assert_eq!(theirs.lists.len(), 2);
        // Facts once per type name (from the first parent), counts for every parent read.
        assert_eq!(theirs.files.len(), 2 * 4 + 2);
        let mut ours = Read::default();
        p.read_while_free(&host, (0..3).rev(), &mut ours);
        assert!(ours.files.is_empty(), "every parent was claimed");
    }
}
