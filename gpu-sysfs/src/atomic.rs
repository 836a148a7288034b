//! The one confined atomic writer of gpuslice: every file gpuslice keeps goes through here (the
//! state directory's promises, DRA claims and checkpoint, remembered type names, the health
//! baseline, fleet files, CDI specs and KubeVirt metadata files, the sandbox's state file and
//! lock), and no other production file renames anything.
//!
//! A file is written into a [`Dir`]: an open directory reached from a base the caller trusts (a
//! host's root, a directory an operator named) one component at a time with
//! `openat(O_NOFOLLOW | O_DIRECTORY)`, never by path. What it guarantees:
//! - **confined**: a link, or anything but a directory, where a directory is expected is refused
//!   with an error naming it (and a link's target); a missing directory is made with `mkdirat`
//!   beside the one before, so nothing is ever written below a link someone planted;
//! - **never through a planted entry**: the new text goes to a temporary file created beside the
//!   target with `O_CREAT | O_EXCL | O_NOFOLLOW` under an unpredictable name
//!   (`.<name>.<16 hex digits>.tmp`, drawn from the process's randomly keyed hasher), so a link or
//!   file planted at a guessed name is neither written through nor renamed into place; a target
//!   that is a link or not a regular file is refused, naming it, and left as it is;
//! - **atomic and durable**: the temporary file is written, fsynced, renamed onto the target with
//!   `renameat` and the directory fsynced: a reader or a restart sees the old file or the new one;
//!   a failed step removes the temporary file and leaves the target as it was;
//! - **never blocking**: an entry is looked at with `fstatat(AT_SYMLINK_NOFOLLOW)` before any
//!   open, so a FIFO or device node is never opened; reads open with
//!   `O_NONBLOCK | O_NOFOLLOW`, check the open file again with `fstat`, and stop one byte past
//!   the caller's cap. Nothing here can wait on another process while its caller holds a lock.
//!
//! Removal is confined the same way: an entry is unlinked in its [`Dir`] with `unlinkat` (a link
//! is removed itself, never followed), and a directory tree is removed entry by entry, never
//! descending through a link.
//!
//! Errors name the path and keep the OS error's errno ([`errno_of`]); a refusal has the kind
//! `InvalidInput` (a link where a file or directory was expected) or `InvalidData` (a file that
//! is not a regular one, or is larger than the cap).

use std::fs::File;
use std::hash::{BuildHasher, Hasher};
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Component, Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use nix::errno::Errno;
use nix::fcntl::{AtFlags, OFlag, openat, readlinkat, renameat};
use nix::sys::stat::{FileStat, Mode, SFlag, fstat, fstatat, mkdirat};
use nix::unistd::{UnlinkatFlags, fsync, unlinkat};

/// How deep [`Dir::remove_tree`] descends (a claim's metadata is two levels deep).
const MAX_TREE_DEPTH: usize = 16;

/// How many temporary names are tried before giving up (each is new and unpredictable, so a
/// second is needed only when a file of that name was planted or left by a crash).
const TEMP_TRIES: usize = 8;

/// An error on a path: the path and what is wrong, keeping the OS error (and its errno) as the
/// source when there is one.
#[derive(Debug)]
pub struct PathError {
    path: String,
    message: Option<String>,
    source: Option<io::Error>,
}

impl std::fmt::Display for PathError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match (&self.message, &self.source) {
            (Some(m), _) => f.write_str(m),
            (None, Some(s)) => write!(f, "{}: {s}", self.path),
            (None, None) => f.write_str(&self.path),
        }
    }
}

impl std::error::Error for PathError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source
            .as_ref()
            .map(|s| s as &(dyn std::error::Error + 'static))
    }
}

/// The OS error `e` on `path`: the path, then the OS's message; the kind and errno are kept.
pub fn os_error_at(path: &Path, e: impl Into<io::Error>) -> io::Error {
    let e: io::Error = e.into();
    io::Error::new(
        e.kind(),
        PathError {
            path: path.display().to_string(),
            message: None,
            source: Some(e),
        },
    )
}

/// A refusal of `path` with `message` (which names it), with `errno` as its source.
fn refused(path: &Path, kind: io::ErrorKind, message: String, errno: Option<Errno>) -> io::Error {
    io::Error::new(
        kind,
        PathError {
            path: path.display().to_string(),
            message: Some(message),
            source: errno.map(io::Error::from),
        },
    )
}

/// The errno of an error of this module (or any I/O error), looking through the path it names.
pub fn errno_of(e: &io::Error) -> Option<i32> {
    e.raw_os_error().or_else(|| {
        e.get_ref()
            .and_then(|inner| inner.downcast_ref::<PathError>())
            .and_then(|p| p.source.as_ref())
            .and_then(io::Error::raw_os_error)
    })
}

/// What an entry of a directory is, looked at without following it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Entry {
    /// Nothing of that name.
    Missing,
    /// A regular file of this many bytes.
    File {
        /// Its size.
        size: u64,
    },
    /// A directory.
    Dir,
    /// A symbolic link.
    Link,
    /// A FIFO, socket or device node (named for messages: `a FIFO`, ...).
    Other(&'static str),
}

impl Entry {
    fn of(st: &FileStat) -> Self {
        let kind = SFlag::from_bits_truncate(st.st_mode & SFlag::S_IFMT.bits());
        if kind == SFlag::S_IFREG {
            Entry::File {
                size: u64::try_from(st.st_size).unwrap_or(0),
            }
        } else if kind == SFlag::S_IFDIR {
            Entry::Dir
        } else if kind == SFlag::S_IFLNK {
            Entry::Link
        } else if kind == SFlag::S_IFIFO {
            Entry::Other("a FIFO")
        } else if kind == SFlag::S_IFSOCK {
            Entry::Other("a socket")
        } else if kind == SFlag::S_IFCHR || kind == SFlag::S_IFBLK {
            Entry::Other("a device node")
        } else {
            Entry::Other("not a regular file")
        }
    }
}

/// Checks that `name` is one plain entry name: not empty, not `.` or `..`, no `/` or NUL.
///
/// # Errors
/// `InvalidInput` naming it.
pub fn check_name(name: &str) -> io::Result<()> {
    if name.is_empty()
        || name == "."
        || name == ".."
        || name.len() > 255
        || name.bytes().any(|b| b == b'/' || b == 0)
    {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{name:?} is not a plain file name"),
        ));
    }
    Ok(())
}

/// An unpredictable 64-bit value: std's hasher keys are drawn from the OS's random source once
/// per thread and changed for every hasher, so another process cannot guess the next one.
fn unpredictable() -> u64 {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(COUNTER.fetch_add(1, Ordering::Relaxed));
    h.write_u32(std::process::id());
    if let Ok(t) = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH) {
        h.write_u128(t.as_nanos());
    }
    h.finish()
}

/// The temporary name beside `name`: `.<name>.<16 hex digits>.tmp` (the name cut to 64 bytes so
/// the whole stays a valid file name).
fn temporary_name(name: &str) -> String {
    let mut cut = name.len().min(64);
    while !name.is_char_boundary(cut) {
        cut -= 1;
    }
    format!(".{}.{:016x}.tmp", &name[..cut], unpredictable())
}

/// An open directory reached without following links from a base its caller trusts; see the
/// module documentation for what writing into it guarantees.
#[derive(Debug)]
pub struct Dir {
    fd: OwnedFd,
    path: PathBuf,
}

impl Dir {
    /// Opens the directory `base`, which the caller trusts (a host's root, a directory an
    /// operator named): links in its own path are followed as the OS follows them.
    ///
    /// # Errors
    /// The OS error naming `base` (`NotFound`, `ENOTDIR`, ...).
    pub fn open(base: &Path) -> io::Result<Dir> {
        let fd = nix::fcntl::open(
            base,
            OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| os_error_at(base, e))?;
        Ok(Dir {
            fd,
            path: base.to_path_buf(),
        })
    }

    /// Splits a directory an operator named into the base trusted (its deepest existing
    /// ancestor, at most its parent) and the components below it, which are walked without
    /// following links: the named directory itself is never reached through a link.
    ///
    /// # Errors
    /// `InvalidInput` for a path that names no directory (empty, `/`, or with a `..`).
    pub fn split_named(dir: &Path) -> io::Result<(PathBuf, Vec<String>)> {
        let bad = || {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "{:?} names no directory (give a path without `..`, not `/`)",
                    dir.display().to_string()
                ),
            )
        };
        if dir.as_os_str().is_empty()
            || dir.components().any(|c| matches!(c, Component::ParentDir))
            || dir.file_name().is_none()
        {
            return Err(bad());
        }
        let mut base = dir.to_path_buf();
        let mut rest: Vec<String> = Vec::new();
        loop {
            let name = base.file_name().ok_or_else(bad)?;
            let name = name.to_str().ok_or_else(bad)?.to_owned();
            rest.push(name);
            base = match base.parent() {
                Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
                _ => PathBuf::from("."),
            };
            if std::fs::metadata(&base).is_ok_and(|m| m.is_dir()) {
                break;
            }
            if base == Path::new("/") || base == Path::new(".") {
                return Err(bad());
            }
        }
        rest.reverse();
        Ok((base, rest))
    }

    /// The directory an operator named (`/var/run/cdi`), when it is there: reached from its
    /// parent without following a link ([`Dir::split_named`]); `None` when it does not exist.
    ///
    /// # Errors
    /// As [`Dir::split_named`]; a component that is a link or not a directory, naming it.
    pub fn named(dir: &Path) -> io::Result<Option<Dir>> {
        let (base, rest) = Self::split_named(dir)?;
        Dir::open(&base)?.sub(&rest.join("/"))
    }

    /// [`Dir::named`], making what is missing.
    ///
    /// # Errors
    /// As [`Dir::named`]; the OS error of `mkdirat`.
    pub fn create_named(dir: &Path) -> io::Result<Dir> {
        let (base, rest) = Self::split_named(dir)?;
        Dir::open(&base)?.create_sub(&rest.join("/"))
    }

    /// Where the directory is, for messages.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The entry `name`'s path, for messages.
    pub fn file_path(&self, name: &str) -> PathBuf {
        self.path.join(name)
    }

    /// What the entry `name` is, without following it.
    ///
    /// # Errors
    /// A name that is not plain; the OS error of `fstatat` other than `ENOENT`.
    pub fn entry(&self, name: &str) -> io::Result<Entry> {
        check_name(name)?;
        match fstatat(&self.fd, name, AtFlags::AT_SYMLINK_NOFOLLOW) {
            Ok(st) => Ok(Entry::of(&st)),
            Err(Errno::ENOENT) => Ok(Entry::Missing),
            Err(e) => Err(os_error_at(&self.file_path(name), e)),
        }
    }

    /// The refusal of the entry `name` found to be `what` where `expected` was.
    fn refuse(&self, name: &str, what: Entry, expected: &str, not_done: &str) -> io::Error {
        let path = self.file_path(name);
        match what {
            Entry::Link => {
                let target = readlinkat(&self.fd, name)
                    .map(|t| t.to_string_lossy().into_owned())
                    .unwrap_or_else(|_| "?".to_owned());
                refused(
                    &path,
                    io::ErrorKind::InvalidInput,
                    format!(
                        "{} is a link (-> {target}), not {expected}; {not_done}, not followed",
                        path.display()
                    ),
                    Some(Errno::ELOOP),
                )
            }
            Entry::Dir => refused(
                &path,
                io::ErrorKind::InvalidData,
                format!(
                    "{} is a directory, not {expected}; {not_done}",
                    path.display()
                ),
                Some(Errno::EISDIR),
            ),
            Entry::File { .. } => refused(
                &path,
                io::ErrorKind::InvalidData,
                format!("{} is a file, not {expected}; {not_done}", path.display()),
                Some(Errno::ENOTDIR),
            ),
            Entry::Other(kind) => refused(
                &path,
                io::ErrorKind::InvalidData,
                format!("{} is {kind}, not {expected}; {not_done}", path.display()),
                None,
            ),
            Entry::Missing => os_error_at(&path, Errno::ENOENT),
        }
    }

    /// One step down: the directory `name`, made when `create` and missing.
    fn step(&self, name: &str, create: bool) -> io::Result<Option<Dir>> {
        check_name(name)?;
        let path = self.file_path(name);
        let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
        for _ in 0..2 {
            match openat(&self.fd, name, flags, Mode::empty()) {
                Ok(fd) => return Ok(Some(Dir { fd, path })),
                Err(Errno::ENOENT) if create => {
                    match mkdirat(&self.fd, name, Mode::from_bits_truncate(0o755)) {
                        Ok(()) | Err(Errno::EEXIST) => {}
                        Err(e) => return Err(os_error_at(&path, e)),
                    }
                }
                Err(Errno::ENOENT) => return Ok(None),
                Err(e) => {
                    return Err(match self.entry(name)? {
                        Entry::Dir | Entry::Missing => os_error_at(&path, e),
                        other => {
                            self.refuse(name, other, "a directory", "nothing is kept below it")
                        }
                    });
                }
            }
        }
        Err(os_error_at(&path, Errno::ENOENT))
    }

    /// The directory `rel` (`a/b`, plain components; `""` is this one) below this one, reached
    /// without following a link; `None` when a component is missing.
    ///
    /// # Errors
    /// A component that is a link or not a directory (naming it); the OS error of opening one.
    pub fn sub(&self, rel: &str) -> io::Result<Option<Dir>> {
        self.walk(rel, false)
    }

    /// [`Dir::sub`], making the missing components.
    ///
    /// # Errors
    /// As [`Dir::sub`]; the OS error of `mkdirat`.
    pub fn create_sub(&self, rel: &str) -> io::Result<Dir> {
        self.walk(rel, true)?
            .ok_or_else(|| os_error_at(&self.path.join(rel), Errno::ENOENT))
    }

    fn walk(&self, rel: &str, create: bool) -> io::Result<Option<Dir>> {
        // The first step is taken from this directory itself: its descriptor is duplicated
        // only when `rel` names no component (a walk costs one `openat` per component).
        let mut at: Option<Dir> = None;
        for part in rel.split('/').filter(|p| !p.is_empty()) {
            let from = at.as_ref().unwrap_or(self);
            match from.step(part, create)? {
                Some(next) => at = Some(next),
                None => return Ok(None),
            }
        }
        match at {
            Some(d) => Ok(Some(d)),
            None => Ok(Some(Dir {
                fd: self.fd.try_clone()?,
                path: self.path.clone(),
            })),
        }
    }

    /// Reads the regular file `name` of at most `max` bytes; `None` when it does not exist.
    /// A link, FIFO, socket or device is refused without being opened.
    ///
    /// # Errors
    /// `InvalidInput` for a link, `InvalidData` for anything but a regular file or a file larger
    /// than `max` (each naming it); the OS error of reading.
    pub fn read(&self, name: &str, max: usize) -> io::Result<Option<Vec<u8>>> {
        let path = self.file_path(name);
        let max64 = u64::try_from(max).unwrap_or(u64::MAX);
        match self.entry(name)? {
            Entry::Missing => return Ok(None),
            Entry::File { size } if size > max64 => return Err(too_large(&path, max)),
            Entry::File { .. } => {}
            other => return Err(self.refuse(name, other, "a regular file", "not read")),
        }
        let Some(file) = self.open_regular(name, OFlag::O_RDONLY)? else {
            return Ok(None);
        };
        let mut buf = Vec::new();
        file.take(max64.saturating_add(1))
            .read_to_end(&mut buf)
            .map_err(|e| os_error_at(&path, e))?;
        if buf.len() > max {
            return Err(too_large(&path, max));
        }
        Ok(Some(buf))
    }

    /// Opens the entry `name` (already seen to be a regular file) with `O_NONBLOCK |
    /// O_NOFOLLOW` and checks again that it is one; `None` when it went away.
    fn open_regular(&self, name: &str, flags: OFlag) -> io::Result<Option<File>> {
        let path = self.file_path(name);
        let flags =
            flags | OFlag::O_NONBLOCK | OFlag::O_NOFOLLOW | OFlag::O_NOCTTY | OFlag::O_CLOEXEC;
        let fd = match openat(&self.fd, name, flags, Mode::empty()) {
            Ok(fd) => fd,
            Err(Errno::ENOENT) => return Ok(None),
            Err(Errno::ELOOP) => {
                return Err(self.refuse(name, Entry::Link, "a regular file", "not opened"));
            }
            Err(e) => return Err(os_error_at(&path, e)),
        };
        let st = fstat(&fd).map_err(|e| os_error_at(&path, e))?;
        match Entry::of(&st) {
            Entry::File { .. } => Ok(Some(File::from(fd))),
            other => Err(self.refuse(name, other, "a regular file", "not read")),
        }
    }

    /// Checks that the target `name` is a regular file or missing before it is replaced.
    fn check_replaceable(&self, name: &str) -> io::Result<Entry> {
        self.expect_file(name, "not replaced")
    }

    /// What `name` is when it is a regular file or missing, looked at without opening it; a
    /// link or anything but a regular file is refused, naming it (`not_done` says what is not
    /// done: `not read`).
    ///
    /// # Errors
    /// The refusal; the OS error of `fstatat`.
    pub fn expect_file(&self, name: &str, not_done: &str) -> io::Result<Entry> {
        match self.entry(name)? {
            e @ (Entry::Missing | Entry::File { .. }) => Ok(e),
            other => Err(self.refuse(name, other, "a regular file", not_done)),
        }
    }

    /// Replaces the file `name` with `data` atomically: a temporary file created beside it
    /// exclusively under an unpredictable name, written, fsynced, renamed onto it, the
    /// directory fsynced.
    ///
    /// # Errors
    /// A target that is a link or not a regular file (naming it; it is left as it is); the OS
    /// error of the step that failed, with its errno (`ENOSPC`, `EROFS`): the target is then as
    /// it was and no temporary file is left.
    pub fn write(&self, name: &str, data: &[u8]) -> io::Result<()> {
        self.check_replaceable(name)?;
        self.replace(name, data)
    }

    fn replace(&self, name: &str, data: &[u8]) -> io::Result<()> {
        let path = self.file_path(name);
        let (tmp, mut file) = self.create_temporary(name)?;
        let written = (|| -> nix::Result<()> {
            file.write_all(data).map_err(errno_from)?;
            file.sync_all().map_err(errno_from)?;
            renameat(&self.fd, tmp.as_str(), &self.fd, name)
        })();
        if let Err(e) = written {
            let _ = unlinkat(&self.fd, tmp.as_str(), UnlinkatFlags::NoRemoveDir);
            return Err(os_error_at(&path, e));
        }
        // The rename is durable once the directory entry is.
        fsync(&self.fd).map_err(|e| os_error_at(&self.path, e))
    }

    /// Creates a new temporary file beside `name`: exclusively, never through a link.
    fn create_temporary(&self, name: &str) -> io::Result<(String, File)> {
        let flags = OFlag::O_WRONLY
            | OFlag::O_CREAT
            | OFlag::O_EXCL
            | OFlag::O_NOFOLLOW
            | OFlag::O_NOCTTY
            | OFlag::O_CLOEXEC;
        let mut last = Errno::EEXIST;
        for _ in 0..TEMP_TRIES {
            let tmp = temporary_name(name);
            match openat(
                &self.fd,
                tmp.as_str(),
                flags,
                Mode::from_bits_truncate(0o644),
            ) {
                Ok(fd) => return Ok((tmp, File::from(fd))),
                Err(Errno::EEXIST) => last = Errno::EEXIST,
                Err(e) => return Err(os_error_at(&self.file_path(name), e)),
            }
        }
        Err(os_error_at(&self.file_path(name), last))
    }

    /// [`Dir::write`] unless the file already holds exactly `data` (read bounded, and only when
    /// it is a regular file of that size); true when it wrote.
    ///
    /// # Errors
    /// As [`Dir::write`].
    pub fn write_if_changed(&self, name: &str, data: &[u8]) -> io::Result<bool> {
        let size = u64::try_from(data.len()).unwrap_or(u64::MAX);
        if let Entry::File { size: old } = self.check_replaceable(name)? {
            if old == size {
                if let Some(file) = self.open_regular(name, OFlag::O_RDONLY)? {
                    let mut held = Vec::with_capacity(data.len());
                    file.take(size.saturating_add(1))
                        .read_to_end(&mut held)
                        .map_err(|e| os_error_at(&self.file_path(name), e))?;
                    if held == data {
                        return Ok(false);
                    }
                }
            }
        }
        self.replace(name, data)?;
        Ok(true)
    }

    /// Removes the entry `name` (a link is removed itself, never followed); true when there was
    /// one. A directory is refused: see [`Dir::remove_tree`].
    ///
    /// # Errors
    /// A directory (naming it); the OS error of `unlinkat`.
    pub fn remove(&self, name: &str) -> io::Result<bool> {
        match self.entry(name)? {
            Entry::Missing => Ok(false),
            Entry::Dir => Err(self.refuse(name, Entry::Dir, "a file", "not removed")),
            _ => match unlinkat(&self.fd, name, UnlinkatFlags::NoRemoveDir) {
                Ok(()) => Ok(true),
                Err(Errno::ENOENT) => Ok(false),
                Err(e) => Err(os_error_at(&self.file_path(name), e)),
            },
        }
    }

    /// Removes the entry `name` and, when it is a directory, everything below it, never
    /// descending through a link (a link is removed itself); true when there was one.
    ///
    /// # Errors
    /// The OS error naming what could not be removed; a tree deeper than 16 levels.
    pub fn remove_tree(&self, name: &str) -> io::Result<bool> {
        self.remove_tree_at(name, MAX_TREE_DEPTH)
    }

    fn remove_tree_at(&self, name: &str, depth: usize) -> io::Result<bool> {
        match self.entry(name)? {
            Entry::Missing => return Ok(false),
            Entry::Dir => {}
            _ => return self.remove(name),
        }
        if depth == 0 {
            return Err(refused(
                &self.file_path(name),
                io::ErrorKind::InvalidData,
                format!(
                    "{} is more than {MAX_TREE_DEPTH} levels deep; not removed",
                    self.file_path(name).display()
                ),
                None,
            ));
        }
        if let Some(sub) = self.step(name, false)? {
            for entry in sub.list()? {
                sub.remove_tree_at(&entry, depth - 1)?;
            }
        }
        match unlinkat(&self.fd, name, UnlinkatFlags::RemoveDir) {
            Ok(()) => Ok(true),
            Err(Errno::ENOENT) => Ok(false),
            Err(e) => Err(os_error_at(&self.file_path(name), e)),
        }
    }

    /// The entry names, sorted.
    ///
    /// # Errors
    /// The OS error of listing.
    pub fn list(&self) -> io::Result<Vec<String>> {
        let mut d = nix::dir::Dir::openat(
            &self.fd,
            ".",
            OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| os_error_at(&self.path, e))?;
        let mut names: Vec<String> = d
            .iter()
            .filter_map(Result::ok)
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n != "." && n != "..")
            .collect();
        names.sort();
        Ok(names)
    }

    /// Opens the lock file `name` to `flock` it, creating it (mode 0600) when missing: never
    /// through a link, and only a regular file.
    ///
    /// # Errors
    /// A link or anything but a regular file (naming it); the OS error of opening or creating.
    pub fn open_lock(&self, name: &str) -> io::Result<File> {
        match self.entry(name)? {
            Entry::Missing | Entry::File { .. } => {}
            other => return Err(self.refuse(name, other, "a regular file", "not opened")),
        }
        // Read-only when it is there: a lock is taken on a read-only disk too.
        if let Some(f) = self.open_regular(name, OFlag::O_RDONLY)? {
            return Ok(f);
        }
        let path = self.file_path(name);
        let flags = OFlag::O_WRONLY
            | OFlag::O_CREAT
            | OFlag::O_NONBLOCK
            | OFlag::O_NOFOLLOW
            | OFlag::O_NOCTTY
            | OFlag::O_CLOEXEC;
        let fd = openat(&self.fd, name, flags, Mode::from_bits_truncate(0o600)).map_err(|e| {
            if e == Errno::ELOOP {
                self.refuse(name, Entry::Link, "a regular file", "not opened")
            } else {
                os_error_at(&path, e)
            }
        })?;
        let st = fstat(fd.as_fd()).map_err(|e| os_error_at(&path, e))?;
        match Entry::of(&st) {
            Entry::File { .. } => Ok(File::from(fd)),
            other => Err(self.refuse(name, other, "a regular file", "not opened")),
        }
    }
}

fn errno_from(e: io::Error) -> Errno {
    e.raw_os_error().map_or(Errno::EIO, Errno::from_raw)
}

fn too_large(path: &Path, max: usize) -> io::Error {
    refused(
        path,
        io::ErrorKind::InvalidData,
        format!("{} is larger than {max} bytes; not read", path.display()),
        None,
    )
}

/// Replaces `path` with `data` atomically ([`Dir::write`] in its parent, which the caller
/// trusts): the file named by an operator (a fleet file), never written through a link.
///
/// # Errors
/// A `path` without a file name; as [`Dir::open`] and [`Dir::write`].
pub fn write_file_atomic(path: &Path, data: &[u8]) -> io::Result<()> {
    let name = path.file_name().and_then(|n| n.to_str()).ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{}: no file name to write", path.display()),
        )
    })?;
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    Dir::open(dir)?.write(name, data)
}

#[cfg(test)]
mod tests;
