//! Churn on HGX nodes: Machines of 1, 2, 4 or 8 whole GPUs arrive and leave on a fleet of 8-GPU
//! NVSwitch nodes, each Machine needing one free partition of its size.
//!
//! Each step one Machine arrives and stays for a lifetime drawn uniformly from 1 to twice the
//! mean. Kinds are drawn 8 : 4 : 2 : 1 (1, 2, 4, 8 GPUs), so each size asks for the same share of
//! the GPUs; the mean lifetime is set from the offered load (1 = the Machines alive at once ask
//! for every GPU of the fleet). The stream is SplitMix64 ([`crate::churn::Rng`]): the same seed
//! gives the same trace everywhere. [`replay`] counts what a policy accepts, per size, and the
//! Machines refused while some node had enough free GPUs (refused by fragmentation).

use gpu_core::{DeviceRequest, Fleet, Machine};
use gpu_sched::testing::hgx_node;
use gpu_sched::{FleetState, Policy, SchedError};

use crate::churn::{Event, Rng};

/// The sizes of the Machines, in GPUs, and their weights in the mix.
pub const SIZES: [(u32, u64); 4] = [(1, 8), (2, 4), (4, 2), (8, 1)];

/// A fleet of `n` HGX H100 nodes (`gpu_sched::testing::hgx_node`: NVIDIA's default partitions,
/// Fabric Manager in shared NVSwitch mode).
pub fn hgx_fleet(n: usize) -> Fleet {
    Fleet {
        nodes: (0..n).map(|i| hgx_node(&format!("hgx-{i:05}"))).collect(),
        ..Fleet::default()
    }
}

/// The nodes (100,000 in the benches) and 10,000 Machines the placement examples loop over: HGX
/// nodes and Machines of 1, 2 and 4 whole GPUs in turn (`hgx`, as `place/hgx_partitions`), or the
/// mixed fleet and workload of `place/scaling`.
///
/// # Errors
/// When the generated fleet is invalid.
pub fn loop_workload(hgx: bool, nodes: usize) -> Result<(FleetState, Vec<Machine>), SchedError> {
    let fleet = if hgx {
        hgx_fleet(nodes)
    } else {
        crate::fleetgen::mixed_fleet(nodes)
    };
    let machines = (0..10_000)
        .map(|i| {
            if hgx {
                whole_machine(format!("vm-{i}"), [1, 2, 4][i % 3])
            } else {
                crate::fleetgen::workload_machine(i)
            }
        })
        .collect();
    Ok((FleetState::new(fleet)?, machines))
}

/// A Machine of `gpus` whole NVIDIA GPUs.
pub fn whole_machine(name: String, gpus: u32) -> Machine {
    Machine {
        name,
        devices: vec![DeviceRequest {
            name: "gpu".into(),
            count: Some(gpus),
            gpus: vec!["nvidia".into()],
            ..DeviceRequest::default()
        }],
        ..Machine::default()
    }
}

/// The mean GPUs one arrival asks for.
fn mean_gpus() -> f64 {
    let total: u64 = SIZES.iter().map(|s| s.1).sum();
    SIZES
        .iter()
        .map(|&(g, w)| f64::from(g) * w as f64)
        .sum::<f64>()
        / total as f64
}

/// A trace of `arrivals` Machines for `seed` at `load` on `nodes` HGX nodes.
pub fn trace(seed: u64, arrivals: usize, load: f64, nodes: usize) -> Vec<Event> {
    let gpus = (nodes * 8) as f64;
    let mean_life = ((load * gpus / mean_gpus()).round() as u64).max(1);
    let total: u64 = SIZES.iter().map(|s| s.1).sum();
    let mut rng = Rng::new(seed);
    let mut leaving: std::collections::BTreeSet<(u64, usize)> = Default::default();
    let mut out = Vec::with_capacity(arrivals * 2);
    for step in 0..arrivals as u64 {
        while let Some(&(at, i)) = leaving.first() {
            if at > step {
                break;
            }
            leaving.pop_first();
            out.push(Event::Depart(format!("vm-{i:06}")));
        }
        let mut pick = rng.below(total);
        let size = SIZES
            .iter()
            .find(|&&(_, w)| {
                if pick < w {
                    true
                } else {
                    pick -= w;
                    false
                }
            })
            .map_or(1, |s| s.0);
        let i = step as usize;
        out.push(Event::Arrive(whole_machine(format!("vm-{i:06}"), size)));
        leaving.insert((step + 1 + rng.below(2 * mean_life), i));
    }
    out
}

/// What one replay measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Report {
    /// Arrivals per size (1, 2, 4, 8 GPUs).
    pub arrivals: [usize; 4],
    /// Accepted per size.
    pub accepted: [usize; 4],
    /// Refused while some node had at least as many free GPUs as asked.
    pub refused_with_room: usize,
}

impl Report {
    /// Accepted over arrivals, all sizes.
    pub fn acceptance(&self) -> f64 {
        let a: usize = self.arrivals.iter().sum();
        if a == 0 {
            0.0
        } else {
            self.accepted.iter().sum::<usize>() as f64 / a as f64
        }
    }

    /// GPUs accepted (each Machine counted by its size).
    pub fn gpus_accepted(&self) -> usize {
        self.accepted
            .iter()
            .zip(SIZES)
            .map(|(a, (g, _))| a * g as usize)
            .sum()
    }
}

/// Replays `events` on `fleet` with `policy`.
///
/// # Errors
/// When the fleet is invalid.
pub fn replay(fleet: Fleet, events: &[Event], policy: Policy) -> Result<Report, SchedError> {
    let mut s = FleetState::new(fleet)?;
    let mut r = Report::default();
    for e in events {
        match e {
            Event::Arrive(m) => {
                let gpus = m.devices.first().map_or(1, DeviceRequest::wanted);
                let k = SIZES.iter().position(|s| s.0 == gpus).unwrap_or(0);
                r.arrivals[k] += 1;
                if s.place(m, policy).is_ok() {
                    r.accepted[k] += 1;
                } else if s.free_gpus().iter().any(|(_, f)| *f >= gpus) {
                    r.refused_with_room += 1;
                }
            }
            Event::Depart(name) => {
                let _ = s.release(name);
            }
        }
    }
    Ok(r)
}
