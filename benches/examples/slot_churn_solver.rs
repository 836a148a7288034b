//! Acceptance under churn through the solver on the one slot model (`FleetState::place` and
//! `release` of MIG-backed vGPU Machines on H200 nodes in MIG mode), keep-most against
//! first-fit and the start left to the driver; the table in `benches/RESULTS-slots.md`.
//!
//! `cargo run --release -p gpuslice-benches --example slot_churn_solver [NODES ARRIVALS SEEDS]`

use gpu_sched::SlotPolicy;
use gpuslice_benches::slot_churn::Outcome;
use gpuslice_benches::solver_slot_churn::{GPUS_PER_NODE, replay};

fn main() {
    let args: Vec<u64> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let nodes = args.first().copied().unwrap_or(25) as usize;
    let arrivals = args.get(1).copied().unwrap_or(20_000) as u32;
    let seeds = args.get(2).copied().unwrap_or(5);
    println!(
        "{nodes} nodes x {GPUS_PER_NODE} H200, {arrivals} arrivals per seed, seeds 1..={seeds}"
    );
    println!("| offered load | slot policy | acceptance | refused with room |");
    println!("|---|---|---|---|");
    for load in [0.8, 0.9, 1.0, 1.1, 1.2, 1.5] {
        for policy in [
            SlotPolicy::KeepMost,
            SlotPolicy::FirstFit,
            SlotPolicy::Driver,
        ] {
            let mut t = Outcome::default();
            for seed in 1..=seeds {
                let o = replay(nodes, arrivals, load, seed, policy);
                t.arrivals += o.arrivals;
                t.accepted += o.accepted;
                t.refused_with_room += o.refused_with_room;
            }
            println!(
                "| {load} | {policy} | {:.2}% ({}/{}) | {} |",
                100.0 * f64::from(t.accepted) / f64::from(t.arrivals.max(1)),
                t.accepted,
                t.arrivals,
                t.refused_with_room
            );
        }
    }
}
