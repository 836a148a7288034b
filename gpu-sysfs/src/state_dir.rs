//! The one state directory of gpuslice's node state: the agent's promises, the DRA claim store
//! and the DRA checkpoint all keep their files in a [`StateDir`].
//!
//! A state directory lives inside a host's root (`<root>/var/lib/gpuslice/agent`) or at a
//! directory the user named, and it is reached the way every other host file is, through a
//! [`Host`]:
//! - **confined**: every component of the directory must be a directory; a component that is a
//!   link is refused with the link and its target named (an [`crate::OutsideRoot`] error when it
//!   leads outside the root), so no state is ever read or written through a planted link;
//! - **atomic**: a file is replaced with [`Host::write_atomic`], which on a real tree is the one
//!   confined writer ([`crate::atomic::Dir::write`]: a temporary file created exclusively under
//!   an unpredictable name, fsync, moved into place, fsync of the directory), so a reader or a restart sees
//!   the old file or the new one, and a planted link or FIFO is refused, never written through;
//! - **bounded**: a file is read with [`Host::read_bounded`], only when it is a regular file (a
//!   FIFO or device is refused without blocking) and never past the cap the caller gives;
//! - **one lock discipline**: a read-modify-write of the directory's files holds
//!   [`StateDir::lock`], an exclusive `flock` on `<dir>/.lock` (never opened through a link, only
//!   a regular file), waited for at most a bounded time.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::fcntl::{Flock, FlockArg};

use crate::atomic::Dir;
use crate::confine::OutsideRoot;
use crate::host::check_relative;
use crate::{Host, RealHost};

/// The lock file of a state directory.
pub const LOCK_FILE: &str = ".lock";

/// How often a wait for the lock looks again.
const LOCK_POLL: Duration = Duration::from_millis(20);

/// A state directory: a directory under a host's root whose files are read bounded and written
/// atomically, never through a link.
#[derive(Debug, Clone)]
pub struct StateDir {
    host: Arc<dyn Host>,
    /// The directory the host is rooted at (for messages and the lock file).
    base: PathBuf,
    /// The state directory, relative to the host's root.
    rel: String,
}

/// An error naming the state path it concerns, keeping the I/O error's kind and errno (and an
/// [`OutsideRoot`] inside it, so [`crate::is_outside_root`] still answers).
fn at_path(path: &Path, e: io::Error) -> io::Error {
    if crate::is_outside_root(&e) || e.to_string().contains(&path.display().to_string()) {
        return e;
    }
    crate::atomic::os_error_at(path, e)
}

/// The errno of a state-directory error, looking through the path it names.
pub use crate::atomic::errno_of;

impl StateDir {
    /// The state directory `rel` (`var/lib/gpuslice/agent`) inside `host`'s root. Nothing is
    /// created until a file is written.
    ///
    /// # Errors
    /// `rel` is not a plain root-relative path, or the host has no root directory.
    pub fn in_root(host: Arc<dyn Host>, rel: &str) -> io::Result<Self> {
        check_relative(rel)?;
        let base = host
            .root_dir()
            .ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::InvalidInput,
                    "the host has no root directory to keep state in",
                )
            })?
            .to_path_buf();
        Ok(StateDir {
            host,
            base,
            rel: rel.to_owned(),
        })
    }

    /// The state directory `dir` on this machine, named by the user. It is reached through a
    /// host rooted at its deepest existing ancestor, so the part still to be created is
    /// confined like a state directory inside a root.
    ///
    /// # Errors
    /// A path that names no directory (empty, `/`, or with a `..` component), or an ancestor
    /// that cannot be opened.
    pub fn at(dir: &Path) -> io::Result<Self> {
        let (base, rest) = Dir::split_named(dir).map_err(|_| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "state directory {:?} names no directory (give a path without `..`, not `/`)",
                    dir.display().to_string()
                ),
            )
        })?;
        let host = RealHost::new(&base)?;
        Self::in_root(Arc::new(host), &rest.join("/"))
    }

    /// The directory on this machine.
    pub fn path(&self) -> PathBuf {
        self.base.join(&self.rel)
    }

    /// A file of the directory, on this machine.
    pub fn file_path(&self, name: &str) -> PathBuf {
        self.path().join(name)
    }

    /// The host-relative path of `name` (a file name, or `claims/<uid>.json`).
    fn rel_of(&self, name: &str) -> io::Result<String> {
        check_relative(name)?;
        Ok(format!("{}/{name}", self.rel))
    }

    /// Checks that every existing component of the directory is a directory: a link is refused
    /// with its name and target (an [`OutsideRoot`] error when it leaves the root), so no state
    /// is read or written through it. A component not there yet is fine (it is created on the
    /// first write).
    ///
    /// # Errors
    /// A component that is a link (`PermissionDenied` with [`OutsideRoot`] when it leaves the
    /// root, `InvalidInput` when it stays inside) or a file.
    pub fn check(&self) -> io::Result<()> {
        self.check_rel(&self.rel)
    }

    fn check_rel(&self, rel: &str) -> io::Result<()> {
        let mut at = String::new();
        for part in rel.split('/') {
            if !at.is_empty() {
                at.push('/');
            }
            at.push_str(part);
            match self.host.read_link(&at) {
                Ok(target) => {
                    let target = target.to_string_lossy().into_owned();
                    let shown = self.base.join(&at);
                    // An absolute target is the host's `/` under a root, but the OS would
                    // follow it out of the root: both count as leaving.
                    let leaves = target.starts_with('/')
                        || self
                            .host
                            .canonicalize(&at)
                            .is_err_and(|e| crate::is_outside_root(&e));
                    return Err(if leaves {
                        io::Error::new(
                            io::ErrorKind::PermissionDenied,
                            OutsideRoot {
                                path: self.base.join(rel).display().to_string(),
                                link: shown.display().to_string(),
                                target,
                            },
                        )
                    } else {
                        io::Error::new(
                            io::ErrorKind::InvalidInput,
                            format!(
                                "{} is a link (-> {target}); no state is kept through a link",
                                shown.display()
                            ),
                        )
                    });
                }
                Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
                // EINVAL: not a link. Whether it is a directory is the kernel's answer on use.
                Err(_) => {}
            }
        }
        Ok(())
    }

    /// Creates the directory (and its missing parents), refusing links.
    ///
    /// # Errors
    /// As [`StateDir::check`]; the I/O error of creating a component.
    pub fn create(&self) -> io::Result<()> {
        self.check()?;
        self.host
            .create_dir_all(&self.rel)
            .map_err(|e| at_path(&self.path(), e))
    }

    /// Reads the file `name` of at most `max` bytes; `None` when it does not exist.
    ///
    /// # Errors
    /// A link in the directory (as [`StateDir::check`]); a file larger than `max`, not a regular
    /// file, or unreadable (`InvalidData` and the I/O errors, naming the file).
    pub fn read(&self, name: &str, max: usize) -> io::Result<Option<Vec<u8>>> {
        let rel = self.rel_of(name)?;
        self.check_rel(&rel)?;
        // Looked at before it is opened: a FIFO or device there is refused, never opened.
        let (dir, last) = rel.rsplit_once('/').unwrap_or(("", rel.as_str()));
        if let Ok(Some(d)) = Dir::open(&self.base).and_then(|b| b.sub(dir)) {
            d.expect_file(last, "not read")?;
        }
        match self.host.read_bounded(&rel, max) {
            Ok(b) => Ok(Some(b)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(at_path(&self.file_path(name), e)),
        }
    }

    /// Replaces the file `name` with `data` atomically, creating the directory first.
    ///
    /// # Errors
    /// A link in the directory; the I/O error of the step that failed (with its errno:
    /// `ENOSPC` on a full disk, `EROFS` on a read-only one). The file is then as it was.
    pub fn write(&self, name: &str, data: &[u8]) -> io::Result<()> {
        let rel = self.rel_of(name)?;
        self.check_rel(&rel)?;
        self.host
            .write_atomic(&rel, data)
            .map_err(|e| at_path(&self.file_path(name), e))
    }

    /// Removes the file `name`; one that is not there is no error.
    ///
    /// # Errors
    /// A link in the directory; the I/O error of removing it.
    pub fn remove(&self, name: &str) -> io::Result<()> {
        let rel = self.rel_of(name)?;
        let dir = rel.rsplit_once('/').map_or(self.rel.as_str(), |(d, _)| d);
        self.check_rel(dir)?;
        if !self.host.exists(dir) {
            return Ok(());
        }
        // Component by component: the file removed is in the directory checked.
        let Some(dir) = Dir::open(&self.base)?.sub(dir)? else {
            return Ok(());
        };
        let last = rel.rsplit('/').next().unwrap_or(name);
        dir.remove(last)
            .map(|_| ())
            .map_err(|e| at_path(&self.file_path(name), e))
    }

    /// The entry names of the subdirectory `sub` (`""` for the directory itself), sorted; a
    /// directory not there yet has none.
    ///
    /// # Errors
    /// A link in the directory; the I/O error of listing it.
    pub fn list(&self, sub: &str) -> io::Result<Vec<String>> {
        let rel = if sub.is_empty() {
            self.rel.clone()
        } else {
            self.rel_of(sub)?
        };
        self.check_rel(&rel)?;
        match self.host.list(&rel) {
            Ok(n) => Ok(n),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(Vec::new()),
            Err(e) => Err(at_path(&self.base.join(&rel), e)),
        }
    }

    /// Takes the directory's lock (an exclusive `flock` on [`LOCK_FILE`], never through a
    /// link), waiting at most `timeout` for another holder; creates the directory.
    ///
    /// # Errors
    /// As [`StateDir::create`]; `TimedOut` when another holder kept it for `timeout`; the I/O
    /// error of opening or locking the file.
    pub fn lock(&self, timeout: Duration) -> io::Result<StateLock> {
        self.create()?;
        let path = self.file_path(LOCK_FILE);
        self.check_rel(&self.rel_of(LOCK_FILE)?)?;
        let dir = Dir::open(&self.base)?.create_sub(&self.rel)?;
        let start = Instant::now();
        loop {
            // Never through a link, only a regular file; read-only when it is there.
            let file = dir.open_lock(LOCK_FILE).map_err(|e| at_path(&path, e))?;
            match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
                Ok(lock) => return Ok(StateLock { _lock: lock }),
                Err((_, Errno::EWOULDBLOCK | Errno::EINTR)) => {}
                Err((_, e)) => return Err(at_path(&path, io::Error::from(e))),
            }
            if start.elapsed() >= timeout {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!(
                        "{}: held by another process for {} ms; not taken",
                        path.display(),
                        timeout.as_millis()
                    ),
                ));
            }
            std::thread::sleep(LOCK_POLL);
        }
    }
}

/// A held state-directory lock; released when dropped.
#[derive(Debug)]
pub struct StateLock {
    _lock: Flock<std::fs::File>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn in_tree() -> (tempfile::TempDir, StateDir) {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("root")).unwrap();
        let host = RealHost::new(dir.path().join("root")).unwrap();
        let s = StateDir::in_root(Arc::new(host), "var/lib/gpuslice/agent").unwrap();
        (dir, s)
    }

    #[test]
    fn a_file_written_reads_back_and_a_missing_one_is_none() {
        let (_d, s) = in_tree();
        assert_eq!(s.read("promises.json", 1024).unwrap(), None);
        s.write("promises.json", b"{}").unwrap();
        assert_eq!(
            s.read("promises.json", 1024).unwrap().as_deref(),
            Some(&b"{}"[..])
        );
        assert_eq!(s.list("").unwrap(), ["promises.json"]);
        s.remove("promises.json").unwrap();
        s.remove("promises.json").unwrap();
        assert_eq!(s.read("promises.json", 1024).unwrap(), None);
    }

    #[test]
    fn a_component_linked_out_of_the_root_is_refused_naming_the_link() {
        let (d, s) = in_tree();
        std::fs::create_dir_all(d.path().join("root/var")).unwrap();
        std::fs::create_dir(d.path().join("outside")).unwrap();
        std::os::unix::fs::symlink(d.path().join("outside"), d.path().join("root/var/lib"))
            .unwrap();
        let e = s.write("promises.json", b"{}").unwrap_err();
        assert!(crate::is_outside_root(&e), "{e}");
        assert!(e.to_string().contains("root/var/lib"), "{e}");
        assert!(s.check().is_err());
        assert!(s.create().is_err());
        assert!(s.read("promises.json", 10).is_err());
        assert_eq!(
            std::fs::read_dir(d.path().join("outside")).unwrap().count(),
            0,
            "nothing was written outside"
        );
    }

    #[test]
    fn a_link_that_stays_inside_the_root_is_refused_too() {
        let (d, s) = in_tree();
        std::fs::create_dir_all(d.path().join("root/var/elsewhere")).unwrap();
        std::os::unix::fs::symlink("elsewhere", d.path().join("root/var/lib")).unwrap();
        let e = s.write("promises.json", b"{}").unwrap_err();
        assert!(!crate::is_outside_root(&e));
        assert!(
            e.to_string()
                .contains("root/var/lib is a link (-> elsewhere)"),
            "{e}"
        );
    }

    #[test]
    fn a_planted_temporary_or_state_link_is_never_written_through() {
        let (d, s) = in_tree();
        s.create().unwrap();
        let outside = d.path().join("victim");
        std::fs::write(&outside, "keep").unwrap();
        let dir = s.path();
        std::os::unix::fs::symlink(&outside, dir.join(".promises.json.tmp")).unwrap();
        std::os::unix::fs::symlink(&outside, dir.join("promises.json")).unwrap();
        assert!(
            s.read("promises.json", 100).is_err(),
            "a link out is not read"
        );
        let e = s.write("promises.json", b"new").unwrap_err();
        assert!(e.to_string().contains("promises.json"), "{e}");
        assert_eq!(std::fs::read_to_string(&outside).unwrap(), "keep");
        std::fs::remove_file(dir.join("promises.json")).unwrap();
        s.write("promises.json", b"new").unwrap();
        assert_eq!(std::fs::read_to_string(&outside).unwrap(), "keep");
        assert_eq!(
            s.read("promises.json", 100).unwrap().as_deref(),
            Some(&b"new"[..])
        );
    }

    #[test]
    fn a_file_over_the_cap_or_not_regular_is_refused() {
        let (_d, s) = in_tree();
        s.write("big", &[b'x'; 2000]).unwrap();
        let e = s.read("big", 1000).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData);
        assert!(e.to_string().contains("larger than 1000"), "{e}");
        nix::unistd::mkfifo(&s.file_path("fifo"), nix::sys::stat::Mode::S_IRWXU).unwrap();
        let t = Instant::now();
        let e = s.read("fifo", 1000).unwrap_err();
        assert!(e.to_string().contains("FIFO"), "{e}");
        assert!(
            t.elapsed() < Duration::from_secs(2),
            "a FIFO must not block"
        );
    }

    #[test]
    fn an_explicit_directory_is_created_from_its_deepest_existing_ancestor() {
        let d = tempfile::tempdir().unwrap();
        let s = StateDir::at(&d.path().join("a/b/state")).unwrap();
        s.write("f.json", b"1").unwrap();
        assert!(d.path().join("a/b/state/f.json").is_file());
        assert!(StateDir::at(Path::new("/")).is_err());
        assert!(StateDir::at(&d.path().join("a/../b")).is_err());
    }

    #[test]
    fn the_lock_is_exclusive_and_its_wait_is_bounded() {
        let (_d, s) = in_tree();
        let held = s.lock(Duration::from_millis(10)).unwrap();
        let t = Instant::now();
        let e = s.lock(Duration::from_millis(100)).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::TimedOut);
        assert!(t.elapsed() < Duration::from_secs(2));
        drop(held);
        s.lock(Duration::from_millis(10)).unwrap();
    }

    #[test]
    fn a_write_error_keeps_its_errno_and_names_the_file() {
        let d = tempfile::tempdir().unwrap();
        let s = StateDir::at(&d.path().join("state")).unwrap();
        s.create().unwrap();
        // A directory where the file should be: refused with EISDIR.
        std::fs::create_dir(s.file_path("f")).unwrap();
        std::fs::write(s.file_path("f").join("x"), "").unwrap();
        let e = s.write("f", b"1").unwrap_err();
        assert!(errno_of(&e).is_some(), "{e:?}");
        assert!(e.to_string().contains("state/f"), "{e}");
    }
}
