#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! The HGX churn trace is deterministic for a seed, asks each Machine size for the same share of
//! GPUs, and a replay's counts add up; keeping larger partitions whole pays off on 8-GPU Machines.

use gpu_sched::Policy;
use gpuslice_benches::churn::Event;
use gpuslice_benches::fabric::{SIZES, hgx_fleet, replay, trace};

#[test]
fn the_same_seed_gives_the_same_trace_and_another_seed_another() {
    assert_eq!(trace(7, 500, 1.0, 10), trace(7, 500, 1.0, 10));
    assert_ne!(trace(7, 500, 1.0, 10), trace(8, 500, 1.0, 10));
}

#[test]
fn each_size_asks_for_about_the_same_share_of_gpus() {
    let mut gpus = [0u64; 4];
    for e in trace(1, 20_000, 1.0, 100) {
        if let Event::Arrive(m) = e {
            let n = m.devices[0].wanted();
            let k = SIZES.iter().position(|s| s.0 == n).unwrap();
            gpus[k] += u64::from(n);
        }
    }
    let total: u64 = gpus.iter().sum();
    for g in gpus {
        let share = g as f64 / total as f64;
        assert!((share - 0.25).abs() < 0.03, "{gpus:?}");
    }
}

#[test]
fn a_replay_is_deterministic_and_takes_everything_at_a_low_load() {
    let events = trace(2, 2_000, 0.5, 20);
    for policy in [Policy::Binpack, Policy::FirstFit] {
        let a = replay(hgx_fleet(20), &events, policy).unwrap();
        assert_eq!(a, replay(hgx_fleet(20), &events, policy).unwrap());
        assert_eq!(a.arrivals.iter().sum::<usize>(), 2_000);
        assert_eq!(a.accepted, a.arrivals, "{policy}");
    }
}

#[test]
fn keeping_larger_partitions_whole_accepts_more_eight_gpu_machines_than_first_fit() {
    let events = trace(1, 4_000, 1.0, 100);
    let ours = replay(hgx_fleet(100), &events, Policy::Binpack).unwrap();
    let first = replay(hgx_fleet(100), &events, Policy::FirstFit).unwrap();
    assert!(ours.accepted[3] > first.accepted[3], "{ours:?} {first:?}");
    assert!(
        ours.gpus_accepted() > first.gpus_accepted(),
        "{ours:?} {first:?}"
    );
}
