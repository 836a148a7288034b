//! A [`Host`] that passes every call on to another and tells an [`Observer`] about each read.
//!
//! Wrapping a host by hand means delegating every method of the trait, and a method left to
//! the trait's default silently changes behaviour: the default `write_atomic` is a plain write
//! (no temporary file, no `O_CREAT` on a real root), the default `read_bounded` reads through
//! `read` with the attribute size limit. [`Observed`] delegates all of them once; the agent's
//! read tracker and the tests' read counter are observers on it.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use crate::host::{CommandOutput, Host};

/// What an [`Observed`] host is about to pass on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HostOp {
    /// A file read (`read`, `read_bounded`, `read_string`).
    Read,
    /// A directory listing.
    List,
}

/// Told about each read and listing an [`Observed`] host passes on.
pub trait Observer: Send + Sync + std::fmt::Debug {
    /// What is kept while the call runs; dropped when it returns (a tracker's in-flight entry).
    type Guard<'a>
    where
        Self: 'a;

    /// Called before `op` on `path` is passed on.
    fn before<'a>(&'a self, op: HostOp, path: &str) -> Self::Guard<'a>;
}

/// Passes every [`Host`] call to `inner`, telling `observer` about reads and listings first.
#[derive(Debug)]
pub struct Observed<O> {
    inner: Arc<dyn Host>,
    observer: O,
}

impl<O: Observer> Observed<O> {
    /// Wraps `inner`, reporting to `observer`.
    pub fn wrap(inner: Arc<dyn Host>, observer: O) -> Self {
        Observed { inner, observer }
    }

    /// The observer.
    pub fn observer(&self) -> &O {
        &self.observer
    }

    /// The host wrapped.
    pub fn inner(&self) -> &dyn Host {
        self.inner.as_ref()
    }
}

impl<O: Observer> Host for Observed<O> {
    fn read(&self, path: &str) -> io::Result<Vec<u8>> {
        let _g = self.observer.before(HostOp::Read, path);
        self.inner.read(path)
    }

    fn read_bounded(&self, path: &str, max: usize) -> io::Result<Vec<u8>> {
        let _g = self.observer.before(HostOp::Read, path);
        self.inner.read_bounded(path, max)
    }

    fn read_string(&self, path: &str) -> io::Result<String> {
        let _g = self.observer.before(HostOp::Read, path);
        self.inner.read_string(path)
    }

    fn list(&self, dir: &str) -> io::Result<Vec<String>> {
        let _g = self.observer.before(HostOp::List, dir);
        self.inner.list(dir)
    }

    fn write(&self, path: &str, data: &[u8]) -> io::Result<()> {
        self.inner.write(path, data)
    }

    fn write_atomic(&self, path: &str, data: &[u8]) -> io::Result<()> {
        self.inner.write_atomic(path, data)
    }

    fn create_dir_all(&self, path: &str) -> io::Result<()> {
        self.inner.create_dir_all(path)
    }

    fn read_link(&self, path: &str) -> io::Result<PathBuf> {
        self.inner.read_link(path)
    }

    fn resolve_link(&self, path: &str) -> io::Result<String> {
        self.inner.resolve_link(path)
    }

    fn canonicalize(&self, path: &str) -> io::Result<String> {
        self.inner.canonicalize(path)
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
    fn parallel_reads(&self) -> bool {
        self.inner.parallel_reads()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::sync::Mutex;

    use super::*;
    use crate::RealHost;

    #[derive(Debug, Default)]
    struct Log(Mutex<Vec<(HostOp, String)>>);

    impl Observer for Log {
        type Guard<'a> = ();
        fn before(&self, op: HostOp, path: &str) {
            self.0.lock().unwrap().push((op, path.to_owned()));
        }
    }

    fn tree() -> (tempfile::TempDir, Observed<Log>) {
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(d.path().join("sys/x")).unwrap();
        std::fs::write(d.path().join("sys/x/attr"), "1\n").unwrap();
        let host = RealHost::new(d.path()).unwrap();
        (d, Observed::wrap(Arc::new(host), Log::default()))
    }

    #[test]
    fn state_files_are_written_atomically_and_read_whole_as_the_wrapped_host_does() {
        let (d, h) = tree();
        // A new state file in a new directory: the default write_atomic (a plain write) fails.
        h.write_atomic("var/lib/gpuslice/state.json", b"{}")
            .unwrap();
        assert_eq!(
            std::fs::read(d.path().join("var/lib/gpuslice/state.json")).unwrap(),
            b"{}"
        );
        // Larger than an attribute: the default read_bounded goes through the 16 KiB `read`.
        let big = vec![b'a'; 100 * 1024];
        h.write_atomic("var/lib/gpuslice/big", &big).unwrap();
        assert_eq!(
            h.read_bounded("var/lib/gpuslice/big", 1 << 20).unwrap(),
            big
        );
        h.create_dir_all("var/lib/other").unwrap();
        assert!(d.path().join("var/lib/other").is_dir());
    }

    #[test]
    fn reads_and_listings_are_observed_and_nothing_else() {
        let (_d, h) = tree();
        assert_eq!(h.read_string("sys/x/attr").unwrap(), "1");
        assert_eq!(h.list("sys/x").unwrap(), vec!["attr".to_owned()]);
        assert!(h.exists("sys/x/attr"));
        h.write_atomic("var/s", b"x").unwrap();
        assert_eq!(
            *h.observer().0.lock().unwrap(),
            vec![
                (HostOp::Read, "sys/x/attr".to_owned()),
                (HostOp::List, "sys/x".to_owned()),
            ]
        );
    }
}
