//! Directories held open for a burst of reads below them.
//!
//! Opening `sys/class/mdev_bus/0000:08:00.4/mdev_supported_types/nvidia-745/available_instances`
//! from the root makes the kernel walk a dozen components (the class link into `sys/devices`
//! among them) for every one of the 15 types of every parent; a GPU's dozen attributes each walk
//! its whole device path again. Where three reads in a row fall below one directory (a device's
//! directory, a parent's `mdev_supported_types`), [`DirCache`] opens that directory once and the
//! reads after it resolve only what is left, beneath it: the same answers for half the cost of an
//! open.
//!
//! Each reading thread holds its own directories, under a lock of its own (threads are spread
//! over [`SHARDS`] locks in the order they first read): discovery's two reading threads never
//! wait for each other here, and every read takes only an uncontended lock.
//!
//! A read below a device's directory before that directory is held (each PCI function's `class`
//! in the scan, the first attributes of a GPU, a parent's first types) resolves below the listing
//! it is an entry of, `sys/bus/pci/devices` or `sys/class/mdev_bus`, held from its first such
//! read: the entry's link is still followed, but the components above it and the mount point at
//! `/sys` are not walked again for every function. Only under `/`, where links are followed as
//! the kernel follows them; under another root a link may not leave the directory it is
//! resolved beneath. A listing is never replaced, so it stays held while the device directories
//! held after it come and go.
//!
//! Nothing is held long: a directory is let go 100 ms after it was opened and whenever the host
//! is written through (a write may remove or re-create the very directories held: VFs re-made by
//! `sriov_numvfs`), so a held directory never stands for one that was replaced since. A read
//! through a held directory that fails for any reason is made again from the root, which gives
//! the authoritative answer or error.

use std::io;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How long a directory stays open after it was opened.
const HOLD: Duration = Duration::from_millis(100);

/// Directories held at once.
const HELD: usize = 4;

/// The read in a row below one directory that opens it.
const OPEN_AT: u32 = 3;

/// The read in a row below one entry of a held listing that opens the entry's own directory:
/// below the listing a read costs only the entry's link more, so the open pays only for a
/// longer run (a GPU's attributes, not a companion function's two or three).
const OPEN_BELOW_LISTING_AT: u32 = 5;

#[derive(Debug)]
struct Held {
    dir: String,
    fd: Arc<OwnedFd>,
    opened: Instant,
}

#[derive(Debug, Default)]
struct Inner {
    held: Vec<Held>,
    /// Per reading thread, the directory of its last reads made from the root, and how many in
    /// a row fell below it: the third opens it (a VF's two `nvidia/` files are read from the
    /// root, as a held directory would cost them one open more). Threads that read side by side
    /// (discovery's prefetch) each keep their own run.
    runs: Vec<Run>,
}

#[derive(Debug)]
struct Run {
    thread: std::thread::ThreadId,
    last: String,
    count: u32,
}

/// Listings whose entries are links to the directories they list, held for the reads below their
/// entries ([`DirCache::with_listings`]).
const LISTINGS: [&str; 2] = ["sys/bus/pci/devices", "sys/class/mdev_bus"];

/// The listing of [`LISTINGS`] `path` is below an entry of (a file in the entry's directory or
/// deeper), and the rest of `path` beneath the listing.
pub(crate) fn below_listing(path: &str) -> Option<(&'static str, &str)> {
    LISTINGS.iter().find_map(|l| {
        let rest = path.strip_prefix(l)?.strip_prefix('/')?;
        // An entry and something below it: the entry alone is read where it is listed already.
        let (entry, _) = rest.split_once('/')?;
        (!entry.is_empty()).then_some((*l, rest))
    })
}

/// Reading threads whose runs are kept (the oldest is forgotten).
const THREADS: usize = 8;

/// Locks the reading threads are spread over.
const SHARDS: usize = 4;

/// The directories held open; see the module docs.
#[derive(Debug, Default)]
pub(crate) struct DirCache {
    shards: [Mutex<Inner>; SHARDS],
    /// Whether reads below an entry of [`LISTINGS`] may resolve beneath the listing.
    listings: bool,
}

/// This thread's shard: threads take them in turn, in the order of their first read.
fn my_shard() -> usize {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local! {
        static MINE: usize = NEXT.fetch_add(1, Ordering::Relaxed) % SHARDS;
    }
    MINE.try_with(|m| *m).unwrap_or(0)
}

/// The directory a read of `path` is made below and what is left of the path under it: a
/// parent's `mdev_supported_types` for the files of its types, otherwise the file's own
/// directory. `None` for a path of one component.
pub(crate) fn split(path: &str) -> Option<(&str, &str)> {
    const TYPES: &str = "mdev_supported_types";
    // Component by component (a `/` is one byte to look for; a substring search would build its
    // searcher again for every read).
    let mut start = 0;
    for (i, b) in path.bytes().enumerate() {
        if b != b'/' {
            continue;
        }
        if start > 0 && &path[start..i] == TYPES {
            return Some((&path[..i], &path[i + 1..]));
        }
        start = i + 1;
    }
    path.rsplit_once('/')
}

impl DirCache {
    /// A cache that also holds the bus listings of [`LISTINGS`] for reads below their entries:
    /// only where links are followed as the kernel follows them (under `/`).
    pub(crate) fn with_listings() -> Self {
        DirCache {
            listings: true,
            ..Self::default()
        }
    }

    /// The open directory to resolve `path`'s rest beneath, and that rest: one held already, or
    /// opened now with `open_dir` when the two reads before this one were below the same
    /// directory; otherwise, where the cache holds listings, the listing the path is below
    /// ([`below_listing`]), opened with `open_dir` the first time.
    /// `None`: read from the root (and remember the directory for the next read).
    pub(crate) fn held_for<'p>(
        &self,
        path: &'p str,
        open_dir: impl FnOnce(&str) -> io::Result<OwnedFd>,
    ) -> Option<(Arc<OwnedFd>, &'p str)> {
        let (dir, rest) = split(path)?;
        let mut inner = self.shards[my_shard()].lock().ok()?;
        inner.let_go_of_old();
        if let Some(fd) = inner.find(dir) {
            return Some((fd, rest));
        }
        let listed = if self.listings {
            below_listing(path)
        } else {
            None
        };
        let open_at = if listed.is_some() {
            OPEN_BELOW_LISTING_AT
        } else {
            OPEN_AT
        };
        if inner.run_reaches(dir, open_at) {
            return Some((inner.open_and_hold(dir, open_dir)?, rest));
        }
        // Not held and not to be opened: below a listing's entry, the listing serves.
        let (listing, below) = listed?;
        let fd = match inner.find(listing) {
            Some(fd) => fd,
            None => inner.open_and_hold(listing, open_dir)?,
        };
        Some((fd, below))
    }

    /// Lets every held directory go (the host is about to be written through).
    pub(crate) fn clear(&self) {
        for shard in &self.shards {
            if let Ok(mut inner) = shard.lock() {
                inner.held.clear();
                inner.runs.clear();
            }
        }
    }
}

impl Inner {
    /// Lets go of the directories held past their time (the clock only when something is held:
    /// under another root than `/`, most reads of a scan find nothing held).
    fn let_go_of_old(&mut self) {
        if !self.held.is_empty() {
            let now = Instant::now();
            self.held
                .retain(|h| now.saturating_duration_since(h.opened) < HOLD);
        }
    }

    /// The held directory `dir`.
    fn find(&self, dir: &str) -> Option<Arc<OwnedFd>> {
        self.held
            .iter()
            .find(|h| h.dir == dir)
            .map(|h| Arc::clone(&h.fd))
    }

    /// Whether this read is the `open_at`th in a row below `dir` on this thread.
    fn run_reaches(&mut self, dir: &str, open_at: u32) -> bool {
        let me = std::thread::current().id();
        let i = match self.runs.iter().position(|r| r.thread == me) {
            Some(i) => i,
            None => {
                if self.runs.len() >= THREADS {
                    self.runs.remove(0);
                }
                self.runs.push(Run {
                    thread: me,
                    last: String::new(),
                    count: 0,
                });
                self.runs.len() - 1
            }
        };
        let run = &mut self.runs[i];
        if run.last != dir {
            dir.clone_into(&mut run.last);
            run.count = 1;
            return false;
        }
        run.count += 1;
        run.count >= open_at
    }

    /// Opens `dir` with `open` and holds it, letting the oldest go when [`HELD`] are held (a
    /// listing last: a scan reads below it between the device directories it holds).
    fn open_and_hold(
        &mut self,
        dir: &str,
        open: impl FnOnce(&str) -> io::Result<OwnedFd>,
    ) -> Option<Arc<OwnedFd>> {
        let fd = Arc::new(open(dir).ok()?);
        if self.held.len() >= HELD {
            let oldest = self
                .held
                .iter()
                .position(|h| !LISTINGS.contains(&h.dir.as_str()))
                .unwrap_or(0);
            self.held.remove(oldest);
        }
        self.held.push(Held {
            dir: dir.to_owned(),
            fd: Arc::clone(&fd),
            opened: Instant::now(),
        });
        Some(fd)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn types_resolve_below_their_parents_list_and_attributes_below_their_device() {
        assert_eq!(
            split("sys/class/mdev_bus/0000:08:00.4/mdev_supported_types/nvidia-745/name"),
            Some((
                "sys/class/mdev_bus/0000:08:00.4/mdev_supported_types",
                "nvidia-745/name"
            ))
        );
        assert_eq!(
            split("sys/bus/pci/devices/0000:08:00.0/vendor"),
            Some(("sys/bus/pci/devices/0000:08:00.0", "vendor"))
        );
        assert_eq!(split("vendor"), None);
        // Only a whole component that is not the first counts.
        assert_eq!(
            split("mdev_supported_types/nvidia-1/name"),
            Some(("mdev_supported_types/nvidia-1", "name"))
        );
        assert_eq!(
            split("sys/xmdev_supported_types/nvidia-1/name"),
            Some(("sys/xmdev_supported_types/nvidia-1", "name"))
        );
        assert_eq!(
            split("sys/a/mdev_supported_types"),
            Some(("sys/a", "mdev_supported_types"))
        );
    }

    fn dir() -> io::Result<OwnedFd> {
        nix::fcntl::open(
            "/",
            nix::fcntl::OFlag::O_PATH | nix::fcntl::OFlag::O_DIRECTORY,
            nix::sys::stat::Mode::empty(),
        )
        .map_err(io::Error::from)
    }

    #[test]
    fn a_directory_is_opened_on_the_third_read_below_it_and_let_go_on_a_write() {
        let c = DirCache::default();
        let opened = std::cell::Cell::new(0);
        let open = |_: &str| {
            opened.set(opened.get() + 1);
            dir()
        };
        assert!(c.held_for("sys/a/x", open).is_none());
        assert!(c.held_for("sys/b/x", open).is_none());
        assert!(c.held_for("sys/b/w", open).is_none());
        let (_, rest) = c.held_for("sys/b/y", open).expect("held on the third read");
        assert_eq!(rest, "y");
        assert!(c.held_for("sys/b/z", open).is_some());
        assert_eq!(opened.get(), 1);
        c.clear();
        assert!(c.held_for("sys/b/z", open).is_none(), "a write lets go");
        assert_eq!(opened.get(), 1);
    }

    #[test]
    fn a_read_on_another_thread_does_not_break_this_threads_run() {
        let c = DirCache::default();
        assert!(c.held_for("sys/b/x", |_| dir()).is_none());
        assert!(c.held_for("sys/b/w", |_| dir()).is_none());
        std::thread::scope(|s| {
            s.spawn(|| assert!(c.held_for("sys/c/x", |_| dir()).is_none()))
                .join()
                .unwrap();
        });
        let (_, rest) = c
            .held_for("sys/b/y", |_| dir())
            .expect("still the third read in a row on this thread");
        assert_eq!(rest, "y");
    }

    #[test]
    fn threads_hold_their_own_directories_and_a_write_lets_go_of_all() {
        let c = DirCache::default();
        let opened = std::sync::atomic::AtomicUsize::new(0);
        let open = |_: &str| {
            opened.fetch_add(1, Ordering::Relaxed);
            dir()
        };
        for f in ["x", "y", "z"] {
            let _ = c.held_for(&format!("sys/b/{f}"), open);
        }
        assert!(c.held_for("sys/b/w", open).is_some());
        std::thread::scope(|s| {
            s.spawn(|| {
                for f in ["x", "y", "z"] {
                    let _ = c.held_for(&format!("sys/b/{f}"), open);
                }
                assert!(c.held_for("sys/b/w", open).is_some());
            })
            .join()
            .unwrap();
        });
        // One open per thread (the second thread's own shard, or the first's when they share one:
        // then it found the directory held already).
        assert!((1..=2).contains(&opened.load(Ordering::Relaxed)));
        c.clear();
        assert!(
            c.held_for("sys/b/v", open).is_none(),
            "a write lets go on every thread"
        );
    }

    #[test]
    fn reads_below_a_bus_entry_resolve_beneath_the_bus_listing_until_the_entry_is_held() {
        let c = DirCache::with_listings();
        let opened = std::cell::RefCell::new(Vec::<String>::new());
        let open = |d: &str| {
            opened.borrow_mut().push(d.to_owned());
            dir()
        };
        let pci = "sys/bus/pci/devices";
        // Each function's class, below the listing opened once.
        for f in ["0000:00:00.0", "0000:00:01.0", "0000:08:00.0"] {
            let path = format!("{pci}/{f}/class");
            let (_, rest) = c.held_for(&path, open).expect("below the listing");
            assert_eq!(rest, format!("{f}/class"));
        }
        assert_eq!(*opened.borrow(), [pci]);
        // The fifth read in a row below one function opens the function's own directory; a
        // companion's two or three reads stay below the listing.
        for f in ["vendor", "device", "subsystem_vendor"] {
            let path = format!("{pci}/0000:08:00.0/{f}");
            let (_, rest) = c.held_for(&path, open).unwrap();
            assert_eq!(rest, format!("0000:08:00.0/{f}"));
        }
        assert_eq!(*opened.borrow(), [pci]);
        let path = format!("{pci}/0000:08:00.0/subsystem_device");
        let (_, rest) = c.held_for(&path, open).unwrap();
        assert_eq!(rest, "subsystem_device");
        assert_eq!(
            opened.borrow().last().unwrap(),
            &format!("{pci}/0000:08:00.0")
        );
        // Device directories held after it let each other go, not the listing.
        for gpu in [
            "0000:41:00.0",
            "0000:81:00.0",
            "0000:c1:00.0",
            "0000:e1:00.0",
        ] {
            for f in ["a", "b", "c", "d", "e"] {
                let path = format!("{pci}/{gpu}/{f}");
                let _ = c.held_for(&path, open);
            }
        }
        let before = opened.borrow().len();
        let path = format!("{pci}/0000:00:00.0/class");
        let (_, rest) = c.held_for(&path, open).unwrap();
        assert_eq!(rest, "0000:00:00.0/class");
        assert_eq!(opened.borrow().len(), before, "the listing is still held");
        assert_eq!(opened.borrow().iter().filter(|d| *d == pci).count(), 1);
        // The listing itself, and paths elsewhere, are not below an entry.
        assert_eq!(below_listing(pci), None);
        assert_eq!(below_listing(&format!("{pci}/0000:00:00.0")), None);
        assert_eq!(below_listing("sys/bus/pci/devicesX/a/b"), None);
        assert_eq!(
            below_listing("sys/class/mdev_bus/0000:08:00.4/mdev_supported_types/nvidia-745/name"),
            Some((
                "sys/class/mdev_bus",
                "0000:08:00.4/mdev_supported_types/nvidia-745/name"
            ))
        );
        assert_eq!(below_listing("sys/class/mdev_busX/0000:08:00.4/x"), None);
    }

    #[test]
    fn without_listings_a_bus_entry_is_read_from_the_root() {
        let c = DirCache::default();
        assert!(
            c.held_for("sys/bus/pci/devices/0000:00:00.0/class", |_| dir())
                .is_none()
        );
    }

    #[test]
    fn a_directory_that_cannot_be_opened_sends_the_read_to_the_root() {
        let c = DirCache::default();
        let fail = |_: &str| -> io::Result<OwnedFd> { Err(io::Error::other("gone")) };
        for f in ["x", "y", "z"] {
            assert!(c.held_for(&format!("sys/b/{f}"), fail).is_none());
        }
    }
}
