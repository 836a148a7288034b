//! Seeded churn traces and the placement quality they measure.
//!
//! A trace draws arrivals and departures of Machines with a mix like a real estate's: small and
//! large time-sliced vGPUs of several sizes (A2, L40S), MIG-backed slices (H200), whole GPUs and
//! multi-device Machines (2 or 4 whole H100s, 2 vGPUs). Each step one Machine arrives; each
//! Machine stays for a lifetime drawn uniformly from 1 to twice the mean, so about the mean
//! lifetime's number of Machines are alive at once. The generator is a SplitMix64 stream: the
//! same seed gives the same trace on every machine.
//!
//! [`trace_at_load`] sets the load directly: every GPU model's sub-fleet is asked for the same
//! share of its GPUs (the offered load, 1 = all it has), as in a fleet sized for its demand.
//! [`trace`] keeps one fixed mix (the *skewed* one) and takes the mean lifetime: at 700 Machines
//! alive it asks the churn fleet's A2s for about 1.2 times what they hold, its H100s for 1.75
//! times, its L40S for 0.8 and its H200s for 0.55 ([`demand_per_model`]).
//!
//! [`run`] replays a trace on a fleet with one policy and reports the acceptance rate, the
//! Machines refused while the fleet as a whole still had the capacity (fragmentation), and the
//! framebuffer stranded on size-locked cards (free memory on time-sliced GPUs that host vGPUs,
//! usable only by vGPUs of the size they are locked to).

use std::collections::HashMap;

use gpu_core::{AllocatedDevice, DeviceRequest, Fleet, Machine, PciAddress};
use gpu_sched::{FleetState, Policy};

use crate::fleetgen::GPUS_PER_NODE;

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

/// The kinds of Machines, their weights in the mix, and how many of each kind's devices one GPU
/// holds (an A2 eight A2-2Q, an L40S twelve L40S-4Q, an H200 three 2-slice instances in its seven
/// slices, a whole GPU one).
const MIX: &[(u64, &str, u32, u32)] = &[
    // (weight, profile or "whole", devices per Machine, devices per GPU)
    (10, "A2-2Q", 1, 8),
    (14, "A2-4Q", 1, 4),
    (10, "A2-8Q", 1, 2),
    (4, "A2-16Q", 1, 1),
    (8, "L40S-4Q", 1, 12),
    (10, "L40S-8Q", 1, 6),
    (6, "L40S-16Q", 1, 3),
    (4, "L40S-24Q", 1, 2),
    (2, "L40S-48Q", 1, 1),
    (3, "L40S-8Q", 2, 6),
    (8, "H200X-1-18C", 1, 7),
    (5, "H200X-2-35C", 1, 3),
    (3, "H200X-3-71C", 1, 2),
    (2, "H200X-7-141C", 1, 1),
    (6, "whole", 1, 1),
    (3, "whole", 2, 1),
    (2, "whole", 4, 1),
];

/// The GPU model a kind of Machine asks for: its sub-fleet of the churn fleet.
fn model_of(kind: usize) -> &'static str {
    match MIX[kind].1 {
        "whole" => "H100",
        p => board(p),
    }
}

/// The board of a vGPU profile name (`A2` of `A2-4Q`, `H200X` of `H200X-1-18C`).
fn board(profile: &str) -> &str {
    profile.split('-').next().unwrap_or(profile)
}

/// The GPU model a Machine of a trace asks for: its profile's board (`A2`, `L40S`, `H200X`) or
/// the whole GPUs' model (`H100`).
pub fn model_of_machine(m: &Machine) -> String {
    m.devices
        .first()
        .map_or_else(String::new, |d| match &d.profile {
            Some(p) => board(p).to_owned(),
            None => d.model.clone().unwrap_or_else(|| "whole".to_owned()),
        })
}

/// The GPUs one Machine of a kind takes.
fn gpus_of_kind(kind: usize) -> f64 {
    let (_, _, count, per_gpu) = MIX[kind];
    f64::from(count) / f64::from(per_gpu.max(1))
}

/// The mix of [`trace_at_load`]: the kinds of the skewed mix with the same proportions within
/// each GPU model, and each model's share of arrivals set so that every model is asked for the
/// same GPUs (the churn fleet has as many GPUs of each model). Returns the weights (millionths,
/// in the order of the kinds) and the mean lifetime at which the Machines alive at once ask for
/// `load` times `gpus`.
pub fn balanced(load: f64, gpus: f64) -> (Vec<u64>, u64) {
    // GPUs asked for per unit of weight, per model.
    let demand = |model: &str| -> f64 {
        (0..MIX.len())
            .filter(|&k| model_of(k) == model)
            .map(|k| MIX[k].0 as f64 * gpus_of_kind(k))
            .sum()
    };
    let weights: Vec<f64> = (0..MIX.len())
        .map(|k| MIX[k].0 as f64 / demand(model_of(k)))
        .collect();
    let total: f64 = weights.iter().sum();
    let gpus_per_machine = weights
        .iter()
        .enumerate()
        .map(|(k, w)| w * gpus_of_kind(k))
        .sum::<f64>()
        / total;
    let mean_life = (load * gpus / gpus_per_machine).round().max(1.0) as u64;
    let weights = weights
        .iter()
        .map(|w| (w / total * 1e6).round() as u64)
        .collect();
    (weights, mean_life)
}

/// A trace of `arrivals` Machines for `seed` on the churn fleet of `nodes` nodes (a multiple of
/// four: as many nodes of each model), with the mix of [`balanced`]: the Machines alive at once
/// ask for about `load` times the fleet's GPUs, every GPU model alike. At `load` 1 the fleet is
/// asked for all it has.
pub fn trace_at_load(seed: u64, arrivals: usize, load: f64, nodes: usize) -> Vec<Event> {
    let (weights, mean_life) = balanced(load, (nodes * GPUS_PER_NODE) as f64);
    trace_with(seed, arrivals, mean_life, &weights)
}

/// The GPUs asked for at once by each GPU model's Machines in a mix of `weights` (as
/// [`balanced`] returns) with `alive` Machines alive.
pub fn demand_per_model(weights: &[u64], alive: f64) -> Vec<(&'static str, f64)> {
    let total: u64 = weights.iter().sum();
    let mut out: Vec<(&'static str, f64)> = Vec::new();
    for (k, &w) in weights.iter().enumerate().take(MIX.len()) {
        let gpus = alive * w as f64 / total.max(1) as f64 * gpus_of_kind(k);
        match out.iter_mut().find(|(m, _)| *m == model_of(k)) {
            Some((_, g)) => *g += gpus,
            None => out.push((model_of(k), gpus)),
        }
    }
    out
}

/// The weights of the skewed mix of [`trace`], in the order of [`balanced`]'s.
pub fn skewed() -> Vec<u64> {
    MIX.iter().map(|m| m.0).collect()
}

fn machine_of(name: String, kind: usize) -> Machine {
    let (_, what, count, _) = MIX[kind];
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

/// A trace of `arrivals` Machines for `seed` with the skewed mix, about `mean_life` alive at a
/// time.
pub fn trace(seed: u64, arrivals: usize, mean_life: u64) -> Vec<Event> {
    trace_with(seed, arrivals, mean_life, &skewed())
}

fn trace_with(seed: u64, arrivals: usize, mean_life: u64, weights: &[u64]) -> Vec<Event> {
    let mut rng = Rng::new(seed);
    let total: u64 = weights.iter().sum();
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
        let kind = weights
            .iter()
            .position(|&w| {
                if pick < w {
                    true
                } else {
                    pick -= w;
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
    time_sliced_use(s)
        .iter()
        .map(|(k, (_, u))| memory.get(k).map_or(0, |m| m.saturating_sub(*u)))
        .sum()
}

/// The time-sliced GPUs hosting vGPUs now, per (node, address): the vGPU type they are locked to
/// (the last one seen, without an `NVIDIA ` prefix) and the framebuffer their vGPUs use.
pub fn time_sliced_use(s: &FleetState) -> HashMap<(String, PciAddress), (String, u64)> {
    let mut used: HashMap<(String, PciAddress), (String, u64)> = HashMap::new();
    for a in s.allocations() {
        for d in &a.devices {
            if let AllocatedDevice::Vgpu {
                gpu: Some(g),
                profile_name,
                framebuffer_mib,
                mig_slices: None,
                ..
            } = d
            {
                let e = used.entry((a.node.clone(), *g)).or_default();
                e.0 = profile_name.trim_start_matches("NVIDIA ").to_owned();
                e.1 += framebuffer_mib.unwrap_or(0);
            }
        }
    }
    used
}
