//! Reading and grading every GPU of a host, and writing the verdicts into a topology.

use std::collections::BTreeMap;
use std::sync::Arc;

use gpu_core::{Gpu, Health, NodeTopology, PciAddress, PciId};
use gpu_sysfs::Host;
use gpu_sysfs::link::LinkFiles;
use serde::{Deserialize, Serialize};

use crate::aer::{AerReadings, read_aer};
use crate::baseline::{Baseline, DeviceBaseline};
use crate::grade::{BoardIds, ExpectedWidth, History, Signals, expected_width, grade};
use crate::link::{LinkReadings, read_link};
use crate::nvml::NvmlTelemetry;
use crate::policy::Policy;
use crate::reading::Reading;
use crate::telemetry::{GpuTelemetry, Telemetry};

/// PCI vendor ID of NVIDIA: only its GPUs are asked for NVML telemetry.
const NVIDIA: PciId = PciId(0x10de);

/// Where the baseline comes from.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum BaselineSource {
    /// [`crate::baseline::BASELINE_PATH`] under the host root, when present (the default).
    #[default]
    FromHost,
    /// No baseline: growth counts from boot, widths are judged without history.
    None,
    /// This baseline.
    Given(Baseline),
}

/// How to assess health: the policy, the telemetry source and the baseline.
#[derive(Debug, Clone)]
pub struct HealthOptions {
    /// Grading rules.
    pub policy: Policy,
    /// Driver telemetry (NVML); `None` leaves the NVML signals of NVIDIA GPUs Unknown.
    pub telemetry: Option<Arc<dyn Telemetry>>,
    /// Why telemetry is unavailable although it was wanted: NVIDIA GPUs then show their NVML
    /// signals as Unknown with this reason. `None` with no telemetry: NVML was not asked for.
    pub telemetry_note: Option<String>,
    /// Baseline source.
    pub baseline: BaselineSource,
    /// Verdicts of GPU events (NVML XIDs, double-bit ECC) received so far, folded into every
    /// assessment; `None` when no event source runs.
    pub events: Option<Arc<crate::events::EventVerdicts>>,
}

impl Default for HealthOptions {
    /// The default policy, NVML when it can be opened, the host's baseline.
    fn default() -> Self {
        Self::with_nvml(Policy::default())
    }
}

impl HealthOptions {
    /// `policy` with NVML when `libnvidia-ml.so.1` loads and the driver answers; otherwise no
    /// telemetry, with the reason kept in [`HealthOptions::telemetry_note`].
    pub fn with_nvml(policy: Policy) -> Self {
        match NvmlTelemetry::open(None) {
            Ok(t) => Self::with_telemetry(policy, Arc::new(t)),
            Err(e) => Self::unavailable(policy, &e),
        }
    }

    /// `policy` without the NVML that was wanted: NVIDIA GPUs show their NVML signals as
    /// Unknown, saying why.
    pub fn unavailable(policy: Policy, why: &crate::NvmlUnavailable) -> Self {
        HealthOptions {
            telemetry_note: Some(format!("NVML unavailable: {why}")),
            ..Self::without_telemetry(policy)
        }
    }

    /// Options for discovering the host under `root`: NVML reads the GPUs of the machine this
    /// runs on, so it is only asked when `root` is that machine's `/` ([`is_local_root`]); under
    /// another root (a recorded or fake tree) its answers would describe other hardware.
    pub fn for_root(root: &std::path::Path, policy: Policy) -> Self {
        if is_local_root(root) {
            Self::with_nvml(policy)
        } else {
            Self::without_telemetry(policy)
        }
    }

    /// `policy` without telemetry: sysfs signals only, NVML signals left out of the reports.
    pub fn without_telemetry(policy: Policy) -> Self {
        HealthOptions {
            policy,
            telemetry: None,
            telemetry_note: None,
            baseline: BaselineSource::FromHost,
            events: None,
        }
    }

    /// `policy` with this telemetry source.
    pub fn with_telemetry(policy: Policy, telemetry: Arc<dyn Telemetry>) -> Self {
        HealthOptions {
            policy,
            telemetry: Some(telemetry),
            telemetry_note: None,
            baseline: BaselineSource::FromHost,
            events: None,
        }
    }

    /// The same options with verdicts of GPU events folded into every assessment.
    pub fn with_event_verdicts(mut self, verdicts: Arc<crate::events::EventVerdicts>) -> Self {
        self.events = Some(verdicts);
        self
    }

    /// The same options with another baseline source.
    pub fn baseline(mut self, source: BaselineSource) -> Self {
        self.baseline = source;
        self
    }
}

/// One GPU's verdict with everything it was based on.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GpuHealthReport {
    /// Per-node name (`nvidia0`).
    pub name: String,
    /// PCI address.
    pub address: PciAddress,
    /// The verdict.
    pub health: Health,
    /// Framebuffer size from telemetry, when read.
    #[serde(default, rename = "memoryMiB", skip_serializing_if = "Option::is_none")]
    pub memory_mib: Option<u64>,
    /// The width the link was judged against; absent when not judged.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expected_link_width: Option<ExpectedWidth>,
    /// The telemetry source, when one was asked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub telemetry_source: Option<String>,
    /// Every signal as read.
    pub signals: Signals,
    /// Problems met while reading (garbled files, missing library, bad baseline).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
}

fn ids(g: &Gpu) -> BoardIds {
    BoardIds {
        vendor: g.vendor_id,
        device: g.device_id,
        subsystem_vendor: g.subsystem_vendor_id,
        subsystem_device: g.subsystem_device_id,
    }
}

fn load_baseline(host: &dyn Host, source: &BaselineSource) -> (Option<Baseline>, Option<String>) {
    match source {
        BaselineSource::None => (None, None),
        BaselineSource::Given(b) => (Some(b.clone()), None),
        BaselineSource::FromHost => match Baseline::load(host) {
            Ok(b) => (b, None),
            Err(e) => (None, Some(format!("baseline ignored: {e}"))),
        },
    }
}

fn push_unknown<T>(warnings: &mut Vec<String>, r: &Reading<T>) {
    if let Reading::Unknown(why) = r {
        if !why.ends_with("not reported") && !warnings.contains(why) {
            warnings.push(why.clone());
        }
    }
}

/// Reads and grades every GPU in `gpus` (in that order). Never fails: what cannot be read is
/// Unknown, and the report's warnings say why.
pub fn assess(host: &dyn Host, gpus: &[Gpu], opts: &HealthOptions) -> Vec<GpuHealthReport> {
    assess_with_links(host, gpus, opts, &BTreeMap::new())
}

/// [`assess`], judging each GPU's link from the files in `links` (as discovery read them) and
/// reading the link files only of GPUs not in it.
pub fn assess_with_links(
    host: &dyn Host,
    gpus: &[Gpu],
    opts: &HealthOptions,
    links: &BTreeMap<PciAddress, LinkFiles>,
) -> Vec<GpuHealthReport> {
    let (baseline, baseline_warning) = load_baseline(host, &opts.baseline);
    let read: Vec<(AerReadings, LinkReadings)> = gpus
        .iter()
        .map(|g| {
            let link = links
                .get(&g.address)
                .map_or_else(|| read_link(host, &g.address), LinkReadings::from_files);
            (read_aer(host, &g.address), link)
        })
        .collect();
    gpus.iter()
        .zip(&read)
        .map(|(gpu, (aer, link))| {
            // The widest link of the same-model group, this GPU included; only with a peer.
            let group: Vec<Option<u32>> = gpus
                .iter()
                .zip(&read)
                .filter(|(other, _)| ids(other) == ids(gpu))
                .map(|(_, (_, l))| l.current_width.get())
                .collect();
            let peers_width = if group.len() > 1 {
                group.into_iter().flatten().max()
            } else {
                None
            };
            let entry: Option<&DeviceBaseline> = baseline
                .as_ref()
                .and_then(|b| b.entry(&gpu.address, gpu.vendor_id, gpu.device_id));
            let expected = expected_width(
                &opts.policy.link,
                ids(gpu),
                entry.and_then(|e| e.link_width),
                peers_width,
                link.max_width.get(),
            );
            let history = History {
                aer_nonfatal: entry.and_then(|e| e.aer_nonfatal),
                aer_correctable: entry.and_then(|e| e.aer_correctable),
                pcie_replays: entry.and_then(|e| e.pcie_replays),
            };
            let mut warnings = Vec::new();
            // NVML sees only GPUs its driver holds: not one bound to vfio-pci for a VM.
            let nvml_applies =
                gpu.vendor_id == NVIDIA && gpu.driver.as_deref().is_none_or(|d| d == "nvidia");
            let (telemetry, telemetry_source) = if nvml_applies {
                match (&opts.telemetry, &opts.telemetry_note) {
                    (Some(t), _) => (Some(t.read(&gpu.address)), Some(t.source())),
                    // Telemetry was wanted but is unavailable: its signals are Unknown.
                    (None, Some(why)) => {
                        warnings.push(why.clone());
                        (Some(GpuTelemetry::unknown(why)), None)
                    }
                    // Telemetry was not asked for.
                    (None, None) => (None, None),
                }
            } else {
                (None, None)
            };
            for r in [&aer.correctable, &aer.nonfatal, &aer.fatal] {
                push_unknown(&mut warnings, r);
            }
            push_unknown(&mut warnings, &link.current_width);
            push_unknown(&mut warnings, &link.max_width);
            if let (Some(t), Some(_)) = (&telemetry, &telemetry_source) {
                for r in [
                    &t.ecc_uncorrected_volatile,
                    &t.ecc_corrected_volatile,
                    &t.memory_total_bytes,
                ] {
                    push_unknown(&mut warnings, r);
                }
                push_unknown(&mut warnings, &t.temperature_c);
            }
            if let Some(w) = &baseline_warning {
                warnings.push(w.clone());
            }
            let signals = Signals {
                aer: aer.clone(),
                link: link.clone(),
                telemetry,
            };
            let mut health = grade(&opts.policy, &signals, expected.as_ref(), &history);
            if let Some(v) = &opts.events {
                v.fold_into(&gpu.address, &mut health);
            }
            GpuHealthReport {
                name: gpu.name.clone(),
                address: gpu.address,
                health,
                memory_mib: signals
                    .telemetry
                    .as_ref()
                    .and_then(GpuTelemetry::memory_mib),
                expected_link_width: expected,
                telemetry_source,
                signals,
                warnings,
            }
        })
        .collect()
}

/// Writes verdicts into a topology: each GPU's `health` (and `memoryMiB` when telemetry read
/// it), and each vGPU parent's `health` from its physical GPU.
pub fn apply(topology: &mut NodeTopology, reports: &[GpuHealthReport]) {
    for gpu in &mut topology.gpus {
        if let Some(r) = reports.iter().find(|r| r.address == gpu.address) {
            gpu.health = r.health.clone();
            if let Some(m) = r.memory_mib {
                gpu.memory_mib = Some(m);
                gpu.memory_is_lower_bound = false;
            }
        }
    }
    for parent in &mut topology.mediated_devices.parents {
        if let Some(r) = parent
            .gpu
            .and_then(|g| reports.iter().find(|r| r.address == g))
        {
            parent.health = r.health.clone();
        }
    }
}

/// Assesses the GPUs of `topology` and writes the verdicts into it; returns the reports.
pub fn grade_topology(
    host: &dyn Host,
    topology: &mut NodeTopology,
    opts: &HealthOptions,
) -> Vec<GpuHealthReport> {
    grade_topology_with_links(host, topology, opts, &BTreeMap::new())
}

/// [`grade_topology`] with the link files discovery read ([`assess_with_links`]).
pub fn grade_topology_with_links(
    host: &dyn Host,
    topology: &mut NodeTopology,
    opts: &HealthOptions,
    links: &BTreeMap<PciAddress, LinkFiles>,
) -> Vec<GpuHealthReport> {
    let reports = assess_with_links(host, &topology.gpus, opts, links);
    apply(topology, &reports);
    reports
}

/// The baseline to keep after this assessment: each GPU's widest link so far (never lowered,
/// so a link that dropped keeps showing as dropped), and its counters as they are now. Entries
/// of GPUs not assessed now are kept.
pub fn updated_baseline(
    previous: Option<&Baseline>,
    gpus: &[Gpu],
    reports: &[GpuHealthReport],
) -> Baseline {
    let mut out = previous.cloned().unwrap_or_default();
    for (gpu, r) in gpus.iter().zip(reports) {
        let old = previous.and_then(|b| b.entry(&gpu.address, gpu.vendor_id, gpu.device_id));
        let mut e = DeviceBaseline::new(gpu.vendor_id, gpu.device_id);
        let now = r.signals.link.current_width.get();
        e.link_width = match (old.and_then(|o| o.link_width), now) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        };
        let total = |c: &Reading<crate::aer::AerCounters>| c.value().map(|c| c.total);
        e.aer_nonfatal = total(&r.signals.aer.nonfatal).or(old.and_then(|o| o.aer_nonfatal));
        e.aer_correctable =
            total(&r.signals.aer.correctable).or(old.and_then(|o| o.aer_correctable));
        e.pcie_replays = r
            .signals
            .telemetry
            .as_ref()
            .and_then(|t| t.pcie_replay_counter.get())
            .or(old.and_then(|o| o.pcie_replays));
        out.devices.insert(gpu.address, e);
    }
    out
}

/// True when `root` is this machine's `/`, the only root whose GPUs the local NVML describes.
pub fn is_local_root(root: &std::path::Path) -> bool {
    gpu_sysfs::is_local_root(root)
}
