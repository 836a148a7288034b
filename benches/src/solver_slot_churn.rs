//! Acceptance under churn THROUGH THE SOLVER on the one slot model: Machines each asking for one
//! MIG-backed vGPU arrive and leave on a fleet of H200 nodes in MIG mode (every GPU's pool
//! tracks its GPU-instance slots), placed by [`FleetState::place`] (binpack) and released by
//! [`FleetState::release`], under each [`SlotPolicy`]:
//!
//! - **keepmost** (default): the solver takes the start that leaves the most room for later
//!   profiles and records it (`gpuInstanceStart`);
//! - **firstfit**: the solver takes the lowest free legal start and records it;
//! - **driver** (the solver before it chose starts): the instance is held at an unknown start,
//!   which the driver picks at creation; a new instance fits only where it fits whatever those
//!   starts are.
//!
//! The trace is the one of [`crate::slot_churn`]: one arrival per step, profiles drawn by
//! weight, each Machine staying for a lifetime drawn uniformly from 1 to twice the mean, the
//! mean set so that the Machines alive at once ask for `load` times the fleet's memory slots
//! (SplitMix64, seeded: the same counts on every machine).

use std::collections::HashMap;
use std::sync::Arc;

use gpu_core::{AllocatedDevice, Fleet, Machine, MigGeometry, MigSlots, PciAddress};
use gpu_sched::testing::h200_node;
use gpu_sched::{FleetState, Policy, SlotPolicy};

use crate::churn::Rng;
use crate::slot_churn::Outcome;

/// The H200's MIG-backed vGPU types the trace asks for: type name, memory slots of its GPU
/// instance, weight (1g 8, 2g 5, 3g 3, 4g 1, 7g 1).
pub const PROFILES: [(&str, u8, u32); 5] = [
    ("H200X-1-18C", 1, 8),
    ("H200X-2-35C", 2, 5),
    ("H200X-3-71C", 4, 3),
    ("H200X-4-71C", 4, 1),
    ("H200X-7-141C", 8, 1),
];

/// GPUs per node (an HGX H200 board).
pub const GPUS_PER_NODE: usize = 8;

/// A fleet of `nodes` nodes of eight H200 in MIG mode, seven VFs each, slots tracked.
pub fn fleet(nodes: usize, slots: SlotPolicy) -> FleetState {
    let g = MigGeometry::for_vgpu_board("H200X");
    let nodes = (0..nodes)
        .map(|i| {
            let mut n = h200_node(&format!("h200-{i:03}"), GPUS_PER_NODE, 7);
            for p in &mut n.mediated_devices.pools {
                p.mig_slots = g.map(|g| Arc::new(MigSlots::new(g)));
            }
            n
        })
        .collect();
    // A fleet of valid names and no allocations always indexes.
    let mut s = FleetState::new(Fleet {
        nodes,
        ..Fleet::default()
    })
    .unwrap_or_default();
    s.set_slot_policy(slots);
    s
}

/// A GPU of the fleet: its node and address.
type Gpu = (String, Option<PciAddress>);

fn gpu_of(d: &AllocatedDevice) -> Option<PciAddress> {
    match d {
        AllocatedDevice::Vgpu { gpu, .. } => *gpu,
        AllocatedDevice::Gpu { address, .. } => Some(*address),
    }
}

fn machine(name: &str, profile: &str) -> Option<Machine> {
    Machine::from_text(&format!(
        "name: {name}\ndevices: [{{name: gpu, profile: \"{profile}\"}}]"
    ))
    .ok()
}

/// Replays `arrivals` Machines on `nodes` nodes at offered load `load` with `slots`.
pub fn replay(nodes: usize, arrivals: u32, load: f64, seed: u64, slots: SlotPolicy) -> Outcome {
    let mut s = fleet(nodes, slots);
    let mut rng = Rng::new(seed);
    let total: u32 = PROFILES.iter().map(|p| p.2).sum();
    let mean_size = PROFILES
        .iter()
        .map(|p| f64::from(p.1) * f64::from(p.2))
        .sum::<f64>()
        / f64::from(total);
    let pool = (nodes * GPUS_PER_NODE * 8) as f64;
    let mean_life = (load * pool / mean_size).max(1.0) as u64;
    // (leaves at step, machine, its GPU, slots it holds); memory slots held per GPU.
    let mut alive: Vec<(u64, String, Gpu, u8)> = Vec::new();
    let mut held: HashMap<Gpu, u8> = HashMap::new();
    let gpus = nodes * GPUS_PER_NODE;
    let mut out = Outcome::default();
    for step in 0..u64::from(arrivals) {
        alive.retain(|(leave, name, gpu, size)| {
            if *leave > step {
                return true;
            }
            let _ = s.release(name);
            if let Some(h) = held.get_mut(gpu) {
                *h -= size;
            }
            false
        });
        let mut draw = rng.below(u64::from(total));
        let mut pick = PROFILES[0];
        for p in PROFILES {
            if draw < u64::from(p.2) {
                pick = p;
                break;
            }
            draw -= u64::from(p.2);
        }
        let life = 1 + rng.below(2 * mean_life);
        out.arrivals += 1;
        let name = format!("m{step}");
        let Some(m) = machine(&name, pick.0) else {
            continue;
        };
        match s.place(&m, Policy::Binpack) {
            Ok(a) => {
                let gpu = (a.node.clone(), a.devices.first().and_then(gpu_of));
                *held.entry(gpu.clone()).or_default() += pick.1;
                alive.push((step + life, name, gpu, pick.1));
                out.accepted += 1;
            }
            Err(_) => {
                // Refused while some GPU had as many free memory slots as it needs: a GPU
                // never used, or one whose held slots leave room.
                let room = held.len() < gpus || held.values().any(|h| 8 - h >= pick.1);
                if room {
                    out.refused_with_room += 1;
                }
            }
        }
    }
    out
}
