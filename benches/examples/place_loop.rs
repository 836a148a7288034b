//! A profiling aid, not a benchmark: builds the 100,000-node mixed fleet of `place/scaling`, then
//! places and releases 10,000 Machines in a loop (`ROUNDS`, default 60), so that a profiler
//! attached after the build (`perf record -p PID`) sees only placements and releases.
//! `cargo run --release -p gpuslice-benches --example place_loop` (`FLEET=hgx`: the HGX fleet and
//! whole-GPU Machines of `place/hgx_partitions`).

use gpu_sched::Policy;

fn main() {
    let rounds: usize = std::env::var("ROUNDS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(60);
    // `FLEET=hgx`: the 100,000 HGX nodes and 1/2/4-GPU Machines of `place/hgx_partitions`.
    let hgx = std::env::var("FLEET").is_ok_and(|f| f == "hgx");
    let (mut s, machines) = match gpuslice_benches::fabric::loop_workload(hgx, 100_000) {
        Ok(w) => w,
        Err(e) => {
            eprintln!("place_loop: the bench fleet is invalid: {e}");
            std::process::exit(1);
        }
    };
    eprintln!("place_loop: fleet built (pid {})", std::process::id());
    let t = std::time::Instant::now();
    let mut n = 0u64;
    for _ in 0..rounds {
        let mut placed = Vec::new();
        for m in &machines {
            if let Ok(a) = s.place(m, Policy::Binpack) {
                placed.push(a.machine);
            }
            n += 1;
        }
        for p in placed {
            let _ = s.release(&p);
        }
    }
    eprintln!(
        "place_loop: {n} placements and their releases in {:.2?}",
        t.elapsed()
    );
}
