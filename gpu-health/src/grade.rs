//! The rules: signals in, a graded [`Health`] with its reasons out. Pure; no host access.

use gpu_core::{Health, HealthState, PciId};
use serde::{Deserialize, Serialize};

use crate::aer::{AerCounters, AerReadings};
use crate::link::LinkReadings;
use crate::policy::{LinkFallback, LinkPolicy, Policy};
use crate::reading::Reading;
use crate::telemetry::GpuTelemetry;

/// What a link's width was judged against.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", tag = "basis")]
pub enum WidthBasis {
    /// The widest link the same device trained to before (the node agent's baseline).
    Baseline,
    /// The policy's board table: the board is wired for this many lanes.
    Board {
        /// The board's name.
        model: String,
    },
    /// The widest link among the GPUs of the same model (same vendor, device and subsystem IDs)
    /// on this host, when there are at least two.
    Peers,
    /// The chip's `max_link_width`, for lack of anything better.
    MaxWidth,
}

/// The width a link should have and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ExpectedWidth {
    /// Lanes.
    pub lanes: u32,
    /// Where the number comes from.
    #[serde(flatten)]
    pub basis: WidthBasis,
}

/// Identity of a GPU for the board table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BoardIds {
    /// Vendor ID.
    pub vendor: PciId,
    /// Device ID.
    pub device: PciId,
    /// Subsystem vendor ID.
    pub subsystem_vendor: Option<PciId>,
    /// Subsystem device ID.
    pub subsystem_device: Option<PciId>,
}

/// Chooses the width a GPU's link is judged against, in order: the device's own baseline, the
/// board table, the widest same-model peer on the host, and the policy's fallback. The result
/// never exceeds the chip's `max_link_width`. `None`: the width is not judged.
pub fn expected_width(
    policy: &LinkPolicy,
    ids: BoardIds,
    baseline_width: Option<u32>,
    peers_width: Option<u32>,
    max_width: Option<u32>,
) -> Option<ExpectedWidth> {
    if !policy.judge_width {
        return None;
    }
    let board = policy.board(
        ids.vendor,
        ids.device,
        ids.subsystem_vendor,
        ids.subsystem_device,
    );
    let chosen = if let Some(w) = baseline_width {
        Some((w, WidthBasis::Baseline))
    } else if let Some(b) = board {
        Some((
            b.width,
            WidthBasis::Board {
                model: b.model.clone(),
            },
        ))
    } else if let Some(w) = peers_width.filter(|_| policy.compare_peers) {
        Some((w, WidthBasis::Peers))
    } else {
        match policy.fallback {
            LinkFallback::MaxWidth => max_width.map(|w| (w, WidthBasis::MaxWidth)),
            LinkFallback::None => None,
        }
    };
    chosen.map(|(lanes, basis)| ExpectedWidth {
        lanes: max_width.map_or(lanes, |m| lanes.min(m)),
        basis,
    })
}

/// Earlier counter values from the baseline, for the growth rules.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct History {
    /// `TOTAL_ERR_NONFATAL` at the baseline.
    pub aer_nonfatal: Option<u64>,
    /// `TOTAL_ERR_COR` at the baseline.
    pub aer_correctable: Option<u64>,
    /// PCIe replay counter at the baseline.
    pub pcie_replays: Option<u64>,
}

/// Growth of a counter since `before`; a counter that went down was reset (reboot, driver
/// reload), so all of it is new.
fn growth(now: u64, before: Option<u64>) -> u64 {
    match before {
        Some(b) if now >= b => now - b,
        _ => now,
    }
}

/// All signals of one GPU.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Signals {
    /// PCIe AER counters.
    pub aer: AerReadings,
    /// PCIe link.
    pub link: LinkReadings,
    /// Driver telemetry; absent when no source applies to this GPU (not NVIDIA, or NVML
    /// unavailable).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub telemetry: Option<GpuTelemetry>,
}

impl Signals {
    /// True when at least one signal read as a value.
    pub fn any_read(&self) -> bool {
        self.aer.correctable.is_value()
            || self.aer.nonfatal.is_value()
            || self.aer.fatal.is_value()
            || self.link.current_width.is_value()
            || self
                .telemetry
                .as_ref()
                .is_some_and(|t| t.values_read() > 0 || t.gpu_lost)
    }
}

struct Findings(Vec<(HealthState, String)>);

impl Findings {
    fn unhealthy(&mut self, why: String) {
        self.0.push((HealthState::Unhealthy, why));
    }
    fn degraded(&mut self, why: String) {
        self.0.push((HealthState::Degraded, why));
    }
}

fn detail(c: &AerCounters) -> String {
    let s = c.nonzero_summary();
    if s.is_empty() { s } else { format!(" ({s})") }
}

/// Grades one GPU's signals under `policy`. `expected` is the width to judge the link against
/// (see [`expected_width`]); `history` holds the baseline's counters.
///
/// Reasons come worst first, one short phrase per signal that was off. A GPU none of whose
/// signals could be read is Unknown.
pub fn grade(
    policy: &Policy,
    signals: &Signals,
    expected: Option<&ExpectedWidth>,
    history: &History,
) -> Health {
    if !signals.any_read() {
        return Health {
            state: HealthState::Unknown,
            reasons: vec!["no health signal could be read".to_owned()],
        };
    }
    let mut f = Findings(Vec::new());
    grade_aer(policy, &signals.aer, history, &mut f);
    grade_link(&signals.link, expected, &mut f);
    if let Some(t) = &signals.telemetry {
        grade_telemetry(policy, t, history, &mut f);
    }
    let mut found = f.0;
    // Worst first; rule order within a state.
    found.sort_by_key(|(s, _)| std::cmp::Reverse(s.rank()));
    let state = found
        .iter()
        .map(|(s, _)| *s)
        .fold(HealthState::Healthy, HealthState::worst);
    Health {
        state,
        reasons: found.into_iter().map(|(_, r)| r).collect(),
    }
}

fn grade_aer(policy: &Policy, aer: &AerReadings, history: &History, f: &mut Findings) {
    let p = &policy.aer;
    // A counter file that exists but holds garbage (`-5`, 2^64) says nothing about the errors
    // seen: never Healthy on its word.
    for r in [&aer.fatal, &aer.nonfatal, &aer.correctable] {
        if let Reading::Unknown(why) = r {
            f.degraded(format!("AER counters unreadable: {why}"));
        }
    }
    if let Reading::Value(c) = &aer.fatal {
        if p.fatal_max.exceeded_by(c.total) {
            f.unhealthy(format!("AER fatal {}{}", c.total, detail(c)));
        }
    }
    if let Reading::Value(c) = &aer.nonfatal {
        let g = growth(c.total, history.aer_nonfatal);
        if p.nonfatal_growth_max.exceeded_by(g) {
            match history.aer_nonfatal {
                Some(_) if g != c.total => f.degraded(format!(
                    "AER non-fatal +{g} since baseline, {} in all{}",
                    c.total,
                    detail(c)
                )),
                _ => f.degraded(format!("AER non-fatal {}{}", c.total, detail(c))),
            }
        }
    }
    if let Reading::Value(c) = &aer.correctable {
        let g = growth(c.total, history.aer_correctable);
        if p.correctable_growth_max.exceeded_by(g) {
            f.degraded(format!("AER correctable +{g}{}", detail(c)));
        }
    }
}

fn grade_link(link: &LinkReadings, expected: Option<&ExpectedWidth>, f: &mut Findings) {
    let (Some(current), Some(expected)) = (link.current_width.get(), expected) else {
        return;
    };
    if current < expected.lanes {
        f.degraded(format!("link x{current} of x{}", expected.lanes));
    }
}

fn grade_telemetry(policy: &Policy, t: &GpuTelemetry, history: &History, f: &mut Findings) {
    if t.gpu_lost {
        f.unhealthy("GPU lost (fell off the bus)".to_owned());
    }
    let ecc = &policy.ecc;
    for (reading, limit, unhealthy, text) in [
        (
            &t.ecc_uncorrected_volatile,
            ecc.uncorrectable_volatile_max,
            true,
            "uncorrectable ECC {} (volatile)",
        ),
        (
            &t.ecc_uncorrected_aggregate,
            ecc.uncorrectable_aggregate_max,
            true,
            "uncorrectable ECC {} (aggregate)",
        ),
        (
            &t.ecc_corrected_volatile,
            ecc.correctable_volatile_max,
            false,
            "correctable ECC {} (volatile)",
        ),
        (
            &t.ecc_corrected_aggregate,
            ecc.correctable_aggregate_max,
            false,
            "correctable ECC {} (aggregate)",
        ),
    ] {
        if let Some(n) = reading.get() {
            if limit.exceeded_by(n) {
                let why = text.replace("{}", &n.to_string());
                if unhealthy {
                    f.unhealthy(why);
                } else {
                    f.degraded(why);
                }
            }
        }
    }
    if let Some(r) = t.row_remap.get() {
        if r.failure {
            f.unhealthy("row remapping failed".to_owned());
        }
        if r.pending && policy.row_remap.pending_degrades {
            f.degraded("row remapping pending (reset needed)".to_owned());
        }
    }
    let retired = match (t.retired_pages_sbe.get(), t.retired_pages_dbe.get()) {
        (None, None) => None,
        (a, b) => Some(a.unwrap_or(0).saturating_add(b.unwrap_or(0))),
    };
    if let Some(n) = retired {
        if policy.retirement.retired_pages_max.exceeded_by(n) {
            f.unhealthy(format!(
                "retired pages {n} (limit {})",
                policy.retirement.retired_pages_max
            ));
        }
    }
    if t.pages_pending_retirement.get() == Some(true) && policy.retirement.pending_degrades {
        f.degraded("pages pending retirement (reset needed)".to_owned());
    }
    if let Some(temp) = t.temperature_c.get() {
        let tp = &policy.temperature;
        let shutdown = t
            .shutdown_c
            .get()
            .map(|s| s.saturating_sub(tp.shutdown_margin_c));
        let slowdown = t
            .slowdown_c
            .get()
            .map(|s| s.saturating_sub(tp.slowdown_margin_c));
        if let Some(s) = shutdown.filter(|s| temp >= *s) {
            f.unhealthy(format!("temperature {temp}C at or above shutdown {s}C"));
        } else if let Some(s) = slowdown.filter(|s| temp >= *s) {
            f.degraded(format!("temperature {temp}C at or above slowdown {s}C"));
        }
    }
    if let Some(n) = t.pcie_replay_counter.get() {
        let g = growth(n, history.pcie_replays);
        if policy.pcie.replay_growth_max.exceeded_by(g) {
            f.degraded(format!("PCIe replays +{g}"));
        }
    }
}
