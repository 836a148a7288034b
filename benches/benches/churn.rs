//! Placement quality under churn: `cargo bench --bench churn`.
//!
//! Replays seeded traces of `gpuslice_benches::churn` (8,000 arrivals each) on 40 mixed 8-GPU
//! nodes (10 each of A2 with 16 VFs, L40S with 32 VFs, H200 MIG and whole H100) with each
//! policy, and prints two Markdown tables:
//!
//! 1. **By offered load**: every GPU model asked for the same share of its GPUs, from 0.8 to 1.5
//!    times what it holds, ten seeds per load. Per policy: acceptance (all seeds together), on
//!    how many seeds it accepted the most Machines (ties count for each), Machines refused while
//!    the fleet had room elsewhere, framebuffer stranded on size-locked cards, and what the
//!    accepted Machines asked for in GPUs (a whole GPU 1, a vGPU its share of its GPU's memory);
//!    then `binpack`'s lead per seed.
//! 2. **Skewed demand**: one fixed mix that asks the A2s and H100s for more than they hold and
//!    the H200s for about half (the mix of the first version of this bench), at about 700 and
//!    1,400 Machines alive, three seeds, one row per run.

use gpu_core::Fleet;
use gpu_sched::Policy;
use gpuslice_benches::churn::{Report, run, trace, trace_at_load};
use gpuslice_benches::fleetgen::churn_fleet;

const NODES: usize = 40;
const ARRIVALS: usize = 8_000;
const LOADS: [f64; 6] = [0.8, 0.9, 1.0, 1.1, 1.25, 1.5];
const SEEDS: u64 = 10;
const MEAN_LIVES: [u64; 2] = [700, 1_400];
const POLICIES: [Policy; 3] = [Policy::Binpack, Policy::Spread, Policy::FirstFit];

fn replay(fleet: &Fleet, events: &[gpuslice_benches::churn::Event], policy: Policy) -> Report {
    match run(fleet.clone(), events, policy) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("churn: {e}");
            std::process::exit(1);
        }
    }
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let fleet: Fleet = churn_fleet(NODES);
    by_load(&fleet);
    println!();
    skewed(&fleet);
}

fn by_load(fleet: &Fleet) {
    println!(
        "| offered load | policy | acceptance | seeds best | refused with room elsewhere | stranded framebuffer (mean) | GPUs accepted |"
    );
    println!("|---|---|---|---|---|---|---|");
    let mut leads: Vec<(f64, Vec<i64>, Vec<i64>)> = Vec::new();
    for load in LOADS {
        let mut sums = [Report::default(); 3];
        let mut best = [0u32; 3];
        let (mut over_firstfit, mut over_spread) = (Vec::new(), Vec::new());
        for seed in 1..=SEEDS {
            let events = trace_at_load(seed, ARRIVALS, load, NODES);
            let r: Vec<Report> = POLICIES
                .iter()
                .map(|&p| replay(fleet, &events, p))
                .collect();
            let top = r.iter().map(|x| x.accepted).max().unwrap_or(0);
            for (i, x) in r.iter().enumerate() {
                best[i] += u32::from(x.accepted == top);
                sums[i].arrivals += x.arrivals;
                sums[i].accepted += x.accepted;
                sums[i].refused_with_room += x.refused_with_room;
                sums[i].stranded_share += x.stranded_share / SEEDS as f64;
                sums[i].accepted_gpus += x.accepted_gpus;
            }
            over_firstfit.push(r[0].accepted as i64 - r[2].accepted as i64);
            over_spread.push(r[0].accepted as i64 - r[1].accepted as i64);
        }
        for (i, p) in POLICIES.iter().enumerate() {
            let s = &sums[i];
            println!(
                "| {load:.2} | {p} | {:.2}% ({}/{}) | {}/{SEEDS} | {} | {:.1}% | {:.0} |",
                100.0 * s.acceptance(),
                s.accepted,
                s.arrivals,
                best[i],
                s.refused_with_room,
                100.0 * s.stranded_share,
                s.accepted_gpus
            );
        }
        leads.push((load, over_firstfit, over_spread));
    }
    println!();
    println!(
        "| offered load | binpack − firstfit, per seed (Machines) | binpack − spread, per seed |"
    );
    println!("|---|---|---|");
    let list = |v: &[i64]| {
        v.iter()
            .map(|d| format!("{d:+}"))
            .collect::<Vec<_>>()
            .join(" ")
    };
    for (load, f, s) in leads {
        println!("| {load:.2} | {} | {} |", list(&f), list(&s));
    }
}

fn skewed(fleet: &Fleet) {
    println!(
        "| skewed, alive | seed | policy | accepted | acceptance | refused with room elsewhere | stranded framebuffer (mean) | GPUs accepted |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    for (life, seed) in MEAN_LIVES
        .into_iter()
        .flat_map(|l| [1u64, 2, 3].map(|s| (l, s)))
    {
        let events = trace(seed, ARRIVALS, life);
        for policy in POLICIES {
            let r = replay(fleet, &events, policy);
            println!(
                "| ~{life} | {seed} | {policy} | {}/{} | {:.1}% | {} | {:.0} GiB ({:.1}%) | {:.0} |",
                r.accepted,
                r.arrivals,
                100.0 * r.acceptance(),
                r.refused_with_room,
                r.stranded_gib,
                100.0 * r.stranded_share,
                r.accepted_gpus
            );
        }
    }
}
