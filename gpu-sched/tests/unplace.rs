#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! Unplacing a Machine (the inverse of a placement), and a profile no node offers: an invalid
//! request naming the nearest names the fleet offers, never a capacity refusal.

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

fn vgpu(name: &str, profile: &str, count: u32) -> Machine {
    Machine::from_text(&format!(
        "name: {name}\ndevices: [{{name: gpu, profile: \"{profile}\", count: {count}}}]"
    ))
    .unwrap()
}

#[test]
fn unplace_gives_the_capacity_back_so_the_same_machine_fits_again() {
    let mut s = fleet(vec![a2_node("a", 1, 4)]);
    s.place(&vgpu("m", "A2-4Q", 4), Policy::Binpack).unwrap();
    assert!(
        s.try_place(&vgpu("n", "A2-4Q", 1), Policy::Binpack)
            .is_err()
    );
    let u = s.unplace("m").unwrap();
    assert_eq!(u.allocation.machine, "m");
    assert_eq!(u.allocation.devices.len(), 4);
    assert!(!u.on_host, "a pending allocation has nothing on the host");
    assert!(s.allocation("m").is_none());
    s.place(&vgpu("n", "A2-4Q", 4), Policy::Binpack).unwrap();
}

#[test]
fn unplacing_a_created_allocation_says_its_devices_are_still_on_the_host() {
    let mut s = fleet(vec![mbochs_node("a")]);
    s.place(&vgpu("m", "mbochs-large", 1), Policy::Binpack)
        .unwrap();
    s.mark_created("m").unwrap();
    let u = s.unplace("m").unwrap();
    assert!(u.on_host);
    let doc = serde_json::to_value(&u).unwrap();
    assert_eq!(doc["machine"], "m");
    assert_eq!(doc["onHost"], true);
}

#[test]
fn unplacing_an_unknown_machine_is_not_found_naming_the_nearest_placed() {
    let mut s = fleet(vec![mbochs_node("a")]);
    s.place(&vgpu("desktop-1", "mbochs-small", 1), Policy::Binpack)
        .unwrap();
    let e = s.unplace("desktop-7").unwrap_err();
    assert!(matches!(e, SchedError::UnknownMachine { .. }), "{e:?}");
    assert_eq!(e.kind(), gpu_core::ErrorKind::NotFound);
    assert_eq!(
        e.to_string(),
        "no Machine \"desktop-7\" is placed in the fleet (nearest placed: desktop-1)"
    );
    assert_eq!(s.allocations().len(), 1, "nothing released");
}

#[test]
fn a_profile_no_node_offers_is_an_invalid_request_naming_the_nearest_offered() {
    let mut s = fleet(vec![a2_node("a", 1, 4), mbochs_node("b")]);
    let m = vgpu("m", "A2-44Q", 1);
    let tried = s.try_place(&m, Policy::Binpack).unwrap_err();
    let placed = s.place(&m, Policy::Binpack).unwrap_err();
    assert!(s.allocations().is_empty());
    for e in [tried, placed] {
        assert_eq!(e.kind(), gpu_core::ErrorKind::InvalidRequest, "{e:?}");
        let text = e.to_string();
        assert!(
            text.contains("no node in the fleet offers vGPU profile \"A2-44Q\""),
            "{text}"
        );
        assert!(text.contains("nearest offered: A2-4Q"), "{text}");
        assert!(!text.contains("mbochs"), "{text}");
    }
}

#[test]
fn a_profile_offered_but_full_is_still_a_capacity_refusal() {
    let s = fleet(vec![a2_node("a", 1, 4)]);
    let e = s
        .try_place(&vgpu("m", "A2-4Q", 5), Policy::Binpack)
        .unwrap_err();
    assert!(matches!(e, SchedError::Unsatisfiable(_)), "{e:?}");
}
