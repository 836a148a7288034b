//! Acceptance of whole-GPU Machines on HGX nodes under churn, per policy:
//! `cargo run --release -p gpuslice-benches --example fabric_churn -- [NODES [ARRIVALS [SEEDS]]]`
//! (defaults 1,000 nodes, 40,000 arrivals, seeds 1 to 3) at offered loads 0.8 to 1.25. Binpack
//! chooses the partition that keeps larger partitions whole; first-fit takes nodes in order and
//! the lowest free partition ID (`benches/RESULTS-fabric.md`).

use gpu_sched::Policy;
use gpuslice_benches::fabric::{SIZES, hgx_fleet, replay, trace};

fn main() {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let nodes = args.first().copied().unwrap_or(1_000);
    let arrivals = args.get(1).copied().unwrap_or(40_000);
    let seeds = args.get(2).copied().unwrap_or(3) as u64;
    println!(
        "| offered load | policy | acceptance | 1 GPU | 2 GPUs | 4 GPUs | 8 GPUs | GPUs accepted | refused with room |"
    );
    println!("|---|---|---|---|---|---|---|---|---|");
    for load in [0.8, 0.9, 1.0, 1.1, 1.25] {
        for policy in [Policy::Binpack, Policy::FirstFit, Policy::Spread] {
            let mut total = gpuslice_benches::fabric::Report::default();
            for seed in 1..=seeds {
                let events = trace(seed, arrivals, load, nodes);
                let r = match replay(hgx_fleet(nodes), &events, policy) {
                    Ok(r) => r,
                    Err(e) => {
                        eprintln!("fabric churn: {e}");
                        std::process::exit(1);
                    }
                };
                for k in 0..SIZES.len() {
                    total.arrivals[k] += r.arrivals[k];
                    total.accepted[k] += r.accepted[k];
                }
                total.refused_with_room += r.refused_with_room;
            }
            let per = |k: usize| {
                format!(
                    "{:.2}%",
                    100.0 * total.accepted[k] as f64 / total.arrivals[k].max(1) as f64
                )
            };
            println!(
                "| {load:.2} | {} | {:.2}% ({}/{}) | {} | {} | {} | {} | {} | {} |",
                policy.as_str(),
                100.0 * total.acceptance(),
                total.accepted.iter().sum::<usize>(),
                total.arrivals.iter().sum::<usize>(),
                per(0),
                per(1),
                per(2),
                per(3),
                total.gpus_accepted(),
                total.refused_with_room,
            );
        }
    }
}
