#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! Placing a Machine that is placed already: unchanged, it gets its placement back (an
//! orchestrator retrying after a timeout); changed, it is refused. And the fleet's node order is
//! what it is given: `firstfit` and ties follow it, and `to_fleet` writes it back.

use gpu_core::{Fleet, Machine, NodeTopology};
use gpu_sched::testing::{a2_node, mbochs_node};
use gpu_sched::{FleetState, Policy, SchedError};

fn fleet(nodes: Vec<NodeTopology>) -> FleetState {
    FleetState::new(Fleet {
        nodes,
        ..Fleet::default()
    })
    .unwrap()
}

fn machine(yaml: &str) -> Machine {
    Machine::from_text(yaml).unwrap()
}

#[test]
fn placing_a_placed_machine_unchanged_returns_its_placement_and_charges_nothing() {
    let mut s = fleet(vec![a2_node("a", 3, 4), a2_node("b", 3, 4)]);
    let m = machine(
        "name: vm1\ndevices: [{name: gpu, profile: A2-4Q, count: 2}, {name: small, profile: A2-2Q}]",
    );
    let first = s.place_detailed(&m, Policy::Binpack).unwrap();
    assert!(!first.already_placed);
    let free_before = (s.free_instances("A2-4Q"), s.free_gpus());

    for policy in [Policy::Binpack, Policy::Spread, Policy::FirstFit] {
        let again = s.place_detailed(&m, policy).unwrap();
        assert!(again.already_placed, "{policy}");
        assert_eq!(again.allocation, first.allocation, "{policy}");
        let dry = s.try_place_detailed(&m, policy).unwrap();
        assert_eq!(dry.allocation, first.allocation, "{policy}");
    }
    assert_eq!((s.free_instances("A2-4Q"), s.free_gpus()), free_before);
    assert_eq!(s.allocations().len(), 1);
}

#[test]
fn an_unchanged_placed_machine_read_back_from_a_saved_fleet_is_still_unchanged() {
    let mut s = fleet(vec![a2_node("a", 1, 4)]);
    let m = machine("name: vm1\ndevices: [{name: gpu, profile: NVIDIA A2-4Q}]");
    let first = s.place(&m, Policy::Binpack).unwrap();
    let mut reread = FleetState::new(s.to_fleet()).unwrap();
    let again = reread.place_detailed(&m, Policy::Binpack).unwrap();
    assert!(again.already_placed);
    assert_eq!(again.allocation, first);
}

#[test]
fn a_placed_machine_whose_requests_changed_is_still_refused() {
    let mut s = fleet(vec![a2_node("a", 2, 4)]);
    s.place(
        &machine("name: vm1\ndevices: [{name: gpu, profile: A2-4Q}]"),
        Policy::Binpack,
    )
    .unwrap();
    for changed in [
        "name: vm1\ndevices: [{name: gpu, profile: A2-4Q, count: 2}]",
        "name: vm1\ndevices: [{name: gpu, profile: A2-2Q}]",
        "name: vm1\ndevices: [{name: other, profile: A2-4Q}]",
        "name: vm1\ndevices: [{name: gpu, profile: A2-4Q}]\ntargetNode: b",
    ] {
        let e = s
            .place_detailed(&machine(changed), Policy::Binpack)
            .unwrap_err();
        assert!(
            matches!(&e, SchedError::InvalidRequest { why, .. } if why.contains("already placed")),
            "{changed}: {e:?}"
        );
    }
    assert_eq!(s.allocations().len(), 1);
}

#[test]
fn the_fleet_keeps_its_node_order_and_firstfit_follows_it() {
    let mut s = fleet(vec![mbochs_node("c"), mbochs_node("a"), mbochs_node("b")]);
    let m = machine("name: m\ndevices: [{name: gpu, profile: mbochs-small}]");
    assert_eq!(s.try_place(&m, Policy::FirstFit).unwrap().node, "c");
    s.place(&m, Policy::FirstFit).unwrap();
    let order: Vec<String> = s.to_fleet().nodes.into_iter().map(|n| n.node).collect();
    assert_eq!(order, ["c", "a", "b"]);
}

#[test]
fn placing_a_placed_machine_of_whole_gpus_unchanged_returns_the_same_gpus() {
    let mut s = fleet(vec![gpu_sched::testing::whole_node("w", 3)]);
    let m = machine("name: vm2\ndevices: [{name: pass, count: 2}]");
    let first = s.place(&m, Policy::Binpack).unwrap();
    let again = s.place_detailed(&m, Policy::Spread).unwrap();
    assert!(again.already_placed);
    assert_eq!(again.allocation, first);
    assert_eq!(s.free_gpus(), vec![("w".to_owned(), 1)]);
}
