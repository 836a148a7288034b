//! Keeping the served picture current: a refresh worker (one refresh at a time, off the request
//! path), the periodic resync, kernel uevents, a watched layout file, and a watchdog that names a
//! sysfs file that does not answer. Started with [`start`] next to the server; every thread ends
//! when the agent shuts down.

use std::collections::HashMap;
use std::io;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use gpu_core::{AllocatedDevice, Allocation, AllocationStatus, NodeTopology, ParentId};
use gpu_sysfs::observed::{HostOp, Observed, Observer};

use crate::agent::Agent;
use crate::events::EventKind;
use crate::state::{Device, Promise};
use crate::uevent::{Reread, Uevent, UeventSource};
use gpu_sysfs::discover::Change;

// ------------------------------------------------------------------------------ the tracker

/// Which reads are in flight and since when, so the watchdog can name a file that does not
/// answer (a hung driver attribute, a FIFO) while the rest is served. Writes are not tracked: a
/// write is actuation (enabling VFs may take seconds), not a read.
#[derive(Debug, Default)]
pub struct InFlightReads {
    next: AtomicU64,
    in_flight: Mutex<HashMap<u64, InFlight>>,
}

/// A [`Host`] whose reads and listings the agent tracks ([`InFlightReads`]); every other call
/// goes straight to the wrapped host.
pub type TrackedHost = Observed<InFlightReads>;

#[derive(Debug)]
struct InFlight {
    path: String,
    since: Instant,
    reported: bool,
}

/// An in-flight read, removed when the read returns.
pub struct Guard<'a> {
    reads: &'a InFlightReads,
    id: u64,
}

impl Drop for Guard<'_> {
    fn drop(&mut self) {
        self.reads.map().remove(&self.id);
    }
}

impl Observer for InFlightReads {
    type Guard<'a> = Guard<'a>;

    fn before<'a>(&'a self, _op: HostOp, path: &str) -> Guard<'a> {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        self.map().insert(
            id,
            InFlight {
                path: path.to_owned(),
                since: Instant::now(),
                reported: false,
            },
        );
        Guard { reads: self, id }
    }
}

impl InFlightReads {
    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<u64, InFlight>> {
        self.in_flight
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The reads in flight for longer than `deadline` and not returned before: each path with
    /// how long it has waited, each once.
    pub fn overdue(&self, deadline: Duration) -> Vec<(String, Duration)> {
        let mut out = Vec::new();
        for f in self.map().values_mut() {
            let waited = f.since.elapsed();
            if !f.reported && waited >= deadline {
                f.reported = true;
                out.push((f.path.clone(), waited));
            }
        }
        out
    }
}

// ------------------------------------------------------------------------------ counters

/// The agent's own figures, served at the end of `/metrics`.
#[derive(Debug, Default)]
pub struct Stats {
    resyncs: AtomicU64,
    resync_failures: AtomicU64,
    resync_nanos_total: AtomicU64,
    resync_nanos_last: AtomicU64,
    uevents_seen: AtomicU64,
    uevents_relevant: AtomicU64,
    uevents_malformed: AtomicU64,
    reads_timed_out: AtomicU64,
    layouts_applied: AtomicU64,
    layouts_refused: AtomicU64,
    pub(crate) narrow_rereads: AtomicU64,
    pub(crate) gpu_events: AtomicU64,
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

impl Stats {
    pub(crate) fn record_resync(&self, took: Duration, ok: bool) {
        self.resyncs.fetch_add(1, Ordering::Relaxed);
        if !ok {
            self.resync_failures.fetch_add(1, Ordering::Relaxed);
        }
        self.resync_nanos_total
            .fetch_add(nanos(took), Ordering::Relaxed);
        self.resync_nanos_last.store(nanos(took), Ordering::Relaxed);
    }

    pub(crate) fn read_timed_out(&self) {
        self.reads_timed_out.fetch_add(1, Ordering::Relaxed);
    }

    /// Reads of the host that did not answer within the read deadline.
    pub fn reads_timed_out(&self) -> u64 {
        self.reads_timed_out.load(Ordering::Relaxed)
    }

    /// GPU events received (NVML XIDs, double-bit ECC).
    pub fn gpu_events(&self) -> u64 {
        self.gpu_events.load(Ordering::Relaxed)
    }

    /// Uevents received (relevant or not).
    pub fn uevents_seen(&self) -> u64 {
        self.uevents_seen.load(Ordering::Relaxed)
    }

    /// Refreshes after uevents that re-read only the devices named.
    pub fn narrow_rereads(&self) -> u64 {
        self.narrow_rereads.load(Ordering::Relaxed)
    }

    /// Host reads (refreshes) done.
    pub fn resyncs(&self) -> u64 {
        self.resyncs.load(Ordering::Relaxed)
    }

    /// The Prometheus text of these figures and the bus's.
    pub fn render(&self, published: u64, delivered: u64) -> String {
        let secs = |n: &AtomicU64| n.load(Ordering::Relaxed) as f64 / 1e9;
        let n = |n: &AtomicU64| n.load(Ordering::Relaxed);
        let mut out = String::new();
        let mut metric = |name: &str, kind: &str, help: &str, value: String| {
            out.push_str(&format!(
                "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {value}\n"
            ));
        };
        metric(
            "gpuslice_agent_events_published_total",
            "counter",
            "Events the agent published on /v1/events (the latest revision).",
            published.to_string(),
        );
        metric(
            "gpuslice_agent_events_sent_total",
            "counter",
            "Events delivered to live /v1/events subscribers, once per subscriber.",
            delivered.to_string(),
        );
        metric(
            "gpuslice_agent_resyncs_total",
            "counter",
            "Reads of the host (resync, uevent, after a write), narrow ones included.",
            n(&self.resyncs).to_string(),
        );
        metric(
            "gpuslice_agent_resync_failures_total",
            "counter",
            "Reads of the host that failed (the cached topology was kept).",
            n(&self.resync_failures).to_string(),
        );
        metric(
            "gpuslice_agent_resync_duration_seconds_sum",
            "counter",
            "Time spent reading the host, all reads together.",
            format!("{}", secs(&self.resync_nanos_total)),
        );
        metric(
            "gpuslice_agent_resync_last_duration_seconds",
            "gauge",
            "How long the last read of the host took.",
            format!("{}", secs(&self.resync_nanos_last)),
        );
        metric(
            "gpuslice_agent_gpu_events_total",
            "counter",
            "GPU events received from NVML (critical XIDs, double-bit ECC errors).",
            n(&self.gpu_events).to_string(),
        );
        metric(
            "gpuslice_agent_narrow_rereads_total",
            "counter",
            "Refreshes after uevents that re-read only the changed devices (the rest are full reads).",
            n(&self.narrow_rereads).to_string(),
        );
        metric(
            "gpuslice_agent_uevents_seen_total",
            "counter",
            "Kernel uevents received.",
            n(&self.uevents_seen).to_string(),
        );
        metric(
            "gpuslice_agent_uevents_relevant_total",
            "counter",
            "Kernel uevents about PCI devices or mdevs (each starts a refresh).",
            n(&self.uevents_relevant).to_string(),
        );
        metric(
            "gpuslice_agent_uevents_malformed_total",
            "counter",
            "Messages on the uevent socket that did not parse.",
            n(&self.uevents_malformed).to_string(),
        );
        metric(
            "gpuslice_agent_reads_timed_out_total",
            "counter",
            "Reads of sysfs files that did not answer within the read deadline.",
            n(&self.reads_timed_out).to_string(),
        );
        metric(
            "gpuslice_agent_layouts_applied_total",
            "counter",
            "Applies of the watched layout file.",
            n(&self.layouts_applied).to_string(),
        );
        metric(
            "gpuslice_agent_layouts_refused_total",
            "counter",
            "Versions of the watched layout file that could not be read or applied.",
            n(&self.layouts_refused).to_string(),
        );
        out
    }
}

// ------------------------------------------------------------------------------ machines

/// The Machines the agent's promises record, as allocations on `topology` (what
/// `gpuslice plan evacuate` plans on). Promises without a Machine are left out.
pub fn allocations_of(topology: &NodeTopology, promises: &[Promise]) -> Vec<Allocation> {
    let mut by_machine: std::collections::BTreeMap<String, Vec<AllocatedDevice>> =
        Default::default();
    for p in promises {
        let Some(machine) = &p.owner.machine else {
            continue;
        };
        let request = p.owner.request.clone().unwrap_or_else(|| "gpu".to_owned());
        let index = p.owner.index.unwrap_or(0);
        let (parent, uuid, type_num) = match &p.device {
            Device::Mdev { uuid, parent, .. } => (parent.clone(), *uuid, None),
            Device::VendorVfio { vf, type_num } => (
                ParentId::Pci(*vf),
                gpu_core::MdevUuid::for_machine(machine, &request, index),
                Some(*type_num),
            ),
        };
        let Some(par) = topology.parent(&parent) else {
            continue;
        };
        let profile = par.profiles.iter().find(|pr| match (&p.device, type_num) {
            (Device::Mdev { type_id, .. }, _) => pr.id == *type_id,
            (_, Some(n)) => pr.id.number() == Some(n),
            _ => false,
        });
        let Some(profile) = profile else { continue };
        by_machine
            .entry(machine.clone())
            .or_default()
            .push(AllocatedDevice::Vgpu {
                request,
                index,
                parent,
                gpu: par.gpu,
                framework: par.framework,
                profile: profile.id.clone(),
                profile_name: profile.name.clone(),
                framebuffer_mib: profile.framebuffer_mib,
                mig_slices: profile.mig_slices,
                uuid,
            });
    }
    by_machine
        .into_iter()
        .map(|(machine, devices)| Allocation {
            machine,
            node: topology.node.clone(),
            status: AllocationStatus::Created,
            devices,
        })
        .collect()
}

// ------------------------------------------------------------------------------ watchers

/// A layout file the agent keeps applied.
#[derive(Debug, Clone)]
pub struct WatchedLayout {
    /// The file (a mounted ConfigMap key, typically a symlink into `..data`).
    pub path: PathBuf,
    /// The config to apply (`-c NAME`); the file's only config when `None`.
    pub config: Option<String>,
}

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

/// Refreshes the agent: the devices in `changes` only when the narrow read can place them
/// (health re-graded when a PCI function changed, carried over otherwise), else everything.
fn refresh(agent: &Agent, changes: &[Change]) -> Result<u64, crate::ApiError> {
    if changes.is_empty() {
        return agent.refresh();
    }
    agent.refresh_with(&|host, config, cached| {
        let mut topology =
            gpu_sysfs::discover::rediscover(host, &config.discover, &cached.topology, changes)?;
        let health = if changes.iter().any(|c| matches!(c, Change::Pci(_))) {
            gpu_health::grade_topology(host, &mut topology, &config.health)
        } else {
            cached.health.clone()
        };
        agent.stats().narrow_rereads.fetch_add(1, Ordering::Relaxed);
        Some((topology, health))
    })
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

    /// Waits for the threads to end (after the agent's shutdown). A thread stuck in a read
    /// that never answers is left behind.
    pub fn join(self, within: Duration) {
        let end = Instant::now() + within;
        for t in self.threads {
            while !t.is_finished() && Instant::now() < end {
                std::thread::sleep(Duration::from_millis(20));
            }
            if t.is_finished() {
                let _ = t.join();
            }
        }
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
                        if let Err(e) = refresh(&a, &changes) {
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
                while !stopping(&a) {
                    std::thread::sleep(TICK.min(period));
                    if Instant::now() >= next {
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
            Box::new(move || crate::gpu_events::run(&a, source.as_mut(), &|| r.request())),
        )?);
    }
    if let Some(layout) = opts.layout {
        let w = LayoutWatch::open(&layout)?;
        let a = Arc::clone(agent);
        threads.push(spawn(
            "layout",
            Box::new(move || w.run(&a, &layout, &runtime)),
        )?);
    }
    Ok(Watchers { requests, threads })
}

fn uevent_loop(
    agent: &Arc<Agent>,
    source: &mut dyn UeventSource,
    requests: &Requests,
    debounce: Duration,
) {
    let mut due: Option<Instant> = None;
    let mut everything = false;
    let mut changes: Vec<Change> = Vec::new();
    while !stopping(agent) {
        let wait = due.map_or(TICK, |d| d.saturating_duration_since(Instant::now()));
        match source.next(wait.min(TICK)) {
            Ok(Some(msg)) => {
                agent.stats().uevents_seen.fetch_add(1, Ordering::Relaxed);
                match Uevent::parse(&msg) {
                    Ok(e) if e.is_relevant() => {
                        agent
                            .stats()
                            .uevents_relevant
                            .fetch_add(1, Ordering::Relaxed);
                        agent.events().publish(
                            EventKind::Uevent,
                            serde_json::json!({
                                "action": e.action,
                                "devpath": e.devpath,
                                "subsystem": e.subsystem(),
                                "driver": e.get("DRIVER"),
                                "address": e.pci_address(),
                                "mdev": e.get("MDEV_TYPE").map(|_| e.devpath.rsplit('/').next()),
                                "seqnum": e.get("SEQNUM").and_then(|s| s.parse::<u64>().ok()),
                            }),
                        );
                        match e.reread() {
                            Reread::Nothing => {}
                            Reread::Narrow(c) => changes.push(c),
                            Reread::Everything => everything = true,
                        }
                        due = Some(Instant::now() + debounce);
                    }
                    Ok(_) => {}
                    Err(_) => {
                        agent
                            .stats()
                            .uevents_malformed
                            .fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
            Ok(None) => {}
            Err(e) => {
                crate::log!("gpuslice agent: uevents: {e}; relying on the resync");
                return;
            }
        }
        if due.is_some_and(|d| Instant::now() >= d) {
            due = None;
            if everything {
                requests.request();
            } else if !changes.is_empty() {
                requests.request_narrow(changes.drain(..));
            }
            everything = false;
            changes.clear();
        }
    }
}

struct LayoutWatch {
    inotify: nix::sys::inotify::Inotify,
}

impl LayoutWatch {
    fn open(layout: &WatchedLayout) -> io::Result<Self> {
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

    fn run(self, agent: &Arc<Agent>, layout: &WatchedLayout, runtime: &tokio::runtime::Handle) {
        let mut last: Option<Vec<u8>> = None;
        let mut due = Some(Instant::now());
        while !stopping(agent) {
            if self.changed(TICK) {
                // Let the writer finish (an editor's write and rename, the kubelet's swap).
                due = Some(Instant::now() + Duration::from_millis(50));
            }
            if due.is_some_and(|d| Instant::now() >= d) {
                due = None;
                if !apply_file(agent, layout, runtime, &mut last) {
                    // The host refused for now (the lock is busy, a write failed and was rolled
                    // back): the same version is tried again later.
                    due = Some(Instant::now() + RETRY);
                }
            }
        }
    }
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
) -> bool {
    let source = layout.path.display().to_string();
    let bytes = match std::fs::read(&layout.path) {
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
        text,
        layout.config.clone(),
        false,
        false,
        Some(source.clone()),
    ));
    match out {
        Ok(report) => {
            agent
                .stats()
                .layouts_applied
                .fetch_add(1, Ordering::Relaxed);
            let status = report["status"].as_str().unwrap_or("?");
            crate::log!("gpuslice agent: layout {source}: {status}");
            if matches!(status, "rolled-back" | "rollback-incomplete") {
                *last = None;
                return false;
            }
            true
        }
        Err(e) => {
            let lasting = e.status == 400;
            refuse(agent, &source, e.message);
            if !lasting {
                *last = None;
            }
            lasting
        }
    }
}

fn refuse(agent: &Agent, source: &str, message: String) {
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
