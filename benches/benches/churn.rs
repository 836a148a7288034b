//! Placement quality under churn: `cargo bench --bench churn`.
//!
//! Replays the seeded traces of `gpuslice_benches::churn` (8,000 arrivals) on 40 mixed 8-GPU
//! nodes (10 each of A2 with 16 VFs, L40S with 32 VFs, H200 MIG and whole H100) with each
//! policy, for three seeds and two loads: about 700 Machines alive at once (high load: the fleet
//! runs near full and about one in fifteen Machines is refused) and about 1,400 (overload: about
//! one in three is refused). Prints a Markdown table: acceptance, Machines refused while the fleet
//! had room elsewhere, framebuffer stranded on size-locked cards, and what the accepted Machines
//! asked for in GPUs (a whole GPU 1, a vGPU its share of its GPU's memory).

use gpu_core::Fleet;
use gpu_sched::Policy;
use gpuslice_benches::churn::{run, trace};
use gpuslice_benches::fleetgen::churn_fleet;

const NODES: usize = 40;
const ARRIVALS: usize = 8_000;
const MEAN_LIVES: [u64; 2] = [700, 1_400];

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let fleet: Fleet = churn_fleet(NODES);
    println!(
        "| alive | seed | policy | accepted | acceptance | refused with room elsewhere | stranded framebuffer (mean) | GPUs accepted |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    for (life, seed) in MEAN_LIVES
        .into_iter()
        .flat_map(|l| [1u64, 2, 3].map(|s| (l, s)))
    {
        let events = trace(seed, ARRIVALS, life);
        for policy in [Policy::Binpack, Policy::Spread, Policy::FirstFit] {
            match run(fleet.clone(), &events, policy) {
                Ok(r) => println!(
                    "| ~{life} | {seed} | {policy} | {}/{} | {:.1}% | {} | {:.0} GiB ({:.1}%) | {:.0} |",
                    r.accepted,
                    r.arrivals,
                    100.0 * r.acceptance(),
                    r.refused_with_room,
                    r.stranded_gib,
                    100.0 * r.stranded_share,
                    r.accepted_gpus
                ),
                Err(e) => {
                    eprintln!("churn: {e}");
                    std::process::exit(1);
                }
            }
        }
    }
}
