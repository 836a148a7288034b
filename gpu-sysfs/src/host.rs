//! The few primitives all host access goes through.
//!
//! Every path is relative to one injected root that stands for the host's `/` and is written
//! without a leading `/` (`sys/bus/pci/devices`). Production uses [`RealHost`] over `/`; tests use a
//! tempdir tree, or the fake kernel that also reacts to writes.

use std::io;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// What a command run on the host printed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CommandOutput {
    /// Exit status (`None` when killed by a signal or timed out).
    pub status: Option<i32>,
    /// Standard output.
    pub stdout: String,
    /// Standard error.
    pub stderr: String,
    /// True when the command was killed at its timeout.
    pub timed_out: bool,
}

/// Host access primitives. All helpers of discovery and actuation are built on these.
pub trait Host: Send + Sync + std::fmt::Debug {
    /// Reads a whole file.
    ///
    /// # Errors
    /// The I/O error, as the kernel gave it (the errno is kept).
    fn read(&self, path: &str) -> io::Result<Vec<u8>>;

    /// Writes `data` to a file in one `write` call, as sysfs attributes need.
    ///
    /// # Errors
    /// The I/O error with the kernel's errno (`EEXIST`, `ENOSPC`, `EPERM`, ...).
    fn write(&self, path: &str, data: &[u8]) -> io::Result<()>;

    /// Lists the entry names of a directory, sorted as text (callers sort numerically where needed).
    ///
    /// # Errors
    /// The I/O error.
    fn list(&self, dir: &str) -> io::Result<Vec<String>>;

    /// Reads a symlink's target as written.
    ///
    /// # Errors
    /// The I/O error (`EINVAL` when not a link).
    fn read_link(&self, path: &str) -> io::Result<PathBuf>;

    /// True when the path exists (following links).
    fn exists(&self, path: &str) -> bool;

    /// Runs a host program with a timeout. `program` is an absolute path on the host.
    ///
    /// # Errors
    /// The I/O error of starting it.
    fn run(&self, program: &str, args: &[String], timeout: Duration) -> io::Result<CommandOutput>;

    /// The root directory on this machine, when the host is a real directory tree.
    fn root_dir(&self) -> Option<&Path>;

    /// The vGPU types (ID, name) the driver of this host says GPU `gpu` supports, where the
    /// host itself holds the driver's answer (a sandbox: the types its recording's VFs
    /// listed); `None` elsewhere: a real host's driver is asked through NVML.
    fn recorded_vgpu_types(&self, gpu: &gpu_core::PciAddress) -> Option<Vec<(u32, String)>> {
        let _ = gpu;
        None
    }

    /// True when reads from two threads at once go faster than from one: each read is a few
    /// system calls into the kernel (a real directory tree), so discovery reads independent
    /// parts of the tree side by side. An in-memory host answers at once and says false.
    fn parallel_reads(&self) -> bool {
        false
    }

    /// Reads a whole file of at most `max` bytes (state files gpuslice keeps, larger than an
    /// attribute); a larger file is an `InvalidData` error.
    ///
    /// # Errors
    /// The I/O error.
    fn read_bounded(&self, path: &str, max: usize) -> io::Result<Vec<u8>> {
        let bytes = self.read(path)?;
        if bytes.len() > max {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{path} is larger than {max} bytes; not read"),
            ));
        }
        Ok(bytes)
    }

    /// Replaces a state file (not a sysfs attribute) with `data` atomically: write a temporary
    /// file, fsync, move it into place, fsync the directory (on a real tree the one confined
    /// writer, [`crate::atomic`]). Hosts without a directory tree keep the data as a plain write.
    ///
    /// # Errors
    /// The I/O error; the file is then as it was.
    fn write_atomic(&self, path: &str, data: &[u8]) -> io::Result<()> {
        self.write(path, data)
    }

    /// Creates a directory and its parents under the root (for state directories). Hosts
    /// without a directory tree have nothing to create.
    ///
    /// # Errors
    /// The I/O error.
    fn create_dir_all(&self, path: &str) -> io::Result<()> {
        let _ = path;
        Ok(())
    }

    /// Reads a file as trimmed UTF-8 text (lossy).
    ///
    /// # Errors
    /// The I/O error.
    fn read_string(&self, path: &str) -> io::Result<String> {
        let bytes = self.read(path)?;
        Ok(String::from_utf8_lossy(&bytes).trim().to_owned())
    }

    /// Resolves a symlink to a canonical root-relative path (`sys/bus/pci/devices/X` →
    /// `sys/devices/pci0000:00/.../X`), following links in every component as the kernel's
    /// path walk does.
    ///
    /// # Errors
    /// The I/O error, an [`crate::OutsideRoot`] error when a target leaves the root, or
    /// `InvalidData` when links loop.
    fn resolve_link(&self, path: &str) -> io::Result<String> {
        self.read_link(path)?;
        self.canonicalize(path)
    }

    /// The canonical root-relative form of `path`: every symlink in it followed, `..` folded.
    ///
    /// # Errors
    /// An [`crate::OutsideRoot`] error when a link leaves the root; `InvalidData` when more
    /// than 40 links are followed.
    fn canonicalize(&self, path: &str) -> io::Result<String> {
        let mut pending: Vec<String> = path
            .split('/')
            .filter(|p| !p.is_empty())
            .rev()
            .map(str::to_owned)
            .collect();
        let mut done: Vec<String> = Vec::new();
        let mut via = (String::new(), String::new());
        let mut hops = 0;
        while let Some(part) = pending.pop() {
            match part.as_str() {
                "." => continue,
                ".." => {
                    if done.pop().is_none() {
                        return Err(io::Error::new(
                            io::ErrorKind::PermissionDenied,
                            crate::confine::OutsideRoot {
                                path: path.to_owned(),
                                link: via.0,
                                target: via.1,
                            },
                        ));
                    }
                    continue;
                }
                _ => {}
            }
            done.push(part);
            let here = done.join("/");
            if let Ok(target) = self.read_link(&here) {
                hops += 1;
                if hops > 40 {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        format!("too many links resolving {path}"),
                    ));
                }
                done.pop();
                let t = target.to_string_lossy().into_owned();
                if target.is_absolute() {
                    done.clear();
                }
                for p in t.split('/').filter(|p| !p.is_empty()).rev() {
                    pending.push(p.to_owned());
                }
                via = (here, t);
            }
        }
        Ok(done.join("/"))
    }
}

/// Folds `.` and `..` in a root-relative path; `None` when it would leave the root.
pub fn normalize(path: &str) -> Option<String> {
    let mut out: Vec<&str> = Vec::new();
    for part in path.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                out.pop()?;
            }
            p => out.push(p),
        }
    }
    Some(out.join("/"))
}

/// Checks that a root-relative path cannot escape the root.
///
/// # Errors
/// `InvalidInput` naming the path.
pub fn check_relative(path: &str) -> io::Result<()> {
    // One pass over the bytes (every read of discovery comes through here): no NUL, and every
    // `/`-separated component non-empty and neither `.` nor `..`, which also refuses a leading
    // `/` (an empty first component) and a trailing one.
    let plain = !path.is_empty()
        && !path.as_bytes().contains(&0)
        && path
            .split('/')
            .all(|part| !part.is_empty() && part != "." && part != "..");
    if plain {
        Ok(())
    } else {
        Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("path {path:?} is not a plain path under the root"),
        ))
    }
}

/// Whether [`RealHost`]s made from now on read from two threads at once.
static PARALLEL_READS: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Makes the [`RealHost`]s made from now on read from two threads at once during discovery
/// (`on`) or from one. A process that discovers once and exits (the CLI) gains: its second core
/// is idle, and the A2 topology process took 0.7–0.9 ms (8–11 %) less wall time than the
/// same build reading from one thread (3 Dec 2026). Off by default: a
/// process that discovers again and again (the agent, a binding in a scheduler) measured the
/// reverse in the discovery benches (`a2_real` 4.07 ms against 3.39 ms serial), the thread's
/// start and the two threads' contention on shared kernel structures costing more than the
/// overlap gives.
pub fn set_parallel_reads(on: bool) {
    PARALLEL_READS.store(on, std::sync::atomic::Ordering::Relaxed);
}

/// The real host: files under a root directory (`/` in production).
///
/// Under any root but `/`, every open, `readlink`, listing and write resolves inside the root
/// (see [`crate::confine`]): a link that leads outside is an error naming the path
/// ([`crate::is_outside_root`]), never followed. Every read is bounded: at most
/// [`crate::confine::ATTRIBUTE_MAX`] bytes (or what [`Host::read_bounded`] allows), answered
/// within [`crate::confine::READ_DEADLINE`], and only from a regular file (a FIFO, socket or
/// device node is refused).
#[derive(Debug, Clone)]
pub struct RealHost {
    root: PathBuf,
    /// The open root when it is not `/`; `None` for the machine itself.
    confined: Option<std::sync::Arc<crate::confine::Root>>,
    /// Directories held open for a burst of reads below them (shared by clones).
    dirs: std::sync::Arc<crate::dircache::DirCache>,
    /// Whether discovery may read from two threads at once ([`Host::parallel_reads`]).
    parallel: bool,
}

impl RealHost {
    /// A host rooted at `root`.
    ///
    /// # Errors
    /// `NotFound`/`NotADirectory`-style errors when `root` is not a directory.
    pub fn new(root: impl Into<PathBuf>) -> io::Result<Self> {
        let root = root.into();
        let meta = std::fs::metadata(&root)
            .map_err(|e| io::Error::new(e.kind(), format!("root {}: {e}", root.display())))?;
        if !meta.is_dir() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("root {} is not a directory", root.display()),
            ));
        }
        let is_machine = crate::confine::is_local_root(&root);
        let confined = if is_machine {
            None
        } else {
            Some(std::sync::Arc::new(
                crate::confine::Root::open_dir(&root).map_err(|e| {
                    io::Error::new(e.kind(), format!("root {}: {e}", root.display()))
                })?,
            ))
        };
        // Under `/` links are followed as the kernel follows them, so a bus listing can serve
        // the reads below its entries; under another root a link may not leave where it is
        // resolved beneath.
        let dirs = if confined.is_none() {
            crate::dircache::DirCache::with_listings()
        } else {
            crate::dircache::DirCache::default()
        };
        Ok(Self {
            root,
            confined,
            dirs: std::sync::Arc::new(dirs),
            parallel: PARALLEL_READS.load(std::sync::atomic::Ordering::Relaxed),
        })
    }

    /// The same host, reading from two threads at once or from one only (the default, see
    /// [`set_parallel_reads`]): the answers are the same either way.
    #[must_use]
    pub fn with_parallel_reads(mut self, on: bool) -> Self {
        self.parallel = on;
        self
    }

    fn full(&self, path: &str) -> io::Result<PathBuf> {
        check_relative(path)?;
        Ok(self.root.join(path))
    }

    /// Opens the root-relative `path` for reading as [`RealHost::open_in_root`] does, below a
    /// directory held open when the reads before it were below the same one
    /// ([`crate::dircache`]); any failure there is answered by the open from the root.
    fn open_for_read(&self, path: &str, flags: nix::fcntl::OFlag) -> io::Result<std::fs::File> {
        use nix::fcntl::OFlag;
        check_relative(path)?;
        if let Some((dir, rest)) = self.dirs.held_for(path, |d| self.open_held(d)) {
            use std::os::fd::AsFd;
            let opened = match &self.confined {
                Some(root) => root.open_beneath(dir.as_fd(), rest, flags),
                None => nix::fcntl::openat(
                    dir.as_fd(),
                    rest,
                    flags | OFlag::O_CLOEXEC | OFlag::O_NOCTTY,
                    nix::sys::stat::Mode::empty(),
                )
                .map_err(io::Error::from),
            };
            if let Ok(fd) = opened {
                return Ok(std::fs::File::from(fd));
            }
        }
        self.open_checked(path, flags)
    }

    /// Opens `dir`, a prefix of a path already through [`check_relative`] (so checked too), to be
    /// held for the reads below it.
    fn open_held(&self, dir: &str) -> io::Result<std::os::fd::OwnedFd> {
        use nix::fcntl::OFlag;
        self.open_checked(dir, OFlag::O_PATH | OFlag::O_DIRECTORY)
            .map(std::os::fd::OwnedFd::from)
    }

    /// Opens the root-relative `path` with `flags`, resolving inside the root (links that stay
    /// inside are followed, one that leaves is an [`crate::confine::OutsideRoot`] error). Under
    /// `/` a plain open. Every file access of this host goes through here.
    fn open_in_root(&self, path: &str, flags: nix::fcntl::OFlag) -> io::Result<std::fs::File> {
        check_relative(path)?;
        self.open_checked(path, flags)
    }

    /// [`RealHost::open_in_root`] for a `path` already through [`check_relative`].
    fn open_checked(&self, path: &str, flags: nix::fcntl::OFlag) -> io::Result<std::fs::File> {
        use nix::fcntl::OFlag;
        match &self.confined {
            Some(root) => Ok(std::fs::File::from(root.open(
                path,
                flags,
                nix::sys::stat::Mode::from_bits_truncate(0o600),
            )?)),
            None => {
                use std::os::unix::fs::OpenOptionsExt;
                let access = flags & OFlag::O_ACCMODE;
                let rest = flags & !OFlag::O_ACCMODE;
                std::fs::OpenOptions::new()
                    .read(access == OFlag::O_RDONLY || access == OFlag::O_RDWR)
                    .write(access == OFlag::O_WRONLY || access == OFlag::O_RDWR)
                    .custom_flags(rest.bits())
                    .open(self.root.join(path))
            }
        }
    }
}

impl Host for RealHost {
    fn read(&self, path: &str) -> io::Result<Vec<u8>> {
        self.read_bounded(path, crate::confine::ATTRIBUTE_MAX)
    }

    fn read_bounded(&self, path: &str, max: usize) -> io::Result<Vec<u8>> {
        use nix::fcntl::OFlag;
        // Non-blocking: opening a FIFO must not wait for a writer (it is refused just after).
        let f = self.open_for_read(path, OFlag::O_RDONLY | OFlag::O_NONBLOCK)?;
        crate::confine::check_regular(&f, path)?;
        crate::confine::read_bounded(f, max, path)
    }

    fn write(&self, path: &str, data: &[u8]) -> io::Result<()> {
        use nix::fcntl::OFlag;
        use std::io::Write;
        // A write may remove or re-create the directories held for reads.
        self.dirs.clear();
        // No O_CREAT, no truncation games: a sysfs attribute takes one write on an existing file.
        let mut f = self.open_in_root(path, OFlag::O_WRONLY | OFlag::O_NONBLOCK)?;
        crate::confine::check_regular(&f, path)?;
        let n = f.write(data)?;
        if n != data.len() {
            return Err(io::Error::new(
                io::ErrorKind::WriteZero,
                format!("short write to {path}: {n} of {}", data.len()),
            ));
        }
        Ok(())
    }

    fn list(&self, dir: &str) -> io::Result<Vec<String>> {
        let mut names: Vec<String> = match &self.confined {
            None => std::fs::read_dir(self.full(dir)?)?
                .filter_map(|e| {
                    // The name as it came, unless it is not UTF-8 (then lossily, as before).
                    e.ok().map(|e| {
                        e.file_name()
                            .into_string()
                            .unwrap_or_else(|n| n.to_string_lossy().into_owned())
                    })
                })
                .collect(),
            Some(_) => {
                use nix::fcntl::OFlag;
                let f = self.open_in_root(dir, OFlag::O_RDONLY | OFlag::O_DIRECTORY)?;
                let mut d = nix::dir::Dir::from_fd(std::os::fd::OwnedFd::from(f))?;
                d.iter()
                    .filter_map(Result::ok)
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .filter(|n| n != "." && n != "..")
                    .collect()
            }
        };
        names.sort();
        Ok(names)
    }

    fn read_link(&self, path: &str) -> io::Result<PathBuf> {
        match &self.confined {
            None => {
                check_relative(path)?;
                // Below a held directory when the reads before were below it too; any failure
                // there is answered from the root.
                if let Some((dir, rest)) = self.dirs.held_for(path, |d| self.open_held(d)) {
                    if let Ok(target) = nix::fcntl::readlinkat(dir.as_ref(), rest) {
                        return Ok(PathBuf::from(target));
                    }
                }
                std::fs::read_link(self.root.join(path))
            }
            Some(root) => {
                check_relative(path)?;
                root.read_link(path)
            }
        }
    }

    fn exists(&self, path: &str) -> bool {
        match &self.confined {
            None => self.full(path).map(|p| p.exists()).unwrap_or(false),
            Some(_) => self.open_in_root(path, nix::fcntl::OFlag::O_PATH).is_ok(),
        }
    }

    fn run(&self, program: &str, args: &[String], timeout: Duration) -> io::Result<CommandOutput> {
        run_with_timeout(Command::new(program).args(args), timeout)
    }

    fn root_dir(&self) -> Option<&Path> {
        Some(&self.root)
    }

    fn parallel_reads(&self) -> bool {
        self.parallel
    }

    fn write_atomic(&self, path: &str, data: &[u8]) -> io::Result<()> {
        self.dirs.clear();
        check_relative(path)?;
        let (dir, name) = path.rsplit_once('/').unwrap_or(("", path));
        crate::atomic::Dir::open(&self.root)?
            .create_sub(dir)?
            .write(name, data)
    }

    fn create_dir_all(&self, path: &str) -> io::Result<()> {
        self.dirs.clear();
        make_state_dir(&self.root, path).map(|_| ())
    }
}

/// Creates the directory `rel` under `root` (`run/gpuslice`) component by component and returns
/// its path; a component that is a link or not a directory is an error naming it, so a state
/// file is never written through a link that leaves the root.
///
/// # Errors
/// As [`crate::atomic::Dir::create_sub`]: a component that is a link (`InvalidInput`) or not a
/// directory (`InvalidData`), naming it; the I/O error of `mkdirat`.
pub fn make_state_dir(root: &Path, rel: &str) -> io::Result<PathBuf> {
    check_relative(rel)?;
    crate::atomic::Dir::open(root)?.create_sub(rel)?;
    Ok(root.join(rel))
}

/// Runs a command, killing it after `timeout`; stdout and stderr are captured.
///
/// The command runs in its own process group and the whole group is killed at the timeout: a
/// script that hangs in a child (`sriov-manage` waiting on a sysfs write) would otherwise keep
/// the output pipes open and the wait would never end. Output still unread shortly after the
/// command ended (a daemon it left behind holds the pipes) is given up.
///
/// # Errors
/// The I/O error of spawning it.
pub fn run_with_timeout(cmd: &mut Command, timeout: Duration) -> io::Result<CommandOutput> {
    use std::io::Read;
    use std::os::unix::process::CommandExt;
    use std::process::Stdio;
    use std::sync::mpsc;
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .spawn()?;
    let (out_tx, out_rx) = mpsc::channel();
    let (err_tx, err_rx) = mpsc::channel();
    let mut out_pipe = child.stdout.take();
    let mut err_pipe = child.stderr.take();
    std::thread::spawn(move || {
        let mut s = String::new();
        if let Some(p) = out_pipe.as_mut() {
            let _ = p.read_to_string(&mut s);
        }
        let _ = out_tx.send(s);
    });
    std::thread::spawn(move || {
        let mut s = String::new();
        if let Some(p) = err_pipe.as_mut() {
            let _ = p.read_to_string(&mut s);
        }
        let _ = err_tx.send(s);
    });
    let start = std::time::Instant::now();
    let (status, timed_out) = loop {
        if let Some(st) = child.try_wait()? {
            break (st.code(), false);
        }
        if start.elapsed() >= timeout {
            if let Ok(pid) = i32::try_from(child.id()) {
                let _ = nix::sys::signal::killpg(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
            let _ = child.kill();
            let _ = child.wait();
            break (None, true);
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let grace = Duration::from_secs(2);
    let stdout = out_rx.recv_timeout(grace).unwrap_or_default();
    let stderr = err_rx.recv_timeout(grace).unwrap_or_default();
    Ok(CommandOutput {
        status,
        stdout,
        stderr,
        timed_out,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Reads below a held directory answer what reads from the root do: after the directory is
    /// removed and made again (a device gone and back) the held one answers nothing and the
    /// read is made from the root; a write lets held directories go; a link in a held directory
    /// that leaves it (but not the root) is followed from the root.
    #[test]
    fn reads_below_a_held_directory_answer_what_reads_from_the_root_do() {
        let t = tempfile::tempdir().unwrap();
        let d = t.path().join("sys/dev");
        std::fs::create_dir_all(&d).unwrap();
        for (f, v) in [("a", "1"), ("b", "2"), ("c", "3")] {
            std::fs::write(d.join(f), v).unwrap();
        }
        std::fs::write(t.path().join("sys/outside"), "o").unwrap();
        std::os::unix::fs::symlink("../outside", d.join("link")).unwrap();
        let h = RealHost::new(t.path()).unwrap();
        let read = |p: &str| h.read(p).map(|b| String::from_utf8(b).unwrap());
        assert_eq!(read("sys/dev/a").unwrap(), "1");
        assert_eq!(read("sys/dev/b").unwrap(), "2");
        assert_eq!(
            read("sys/dev/b").unwrap(),
            "2",
            "the third read holds sys/dev"
        );
        assert_eq!(
            read("sys/dev/link").unwrap(),
            "o",
            "a link out of the held directory"
        );
        std::fs::remove_dir_all(&d).unwrap();
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join("c"), "new").unwrap();
        assert_eq!(read("sys/dev/c").unwrap(), "new");
        assert_eq!(read("sys/dev/c").unwrap(), "new");
        // A directory moved aside while held would still answer; a write lets it go first.
        h.write("sys/dev/c", b"w").unwrap();
        std::fs::rename(&d, t.path().join("sys/old")).unwrap();
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join("c"), "newer").unwrap();
        assert_eq!(read("sys/dev/c").unwrap(), "newer");
        assert!(read("sys/dev/a").is_err(), "gone from the new directory");
    }

    #[test]
    fn paths_cannot_escape_the_root() {
        assert!(check_relative("sys/bus/pci/devices").is_ok());
        for bad in ["", "/etc/passwd", "sys/../../etc", "sys/./x", "a\0b"] {
            assert!(check_relative(bad).is_err(), "{bad}");
        }
        assert_eq!(
            normalize("sys/bus/pci/devices/../../../devices/x").as_deref(),
            Some("sys/devices/x")
        );
        assert_eq!(normalize("sys/../.."), None);
    }

    #[test]
    fn real_host_reads_writes_lists_and_resolves_links() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::create_dir_all(root.join("sys/devices/pci0000:00/0000:00:02.0")).unwrap();
        std::fs::create_dir_all(root.join("sys/bus/pci/devices")).unwrap();
        std::fs::write(
            root.join("sys/devices/pci0000:00/0000:00:02.0/vendor"),
            "0x1234\n",
        )
        .unwrap();
        std::os::unix::fs::symlink(
            "../../../devices/pci0000:00/0000:00:02.0",
            root.join("sys/bus/pci/devices/0000:00:02.0"),
        )
        .unwrap();
        let h = RealHost::new(root).unwrap();
        assert_eq!(h.list("sys/bus/pci/devices").unwrap(), ["0000:00:02.0"]);
        assert_eq!(
            h.read_string("sys/bus/pci/devices/0000:00:02.0/vendor")
                .unwrap(),
            "0x1234"
        );
        assert_eq!(
            h.resolve_link("sys/bus/pci/devices/0000:00:02.0").unwrap(),
            "sys/devices/pci0000:00/0000:00:02.0"
        );
        h.write("sys/bus/pci/devices/0000:00:02.0/vendor", b"x")
            .unwrap();
        assert!(
            h.write("sys/bus/pci/devices/0000:00:02.0/nope", b"x")
                .is_err(),
            "write must not create files"
        );
        assert!(h.read("../etc/passwd").is_err());
        let big = "x".repeat(12_000);
        std::fs::write(root.join("sys/big"), &big).unwrap();
        assert_eq!(
            h.read("sys/big").unwrap(),
            big.as_bytes(),
            "files larger than one read come whole"
        );
        let huge = "x".repeat(crate::confine::ATTRIBUTE_MAX + 1);
        std::fs::write(root.join("sys/huge"), &huge).unwrap();
        let e = h.read("sys/huge").unwrap_err();
        assert!(e.to_string().contains("sys/huge is larger than"), "{e}");
        assert_eq!(
            h.read_bounded("sys/huge", 1 << 20).unwrap().len(),
            huge.len(),
            "a state file may be larger than an attribute"
        );
        assert!(RealHost::new(root.join("missing")).is_err());
    }

    #[test]
    fn a_command_hanging_in_a_child_is_killed_with_its_children_at_the_timeout() {
        let start = std::time::Instant::now();
        let out = run_with_timeout(
            Command::new("sh").args(["-c", "echo started >&2; sleep 20; echo never"]),
            Duration::from_millis(300),
        )
        .unwrap();
        assert!(out.timed_out);
        assert_eq!(out.stderr, "started\n");
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "{:?}",
            start.elapsed()
        );
    }

    #[test]
    fn commands_time_out() {
        let out =
            run_with_timeout(Command::new("sleep").arg("5"), Duration::from_millis(100)).unwrap();
        assert!(out.timed_out);
        let out = run_with_timeout(
            Command::new("sh").args(["-c", "echo hi; echo err >&2; exit 3"]),
            Duration::from_secs(5),
        )
        .unwrap();
        assert_eq!(
            (out.status, out.stdout.as_str(), out.stderr.as_str()),
            (Some(3), "hi\n", "err\n")
        );
    }
}
