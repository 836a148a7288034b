//! Keeping the served picture current: a refresh worker (one refresh at a time, off the request
//! path), the periodic resync, kernel uevents, a watched layout file, and a watchdog that names a
//! sysfs file that does not answer. Started with [`start`] next to the server; every thread ends
//! when the agent shuts down.

use std::io;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use gpu_sysfs::discover::Change;

use crate::agent::Agent;
use crate::uevent::UeventSource;

mod gpu_events;
mod layout;
mod uevents;

use layout::LayoutWatch;
pub use layout::{WatchedLayout, read_layout_file};
pub(crate) use layout::{refuse, settle};
use uevents::uevent_loop;

/// What [`start`] runs.
pub struct WatchOptions {
    /// Read the whole host every this often (`None`: never).
    pub resync: Option<Duration>,
    /// Kernel uevents; each relevant one (debounced) re-reads the device it names.
    pub uevents: Option<Box<dyn UeventSource>>,
    /// How long to wait after a uevent for the rest of its burst before refreshing.
    pub debounce: Duration,
    /// GPU events (NVML XIDs, double-bit ECC), graded as they come; their verdicts are kept in
    /// the agent's `health.events`, which must be set for them to count.
    pub gpu_events: Option<Box<dyn gpu_health::GpuEventSource>>,
    /// A layout file applied at start and whenever it changes.
    pub layout: Option<WatchedLayout>,
    /// A read of the host taking longer than this is reported (event, metric, GPU Unknown).
    pub read_deadline: Duration,
}

impl std::fmt::Debug for WatchOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WatchOptions")
            .field("resync", &self.resync)
            .field("uevents", &self.uevents.is_some())
            .field("gpu_events", &self.gpu_events.is_some())
            .field("debounce", &self.debounce)
            .field("layout", &self.layout)
            .field("read_deadline", &self.read_deadline)
            .finish()
    }
}

impl Default for WatchOptions {
    /// A resync every 60 s, no uevents, no GPU events, 20 ms debounce, no layout, 5 s read deadline.
    fn default() -> Self {
        WatchOptions {
            resync: Some(Duration::from_secs(60)),
            uevents: None,
            gpu_events: None,
            debounce: Duration::from_millis(20),
            layout: None,
            read_deadline: Duration::from_secs(5),
        }
    }
}

/// What the refresher is asked to read: everything, or only the devices uevents named.
#[derive(Debug, Default)]
struct Pending {
    asked: bool,
    everything: bool,
    changes: std::collections::BTreeSet<Change>,
}

/// Coalesces refresh requests: any number of requests while a refresh runs make one more, which
/// reads everything when any request asked for everything.
#[derive(Debug, Default)]
struct Requests {
    pending: Mutex<Pending>,
    wake: Condvar,
}

impl Requests {
    fn lock(&self) -> std::sync::MutexGuard<'_, Pending> {
        self.pending
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Asks for a read of the whole host.
    fn request(&self) {
        let mut p = self.lock();
        p.asked = true;
        p.everything = true;
        self.wake.notify_one();
    }

    /// Asks for a read of these devices only.
    fn request_narrow(&self, changes: impl IntoIterator<Item = Change>) {
        let mut p = self.lock();
        p.asked = true;
        p.changes.extend(changes);
        self.wake.notify_one();
    }

    /// Waits up to `timeout` for a request and takes it: `Some(changes)` to read only these
    /// devices, `Some(empty)` to read everything.
    fn take(&self, timeout: Duration) -> Option<Vec<Change>> {
        let guard = self.lock();
        let (mut guard, _) = self
            .wake
            .wait_timeout_while(guard, timeout, |p| !p.asked)
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let p = std::mem::take(&mut *guard);
        if !p.asked {
            return None;
        }
        Some(if p.everything {
            Vec::new()
        } else {
            p.changes.into_iter().collect()
        })
    }
}

/// The running watchers.
#[derive(Debug)]
pub struct Watchers {
    requests: Arc<Requests>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Watchers {
    /// Asks for a refresh now (coalesced with any already asked for).
    pub fn refresh_soon(&self) {
        self.requests.request();
    }

    /// Waits for the threads to end (after the agent's shutdown); whether all of them did. A
    /// thread stuck in a read that never answers is left behind.
    pub fn join(self, within: Duration) -> bool {
        let end = Instant::now() + within;
        let mut all = true;
        for t in self.threads {
            while !t.is_finished() && Instant::now() < end {
                std::thread::sleep(Duration::from_millis(20));
            }
            if t.is_finished() {
                let _ = t.join();
            } else {
                all = false;
            }
        }
        all
    }
}

fn stopping(agent: &Agent) -> bool {
    *agent.shutdown_signal().borrow()
}

const TICK: Duration = Duration::from_millis(100);

/// Starts the watchers on `agent`. `runtime` runs the layout applies (they use the agent's
/// async writer).
///
/// # Errors
/// The layout file's directory cannot be watched.
pub fn start(
    agent: &Arc<Agent>,
    opts: WatchOptions,
    runtime: tokio::runtime::Handle,
) -> io::Result<Watchers> {
    let requests = Arc::new(Requests::default());
    let mut threads = Vec::new();
    let spawn = |name: &str, f: Box<dyn FnOnce() + Send>| {
        std::thread::Builder::new()
            .name(format!("gpuslice-{name}"))
            .spawn(f)
    };
    // The refresher: the only place background refreshes run, one at a time.
    {
        let (a, r) = (Arc::clone(agent), Arc::clone(&requests));
        threads.push(spawn(
            "refresh",
            Box::new(move || {
                while !stopping(&a) {
                    if let Some(changes) = r.take(TICK) {
                        if let Err(e) = a.refresh_devices(&changes) {
                            crate::log!("gpuslice agent: refresh: {e}");
                        }
                    }
                }
            }),
        )?);
    }
    // The watchdog of slow reads.
    {
        let a = Arc::clone(agent);
        let deadline = opts.read_deadline;
        threads.push(spawn(
            "watchdog",
            Box::new(move || {
                while !stopping(&a) {
                    for (path, waited) in a.tracked().observer().overdue(deadline) {
                        crate::log!(
                            "gpuslice agent: {path} did not answer within {} ms",
                            waited.as_millis()
                        );
                        a.mark_stalled(&path, waited);
                    }
                    std::thread::sleep(TICK.min(deadline / 4).max(Duration::from_millis(5)));
                }
            }),
        )?);
    }
    if let Some(period) = opts.resync {
        let (a, r) = (Arc::clone(agent), Arc::clone(&requests));
        threads.push(spawn(
            "resync",
            Box::new(move || {
                let mut next = Instant::now() + period;
                let mut kept = crate::agent::keep::KeptPromises::default();
                while !stopping(&a) {
                    std::thread::sleep(TICK.min(period));
                    if Instant::now() >= next {
                        // What the host lost of the agent's promises is made again first, so
                        // the read that follows serves it.
                        a.keep_promises(&mut kept);
                        r.request();
                        next = Instant::now() + period;
                    }
                }
            }),
        )?);
    }
    if let Some(mut source) = opts.uevents {
        let (a, r) = (Arc::clone(agent), Arc::clone(&requests));
        let debounce = opts.debounce;
        threads.push(spawn(
            "uevents",
            Box::new(move || uevent_loop(&a, source.as_mut(), &r, debounce)),
        )?);
    }
    if let Some(mut source) = opts.gpu_events {
        let (a, r) = (Arc::clone(agent), Arc::clone(&requests));
        threads.push(spawn(
            "gpu-events",
            Box::new(move || gpu_events::run(&a, source.as_mut(), &|| r.request())),
        )?);
    }
    if let Some(layout) = opts.layout {
        // On each resync the layout thread also checks that the host still holds the layout.
        let resync = opts.resync;
        let w = LayoutWatch::open(&layout)?;
        let a = Arc::clone(agent);
        threads.push(spawn(
            "layout",
            Box::new(move || w.run(&a, &layout, &runtime, resync)),
        )?);
    }
    Ok(Watchers { requests, threads })
}
