//! Acceptance per kind of Machine in the churn replay, summed over the bench's three seeds:
//! `cargo run --release -p gpuslice-benches --example churn_kinds -- 1400` (the mean number of
//! Machines alive; 700 or 1400 in the bench). Shows which Machines each policy accepts more
//! often (`benches/RESULTS-churn.md`).

use std::collections::BTreeMap;

use gpu_core::Machine;
use gpu_sched::{FleetState, Policy};
use gpuslice_benches::churn::{Event, trace};
use gpuslice_benches::fleetgen::churn_fleet;

const POLICIES: [Policy; 3] = [Policy::Binpack, Policy::Spread, Policy::FirstFit];

fn kind(m: &Machine) -> String {
    m.devices.first().map_or_else(String::new, |d| {
        let what = d.profile.clone().unwrap_or_else(|| "whole".to_owned());
        format!("{what} x {}", d.wanted())
    })
}

fn main() {
    let life: u64 = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(1_400);
    // Per kind: arrivals, then accepted per policy.
    let mut kinds: BTreeMap<String, (usize, [usize; 3])> = BTreeMap::new();
    for seed in [1u64, 2, 3] {
        let events = trace(seed, 8_000, life);
        for (pi, policy) in POLICIES.into_iter().enumerate() {
            let mut s = match FleetState::new(churn_fleet(40)) {
                Ok(s) => s,
                Err(e) => {
                    eprintln!("churn fleet: {e}");
                    std::process::exit(1);
                }
            };
            for e in &events {
                match e {
                    Event::Arrive(m) => {
                        let k = kinds.entry(kind(m)).or_default();
                        if pi == 0 {
                            k.0 += 1;
                        }
                        if s.place(m, policy).is_ok() {
                            k.1[pi] += 1;
                        }
                    }
                    Event::Depart(name) => {
                        let _ = s.release(name);
                    }
                }
            }
        }
    }
    println!("| kind | arrivals | binpack | spread | firstfit |");
    println!("|---|---|---|---|---|");
    for (k, (n, acc)) in kinds {
        println!("| {k} | {n} | {} | {} | {} |", acc[0], acc[1], acc[2]);
    }
}
