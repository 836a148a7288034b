//! Placement benchmarks: `cargo bench --bench place`.
//!
//! - `place/10k_nodes/single`: one placement, state update included, on 10,000 mixed 8-GPU
//!   nodes (the workload of `fleetgen::workload_machine` in turn).
//! - `place/10k_nodes/sequence_100k`: 100,000 Machines placed one after the other.
//! - `place/10k_nodes/refusal`: a Machine no node can hold, with every node's reasons.
//! - `place/8gpu_whole`: an 8-whole-GPU Machine on a fleet of 1,000 8-GPU passthrough nodes.
//! - `place/56_mig_slices`: 56 one-slice MIG vGPUs (a whole 8-GPU H200 node) on 1,000 such nodes.
//! - `place/scaling/<nodes>`: as `single`, from 100 to 100,000 nodes.
//! - `place/hgx_partitions/100000`: 1, 2 and 4 whole GPUs in turn, each on one free NVSwitch
//!   partition, on 100,000 HGX nodes (`fabric::hgx_fleet`).
//! - `place/discovered_10k/{place,refusal,mixed}`: 10,000 nodes built as a binding builds them,
//!   from discovered host trees (an L40S with 16 VFs, an A2 with 16 VFs, an 8-GPU H200 in MIG
//!   mode, a whole-GPU host; `support/hosts.rs`) through `gpu_health::open_node` and
//!   `FleetState::add_node`: a placement, a refusal (a count no node holds, each host's in
//!   turn), and one operation of a scheduler's mixed loop (70% place, 20% refusal, 10% release).
//!
//! Placed Machines are released outside the timed sections, so every sample sees a fleet with
//! room; the memory of the 10k fleet is printed before the runs.

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use gpu_core::Machine;
use gpu_sched::{FleetState, Policy};
#[allow(dead_code)] // writing the trees out is the `host_trees` example's part
#[path = "support/hosts.rs"]
mod hosts;

use gpuslice_benches::fabric::{hgx_fleet, whole_machine};
use gpuslice_benches::fleetgen::{
    all_slices_machine, eight_gpu_machine, h200_fleet, mixed_fleet, too_big_machine, whole_fleet,
    workload_machine,
};

/// Resident memory of this process in KiB (Linux), 0 elsewhere.
fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
}

fn build(fleet: gpu_core::Fleet) -> FleetState {
    match FleetState::new(fleet) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("bench fleet is invalid: {e}");
            std::process::exit(1);
        }
    }
}

/// Times `iters` placements of `machine(k)`, releasing everything (untimed) whenever `batch`
/// Machines are placed, so the fleet never fills up.
fn time_placements(
    state: &mut FleetState,
    iters: u64,
    batch: usize,
    machine: impl Fn(usize) -> Machine,
) -> Duration {
    let mut total = Duration::ZERO;
    let mut placed: Vec<String> = Vec::with_capacity(batch);
    let machines: Vec<Machine> = (0..batch).map(&machine).collect();
    let mut k = 0usize;
    for _ in 0..iters {
        let m = &machines[k];
        let t = Instant::now();
        let r = state.place(m, Policy::Binpack);
        total += t.elapsed();
        if let Ok(a) = black_box(r) {
            placed.push(a.machine);
        }
        k += 1;
        if k == batch {
            for name in placed.drain(..) {
                let _ = state.release(&name);
            }
            k = 0;
        }
    }
    for name in placed.drain(..) {
        let _ = state.release(&name);
    }
    total
}

fn bench_place(c: &mut Criterion) {
    let before = rss_kib();
    let t = Instant::now();
    let fleet = mixed_fleet(10_000);
    let fleet_kib = rss_kib().saturating_sub(before);
    let mut state = build(fleet);
    let state_kib = rss_kib().saturating_sub(before);
    println!(
        "memory: 10k-node fleet as data {} MiB; FleetState (data + index) {} MiB; built in {:.2} s",
        fleet_kib / 1024,
        state_kib / 1024,
        t.elapsed().as_secs_f64()
    );

    let mut g = c.benchmark_group("place");
    g.sample_size(20)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3));
    g.bench_function("10k_nodes/single", |b| {
        b.iter_custom(|iters| time_placements(&mut state, iters, 10_000, workload_machine));
    });

    g.sample_size(10).measurement_time(Duration::from_secs(20));
    g.bench_function("10k_nodes/sequence_100k", |b| {
        b.iter_custom(|iters| {
            let machines: Vec<Machine> = (0..100_000).map(workload_machine).collect();
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                let t = Instant::now();
                let mut refused = 0usize;
                for m in &machines {
                    if state.place(m, Policy::Binpack).is_err() {
                        refused += 1;
                    }
                }
                total += t.elapsed();
                if refused > 0 {
                    eprintln!("sequence_100k: {refused} Machines refused");
                }
                for m in &machines {
                    let _ = state.release(&m.name);
                }
            }
            total
        });
    });
    g.sample_size(10).measurement_time(Duration::from_secs(5));
    g.bench_function("10k_nodes/refusal", |b| {
        // More than any node holds: every node is asked why not.
        let m = too_big_machine();
        b.iter(|| black_box(state.try_place(&m, Policy::Binpack).is_err()));
    });
    drop(state);

    g.sample_size(20).measurement_time(Duration::from_secs(3));
    // Criterion calls a bench's closure once per sample: fleets are built on the first call.
    let mut whole: Option<FleetState> = None;
    g.bench_function("8gpu_whole", |b| {
        let whole = whole.get_or_insert_with(|| build(whole_fleet(1_000)));
        b.iter_custom(|iters| time_placements(whole, iters, 500, eight_gpu_machine));
    });
    drop(whole);

    let mut mig: Option<FleetState> = None;
    g.bench_function("56_mig_slices", |b| {
        let mig = mig.get_or_insert_with(|| build(h200_fleet(1_000)));
        b.iter_custom(|iters| time_placements(mig, iters, 500, all_slices_machine));
    });
    drop(mig);

    bench_discovered(&mut g);

    for nodes in [100usize, 1_000, 10_000, 100_000] {
        // Fleets are built only for the benches selected, one at a time.
        let mut fleet: Option<FleetState> = None;
        g.bench_with_input(BenchmarkId::new("scaling", nodes), &nodes, |b, &nodes| {
            let s = fleet.get_or_insert_with(|| build(mixed_fleet(nodes)));
            // Keep batches within what the smallest fleet holds (10 Machines per node).
            let batch = (nodes * 5).min(10_000);
            b.iter_custom(|iters| time_placements(s, iters, batch, workload_machine));
        });
        drop(fleet);
    }
    let mut hgx: Option<FleetState> = None;
    g.bench_function("hgx_partitions/100000", |b| {
        let s = hgx.get_or_insert_with(|| build(hgx_fleet(100_000)));
        b.iter_custom(|iters| {
            time_placements(s, iters, 10_000, |i| {
                whole_machine(format!("vm-{i}"), [1, 2, 4][i % 3])
            })
        });
    });
    drop(hgx);
    g.finish();
}

/// The hosts' short names, in the order `hosts::discovered_hosts` gives them.
const HOSTS: [&str; 4] = ["l40s", "a2", "h200", "whole"];

/// A Machine of one device that fits on a fresh node of `host`, or, with `count`, one that no
/// node holds.
fn host_machine(name: &str, host: &str, count: Option<u32>) -> Machine {
    let mut d = gpu_core::DeviceRequest {
        name: "gpu".into(),
        count,
        ..gpu_core::DeviceRequest::default()
    };
    match host {
        "l40s" => d.profile = Some("L40S-8Q".into()),
        "a2" => d.profile = Some("A2-4Q".into()),
        "h200" => d.profile = Some("H200X-1-18C".into()),
        _ => d.vendor = Some("nvidia".into()),
    }
    Machine {
        name: name.into(),
        devices: vec![d],
        ..Machine::default()
    }
}

/// A small seeded generator, so that every run draws the same operations.
struct Lcg(u64);

impl Lcg {
    fn below(&mut self, n: usize) -> usize {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        ((self.0 >> 33) as usize) % n.max(1)
    }
}

fn bench_discovered(g: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>) {
    let protos = match hosts::discovered_hosts() {
        Ok(p) => p,
        Err(e) => {
            eprintln!("bench hosts: {e}");
            std::process::exit(1);
        }
    };
    let t = Instant::now();
    let mut state = build(gpu_core::Fleet::default());
    for i in 0..10_000 {
        let (host, proto) = &protos[i % protos.len()];
        let mut topo = proto.clone();
        topo.node = format!("{host}-{i:05}");
        if let Err(e) = state.add_node(topo) {
            eprintln!("bench node {i}: {e}");
            std::process::exit(1);
        }
    }
    println!(
        "discovered_10k: 10,000 nodes of {} discovered hosts added in {:.2} s",
        protos.len(),
        t.elapsed().as_secs_f64()
    );
    let fits: Vec<Machine> = HOSTS.iter().map(|h| host_machine("vm", h, None)).collect();
    let refused: Vec<Machine> = HOSTS
        .iter()
        .map(|h| host_machine(&format!("no-{h}"), h, Some(999)))
        .collect();
    g.sample_size(20).measurement_time(Duration::from_secs(3));
    let mut k = 0usize;
    g.bench_function("discovered_10k/place", |b| {
        b.iter(|| {
            k += 1;
            black_box(
                state
                    .try_place(&fits[k % fits.len()], Policy::Binpack)
                    .is_ok(),
            )
        });
    });
    g.bench_function("discovered_10k/refusal", |b| {
        b.iter(|| {
            k += 1;
            black_box(
                state
                    .try_place(&refused[k % refused.len()], Policy::Binpack)
                    .is_err(),
            )
        });
    });
    let mut rng = Lcg(7);
    let mut placed: Vec<String> = Vec::new();
    let (mut n, mut ops) = (0usize, 0u64);
    // Every 10,000 operations (the loop the Python and Node benches run) the Machines still
    // placed are released, untimed, so that the fleet never fills up.
    g.bench_function("discovered_10k/mixed", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                let r = rng.below(10);
                let t = Instant::now();
                if r < 7 {
                    n += 1;
                    let m = host_machine(&format!("m-{n}"), HOSTS[rng.below(4)], None);
                    if state.place(&m, Policy::Binpack).is_ok() {
                        placed.push(m.name);
                    }
                } else if r < 9 {
                    let m = &refused[rng.below(refused.len())];
                    black_box(state.place(m, Policy::Binpack).is_err());
                } else if !placed.is_empty() {
                    let name = placed.swap_remove(rng.below(placed.len()));
                    black_box(state.release(&name).is_ok());
                }
                total += t.elapsed();
                ops += 1;
                if ops % 10_000 == 0 {
                    for name in placed.drain(..) {
                        let _ = state.release(&name);
                    }
                }
            }
            total
        });
    });
}

criterion_group!(benches, bench_place);
criterion_main!(benches);
