//! Acceptance per kind of Machine in the churn replay, summed over three seeds:
//! `cargo run --release -p gpuslice-benches --example churn_kinds -- 1400` replays the skewed
//! mix with that mean number of Machines alive (700 or 1400 in the bench), `-- load 1.25` the
//! balanced mix at that offered load; a further argument replays one seed only. Shows
//! which Machines each policy accepts more often, the counts per seed and GPU model, and how many
//! time-sliced GPUs are locked to each vGPU size on average (`benches/RESULTS-churn.md`).

use std::collections::BTreeMap;

use gpu_core::Machine;
use gpu_sched::{FleetState, Policy};
use gpuslice_benches::churn::{Event, model_of_machine, time_sliced_use, trace, trace_at_load};
use gpuslice_benches::fleetgen::churn_fleet;

const POLICIES: [Policy; 3] = [Policy::Binpack, Policy::Spread, Policy::FirstFit];

fn kind(m: &Machine) -> String {
    m.devices.first().map_or_else(String::new, |d| {
        let what = d.profile.clone().unwrap_or_else(|| "whole".to_owned());
        format!("{what} x {}", d.wanted())
    })
}

/// Time-sliced GPUs per locked vGPU size (`A2-4Q`) right now.
fn locked(s: &FleetState) -> BTreeMap<String, usize> {
    let mut out = BTreeMap::new();
    for (size, _) in time_sliced_use(s).into_values() {
        *out.entry(size).or_default() += 1;
    }
    out
}

fn main() {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let load: Option<f64> = if args.first().is_some_and(|a| a == "load") {
        args.remove(0);
        Some(args.first().and_then(|s| s.parse().ok()).unwrap_or(1.0))
    } else {
        None
    };
    let life: u64 = args.first().and_then(|s| s.parse().ok()).unwrap_or(1_400);
    // Per kind: arrivals, then accepted per policy.
    let mut kinds: BTreeMap<String, (usize, [usize; 3])> = BTreeMap::new();
    // Per seed and GPU model: accepted per policy.
    let mut seeds: BTreeMap<(u64, String), [usize; 3]> = BTreeMap::new();
    // Per locked size: GPUs summed over the samples, per policy; and the samples per policy.
    let mut locks: BTreeMap<String, [usize; 3]> = BTreeMap::new();
    let mut samples = [0usize; 3];
    let only: Option<u64> = args.get(1).and_then(|s| s.parse().ok());
    for seed in [1u64, 2, 3]
        .into_iter()
        .filter(|s| only.is_none_or(|o| o == *s))
    {
        let events = match load {
            Some(load) => trace_at_load(seed, 8_000, load, 40),
            None => trace(seed, 8_000, life),
        };
        for (pi, policy) in POLICIES.into_iter().enumerate() {
            let mut s = match FleetState::new(churn_fleet(40)) {
                Ok(s) => s,
                Err(e) => {
                    eprintln!("churn fleet: {e}");
                    std::process::exit(1);
                }
            };
            let mut seen = 0usize;
            for e in &events {
                match e {
                    Event::Arrive(m) => {
                        seen += 1;
                        // As the bench samples stranded framebuffer: every 50 arrivals after the
                        // first quarter.
                        if seen > 2_000 && seen % 50 == 0 {
                            samples[pi] += 1;
                            for (size, n) in locked(&s) {
                                locks.entry(size).or_default()[pi] += n;
                            }
                        }
                        let k = kinds.entry(kind(m)).or_default();
                        if pi == 0 {
                            k.0 += 1;
                        }
                        if s.place(m, policy).is_ok() {
                            k.1[pi] += 1;
                            seeds.entry((seed, model_of_machine(m))).or_default()[pi] += 1;
                            seeds.entry((seed, "all".to_owned())).or_default()[pi] += 1;
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
    println!();
    println!("| seed | Machines for | binpack | spread | firstfit |");
    println!("|---|---|---|---|---|");
    for ((seed, f), acc) in seeds {
        println!("| {seed} | {f} | {} | {} | {} |", acc[0], acc[1], acc[2]);
    }
    println!();
    println!("| GPUs locked to (mean) | binpack | spread | firstfit |");
    println!("|---|---|---|---|");
    let mean = |sum: usize, pi: usize| sum as f64 / samples[pi].max(1) as f64;
    for (size, sums) in locks {
        println!(
            "| {size} | {:.1} | {:.1} | {:.1} |",
            mean(sums[0], 0),
            mean(sums[1], 1),
            mean(sums[2], 2)
        );
    }
}
