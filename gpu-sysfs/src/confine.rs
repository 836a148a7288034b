//! Resolving root-relative paths without ever leaving the root, and reading attribute files with
//! a size cap and a deadline.
//!
//! A tree under `--root` (a replayed recording, a copy of a problem host) is untrusted: any of its
//! components may be a symlink, and the OS would follow one that points outside. [`Root::open`]
//! resolves inside the root only: `openat2(RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS)` where the
//! kernel has it, and a component-wise walk (`openat(O_NOFOLLOW)` per component, links read with
//! `readlinkat` and resolved here) where it has not or where the kernel refused (an absolute link,
//! which the walk resolves against the root, or a `..` that climbs out, which the walk names).

use std::ffi::OsStr;
use std::io::{self, Read};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::fcntl::{OFlag, OpenHow, ResolveFlag, openat, openat2, readlinkat};
use nix::sys::stat::Mode;

/// A link in the tree leads outside the root. Carried inside an [`io::Error`] of kind
/// `PermissionDenied`; see [`is_outside_root`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutsideRoot {
    /// The root-relative path that was asked for.
    pub path: String,
    /// The link (root-relative, as resolved so far) whose target leaves the root.
    pub link: String,
    /// The link's target as written.
    pub target: String,
}

impl std::fmt::Display for OutsideRoot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.link.is_empty() {
            write!(f, "{} leads outside the root; not followed", self.path)
        } else {
            write!(
                f,
                "{}: the link {} -> {} leads outside the root; not followed",
                self.path, self.link, self.target
            )
        }
    }
}

impl std::error::Error for OutsideRoot {}

/// True when `e` is the error of a link that leads outside the root.
pub fn is_outside_root(e: &io::Error) -> bool {
    e.get_ref()
        .is_some_and(|inner| inner.downcast_ref::<OutsideRoot>().is_some())
}

fn outside(path: &str, link: &str, target: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::PermissionDenied,
        OutsideRoot {
            path: path.to_owned(),
            link: link.to_owned(),
            target: target.to_owned(),
        },
    )
}

/// Links followed in one resolution before giving up, as the kernel does.
const MAX_LINKS: usize = 40;

/// Whether `openat2` works here: 0 not tried yet, 1 yes, 2 no (old kernel, seccomp filter).
static OPENAT2: AtomicU8 = AtomicU8::new(0);

/// An open root directory; every path is resolved beneath it.
#[derive(Debug)]
pub(crate) struct Root {
    fd: OwnedFd,
}

impl Root {
    /// Opens the directory `dir` as a root.
    pub fn open_dir(dir: &Path) -> io::Result<Self> {
        let fd = nix::fcntl::open(
            dir,
            OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
            Mode::empty(),
        )?;
        Ok(Self { fd })
    }

    /// Opens the root-relative `path` with `flags` (`O_CLOEXEC`, and `O_NOCTTY` but with `O_PATH`, are added), following
    /// links only where they stay inside the root. With `O_CREAT` the last component is never
    /// followed (an existing link there is an error, as `O_EXCL` wants).
    ///
    /// # Errors
    /// The OS error; an [`OutsideRoot`] error when a link leads out; `ELOOP` after
    /// [`MAX_LINKS`] links.
    pub fn open(&self, path: &str, flags: OFlag, mode: Mode) -> io::Result<OwnedFd> {
        // openat2 refuses any flag but these with O_PATH.
        let flags = if flags.contains(OFlag::O_PATH) {
            flags | OFlag::O_CLOEXEC
        } else {
            flags | OFlag::O_CLOEXEC | OFlag::O_NOCTTY
        };
        let mode = if flags.contains(OFlag::O_CREAT) {
            mode
        } else {
            Mode::empty()
        };
        if OPENAT2.load(Ordering::Relaxed) != 2 {
            let how = OpenHow::new()
                .flags(flags)
                .mode(mode)
                .resolve(ResolveFlag::RESOLVE_BENEATH | ResolveFlag::RESOLVE_NO_MAGICLINKS);
            match openat2(self.fd.as_fd(), path, how) {
                Ok(fd) => {
                    OPENAT2.store(1, Ordering::Relaxed);
                    return Ok(fd);
                }
                // Not available: remember, walk from now on.
                Err(Errno::ENOSYS | Errno::E2BIG) => OPENAT2.store(2, Ordering::Relaxed),
                // EXDEV: an absolute link or a `..` that leaves (the walk tells which); EAGAIN:
                // a concurrent move; EPERM: perhaps a seccomp filter. The walk decides.
                Err(Errno::EXDEV | Errno::EAGAIN | Errno::EPERM) => {}
                Err(e) => return Err(e.into()),
            }
        }
        self.walk(path, flags, mode)
    }

    /// Opens `rest` beneath the directory `dir` (opened through this root), never above it:
    /// `openat2(RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS)`. Only where `openat2` is known to
    /// work; otherwise, and for a link that leaves `dir`, an error: the caller opens the
    /// whole path with [`Root::open`] then.
    ///
    /// # Errors
    /// The OS error; `ENOSYS` where `openat2` has not been seen to work.
    pub fn open_beneath(
        &self,
        dir: BorrowedFd<'_>,
        rest: &str,
        flags: OFlag,
    ) -> io::Result<OwnedFd> {
        if OPENAT2.load(Ordering::Relaxed) != 1 {
            return Err(Errno::ENOSYS.into());
        }
        let how = OpenHow::new()
            .flags(flags | OFlag::O_CLOEXEC | OFlag::O_NOCTTY)
            .resolve(ResolveFlag::RESOLVE_BENEATH | ResolveFlag::RESOLVE_NO_MAGICLINKS);
        Ok(openat2(dir, rest, how)?)
    }

    /// The target of the link `path`: read in the directory holding its last component,
    /// opened through this root (a name at the top is read in the root itself, with no
    /// descriptor duplicated for it).
    ///
    /// # Errors
    /// The OS error of opening the directory or of `readlinkat` (`EINVAL`: not a link).
    pub fn read_link(&self, path: &str) -> io::Result<std::path::PathBuf> {
        let target = match path.rsplit_once('/') {
            Some((dir, last)) => {
                let dir = self.open(dir, OFlag::O_PATH | OFlag::O_DIRECTORY, Mode::empty())?;
                readlinkat(&dir, last)?
            }
            None => readlinkat(self.fd.as_fd(), path)?,
        };
        Ok(std::path::PathBuf::from(target))
    }

    /// The component-wise walk: each component opened with `O_NOFOLLOW` relative to the one
    /// before; a link's target is read and resolved here, `..` steps back to the directory
    /// opened before (never above the root), an absolute target starts again at the root.
    fn walk(&self, path: &str, flags: OFlag, mode: Mode) -> io::Result<OwnedFd> {
        let mut stack: Vec<OwnedFd> = Vec::new();
        let mut names: Vec<String> = Vec::new();
        let mut pending: Vec<String> = path
            .split('/')
            .filter(|p| !p.is_empty())
            .rev()
            .map(str::to_owned)
            .collect();
        let mut via: Option<(String, String)> = None;
        let mut links = 0usize;
        while let Some(part) = pending.pop() {
            match part.as_str() {
                "." => continue,
                ".." => {
                    if stack.pop().is_none() {
                        let (link, target) = via.clone().unwrap_or_default();
                        return Err(outside(path, &link, &target));
                    }
                    names.pop();
                    continue;
                }
                _ => {}
            }
            let last = pending.is_empty();
            let dir: BorrowedFd<'_> = stack.last().map_or(self.fd.as_fd(), |f| f.as_fd());
            let name = OsStr::from_bytes(part.as_bytes());
            // The last component: a link is followed unless creating; checked before opening
            // since `O_PATH | O_NOFOLLOW` would open the link itself.
            let link = if last && flags.contains(OFlag::O_CREAT) {
                None
            } else if last {
                readlinkat(dir, name).ok()
            } else {
                None
            };
            let link = match link {
                Some(l) => Some(l),
                None => {
                    let how = if last {
                        flags | OFlag::O_NOFOLLOW
                    } else {
                        OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC
                    };
                    match openat(dir, name, how, mode) {
                        Ok(fd) if last => return Ok(fd),
                        Ok(fd) => {
                            stack.push(fd);
                            names.push(part);
                            continue;
                        }
                        Err(e) => match (last, readlinkat(dir, name)) {
                            (false, Ok(l)) => Some(l),
                            _ => return Err(e.into()),
                        },
                    }
                }
            };
            if let Some(target) = link {
                links += 1;
                if links > MAX_LINKS {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        format!("{path}: more than {MAX_LINKS} links (a loop?)"),
                    ));
                }
                let t = target.to_string_lossy().into_owned();
                let mut at = names.clone();
                at.push(part);
                via = Some((at.join("/"), t.clone()));
                if t.starts_with('/') {
                    stack.clear();
                    names.clear();
                }
                pending.extend(
                    t.split('/')
                        .filter(|p| !p.is_empty())
                        .rev()
                        .map(str::to_owned),
                );
            }
        }
        // Everything folded away: the path names the directory reached.
        let dir: BorrowedFd<'_> = stack.last().map_or(self.fd.as_fd(), |f| f.as_fd());
        Ok(openat(dir, ".", flags, mode)?)
    }
}

/// The most an attribute read returns: sysfs attributes are at most a page, four are allowed.
pub const ATTRIBUTE_MAX: usize = 16 * 1024;

/// How long one read may take before the watchdog reports it ([`start_read_watchdog`]: a hung
/// driver, a stuck network file).
pub const READ_DEADLINE: Duration = Duration::from_secs(5);

/// What a file that is not a regular one is, for messages (`a FIFO`, `a socket`, ...).
pub(crate) fn file_kind(t: &std::fs::FileType) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    if t.is_fifo() {
        "a FIFO"
    } else if t.is_socket() {
        "a socket"
    } else if t.is_char_device() || t.is_block_device() {
        "a device node"
    } else if t.is_dir() {
        "a directory"
    } else {
        "not a regular file"
    }
}

/// Refuses what is not a regular file: a FIFO would block, a device or socket is no attribute.
pub(crate) fn check_regular(file: &std::fs::File, path: &str) -> io::Result<()> {
    let t = file.metadata()?.file_type();
    if t.is_file() {
        return Ok(());
    }
    let what = file_kind(&t);
    Err(io::Error::new(
        io::ErrorKind::InvalidData,
        format!("{path} is {what}, not an attribute file; not read"),
    ))
}

/// Reads at most `max` bytes; more is an error naming the file.
fn read_capped(mut file: std::fs::File, max: usize, path: &str) -> io::Result<Vec<u8>> {
    // A sysfs attribute arrives whole in one read (at most a page): a short first read is the
    // end of the file, and only what it gave is kept (no page-sized buffer per attribute).
    let mut page = [0u8; 4097];
    let first = max.min(4096) + 1;
    let n = file.read(&mut page[..first])?;
    let mut buf = page[..n].to_vec();
    if n < first {
        return Ok(buf);
    }
    let limit = u64::try_from(max).unwrap_or(u64::MAX) + 1 - u64::try_from(n).unwrap_or(0);
    file.take(limit).read_to_end(&mut buf)?;
    if buf.len() > max {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{path} is larger than {max} bytes; not an attribute file, not read"),
        ));
    }
    Ok(buf)
}

/// One reading thread's read in progress, for the watchdog. The reader touches only its own slot
/// (no clock, no allocation once the path buffer has grown, no lock another reader takes): its
/// sequence number is odd while a read is in progress, and the watchdog times what it sees.
#[derive(Debug, Default)]
struct Slot {
    seq: AtomicU64,
    path: Mutex<String>,
}

/// Whether a watchdog runs ([`start_read_watchdog`]): reads are tracked only then.
static WATCHED: AtomicBool = AtomicBool::new(false);
/// Every reading thread's slot; a thread's slot leaves when the thread ends.
static SLOTS: Mutex<Vec<std::sync::Arc<Slot>>> = Mutex::new(Vec::new());

fn slots() -> std::sync::MutexGuard<'static, Vec<std::sync::Arc<Slot>>> {
    SLOTS
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// This thread's slot, registered on its first tracked read and let go when it ends.
struct Mine {
    slot: std::sync::Arc<Slot>,
    /// Tracked reads in progress on this thread (only the outermost is shown).
    depth: std::cell::Cell<u32>,
}

impl Drop for Mine {
    fn drop(&mut self) {
        slots().retain(|s| !std::sync::Arc::ptr_eq(s, &self.slot));
    }
}

thread_local! {
    static MINE: Mine = {
        let slot = std::sync::Arc::new(Slot::default());
        slots().push(std::sync::Arc::clone(&slot));
        Mine { slot, depth: std::cell::Cell::new(0) }
    };
}

/// Marks its read as in progress until it ends, however it ends.
struct Tracked(bool);

impl Tracked {
    fn start(path: &str) -> Self {
        if !WATCHED.load(Ordering::Relaxed) {
            return Tracked(false);
        }
        Self::begin(path)
    }

    /// Tracks the read whether or not a watchdog runs.
    fn begin(path: &str) -> Self {
        let started = MINE.try_with(|m| {
            let depth = m.depth.get();
            m.depth.set(depth + 1);
            if depth == 0 {
                {
                    let mut p = m
                        .slot
                        .path
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner);
                    p.clear();
                    p.push_str(path);
                }
                m.slot.seq.fetch_add(1, Ordering::Release);
            }
        });
        Tracked(started.is_ok())
    }
}

impl Drop for Tracked {
    fn drop(&mut self) {
        if !self.0 {
            return;
        }
        let _ = MINE.try_with(|m| {
            let depth = m.depth.get().saturating_sub(1);
            m.depth.set(depth);
            if depth == 0 {
                m.slot.seq.fetch_add(1, Ordering::Release);
            }
        });
    }
}

/// What the watchdog last saw of one slot's read in progress.
struct Seen {
    slot: std::sync::Weak<Slot>,
    seq: u64,
    since: Instant,
    reported: bool,
}

/// One look of the watchdog: the reads in progress that it has seen for longer than `deadline`
/// and not reported yet, as (path, how long it has seen them); `seen` carries what it saw
/// from one look to the next. A read is timed from the first look that saw it, so the time
/// given is never more than the read has waited.
fn stalled_reads(seen: &mut Vec<Seen>, deadline: Duration) -> Vec<(String, Duration)> {
    let now = Instant::now();
    let mut next: Vec<Seen> = Vec::new();
    let mut out = Vec::new();
    for slot in slots().iter() {
        let seq = slot.seq.load(Ordering::Acquire);
        if seq % 2 == 0 {
            continue;
        }
        // The same slot: a `Weak` keeps its allocation, so no other slot can have its address.
        let before = seen.iter().position(|s| {
            s.seq == seq && std::ptr::eq(s.slot.as_ptr(), std::sync::Arc::as_ptr(slot))
        });
        let mut entry = match before {
            Some(i) => seen.swap_remove(i),
            None => Seen {
                slot: std::sync::Arc::downgrade(slot),
                seq,
                since: now,
                reported: false,
            },
        };
        let waited = now.saturating_duration_since(entry.since);
        if !entry.reported && waited > deadline {
            entry.reported = true;
            let path = slot
                .path
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .clone();
            out.push((path, waited));
        }
        next.push(entry);
    }
    *seen = next;
    out
}

/// Starts this process's one watchdog of attribute reads: every `deadline / 4` it looks at the
/// reads in progress and calls `on_stall(path, waited)` once for each that has been in progress
/// for longer than `deadline` (a hung driver, a stuck network file). Reads themselves run
/// inline, on the caller's thread, with no hand-off: a command passes an `on_stall` that ends it
/// with an error naming the file; a long-running caller marks what the file concerns as unknown.
/// A second call changes nothing.
///
/// # Errors
/// The watchdog thread cannot be started.
pub fn start_read_watchdog(
    deadline: Duration,
    on_stall: impl Fn(&str, Duration) + Send + 'static,
) -> io::Result<()> {
    if WATCHED.swap(true, Ordering::SeqCst) {
        return Ok(());
    }
    let tick = (deadline / 4).max(Duration::from_millis(5));
    let spawned = std::thread::Builder::new()
        .name("gpuslice-read-watchdog".into())
        .spawn(move || {
            let mut seen = Vec::new();
            loop {
                std::thread::sleep(tick);
                for (path, waited) in stalled_reads(&mut seen, deadline) {
                    on_stall(&path, waited);
                }
            }
        });
    if let Err(e) = spawned {
        WATCHED.store(false, Ordering::SeqCst);
        return Err(e);
    }
    Ok(())
}

/// Reads `file` (already checked to be regular, with `fstat` on the open descriptor) with the
/// size cap, inline: a regular sysfs attribute answers at once, and the one watchdog of the
/// process ([`start_read_watchdog`]) stands guard over a read that does not.
pub(crate) fn read_bounded(file: std::fs::File, max: usize, path: &str) -> io::Result<Vec<u8>> {
    let _tracked = Tracked::start(path);
    read_capped(file, max, path)
}

/// True when `root` is this machine's own `/` (however spelled: `/`, `/.`, a link to it). The
/// one definition: [`crate::OpenedRoot::is_local_host`], [`crate::RealHost::new`]'s confinement and the
/// front-ends that must decide before opening (the agent's uevent socket) all use it.
pub fn is_local_root(root: &Path) -> bool {
    !is_sandbox(root) && root.canonicalize().is_ok_and(|r| r == Path::new("/"))
}

/// True when `root` names a `*.umockdev` recording rather than a directory.
pub fn is_recording(root: &Path) -> bool {
    root.is_file() && root.extension().is_some_and(|e| e == "umockdev")
}

/// True when `root` names a sandbox (`sandbox:DIR`).
pub fn is_sandbox(root: &Path) -> bool {
    root.to_str().is_some_and(|r| r.starts_with("sandbox:"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_watchdog_reports_a_read_that_does_not_answer_once() {
        let (tx, rx) = std::sync::mpsc::channel();
        // Only this test's reads (another test tracks reads of its own on its own threads).
        start_read_watchdog(Duration::from_millis(40), move |path, waited| {
            if path.starts_with("sys/bus/pci/devices/0000:01:00.0/") {
                let _ = tx.send((path.to_owned(), waited));
            }
        })
        .unwrap();
        {
            // A read that hangs, as the watchdog sees it: tracked and not finished.
            let _stuck = Tracked::start("sys/bus/pci/devices/0000:01:00.0/stuck");
            let (path, waited) = rx.recv_timeout(Duration::from_secs(5)).unwrap();
            assert_eq!(path, "sys/bus/pci/devices/0000:01:00.0/stuck");
            assert!(waited >= Duration::from_millis(40));
            std::thread::sleep(Duration::from_millis(100));
        }
        assert!(rx.try_recv().is_err(), "reported twice");
        // Quick reads, one after another, are never reported: each is a new read.
        for _ in 0..20 {
            let _quick = Tracked::start("sys/bus/pci/devices/0000:01:00.0/class");
            std::thread::sleep(Duration::from_millis(5));
        }
        std::thread::sleep(Duration::from_millis(100));
        assert!(rx.try_recv().is_err(), "a finished read was reported");
        let mine = MINE.with(|m| m.slot.seq.load(Ordering::Acquire));
        assert_eq!(mine % 2, 0, "a finished read stays tracked");
    }

    #[test]
    fn a_look_times_a_read_from_when_it_was_first_seen_and_a_thread_leaves_with_its_slot() {
        let (started_tx, started_rx) = std::sync::mpsc::channel();
        let (end_tx, end_rx) = std::sync::mpsc::channel::<()>();
        let reader = std::thread::spawn(move || {
            let _t = Tracked::begin("sys/stuck/attr");
            started_tx.send(()).unwrap();
            end_rx.recv().unwrap();
        });
        started_rx.recv().unwrap();
        let mut seen = Vec::new();
        // Only this test's read: other tests of this binary track reads of their own at the
        // same time, on their own threads, and a look sees every thread's slot.
        let look = |seen: &mut Vec<Seen>| {
            let mut v = stalled_reads(seen, Duration::from_millis(30));
            v.retain(|(path, _)| path == "sys/stuck/attr");
            v
        };
        assert!(look(&mut seen).is_empty(), "first look");
        std::thread::sleep(Duration::from_millis(60));
        let stalled = look(&mut seen);
        assert_eq!(stalled.len(), 1);
        assert_eq!(stalled[0].0, "sys/stuck/attr");
        assert!(stalled[0].1 >= Duration::from_millis(60));
        assert!(look(&mut seen).is_empty(), "once");
        end_tx.send(()).unwrap();
        reader.join().unwrap();
        assert!(look(&mut seen).is_empty());
        assert!(
            slots()
                .iter()
                .all(|s| *s.path.lock().unwrap() != "sys/stuck/attr"),
            "a slot outlives its thread"
        );
    }
}
