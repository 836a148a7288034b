#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! The churn trace is deterministic for a seed, and a replay's counts add up.

use gpu_sched::Policy;
use gpuslice_benches::churn::{Event, run, trace};
use gpuslice_benches::fleetgen::churn_fleet;

#[test]
fn the_same_seed_gives_the_same_trace_and_another_seed_another() {
    assert_eq!(trace(7, 500, 100), trace(7, 500, 100));
    assert_ne!(trace(7, 500, 100), trace(8, 500, 100));
}

#[test]
fn every_machine_arrives_once_and_leaves_at_most_once_after_arriving() {
    let events = trace(1, 2_000, 300);
    let mut alive = std::collections::BTreeSet::new();
    let mut arrivals = 0;
    for e in &events {
        match e {
            Event::Arrive(m) => {
                arrivals += 1;
                assert!(alive.insert(m.name.clone()), "{} arrives twice", m.name);
            }
            Event::Depart(name) => assert!(alive.remove(name), "{name} leaves before arriving"),
        }
    }
    assert_eq!(arrivals, 2_000);
}

#[test]
fn a_replay_is_deterministic_and_its_counts_add_up() {
    let events = trace(3, 1_500, 400);
    let a = run(churn_fleet(8), &events, Policy::Binpack).unwrap();
    let b = run(churn_fleet(8), &events, Policy::Binpack).unwrap();
    assert_eq!(a, b);
    assert_eq!(a.arrivals, 1_500);
    assert!(a.accepted <= a.arrivals);
    assert!(a.refused_with_room <= a.arrivals - a.accepted);
    // Each accepted Machine takes at most 4 GPUs and some share of one.
    assert!(a.accepted_gpus > 0.0 && a.accepted_gpus <= 4.0 * a.accepted as f64);
    assert!(
        a.accepted > 0 && a.accepted < a.arrivals,
        "{a:?}: the load should bite"
    );
}
