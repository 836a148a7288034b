//! The host-wide lock that serializes layout changes: an exclusive `flock` on
//! `<root>/run/gpuslice/vgpu.lock`, held until the [`LayoutLock`] is dropped.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::fcntl::{Flock, FlockArg};

use super::ApplyError;

/// Where the lock file lives, relative to the host root.
pub const LOCK_PATH: &str = "run/gpuslice/vgpu.lock";

/// How often a waiting apply tries the lock again.
const POLL: Duration = Duration::from_millis(50);

/// An exclusive lock on the host's layout; released on drop (and by the kernel if the process
/// dies, so a crashed apply never leaves the host locked).
#[derive(Debug)]
pub struct LayoutLock {
    _lock: Flock<File>,
    path: PathBuf,
}

impl LayoutLock {
    /// The lock file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Takes the lock under `root`, waiting while another process (or thread) holds it.
    /// `waiting` is called once, when the lock is found taken. `timeout` `None` waits forever.
    ///
    /// # Errors
    /// [`ApplyError::Lock`] when the file cannot be created or locked;
    /// [`ApplyError::LockTimeout`] when `timeout` passed while another apply held it.
    pub fn acquire(
        root: &Path,
        timeout: Option<Duration>,
        waiting: &mut dyn FnMut(&Path),
    ) -> Result<Self, ApplyError> {
        let path = root.join(LOCK_PATH);
        let lock_err = |source: std::io::Error| ApplyError::Lock {
            path: path.display().to_string(),
            source,
        };
        let (dir, name) = LOCK_PATH.rsplit_once('/').unwrap_or(("", LOCK_PATH));
        let dir = crate::atomic::Dir::open(root)
            .and_then(|r| r.create_sub(dir))
            .map_err(lock_err)?;
        let start = Instant::now();
        let mut told = false;
        loop {
            // The confined writer's lock file: never through a link, never a FIFO (which would
            // block the open), only a regular file.
            let file = dir.open_lock(name).map_err(lock_err)?;
            match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
                Ok(lock) => return Ok(LayoutLock { _lock: lock, path }),
                Err((_, Errno::EWOULDBLOCK)) => {}
                Err((_, Errno::EINTR)) => continue,
                Err((_, e)) => return Err(lock_err(std::io::Error::from(e))),
            }
            if !told {
                waiting(&path);
                told = true;
            }
            if let Some(t) = timeout {
                if start.elapsed() >= t {
                    return Err(ApplyError::LockTimeout {
                        path: path.display().to_string(),
                        waited: t,
                    });
                }
            }
            std::thread::sleep(POLL);
        }
    }
}
