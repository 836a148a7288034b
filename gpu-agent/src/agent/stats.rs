//! The agent's own figures, served at the end of `/metrics`, the kubelet plugin's counters
//! ([`DraStats`]) among them. They live here, below both the agent and the plugin: the plugin
//! drives the agent, so the agent's figures import nothing of the plugin.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

/// The agent's own figures, served at the end of `/metrics`.
#[derive(Debug, Default)]
pub struct Stats {
    pub(crate) resyncs: AtomicU64,
    pub(crate) resync_failures: AtomicU64,
    pub(crate) resync_nanos_total: AtomicU64,
    pub(crate) resync_nanos_last: AtomicU64,
    pub(crate) uevents_seen: AtomicU64,
    pub(crate) uevents_relevant: AtomicU64,
    pub(crate) uevents_malformed: AtomicU64,
    pub(crate) reads_timed_out: AtomicU64,
    pub(crate) layouts_applied: AtomicU64,
    pub(crate) layouts_refused: AtomicU64,
    pub(crate) layouts_restored: AtomicU64,
    pub(crate) promises_restored: AtomicU64,
    /// 1 while a resync finds the watched layout not in place (and could not make it again).
    pub(crate) layout_not_in_place: AtomicBool,
    pub(crate) narrow_rereads: AtomicU64,
    pub(crate) gpu_events: AtomicU64,
    pub(crate) slices_published: AtomicU64,
    pub(crate) slice_publish_failures: AtomicU64,
    pub(crate) slice_generation: AtomicU64,
    pub(crate) slice_latency_nanos_total: AtomicU64,
    pub(crate) slice_latency_count: AtomicU64,
    pub(crate) slice_latency_nanos_last: AtomicU64,
    /// The kubelet plugin's counters (`gpuslice agent --dra`), served once a plugin runs.
    pub(crate) dra: DraStats,
    pub(crate) dra_on: AtomicBool,
    /// The slice publisher's condition, while one runs.
    publisher: std::sync::Mutex<Option<PublisherCondition>>,
    /// The kubelet plugin's condition (its sockets bound or not), while one is asked for.
    plugin: std::sync::Mutex<Option<PublisherCondition>>,
    /// API server answers refused for their size, counted by the client that refused them.
    apiserver_refused: std::sync::OnceLock<std::sync::Arc<AtomicU64>>,
}

/// Whether the slice publisher keeps the node's ResourceSlices true, as `/healthz` shows it.
/// A publisher the API server's answers keep from publishing (a `/version` that is garbage or
/// too old, no `resource.k8s.io/v1`, refused credentials, an outage) is not ready and says why;
/// the agent serves on and the publisher asks again with back-off.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct PublisherCondition {
    /// Whether its last round went through.
    pub ready: bool,
    /// Why not, when it is not.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

impl Stats {
    pub(crate) fn set_layout_in_place(&self, in_place: bool) {
        self.layout_not_in_place.store(!in_place, Ordering::Relaxed);
    }

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

    pub(crate) fn record_slices_published(&self, writes: usize, generation: i64) {
        self.slices_published
            .fetch_add(u64::try_from(writes).unwrap_or(0), Ordering::Relaxed);
        self.slice_generation
            .store(u64::try_from(generation).unwrap_or(0), Ordering::Relaxed);
    }

    pub(crate) fn record_slice_failure(&self) {
        self.slice_publish_failures.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn set_publisher(&self, condition: PublisherCondition) {
        *self
            .publisher
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(condition);
    }

    /// The slice publisher's condition; `None` when no publisher runs.
    pub fn publisher(&self) -> Option<PublisherCondition> {
        self.publisher
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    pub(crate) fn set_plugin(&self, condition: PublisherCondition) {
        *self
            .plugin
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(condition);
    }

    /// The kubelet plugin's condition (`ready`: its sockets are bound and served); `None` when
    /// no plugin runs.
    pub fn plugin(&self) -> Option<PublisherCondition> {
        self.plugin
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Serves `counter` (the API server client's refused answers) as
    /// `gpuslice_agent_apiserver_answers_refused_total`; the first counter given is kept.
    pub fn count_apiserver_refusals(&self, counter: std::sync::Arc<AtomicU64>) {
        let _ = self.apiserver_refused.set(counter);
    }

    /// API server answers refused for their size (0 when no client is counted).
    pub fn apiserver_answers_refused(&self) -> u64 {
        self.apiserver_refused
            .get()
            .map_or(0, |c| c.load(Ordering::Relaxed))
    }

    pub(crate) fn record_slice_latency(&self, took: Duration) {
        self.slice_latency_nanos_total
            .fetch_add(nanos(took), Ordering::Relaxed);
        self.slice_latency_count.fetch_add(1, Ordering::Relaxed);
        self.slice_latency_nanos_last
            .store(nanos(took), Ordering::Relaxed);
    }

    /// ResourceSlice writes (creates, updates, deletes) the publisher made.
    pub fn slices_published(&self) -> u64 {
        self.slices_published.load(Ordering::Relaxed)
    }

    /// Publishing rounds that failed.
    pub fn slice_publish_failures(&self) -> u64 {
        self.slice_publish_failures.load(Ordering::Relaxed)
    }

    /// The pool generation last published.
    pub fn slice_generation(&self) -> u64 {
        self.slice_generation.load(Ordering::Relaxed)
    }

    /// The last host change to slice written time, and how many were measured.
    pub fn slice_latency_last(&self) -> (Duration, u64) {
        (
            Duration::from_nanos(self.slice_latency_nanos_last.load(Ordering::Relaxed)),
            self.slice_latency_count.load(Ordering::Relaxed),
        )
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

    /// Resyncs that made again what the host had lost of the watched layout.
    pub fn layouts_restored(&self) -> u64 {
        self.layouts_restored.load(Ordering::Relaxed)
    }

    /// Resyncs that made again devices the agent had promised and the host had lost.
    pub fn promises_restored(&self) -> u64 {
        self.promises_restored.load(Ordering::Relaxed)
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
        metric(
            "gpuslice_agent_layout_restored_total",
            "counter",
            "Resyncs that found the host had lost part of the watched layout and made it again.",
            n(&self.layouts_restored).to_string(),
        );
        metric(
            "gpuslice_agent_promises_restored_total",
            "counter",
            "Resyncs that found the host had lost devices the agent promised and made them again.",
            n(&self.promises_restored).to_string(),
        );
        metric(
            "gpuslice_agent_layout_not_in_place",
            "gauge",
            "1 while the host does not hold the watched layout and a resync could not restore it.",
            u8::from(self.layout_not_in_place.load(Ordering::Relaxed)).to_string(),
        );
        metric(
            "gpuslice_agent_slices_published_total",
            "counter",
            "ResourceSlice writes (create, update, delete) made to the API server.",
            n(&self.slices_published).to_string(),
        );
        metric(
            "gpuslice_agent_slice_publish_failures_total",
            "counter",
            "Rounds of publishing ResourceSlices that failed (retried with back-off).",
            n(&self.slice_publish_failures).to_string(),
        );
        metric(
            "gpuslice_agent_slice_generation",
            "gauge",
            "The pool generation of the node's ResourceSlices last published.",
            n(&self.slice_generation).to_string(),
        );
        metric(
            "gpuslice_agent_slice_publish_latency_seconds_sum",
            "counter",
            "Time from a host change to its ResourceSlices written, all changes together.",
            format!("{}", secs(&self.slice_latency_nanos_total)),
        );
        metric(
            "gpuslice_agent_slice_publish_latency_seconds_count",
            "counter",
            "Host changes whose ResourceSlices were written.",
            n(&self.slice_latency_count).to_string(),
        );
        metric(
            "gpuslice_agent_slice_publish_last_latency_seconds",
            "gauge",
            "Time from the last host change to its ResourceSlices written.",
            format!("{}", secs(&self.slice_latency_nanos_last)),
        );
        metric(
            "gpuslice_agent_slice_publisher_blocked",
            "gauge",
            "1 while the API server's answers keep the slice publisher from publishing (it retries with back-off).",
            u8::from(self.publisher().is_some_and(|c| !c.ready)).to_string(),
        );
        if self.apiserver_refused.get().is_some() {
            metric(
                "gpuslice_agent_apiserver_answers_refused_total",
                "counter",
                "API server answers refused because they were larger than the agent's cap (--max-apiserver-answer).",
                self.apiserver_answers_refused().to_string(),
            );
        }
        if let Some(p) = self.plugin() {
            metric(
                "gpuslice_agent_dra_plugin_blocked",
                "gauge",
                "1 while the kubelet plugin's sockets cannot be served (another process holds them; retried with back-off).",
                u8::from(!p.ready).to_string(),
            );
        }
        if self.dra_on.load(Ordering::Relaxed) {
            out.push_str(&self.dra.render());
        }
        out
    }
}

/// What the plugin counted (`/metrics`-ready figures, and the tests' witness).
#[derive(Debug, Default)]
pub struct DraStats {
    /// `NotifyRegistrationStatus` calls saying the kubelet registered the plugin.
    pub registered: AtomicU64,
    /// `NotifyRegistrationStatus` calls saying it did not.
    pub registration_failed: AtomicU64,
    /// Claims prepared (including repeats answered from the record).
    pub prepared: AtomicU64,
    /// Claims whose prepare was refused or failed.
    pub prepare_failed: AtomicU64,
    /// Claims unprepared.
    pub unprepared: AtomicU64,
    /// Claims whose unprepare failed.
    pub unprepare_failed: AtomicU64,
}

impl DraStats {
    /// Prometheus text of the counters.
    pub fn render(&self) -> String {
        let n = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let mut out = String::new();
        for (family, help, label, rows) in [
            (
                "gpuslice_dra_registrations_total",
                "Kubelet registration results of the DRA plugin.",
                "registered",
                [
                    ("true", &self.registered),
                    ("false", &self.registration_failed),
                ],
            ),
            (
                "gpuslice_dra_prepares_total",
                "Claims the DRA plugin prepared, by result.",
                "result",
                [("ok", &self.prepared), ("error", &self.prepare_failed)],
            ),
            (
                "gpuslice_dra_unprepares_total",
                "Claims the DRA plugin unprepared, by result.",
                "result",
                [("ok", &self.unprepared), ("error", &self.unprepare_failed)],
            ),
        ] {
            out.push_str(&format!(
                "# HELP {family} {help}\n# TYPE {family} counter\n"
            ));
            for (value, counter) in rows {
                out.push_str(&format!("{family}{{{label}=\"{value}\"}} {}\n", n(counter)));
            }
        }
        out
    }
}
