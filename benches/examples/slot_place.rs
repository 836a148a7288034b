//! Time per `FleetState::place` of MIG-backed vGPU Machines on a fleet of H200 nodes in MIG
//! mode with GPU-instance slots tracked, under each slot policy: what choosing the start costs
//! against leaving it to the driver (the solver before it chose). Wall-clock, so compare only
//! numbers of one run.
//!
//! `cargo run --release -p gpuslice-benches --example slot_place [NODES MACHINES]`

use std::time::Instant;

use gpu_core::Machine;
use gpu_sched::{Policy, SlotPolicy};
use gpuslice_benches::solver_slot_churn::{PROFILES, fleet};

fn main() {
    let arg = |i: usize, default: usize| {
        std::env::args()
            .nth(i)
            .and_then(|a| a.parse().ok())
            .unwrap_or(default)
    };
    let (nodes, count) = (arg(1, 1_000), arg(2, 4_000));
    // 1g, 2g, 1g, 3g, ... in turn: every GPU ends up with mixed instances.
    let machines: Vec<Machine> = (0..count)
        .filter_map(|i| {
            let p = PROFILES[[0, 1, 0, 2, 0, 3][i % 6]].0;
            Machine::from_text(&format!(
                "name: m{i}\ndevices: [{{name: gpu, profile: \"{p}\"}}]"
            ))
            .ok()
        })
        .collect();
    for policy in [
        SlotPolicy::Driver,
        SlotPolicy::FirstFit,
        SlotPolicy::KeepMost,
    ] {
        let mut s = fleet(nodes, policy);
        let mut times: Vec<u128> = Vec::with_capacity(machines.len());
        let mut placed = 0;
        for m in &machines {
            let t = Instant::now();
            placed += usize::from(s.place(m, Policy::Binpack).is_ok());
            times.push(t.elapsed().as_nanos());
        }
        times.sort_unstable();
        let median = times.get(times.len() / 2).copied().unwrap_or(0);
        let p90 = times.get(times.len() * 9 / 10).copied().unwrap_or(0);
        println!(
            "{policy:>8}: {nodes} nodes, {placed}/{} placed, median {:.2} us, p90 {:.2} us",
            machines.len(),
            median as f64 / 1e3,
            p90 as f64 / 1e3
        );
    }
}
