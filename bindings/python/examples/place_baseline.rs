//! The Rust side of the Python `place` benchmark (`bench/bench_place.py`): the same fleet, the
//! same Machines, the same calls, timed without Python.
//!
//! Usage: `place_baseline FLEET.json MACHINES.json` (the files the Python script writes); prints
//! the mean thread CPU nanoseconds per `place` call.

#![allow(clippy::print_stdout)]

// The same allocator as the extension module, so the two sides differ only by the binding.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use gpu_core::{Fleet, Machine};
use gpu_sched::{FleetState, Policy};

/// CPU time this thread has run, in nanoseconds (`CLOCK_THREAD_CPUTIME_ID`, the clock Python's
/// `time.thread_time_ns` reads): the machine is shared, and wall time would count the time other
/// processes held the CPU.
fn thread_cpu_ns() -> Result<u64, Box<dyn std::error::Error>> {
    let t = nix::time::clock_gettime(nix::time::ClockId::CLOCK_THREAD_CPUTIME_ID)?;
    Ok(u64::try_from(t.tv_sec())? * 1_000_000_000 + u64::try_from(t.tv_nsec())?)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let [_, fleet_path, machines_path] = args.as_slice() else {
        return Err("usage: place_baseline FLEET.json MACHINES.json".into());
    };
    let fleet = Fleet::from_text(&std::fs::read_to_string(fleet_path)?)?;
    let machines: Vec<Machine> = serde_json::from_str(&std::fs::read_to_string(machines_path)?)?;
    let mut best = f64::MAX;
    for _ in 0..2 {
        let mut state = FleetState::new(fleet.clone())?;
        let start = thread_cpu_ns()?;
        for m in &machines {
            let placement = state.place_detailed(m, Policy::Binpack)?;
            std::hint::black_box(placement);
        }
        let per_call = (thread_cpu_ns()? - start) as f64 / machines.len() as f64;
        best = best.min(per_call);
    }
    println!("{best:.0}");
    Ok(())
}
