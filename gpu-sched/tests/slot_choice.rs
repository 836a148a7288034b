#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! The solver chooses where a MIG-backed vGPU's GPU instance starts (the one slot model,
//! keep-most by default), holds it so the next placement sees it taken, records it in the
//! allocation (`gpuInstanceStart`), frees it on release, and a fleet read back places the same.

use gpu_core::{AllocatedDevice, Allocation, Fleet, MigGeometry, MigSlots, NodeTopology};
use gpu_sched::testing::{h200_node, vgpu_machine as vgpus};
use gpu_sched::{FleetState, Policy, SchedError, SlotPolicy};

const ONE_G: &str = "H200X-1-18C";
const TWO_G: &str = "H200X-2-35C";
const THREE_G: &str = "H200X-3-71C";
const FOUR_G: &str = "H200X-4-71C";

/// One H200 in MIG mode with 16 VFs whose pool tracks GPU-instance slots.
fn h200(node: &str) -> NodeTopology {
    let g = MigGeometry::for_device(0x2335).unwrap();
    let mut n = h200_node(node, 1, 16);
    n.mediated_devices.pools[0].mig_slots = Some(std::sync::Arc::new(MigSlots::new(g)));
    n
}

fn fleet(nodes: Vec<NodeTopology>, slots: SlotPolicy) -> FleetState {
    let mut s = FleetState::new(Fleet {
        nodes,
        ..Fleet::default()
    })
    .unwrap();
    s.set_slot_policy(slots);
    s
}

/// The GPU-instance starts an allocation records, in device order.
fn starts(a: &Allocation) -> Vec<Option<u8>> {
    a.devices
        .iter()
        .map(|d| match d {
            AllocatedDevice::Vgpu {
                gpu_instance_start, ..
            } => *gpu_instance_start,
            AllocatedDevice::Gpu { .. } => panic!("a whole GPU: {d:?}"),
        })
        .collect()
}

fn place(s: &mut FleetState, name: &str, wants: &[(&str, u32)]) -> Allocation {
    s.place(&vgpus(name, wants), Policy::Binpack).unwrap()
}

fn refused(s: &mut FleetState, name: &str, wants: &[(&str, u32)]) -> String {
    match s.place(&vgpus(name, wants), Policy::Binpack) {
        Err(SchedError::Unsatisfiable(r)) => r.render(),
        other => panic!("expected a refusal, got {other:?}"),
    }
}

#[test]
fn two_3g_placements_on_an_empty_h200_get_distinct_legal_starts() {
    let mut s = fleet(vec![h200("h200")], SlotPolicy::KeepMost);
    let a = starts(&place(&mut s, "a", &[(THREE_G, 1)]));
    let b = starts(&place(&mut s, "b", &[(THREE_G, 1)]));
    let mut both = [a[0].unwrap(), b[0].unwrap()];
    both.sort_unstable();
    assert_eq!(both, [0, 4], "a at {a:?}, b at {b:?}");
    // Within one Machine too.
    let mut s = fleet(vec![h200("h200")], SlotPolicy::KeepMost);
    let mut ab = starts(&place(&mut s, "ab", &[(THREE_G, 2)]));
    ab.sort_unstable();
    assert_eq!(ab, [Some(0), Some(4)]);
}

#[test]
fn keep_most_puts_a_1g_where_a_later_4g_still_fits_and_first_fit_blocks_it() {
    let mut keep = fleet(vec![h200("h200")], SlotPolicy::KeepMost);
    assert_eq!(starts(&place(&mut keep, "a", &[(ONE_G, 1)])), [Some(6)]);
    assert_eq!(starts(&place(&mut keep, "b", &[(FOUR_G, 1)])), [Some(0)]);

    let mut first = fleet(vec![h200("h200")], SlotPolicy::FirstFit);
    assert_eq!(starts(&place(&mut first, "a", &[(ONE_G, 1)])), [Some(0)]);
    let why = refused(&mut first, "b", &[(FOUR_G, 1)]);
    assert!(why.contains("pool full"), "{why}");
    // The refusal names the profile, its starts and the slots left.
    assert!(
        why.contains("no free GPU-instance start: ")
            && why.contains(": 4g.71gb starts at [0], slots free [1, 2, 3, 4, 5, 6, 7]"),
        "{why}"
    );

    // Leaving the start to the driver records none, and the 1g may sit at slot 0.
    let mut driver = fleet(vec![h200("h200")], SlotPolicy::Driver);
    assert_eq!(starts(&place(&mut driver, "a", &[(ONE_G, 1)])), [None]);
    refused(&mut driver, "b", &[(FOUR_G, 1)]);
}

#[test]
fn keep_most_is_the_default() {
    let s = FleetState::new(Fleet::default()).unwrap();
    assert_eq!(s.slot_policy(), SlotPolicy::KeepMost);
    assert_eq!(
        "firstfit".parse::<SlotPolicy>().unwrap(),
        SlotPolicy::FirstFit
    );
    assert!("nearest".parse::<SlotPolicy>().is_err());
}

#[test]
fn release_frees_the_start_for_the_next_placement() {
    let mut s = fleet(vec![h200("h200")], SlotPolicy::KeepMost);
    place(&mut s, "a", &[(FOUR_G, 1)]);
    let b = starts(&place(&mut s, "b", &[(THREE_G, 1)]));
    assert_eq!(b, [Some(4)]);
    refused(&mut s, "c", &[(ONE_G, 1)]);
    s.release("b").unwrap();
    // Slots 4-7 are free again: the next 3g takes slot 4.
    assert_eq!(starts(&place(&mut s, "c", &[(THREE_G, 1)])), [Some(4)]);
    s.release("a").unwrap();
    assert_eq!(starts(&place(&mut s, "d", &[(FOUR_G, 1)])), [Some(0)]);
}

#[test]
fn a_fleet_read_back_holds_the_same_starts_and_places_the_same() {
    let mut s = fleet(vec![h200("h200"), h200("h200-b")], SlotPolicy::KeepMost);
    place(&mut s, "a", &[(ONE_G, 1)]);
    place(&mut s, "b", &[(TWO_G, 1)]);
    let text = s.to_fleet().to_text(true).unwrap();
    assert!(text.contains("\"gpuInstanceStart\": 6"), "{text}");
    let mut back = FleetState::new(Fleet::from_text(&text).unwrap()).unwrap();
    assert_eq!(back.allocations(), s.allocations());
    for (name, wants) in [
        ("c", &[(ONE_G, 2)][..]),
        ("d", &[(FOUR_G, 1)][..]),
        ("e", &[(TWO_G, 1)][..]),
        ("f", &[(THREE_G, 1)][..]),
    ] {
        let one = s.place(&vgpus(name, wants), Policy::Binpack);
        let two = back.place(&vgpus(name, wants), Policy::Binpack);
        assert_eq!(one.is_ok(), two.is_ok(), "{name}: {one:?} / {two:?}");
        if let (Ok(one), Ok(two)) = (one, two) {
            assert_eq!(one, two, "{name}");
        }
    }
}

#[test]
fn no_two_allocations_on_a_gpu_hold_one_slot_under_churn() {
    let g = MigGeometry::for_device(0x2335).unwrap();
    let mut s = fleet(vec![h200("h200")], SlotPolicy::KeepMost);
    let kinds = [ONE_G, TWO_G, ONE_G, THREE_G, ONE_G, FOUR_G, TWO_G];
    for i in 0..60usize {
        let _ = s.place(
            &vgpus(&format!("m{i}"), &[(kinds[i % kinds.len()], 1)]),
            Policy::Binpack,
        );
        if i % 3 == 2 {
            let victim = s.allocations()[i % s.allocations().len().max(1)]
                .machine
                .clone();
            s.release(&victim).unwrap();
        }
        let mut held = gpu_core::slots::SlotMask::empty();
        for a in s.allocations() {
            for d in &a.devices {
                let AllocatedDevice::Vgpu {
                    gpu_instance_start: Some(at),
                    mig_slices: Some(sl),
                    framebuffer_mib: Some(fb),
                    ..
                } = d
                else {
                    panic!("keep-most records every start: {d:?}");
                };
                let p = g.profile_for(*sl, *fb).unwrap();
                assert!(p.starts.contains(at), "{} at {at}", p.name);
                assert!(
                    held.is_free(*at, p.memory_slices),
                    "{} at {at} overlaps",
                    p.name
                );
                held.hold(*at, p.memory_slices);
            }
        }
    }
}

#[test]
fn a_short_allocation_in_a_fleet_file_holds_the_start_it_gives() {
    let node = serde_json::to_value(h200("h200")).unwrap();
    let doc = serde_json::json!({
        "nodes": [node],
        "allocations": [{"machine": "vm-0", "node": "h200", "devices": [
            {"parent": "0000:10:00.4", "profile": "1414",
             "uuid": "abc73e73-307c-5fb6-af8b-b425771b9b0d", "gpuInstanceStart": 0}]}]
    });
    let mut s = FleetState::new(Fleet::from_text(&doc.to_string()).unwrap()).unwrap();
    assert_eq!(starts(&s.allocations()[0]), [Some(0)]);
    // The 1g at slot 0 holds the 4g's only start.
    let why = refused(&mut s, "vm-4", &[(FOUR_G, 1)]);
    assert!(why.contains("4g.71gb starts at [0]"), "{why}");
}

#[test]
fn a_refusal_tells_apart_nodes_whose_instances_sit_at_other_starts() {
    // Both nodes hold a 1g and a 2g (same counts, same slices); the starts differ, and so do the
    // slots left beside them.
    let alloc = |node: &str, one: u8, two: u8| {
        serde_json::json!({"machine": format!("vm-{node}"), "node": node, "devices": [
            {"parent": "0000:10:00.4", "profile": "1414",
             "uuid": "abc73e73-307c-5fb6-af8b-b425771b9b0d", "gpuInstanceStart": one},
            {"parent": "0000:10:00.5", "profile": "1418",
             "uuid": "abc73e73-307c-5fb6-af8b-b425771b9b0e", "gpuInstanceStart": two}]})
    };
    let doc = serde_json::json!({
        "nodes": [serde_json::to_value(h200("a")).unwrap(), serde_json::to_value(h200("b")).unwrap()],
        "allocations": [alloc("a", 0, 4), alloc("b", 6, 2)]
    });
    let mut s = FleetState::new(Fleet::from_text(&doc.to_string()).unwrap()).unwrap();
    let why = refused(&mut s, "vm-4", &[(FOUR_G, 1)]);
    assert!(why.contains("slots free [1, 2, 3, 6, 7]"), "{why}");
    assert!(why.contains("slots free [0, 1, 4, 5, 7]"), "{why}");
}
