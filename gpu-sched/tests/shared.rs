#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! A fleet read with its shapes shared (`SharedFleet`, `FleetState::from_shared`) is the same
//! state as the expanded fleet indexed node by node: same nodes in the same order, same
//! allocations, same placements and refusals after the same operations.

use gpu_core::{DeviceRequest, Fleet, FleetNode, Machine, SharedFleet};
use gpu_sched::testing::{a2_node, h200_node, l40s_node, whole_node};
use gpu_sched::{FleetState, Policy};
use proptest::prelude::*;

fn node(kind: u8, i: usize) -> gpu_core::NodeTopology {
    let name = format!("n{i:03}");
    match kind % 4 {
        0 => a2_node(&name, 2, 4),
        1 => l40s_node(&name, 2, 4),
        2 => h200_node(&name, 1, 7),
        _ => whole_node(&name, 2),
    }
}

fn machine(k: u8, i: usize) -> Machine {
    let (profile, count) = match k % 5 {
        0 => (Some("A2-4Q"), 1),
        1 => (Some("L40S-8Q"), 2),
        2 => (Some("NVIDIA H200X-1-18C"), 1),
        3 => (None, 1),
        _ => (Some("A2-4Q"), 64),
    };
    Machine {
        name: format!("m{i:03}"),
        devices: vec![DeviceRequest {
            name: "gpu".into(),
            profile: profile.map(Into::into),
            count: Some(count),
            ..DeviceRequest::default()
        }],
        ..Machine::default()
    }
}

fn states(fleet: &Fleet) -> (FleetState, FleetState) {
    let text = fleet.to_text(false).unwrap();
    let full = FleetState::new(Fleet::from_text(&text).unwrap()).unwrap();
    let shared = SharedFleet::from_text_max(&text, 64 << 20).unwrap();
    assert_eq!(
        shared.clone().into_fleet(),
        *fleet,
        "the compact text expands to the fleet"
    );
    (full, FleetState::from_shared(shared).unwrap())
}

#[test]
fn nodes_of_one_shape_share_it_when_read() {
    let fleet = Fleet {
        nodes: (0..4).map(|i| node(1, i)).collect(),
        ..Fleet::default()
    };
    let shared = SharedFleet::from_text_max(&fleet.to_text(true).unwrap(), 64 << 20).unwrap();
    let shapes: Vec<_> = shared
        .nodes
        .iter()
        .map(|n| match n {
            FleetNode::Shaped { shape, .. } => std::sync::Arc::clone(shape),
            FleetNode::Full(_) => panic!("a node of a shared shape is read in full"),
        })
        .collect();
    assert!(
        shapes
            .windows(2)
            .all(|w| std::sync::Arc::ptr_eq(&w[0], &w[1]))
    );
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn the_shared_fleet_is_the_same_state_as_the_full_one(
        kinds in proptest::collection::vec(0u8..4, 1..12),
        ops in proptest::collection::vec((0u8..5, any::<bool>()), 0..24),
    ) {
        let fleet = Fleet {
            nodes: kinds.iter().enumerate().map(|(i, k)| node(*k, i)).collect(),
            ..Fleet::default()
        };
        let (mut full, mut shared) = states(&fleet);
        prop_assert_eq!(full.to_fleet(), shared.to_fleet());
        for (i, (k, release)) in ops.iter().enumerate() {
            let m = machine(*k, i);
            let a = full.place(&m, Policy::Binpack);
            let b = shared.place(&m, Policy::Binpack);
            prop_assert_eq!(&a, &b);
            if *release && a.is_ok() {
                prop_assert_eq!(full.release(&m.name), shared.release(&m.name));
            }
        }
        // With allocations in it, the fleet written and read again is still the same state.
        let (again_full, again_shared) = states(&full.to_fleet());
        prop_assert_eq!(again_full.to_fleet(), again_shared.to_fleet());
        prop_assert_eq!(again_shared.to_fleet(), shared.to_fleet());
    }
}
