//! A seeded churn trace and the placement quality it measures.
//!
//! [`trace`] draws arrivals and departures of Machines with a mix like a real estate's: small and
//! large time-sliced vGPUs of several sizes (A2, L40S), MIG-backed slices (H200), whole GPUs and
//! multi-device Machines (2 or 4 whole H100s, 2 vGPUs). Each step one Machine arrives; each
//! Machine stays for a lifetime drawn uniformly from 1 to twice `mean_life` steps, so about
//! `mean_life` Machines are alive at once: chosen above what the fleet holds, the fleet runs full
//! and every placement choice shows in what is accepted later. The generator is a SplitMix64
//! stream: the same seed gives the same trace on every machine.
//!
//! [`run`] replays a trace on a fleet with one policy and reports the acceptance rate, the
//! Machines refused while the fleet as a whole still had the capacity (fragmentation), and the
//! framebuffer stranded on size-locked cards (free memory on time-sliced GPUs that host vGPUs,
//! usable only by vGPUs of the size they are locked to).

use std::collections::HashMap;

use gpu_core::{AllocatedDevice, DeviceRequest, Fleet, Machine, PciAddress};
use gpu_sched::{FleetState, Policy};

/// One step of a trace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// A Machine asks to be placed.
    Arrive(Machine),
    /// A Machine leaves (released if it was placed).
    Depart(String),
}

/// SplitMix64: small, fast, and the same everywhere.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A stream for a seed.
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }
    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    /// A number in `0..n` (`n > 0`).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }
}

/// The kinds of Machines and their weights in the mix.
const MIX: &[(u64, &str, u32)] = &[
    // (weight, profile or "whole", count)
    (10, "A2-2Q", 1),
    (14, "A2-4Q", 1),
    (10, "A2-8Q", 1),
    (4, "A2-16Q", 1),
    (8, "L40S-4Q", 1),
    (10, "L40S-8Q", 1),
    (6, "L40S-16Q", 1),
    (4, "L40S-24Q", 1),
    (2, "L40S-48Q", 1),
    (3, "L40S-8Q", 2),
    (8, "H200X-1-18C", 1),
    (5, "H200X-2-35C", 1),
    (3, "H200X-3-71C", 1),
    (2, "H200X-7-141C", 1),
    (6, "whole", 1),
    (3, "whole", 2),
    (2, "whole", 4),
];

fn machine_of(name: String, kind: usize) -> Machine {
    let (_, what, count) = MIX[kind];
    let request = if what == "whole" {
        DeviceRequest {
            name: "gpu".into(),
            vendor: Some("nvidia".into()),
            model: Some("H100".into()),
            count: Some(count),
            ..DeviceRequest::default()
        }
    } else {
        DeviceRequest {
            name: "gpu".into(),
            profile: Some(what.into()),
            count: Some(count),
            ..DeviceRequest::default()
        }
    };
    Machine {
        name,
        devices: vec![request],
        ..Machine::default()
    }
}

/// A trace of `arrivals` Machines for `seed`, about `mean_life` alive at a time.
pub fn trace(seed: u64, arrivals: usize, mean_life: u64) -> Vec<Event> {
    let mut rng = Rng::new(seed);
    let total: u64 = MIX.iter().map(|m| m.0).sum();
    // (step it leaves, name); kept sorted by step, then arrival order.
    let mut leaving: Vec<(u64, usize)> = Vec::new();
    let mut out = Vec::with_capacity(arrivals * 2);
    for step in 0..arrivals as u64 {
        while let Some(&(at, i)) = leaving.first() {
            if at > step {
                break;
            }
            leaving.remove(0);
            out.push(Event::Depart(format!("vm-{i:06}")));
        }
        let mut pick = rng.below(total);
        let kind = MIX
            .iter()
            .position(|m| {
                if pick < m.0 {
                    true
                } else {
                    pick -= m.0;
                    false
                }
            })
            .unwrap_or(0);
        let i = step as usize;
        out.push(Event::Arrive(machine_of(format!("vm-{i:06}"), kind)));
        let life = 1 + rng.below(2 * mean_life.max(1));
        let at = step + life;
        let pos = leaving.partition_point(|&(a, j)| (a, j) < (at, i));
        leaving.insert(pos, (at, i));
    }
    out
}

/// What a replay measured.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Report {
    /// Machines that arrived.
    pub arrivals: usize,
    /// Machines placed.
    pub accepted: usize,
    /// Machines refused although the fleet as a whole had enough free instances (or whole GPUs)
    /// of each kind they asked for: refused by fragmentation.
    pub refused_with_room: usize,
    /// Framebuffer on time-sliced GPUs that host vGPUs and is still free, averaged over the
    /// samples (every 50 steps after the first quarter), in GiB.
    pub stranded_gib: f64,
    /// The same as a share of the time-sliced GPUs' framebuffer.
    pub stranded_share: f64,
    /// What the accepted Machines asked for, in GPUs: a whole GPU counts 1, a vGPU its
    /// framebuffer over its GPU's memory (an A2-4Q a quarter, an H200X-1-18C about an eighth).
    pub accepted_gpus: f64,
}

impl Report {
    /// Accepted / arrivals.
    pub fn acceptance(&self) -> f64 {
        if self.arrivals == 0 {
            0.0
        } else {
            self.accepted as f64 / self.arrivals as f64
        }
    }
}

/// Whether the fleet as a whole has the capacity a Machine asks for, fragmentation aside.
fn fleet_has_room(s: &FleetState, m: &Machine) -> bool {
    m.devices.iter().all(|d| match &d.profile {
        Some(p) => {
            let free: u64 = s.free_instances(p).iter().map(|(_, f)| u64::from(*f)).sum();
            free >= u64::from(d.wanted())
        }
        None => {
            let free: u64 = s.free_gpus().iter().map(|(_, f)| u64::from(*f)).sum();
            free >= u64::from(d.wanted())
        }
    })
}

/// Replays a trace on a fleet with one policy.
///
/// # Errors
/// When the fleet is invalid.
pub fn run(
    fleet: Fleet,
    events: &[Event],
    policy: Policy,
) -> Result<Report, gpu_sched::SchedError> {
    // Memory of the time-sliced GPUs, per (node, address).
    let mut memory: HashMap<(String, PciAddress), u64> = HashMap::new();
    let mut ts_total: u64 = 0;
    // Memory of every GPU, per (node, address), for the size of what is accepted.
    let mut all_memory: HashMap<(String, PciAddress), u64> = HashMap::new();
    for n in &fleet.nodes {
        for g in &n.gpus {
            all_memory.insert((n.node.clone(), g.address), g.memory_mib.unwrap_or(0));
            let ts = n.mediated_devices.parents.iter().any(|p| {
                p.gpu == Some(g.address) && p.profiles.iter().any(|t| t.mig_slices.is_none())
            });
            if ts {
                let m = g.memory_mib.unwrap_or(0);
                memory.insert((n.node.clone(), g.address), m);
                ts_total += m;
            }
        }
    }
    let mut s = FleetState::new(fleet)?;
    let mut report = Report::default();
    let arrivals = events
        .iter()
        .filter(|e| matches!(e, Event::Arrive(_)))
        .count();
    let mut seen = 0usize;
    let (mut stranded_sum, mut samples) = (0u64, 0u64);

    for e in events {
        match e {
            Event::Arrive(m) => {
                seen += 1;
                report.arrivals += 1;
                match s.place(m, policy) {
                    Ok(a) => {
                        report.accepted += 1;
                        report.accepted_gpus += gpus_of(&a, &all_memory);
                    }
                    Err(_) => {
                        if fleet_has_room(&s, m) {
                            report.refused_with_room += 1;
                        }
                    }
                }
                if seen > arrivals / 4 && seen % 50 == 0 {
                    stranded_sum += stranded_mib(&s, &memory);
                    samples += 1;
                }
            }
            Event::Depart(name) => {
                let _ = s.release(name);
            }
        }
    }
    if samples > 0 {
        let mean = stranded_sum as f64 / samples as f64;
        report.stranded_gib = mean / 1024.0;
        report.stranded_share = if ts_total > 0 {
            mean / ts_total as f64
        } else {
            0.0
        };
    }
    Ok(report)
}

/// The GPUs an allocation takes: whole GPUs 1 each, vGPUs their share of their GPU's memory.
fn gpus_of(a: &gpu_core::Allocation, memory: &HashMap<(String, PciAddress), u64>) -> f64 {
    a.devices
        .iter()
        .map(|d| match d {
            AllocatedDevice::Gpu { .. } => 1.0,
            AllocatedDevice::Vgpu {
                gpu: Some(g),
                framebuffer_mib: Some(fb),
                ..
            } => match memory.get(&(a.node.clone(), *g)) {
                Some(&m) if m > 0 => (*fb as f64 / m as f64).min(1.0),
                _ => 0.0,
            },
            AllocatedDevice::Vgpu { .. } => 0.0,
        })
        .sum()
}

fn stranded_mib(s: &FleetState, memory: &HashMap<(String, PciAddress), u64>) -> u64 {
    let mut used: HashMap<(String, PciAddress), u64> = HashMap::new();
    for a in s.allocations() {
        for d in &a.devices {
            if let AllocatedDevice::Vgpu {
                gpu: Some(g),
                framebuffer_mib,
                mig_slices: None,
                ..
            } = d
            {
                *used.entry((a.node.clone(), *g)).or_default() += framebuffer_mib.unwrap_or(0);
            }
        }
    }
    used.iter()
        .map(|(k, u)| memory.get(k).map_or(0, |m| m.saturating_sub(*u)))
        .sum()
}
