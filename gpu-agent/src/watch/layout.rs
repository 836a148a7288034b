//! The watched layout file: applied at start and whenever its directory says it changed.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::{TICK, stopping};
use crate::agent::Agent;
use crate::agent::heal::LayoutHealth;
use crate::events::EventKind;

/// A layout file the agent keeps applied.
#[derive(Debug, Clone)]
pub struct WatchedLayout {
    /// The file (a mounted ConfigMap key, typically a symlink into `..data`).
    pub path: PathBuf,
    /// The config to apply (`-c NAME`); the file's only config when `None`.
    pub config: Option<String>,
}

pub(super) struct LayoutWatch {
    inotify: nix::sys::inotify::Inotify,
}

impl LayoutWatch {
    pub(super) fn open(layout: &WatchedLayout) -> io::Result<Self> {
        use nix::sys::inotify::{AddWatchFlags as F, InitFlags, Inotify};
        let dir = match layout.path.parent() {
            Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
            _ => PathBuf::from("."),
        };
        let inotify = Inotify::init(InitFlags::IN_CLOEXEC | InitFlags::IN_NONBLOCK)?;
        // The directory, not the file: a ConfigMap update renames `..data` over the old
        // symlink, and an editor writes a new file and renames it into place.
        inotify
            .add_watch(
                &dir,
                F::IN_CLOSE_WRITE
                    | F::IN_MOVED_TO
                    | F::IN_MOVED_FROM
                    | F::IN_CREATE
                    | F::IN_DELETE
                    | F::IN_MODIFY
                    | F::IN_ATTRIB,
            )
            .map_err(|e| {
                io::Error::new(
                    io::Error::from(e).kind(),
                    format!("cannot watch {}: {e}", dir.display()),
                )
            })?;
        Ok(LayoutWatch { inotify })
    }

    fn changed(&self, timeout: Duration) -> bool {
        use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
        use std::os::fd::AsFd as _;
        let ms = u16::try_from(timeout.as_millis()).unwrap_or(u16::MAX);
        let mut fds = [PollFd::new(self.inotify.as_fd(), PollFlags::POLLIN)];
        if !matches!(poll(&mut fds, PollTimeout::from(ms)), Ok(n) if n > 0) {
            return false;
        }
        let mut any = false;
        while let Ok(events) = self.inotify.read_events() {
            if events.is_empty() {
                break;
            }
            any = true;
        }
        any
    }

    pub(super) fn run(
        self,
        agent: &Arc<Agent>,
        layout: &WatchedLayout,
        runtime: &tokio::runtime::Handle,
        resync: Option<Duration>,
    ) {
        let mut last: Option<Vec<u8>> = None;
        let mut kept = Kept::default();
        let mut due = Some(Instant::now());
        let mut check = resync.map(|p| Instant::now() + p);
        while !stopping(agent) {
            if self.changed(TICK) {
                // Let the writer finish (an editor's write and rename, the kubelet's swap).
                due = Some(Instant::now() + Duration::from_millis(50));
            }
            if due.is_some_and(|d| Instant::now() >= d) {
                due = None;
                if !apply_file(agent, layout, runtime, &mut last, &mut kept) {
                    // The host refused for now (the lock is busy, a write failed and was rolled
                    // back): the same version is tried again later.
                    due = Some(Instant::now() + RETRY);
                }
            }
            if let (Some(at), Some(period)) = (check, resync) {
                if Instant::now() >= at {
                    kept.check(agent, layout, runtime);
                    check = Some(Instant::now() + period);
                }
            }
        }
    }
}

/// Reads a layout file through [`gpu_sysfs::read_document`].
///
/// # Errors
/// As [`gpu_sysfs::read_document`]: `NotFound`, a file that is not regular, over the cap or not
/// UTF-8 text, and the I/O errors.
pub fn read_layout_file(path: &Path) -> io::Result<Vec<u8>> {
    // The one document reader of gpuslice: opened without blocking, regular files only, refused
    // from its size before reading when over the cap (`GPUSLICE_MAX_DOCUMENT_MIB` raises it).
    let limit = gpu_sysfs::DocumentLimit::from_env().unwrap_or_default();
    gpu_sysfs::read_document(path, "--layout", limit).map(String::into_bytes)
}

/// How long a watched layout the host refused waits before it is tried again.
const RETRY: Duration = Duration::from_secs(10);

/// Applies the layout file when its content differs from the last one seen. False when the
/// host refused it for a reason that may pass (to be tried again); a document that does not
/// parse or select waits for the next edit.
fn apply_file(
    agent: &Arc<Agent>,
    layout: &WatchedLayout,
    runtime: &tokio::runtime::Handle,
    last: &mut Option<Vec<u8>>,
    kept: &mut Kept,
) -> bool {
    let source = layout.path.display().to_string();
    let bytes = match read_layout_file(&layout.path) {
        Ok(b) => b,
        // Mid-swap or removed: the next change brings it back.
        Err(e) if e.kind() == io::ErrorKind::NotFound => return true,
        Err(e) => {
            refuse(agent, &source, format!("cannot read {source}: {e}"));
            return true;
        }
    };
    if last.as_ref() == Some(&bytes) {
        return true;
    }
    *last = Some(bytes.clone());
    let Ok(text) = String::from_utf8(bytes) else {
        refuse(agent, &source, format!("{source} is not UTF-8 text"));
        return true;
    };
    let out = runtime.block_on(agent.apply_layout_from(
        text.clone(),
        layout.config.clone(),
        false,
        false,
        Some(source.clone()),
    ));
    if out.is_ok() {
        // The version applied (or rolled back, to be tried again): it is the one each resync
        // keeps in place from now on.
        *kept = Kept {
            text: Some(text),
            said: None,
        };
    }
    let keep = settle(agent, &source, out);
    if !keep {
        *last = None;
    }
    keep
}

/// Counts and logs what became of a layout apply from `source` (a refusal is published as a
/// `layoutRefused` event). True when the version applied or was refused for good; false when it
/// is to be tried again (rolled back, the host busy).
pub(crate) fn settle(
    agent: &Agent,
    source: &str,
    out: Result<serde_json::Value, crate::ApiError>,
) -> bool {
    match out {
        Ok(report) => {
            agent
                .stats()
                .layouts_applied
                .fetch_add(1, Ordering::Relaxed);
            let status = report["status"].as_str().unwrap_or("?");
            crate::log!("gpuslice agent: layout {source}: {status}");
            !matches!(status, "rolled-back" | "rollback-incomplete")
        }
        Err(e) => {
            let lasting = e.status == 400;
            refuse(agent, source, e.message);
            lasting
        }
    }
}

/// Counts, logs and publishes a layout from `source` that changed nothing.
pub(crate) fn refuse(agent: &Agent, source: &str, message: String) {
    agent
        .stats()
        .layouts_refused
        .fetch_add(1, Ordering::Relaxed);
    crate::log!("gpuslice agent: layout {source}: {message}; nothing was changed");
    agent.events().publish(
        EventKind::LayoutRefused,
        serde_json::json!({ "source": source, "message": message }),
    );
}

/// The version the agent keeps in place on each resync, and what it last said about it.
#[derive(Debug, Default)]
struct Kept {
    /// The text of the version last applied.
    text: Option<String>,
    /// The last `layout-not-in-place` said (what was missing and why), so that it is said
    /// once per change, not on every resync.
    said: Option<(Vec<String>, String)>,
}

impl Kept {
    /// Plans the kept version against the host and makes again what the host lost
    /// (`layout-restored`), or says once why it cannot (`layout-not-in-place`).
    fn check(
        &mut self,
        agent: &Arc<Agent>,
        layout: &WatchedLayout,
        runtime: &tokio::runtime::Handle,
    ) {
        let Some(text) = self.text.clone() else {
            return;
        };
        let source = layout.path.display().to_string();
        let found = runtime.block_on(agent.heal_layout(text, layout.config.clone()));
        let (missing, reason) = match found {
            Ok(LayoutHealth::InPlace) => {
                if self.said.take().is_some() {
                    crate::log!("gpuslice agent: layout {source}: in place again");
                }
                agent.stats().set_layout_in_place(true);
                return;
            }
            Ok(LayoutHealth::Restored { missing, changes }) => {
                self.said = None;
                agent.stats().set_layout_in_place(true);
                agent
                    .stats()
                    .layouts_restored
                    .fetch_add(1, Ordering::Relaxed);
                crate::log!(
                    "gpuslice agent: layout {source}: restored ({})",
                    missing.join("; ")
                );
                agent.events().publish(
                    EventKind::LayoutRestored,
                    serde_json::json!({
                        "source": source,
                        "config": layout.config,
                        "missing": missing,
                        "changes": changes,
                    }),
                );
                return;
            }
            Ok(LayoutHealth::NotInPlace { missing, reason }) => (missing, reason),
            Err(e) => (Vec::new(), e.message),
        };
        agent.stats().set_layout_in_place(false);
        let now = (missing, reason);
        if self.said.as_ref() == Some(&now) {
            return;
        }
        let (missing, reason) = &now;
        crate::log!("gpuslice agent: layout {source}: not in place: {reason}");
        agent.events().publish(
            EventKind::LayoutNotInPlace,
            serde_json::json!({
                "source": source,
                "config": layout.config,
                "missing": missing,
                "reason": reason,
            }),
        );
        self.said = Some(now);
    }
}
