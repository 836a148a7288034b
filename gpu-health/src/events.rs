//! GPU events as they happen: NVML's critical XID errors and double-bit ECC errors
//! (`nvmlEventSet`), graded by the policy's [`XidPolicy`] into verdicts that hold for the
//! GPU from then on.
//!
//! A source of events sits behind [`GpuEventSource`]: [`NvmlEventSource`] on a host with the
//! NVIDIA driver (a blocking thread waits on the event set at most [`NVML_WAIT`] at a time, so
//! it notices when it is dropped), [`ChannelEventSource`] in tests. A graded event is recorded
//! in [`EventVerdicts`]; the assessment ([`crate::assess`]) folds the recorded verdicts into each
//! GPU's health, so every later read of the host keeps showing them.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use gpu_core::{Health, HealthState, PciAddress};
use serde::{Deserialize, Serialize};

use crate::nvml::NvmlUnavailable;

/// What happened to a GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case", tag = "kind")]
pub enum GpuEventKind {
    /// A critical XID error; `None` when NVML could not tell which (its 999).
    Xid {
        /// The XID number.
        xid: Option<u64>,
    },
    /// A double-bit (uncorrectable) ECC error.
    DoubleBitEcc,
}

/// One event on one GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct GpuEvent {
    /// The GPU's PCI address.
    pub address: PciAddress,
    /// What happened.
    #[serde(flatten)]
    pub kind: GpuEventKind,
}

impl GpuEvent {
    /// The event in words (`XID 79`, `double-bit ECC error`).
    pub fn describe(&self) -> String {
        match self.kind {
            GpuEventKind::Xid { xid: Some(x) } => format!("XID {x}"),
            GpuEventKind::Xid { xid: None } => "an XID error NVML could not name".to_owned(),
            GpuEventKind::DoubleBitEcc => "a double-bit ECC error".to_owned(),
        }
    }
}

/// How XID events are graded. XIDs in neither list are reported (logged) but change no verdict:
/// most are faults of the application on the GPU (13, 31, 43), not of the GPU.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct XidPolicy {
    /// XIDs that make the GPU Unhealthy until it is reset (the agent restarted after it).
    pub unhealthy: Vec<u64>,
    /// XIDs that make it Degraded.
    pub degraded: Vec<u64>,
    /// The verdict of an XID NVML could not name (999): Degraded unless set otherwise.
    pub unnamed: XidVerdict,
}

/// A verdict an event may give.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum XidVerdict {
    /// No change.
    Ignore,
    /// Degraded.
    Degraded,
    /// Unhealthy.
    Unhealthy,
}

impl Default for XidPolicy {
    /// Unhealthy: 48 (double-bit ECC), 63/64 (row remapping pending/failed), 74 (NVLink), 79
    /// (fallen off the bus), 92 (high single-bit ECC rate), 94/95 (contained/uncontained ECC),
    /// 119/120 (GSP timeouts). Degraded: 62 (internal micro-controller halt), 69 (graphics
    /// engine class error), 122..124 (SPI/PMU errors). Unnamed XIDs: Degraded.
    fn default() -> Self {
        XidPolicy {
            unhealthy: vec![48, 63, 64, 74, 79, 92, 94, 95, 119, 120],
            degraded: vec![62, 69, 122, 123, 124],
            unnamed: XidVerdict::Degraded,
        }
    }
}

impl XidPolicy {
    /// The verdict of `event` (a double-bit ECC error is always Unhealthy), with its reason;
    /// `None` when it changes nothing.
    pub fn grade(&self, event: &GpuEvent) -> Option<(HealthState, String)> {
        let verdict = match event.kind {
            GpuEventKind::DoubleBitEcc => XidVerdict::Unhealthy,
            GpuEventKind::Xid { xid: None } => self.unnamed,
            GpuEventKind::Xid { xid: Some(x) } if self.unhealthy.contains(&x) => {
                XidVerdict::Unhealthy
            }
            GpuEventKind::Xid { xid: Some(x) } if self.degraded.contains(&x) => {
                XidVerdict::Degraded
            }
            GpuEventKind::Xid { .. } => XidVerdict::Ignore,
        };
        let state = match verdict {
            XidVerdict::Ignore => return None,
            XidVerdict::Degraded => HealthState::Degraded,
            XidVerdict::Unhealthy => HealthState::Unhealthy,
        };
        Some((state, format!("NVML reported {}", event.describe())))
    }
}

/// The verdicts events gave, per GPU, shared by the source's reader and the assessment.
#[derive(Debug, Default)]
pub struct EventVerdicts {
    by_gpu: Mutex<BTreeMap<PciAddress, Health>>,
}

impl EventVerdicts {
    fn map(&self) -> std::sync::MutexGuard<'_, BTreeMap<PciAddress, Health>> {
        self.by_gpu
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Records a verdict: the GPU's recorded state becomes the worse of the two, and the reason
    /// is added (once).
    pub fn record(&self, address: PciAddress, state: HealthState, reason: String) {
        let mut map = self.map();
        let h = map.entry(address).or_insert_with(Health::healthy);
        if state.rank() > h.state.rank() {
            h.state = state;
        }
        if !h.reasons.contains(&reason) {
            h.reasons.push(reason);
        }
    }

    /// The verdict recorded for a GPU.
    pub fn get(&self, address: &PciAddress) -> Option<Health> {
        self.map().get(address).cloned()
    }

    /// Folds the recorded verdict of `address` into `health`: the worse state, both reasons.
    pub fn fold_into(&self, address: &PciAddress, health: &mut Health) {
        let Some(v) = self.get(address) else { return };
        if v.state.rank() > health.state.rank() {
            health.state = v.state;
        }
        for r in v.reasons {
            if !health.reasons.contains(&r) {
                health.reasons.push(r);
            }
        }
    }
}

/// Where GPU events come from.
pub trait GpuEventSource: Send {
    /// The next event, waiting at most `timeout`; `Ok(None)` when none came in time.
    ///
    /// # Errors
    /// The source ending (NVML went away); the reader stops.
    fn next(&mut self, timeout: Duration) -> std::io::Result<Option<GpuEvent>>;
}

/// Events sent through a channel: the fake source of tests.
#[derive(Debug)]
pub struct ChannelEventSource {
    rx: Receiver<GpuEvent>,
}

impl ChannelEventSource {
    /// A source and the sender that feeds it.
    pub fn new() -> (Sender<GpuEvent>, Self) {
        let (tx, rx) = std::sync::mpsc::channel();
        (tx, ChannelEventSource { rx })
    }
}

impl GpuEventSource for ChannelEventSource {
    fn next(&mut self, timeout: Duration) -> std::io::Result<Option<GpuEvent>> {
        recv(&self.rx, timeout)
    }
}

fn recv(rx: &Receiver<GpuEvent>, timeout: Duration) -> std::io::Result<Option<GpuEvent>> {
    match rx.recv_timeout(timeout) {
        Ok(e) => Ok(Some(e)),
        Err(RecvTimeoutError::Timeout) => Ok(None),
        Err(RecvTimeoutError::Disconnected) => Err(std::io::Error::new(
            std::io::ErrorKind::BrokenPipe,
            "the GPU event source ended",
        )),
    }
}

/// How long the NVML thread waits on the event set at a time.
pub const NVML_WAIT: Duration = Duration::from_secs(1);

/// Critical XID and double-bit ECC events of every GPU NVML sees, read by a thread of its own
/// (`nvmlEventSetWait` blocks). Dropping the source stops the thread within [`NVML_WAIT`].
#[derive(Debug)]
pub struct NvmlEventSource {
    rx: Receiver<GpuEvent>,
    stop: Arc<AtomicBool>,
    /// The GPUs whose events are watched.
    pub watched: Vec<PciAddress>,
}

impl Drop for NvmlEventSource {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// Why no NVML events can be watched.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NvmlEventsUnavailable {
    /// NVML itself did not open.
    #[error(transparent)]
    Nvml(#[from] NvmlUnavailable),
    /// NVML opened but no GPU takes event registrations (or there is none).
    #[error("no GPU accepts NVML event registrations: {0}")]
    NoDevice(String),
    /// The reader thread could not be started.
    #[error("cannot start the NVML event thread: {0}")]
    Thread(String),
}

/// NVML's bus ID (`00000000:08:00.0`, an 8-digit domain) as a PCI address.
pub fn parse_nvml_bus_id(bus_id: &str) -> Option<PciAddress> {
    let (domain, rest) = bus_id.trim().split_once(':')?;
    let domain = u32::from_str_radix(domain, 16).ok()?;
    let domain = u16::try_from(domain).ok()?;
    format!("{domain:04x}:{}", rest.to_ascii_lowercase())
        .parse()
        .ok()
}

impl NvmlEventSource {
    /// Opens NVML from `library` (the dynamic linker's `libnvidia-ml.so.1` when `None`) in a
    /// thread of its own and registers every GPU for critical XID and double-bit ECC events.
    ///
    /// # Errors
    /// [`NvmlEventsUnavailable`]: NVML absent or not answering, no GPU that takes events, the
    /// thread not starting.
    pub fn open(library: Option<&Path>) -> Result<Self, NvmlEventsUnavailable> {
        let (tx, rx) = std::sync::mpsc::channel();
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let stop = Arc::new(AtomicBool::new(false));
        let library = library.map(Path::to_path_buf);
        let flag = Arc::clone(&stop);
        std::thread::Builder::new()
            .name("gpuslice-nvml-events".to_owned())
            .spawn(move || nvml_thread(library.as_deref(), &tx, &ready_tx, &flag))
            .map_err(|e| NvmlEventsUnavailable::Thread(e.to_string()))?;
        let watched = match ready_rx.recv() {
            Ok(r) => r?,
            Err(_) => {
                return Err(NvmlEventsUnavailable::Thread(
                    "the NVML event thread ended before it was ready".to_owned(),
                ));
            }
        };
        Ok(NvmlEventSource { rx, stop, watched })
    }
}

impl GpuEventSource for NvmlEventSource {
    fn next(&mut self, timeout: Duration) -> std::io::Result<Option<GpuEvent>> {
        recv(&self.rx, timeout)
    }
}

type Ready = Sender<Result<Vec<PciAddress>, NvmlEventsUnavailable>>;

fn nvml_thread(library: Option<&Path>, tx: &Sender<GpuEvent>, ready: &Ready, stop: &AtomicBool) {
    use nvml_wrapper::bitmasks::event::EventTypes;
    use nvml_wrapper::enums::event::XidError;
    use nvml_wrapper::error::NvmlError;

    let nvml = match crate::nvml::open_library(library) {
        Ok(n) => n,
        Err(e) => {
            let _ = ready.send(Err(e.into()));
            return;
        }
    };
    let wanted = EventTypes::CRITICAL_XID_ERROR | EventTypes::DOUBLE_BIT_ECC_ERROR;
    // A registration NVML refuses frees the set it was given: the set is then built again
    // from the GPUs registered so far.
    let register_all = |devices: &[(u32, EventTypes)]| {
        let mut set = nvml.create_event_set().ok()?;
        for (i, types) in devices {
            let device = nvml.device_by_index(*i).ok()?;
            set = device.register_events(*types, set).ok()?;
        }
        Some(set)
    };
    let mut set = match nvml.create_event_set() {
        Ok(s) => Some(s),
        Err(e) => {
            let _ = ready.send(Err(NvmlEventsUnavailable::NoDevice(e.to_string())));
            return;
        }
    };
    let count = nvml.device_count().unwrap_or(0);
    let mut registered: Vec<(u32, EventTypes)> = Vec::new();
    let mut watched = Vec::new();
    let mut refused = Vec::new();
    for i in 0..count {
        let Ok(device) = nvml.device_by_index(i) else {
            continue;
        };
        let Some(address) = device
            .pci_info()
            .ok()
            .and_then(|p| parse_nvml_bus_id(&p.bus_id))
        else {
            continue;
        };
        // A GPU that takes only some of the events (no ECC) is registered for what it takes.
        let types = match device.supported_event_types() {
            Ok(t) if !(t & wanted).is_empty() => t & wanted,
            Ok(_) => {
                refused.push(format!("{address}: takes neither XID nor ECC events"));
                continue;
            }
            Err(e) => {
                refused.push(format!("{address}: {e}"));
                continue;
            }
        };
        let Some(s) = set.take() else { break };
        match device.register_events(types, s) {
            Ok(s) => {
                set = Some(s);
                registered.push((i, types));
                watched.push(address);
            }
            Err(e) => {
                refused.push(format!("{address}: {}", e.error));
                set = register_all(&registered);
            }
        }
    }
    let Some(set) = set else {
        let _ = ready.send(Err(NvmlEventsUnavailable::NoDevice(format!(
            "the event set could not be built again: {}",
            refused.join("; ")
        ))));
        return;
    };
    if watched.is_empty() {
        let why = if refused.is_empty() {
            "NVML sees no GPU".to_owned()
        } else {
            refused.join("; ")
        };
        let _ = ready.send(Err(NvmlEventsUnavailable::NoDevice(why)));
        return;
    }
    if ready.send(Ok(watched)).is_err() {
        return;
    }
    let wait_ms = u32::try_from(NVML_WAIT.as_millis()).unwrap_or(1000);
    while !stop.load(Ordering::Relaxed) {
        match set.wait(wait_ms) {
            Ok(data) => {
                let Some(address) = data
                    .device
                    .pci_info()
                    .ok()
                    .and_then(|p| parse_nvml_bus_id(&p.bus_id))
                else {
                    continue;
                };
                let kind = if data.event_type.contains(EventTypes::DOUBLE_BIT_ECC_ERROR) {
                    GpuEventKind::DoubleBitEcc
                } else {
                    GpuEventKind::Xid {
                        xid: match data.event_data {
                            Some(XidError::Value(v)) => Some(v),
                            _ => None,
                        },
                    }
                };
                if tx.send(GpuEvent { address, kind }).is_err() {
                    return;
                }
            }
            Err(NvmlError::Timeout) => {}
            // The driver went away (unloaded, GPU lost): nothing more will come.
            Err(_) => return,
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn at(s: &str) -> PciAddress {
        s.parse().unwrap()
    }

    #[test]
    fn critical_xids_and_double_bit_errors_are_unhealthy_and_application_xids_change_nothing() {
        let p = XidPolicy::default();
        let ev = |kind| GpuEvent {
            address: at("0000:08:00.0"),
            kind,
        };
        let (state, why) = p.grade(&ev(GpuEventKind::Xid { xid: Some(79) })).unwrap();
        assert_eq!(state, HealthState::Unhealthy);
        assert_eq!(why, "NVML reported XID 79");
        assert_eq!(
            p.grade(&ev(GpuEventKind::DoubleBitEcc)).map(|v| v.0),
            Some(HealthState::Unhealthy)
        );
        assert_eq!(
            p.grade(&ev(GpuEventKind::Xid { xid: Some(62) }))
                .map(|v| v.0),
            Some(HealthState::Degraded)
        );
        assert_eq!(p.grade(&ev(GpuEventKind::Xid { xid: Some(13) })), None);
        assert_eq!(
            p.grade(&ev(GpuEventKind::Xid { xid: None })).map(|v| v.0),
            Some(HealthState::Degraded)
        );
    }

    #[test]
    fn a_recorded_verdict_only_ever_gets_worse_and_is_folded_into_a_graded_health() {
        let v = EventVerdicts::default();
        let a = at("0000:08:00.0");
        v.record(a, HealthState::Unhealthy, "NVML reported XID 79".into());
        v.record(a, HealthState::Degraded, "NVML reported XID 62".into());
        let mut h = Health::healthy();
        v.fold_into(&a, &mut h);
        assert_eq!(h.state, HealthState::Unhealthy);
        assert_eq!(h.reasons.len(), 2);
        let mut other = Health::healthy();
        v.fold_into(&at("0000:09:00.0"), &mut other);
        assert_eq!(other, Health::healthy());
    }

    #[test]
    fn nvml_bus_ids_with_their_long_domain_read_as_pci_addresses() {
        assert_eq!(
            parse_nvml_bus_id("00000000:3B:00.0"),
            Some(at("0000:3b:00.0"))
        );
        assert_eq!(parse_nvml_bus_id("garbage"), None);
        assert_eq!(parse_nvml_bus_id("1ffffffff:00:00.0"), None);
    }

    #[test]
    fn without_nvml_the_event_source_says_why_and_nothing_panics() {
        let e =
            NvmlEventSource::open(Some(Path::new("/nonexistent/libnvidia-ml.so.1"))).unwrap_err();
        assert!(
            matches!(
                e,
                NvmlEventsUnavailable::Nvml(NvmlUnavailable::LibraryNotFound { .. })
            ),
            "{e}"
        );
    }
}
