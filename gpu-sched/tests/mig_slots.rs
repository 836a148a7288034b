#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! MIG start slots in placement: a MIG-backed vGPU needs a free GPU-instance start wherever the
//! GPU's existing instances sit, not just enough free slices.

use gpu_core::{
    AllocatedDevice, Fleet, Instance, MigGeometry, MigOccupancy, MigPlaced, MigProfile, MigSlots,
    NodeTopology,
};
use std::collections::BTreeMap;

use gpu_sched::testing::{h200_node, vgpu_machine as vgpus};
use gpu_sched::{FleetState, Policy, SchedError, SlotPolicy};
use proptest::prelude::*;

const ONE_G: &str = "H200X-1-18C";
const TWO_G: &str = "H200X-2-35C";
const THREE_G: &str = "H200X-3-71C";
const FOUR_G: &str = "H200X-4-71C";

fn h200() -> &'static MigGeometry {
    MigGeometry::for_device(0x2335).unwrap()
}

/// One H200 with 16 VFs whose pool tracks GPU-instance slots, as discovery writes it.
fn h200_with_slots(node: &str) -> NodeTopology {
    let mut n = h200_node(node, 1, 16);
    n.mediated_devices.pools[0].mig_slots = Some(std::sync::Arc::new(MigSlots::new(h200())));
    n
}

/// The node with existing 1g vGPUs on the first VFs at known starts (NVML's placements).
fn with_one_g_at(mut n: NodeTopology, starts: &[u8]) -> NodeTopology {
    for (vf, &start) in starts.iter().enumerate() {
        let p = &mut n.mediated_devices.parents[vf];
        let id = p.profiles[0].id.clone();
        for pr in &mut p.profiles {
            pr.available_instances = 0;
        }
        p.instances.push(Instance {
            uuid: None,
            address: p.id.pci(),
            profile: id,
            profile_name: Some(format!("NVIDIA {ONE_G}")),
            framebuffer_mib: Some(18432),
            in_use: Some(true),
            placement_id: None,
        });
        let pool = &mut n.mediated_devices.pools[0];
        pool.mig_slices_used = Some(pool.mig_slices_used.unwrap_or(0) + 1);
        if let Some(slots) = pool.mig_slots.as_mut().map(std::sync::Arc::make_mut) {
            slots.placed.push(MigPlaced {
                profile: "1g.18gb".into(),
                start,
            });
        }
    }
    n
}

fn fleet(nodes: Vec<NodeTopology>) -> FleetState {
    FleetState::new(Fleet {
        nodes,
        ..Fleet::default()
    })
    .unwrap()
}

fn refused(r: Result<gpu_core::Allocation, SchedError>) -> String {
    match r {
        Err(SchedError::Unsatisfiable(r)) => r.render(),
        other => panic!("expected a refusal, got {other:?}"),
    }
}

#[test]
fn a_3g_is_refused_when_1g_instances_sit_at_slots_0_and_4() {
    let mut s = fleet(vec![with_one_g_at(h200_with_slots("h200"), &[0, 4])]);
    // Five slices are free, but every 3g start (0 and 4) is blocked.
    let why = refused(s.place(&vgpus("vm", &[(THREE_G, 1)]), Policy::Binpack));
    assert!(why.contains("pool full"), "{why}");
    // A 2g still starts at slot 2 (slots 2-3).
    assert!(
        s.place(&vgpus("vm2", &[(TWO_G, 1)]), Policy::Binpack)
            .is_ok()
    );
}

#[test]
fn a_3g_fits_when_the_1g_instances_leave_slot_4_free() {
    let mut s = fleet(vec![with_one_g_at(h200_with_slots("h200"), &[0, 1])]);
    assert!(
        s.place(&vgpus("vm", &[(THREE_G, 1)]), Policy::Binpack)
            .is_ok()
    );
}

#[test]
fn two_3g_and_a_1g_are_refused_in_one_machine() {
    let mut s = fleet(vec![h200_with_slots("h200")]);
    // 7 of 7 compute slices, but 9 of 8 memory slices.
    refused(s.place(&vgpus("vm", &[(THREE_G, 2), (ONE_G, 1)]), Policy::Binpack));
    assert!(s.allocations().is_empty());
    // Three 1g beside one 3g fit (4 + 3 memory slices).
    assert!(
        s.place(&vgpus("vm", &[(THREE_G, 1), (ONE_G, 3)]), Policy::Binpack)
            .is_ok()
    );
}

#[test]
fn two_3g_and_a_1g_are_refused_across_machines() {
    let mut s = fleet(vec![h200_with_slots("h200")]);
    s.place(&vgpus("a", &[(THREE_G, 1)]), Policy::Binpack)
        .unwrap();
    s.place(&vgpus("b", &[(THREE_G, 1)]), Policy::Binpack)
        .unwrap();
    refused(s.place(&vgpus("c", &[(ONE_G, 1)]), Policy::Binpack));
}

#[test]
fn releasing_a_mig_allocation_frees_its_slots() {
    let mut s = fleet(vec![h200_with_slots("h200")]);
    s.place(&vgpus("a", &[(THREE_G, 1)]), Policy::Binpack)
        .unwrap();
    s.place(&vgpus("b", &[(THREE_G, 1)]), Policy::Binpack)
        .unwrap();
    refused(s.place(&vgpus("c", &[(ONE_G, 1)]), Policy::Binpack));
    s.release("a").unwrap();
    // Slots of a's 3g are free again: a 1g fits, and then no 3g (the 1g may sit in the
    // freed half).
    s.place(&vgpus("c", &[(ONE_G, 1)]), Policy::Binpack)
        .unwrap();
    refused(s.place(&vgpus("d", &[(THREE_G, 1)]), Policy::Binpack));
    s.release("c").unwrap();
    s.place(&vgpus("d", &[(THREE_G, 1)]), Policy::Binpack)
        .unwrap();
}

/// The state read back from what `first` would save: its nodes and allocations.
fn saved(first: &FleetState) -> FleetState {
    FleetState::new(Fleet {
        nodes: first.nodes().collect(),
        allocations: first.allocations(),
        ..Fleet::default()
    })
    .unwrap()
}

#[test]
fn allocations_in_a_fleet_file_hold_their_slots() {
    let mut first = fleet(vec![h200_with_slots("h200")]);
    first
        .place(&vgpus("a", &[(THREE_G, 1)]), Policy::Binpack)
        .unwrap();
    let mut s = saved(&first);
    // The saved 3g holds half the GPU: a second 3g takes the other half, and then a 1g finds
    // no start although one slice is free.
    s.place(&vgpus("b", &[(THREE_G, 1)]), Policy::Binpack)
        .unwrap();
    refused(s.place(&vgpus("c", &[(ONE_G, 1)]), Policy::Binpack));
    // The saved 3g says where it starts (slot 4, which keeps the 4g's slot 0): once b is gone,
    // a 4g fits beside it.
    s.release("b").unwrap();
    s.place(&vgpus("d", &[(FOUR_G, 1)]), Policy::Binpack)
        .unwrap();
}

#[test]
fn a_saved_allocation_of_unknown_start_blocks_a_4g_wherever_it_may_sit() {
    let mut first = fleet(vec![h200_with_slots("h200")]);
    first.set_slot_policy(SlotPolicy::Driver);
    first
        .place(&vgpus("a", &[(THREE_G, 1)]), Policy::Binpack)
        .unwrap();
    let mut s = saved(&first);
    // A 4g never fits beside a 3g of unknown start (it may sit at slot 0).
    refused(s.place(&vgpus("d", &[(FOUR_G, 1)]), Policy::Binpack));
}

/// The GPU-instance profile of an allocated vGPU on the H200.
fn profile_of(d: &AllocatedDevice) -> &'static MigProfile {
    match d {
        AllocatedDevice::Vgpu {
            mig_slices: Some(s),
            framebuffer_mib: Some(fb),
            ..
        } => h200().profile_for(*s, *fb).unwrap(),
        other => panic!("not a MIG-backed vGPU: {other:?}"),
    }
}

const CHOICES: [&str; 5] = [ONE_G, TWO_G, THREE_G, FOUR_G, "H200X-7-141C"];

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Whatever the existing instances and the order of Machines and releases, what the solver
    /// holds on a GPU (existing instances at their starts plus every allocation) always has a
    /// placement: the solver never places a MIG set that `place_all` rejects.
    #[test]
    fn the_solver_never_places_a_set_place_all_rejects(
        existing in proptest::collection::vec(0u8..7, 0..3),
        ops in proptest::collection::vec((0usize..5, 1u32..3, any::<bool>()), 1..12),
    ) {
        // Existing 1g instances at distinct known starts.
        let mut starts = existing.clone();
        starts.sort_unstable();
        starts.dedup();
        let node = with_one_g_at(h200_with_slots("h200"), &starts);
        let mut known = MigOccupancy::empty();
        let one = h200().profile_named("1g.18gb").unwrap();
        for s in &starts {
            known.hold(*s, one);
        }
        let mut s = fleet(vec![node]);
        for (i, (choice, count, release)) in ops.iter().enumerate() {
            let name = format!("vm{i}");
            let _ = s.place(&vgpus(&name, &[(CHOICES[*choice], *count)]), Policy::Binpack);
            if *release && i % 3 == 2 {
                let first = s.allocations().first().map(|a| a.machine.clone());
                if let Some(m) = first {
                    s.release(&m).unwrap();
                }
            }
            let held: Vec<&MigProfile> = s
                .allocations()
                .iter()
                .flat_map(|a| a.devices.iter().map(profile_of).collect::<Vec<_>>())
                .collect();
            prop_assert!(
                h200().place_all(known, &held).is_ok(),
                "placed {:?} beside 1g at {:?}",
                held.iter().map(|p| p.name).collect::<Vec<_>>(),
                starts
            );
        }
    }
}

/// The brute-force oracle: whether `n` more GPU instances of `p` fit beside `held` memory slots
/// and `compute` used compute slices of one H200, trying every combination of starts.
fn oracle_fits(held: gpu_core::slots::SlotMask, compute: u32, p: &MigProfile, n: u32) -> bool {
    if compute + u32::from(p.compute_slices) * n > u32::from(h200().compute_slices) {
        return false;
    }
    if n == 0 {
        return true;
    }
    p.starts.iter().any(|&s| {
        let mut next = held;
        next.is_free(s, p.memory_slices) && {
            next.hold(s, p.memory_slices);
            oracle_fits(next, compute + u32::from(p.compute_slices), p, n - 1)
        }
    })
}

/// Per node: the memory slots and compute slices held, from the existing 1g instances and every
/// allocation's recorded start; fails when a start is missing, illegal or overlaps another.
fn held_per_node(
    s: &FleetState,
    existing: &[(String, Vec<u8>)],
) -> Result<BTreeMap<String, (gpu_core::slots::SlotMask, u32)>, String> {
    let one = h200().profile_named("1g.18gb").unwrap();
    let mut out = BTreeMap::new();
    for (node, starts) in existing {
        let mut m = gpu_core::slots::SlotMask::empty();
        for &st in starts {
            m.hold(st, one.memory_slices);
        }
        out.insert(node.clone(), (m, starts.len() as u32));
    }
    for a in s.allocations() {
        let (mask, compute) = out.get_mut(&a.node).ok_or("unknown node")?;
        for d in &a.devices {
            let p = profile_of(d);
            let AllocatedDevice::Vgpu {
                gpu_instance_start: Some(at),
                ..
            } = d
            else {
                return Err(format!("{}: no start recorded: {d:?}", a.machine));
            };
            if !p.starts.contains(at) || !mask.is_free(*at, p.memory_slices) {
                return Err(format!(
                    "{}: {} at {at} is illegal or taken",
                    a.machine, p.name
                ));
            }
            mask.hold(*at, p.memory_slices);
            *compute += u32::from(p.compute_slices);
        }
        if *compute > u32::from(h200().compute_slices) {
            return Err(format!("{} compute slices on {}", compute, a.node));
        }
    }
    Ok(out)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    /// The oracle covers slots: under keep-most and first-fit alike, no two placements hold one
    /// slot (every start recorded, legal and apart), and a Machine is placed exactly when the
    /// brute-force oracle finds starts for all its instances on some node beside what is held.
    #[test]
    fn chosen_starts_never_share_a_slot_and_feasibility_agrees_with_the_oracle(
        existing in proptest::collection::vec(proptest::collection::vec(0u8..7, 0..3), 1..3),
        ops in proptest::collection::vec((0usize..5, 1u32..4, 0usize..4), 1..16),
        first_fit in any::<bool>(),
    ) {
        let mut nodes = Vec::new();
        let mut known = Vec::new();
        for (i, starts) in existing.iter().enumerate() {
            let mut starts = starts.clone();
            starts.sort_unstable();
            starts.dedup();
            let name = format!("h200-{i}");
            nodes.push(with_one_g_at(h200_with_slots(&name), &starts));
            known.push((name, starts));
        }
        let mut s = fleet(nodes);
        s.set_slot_policy(if first_fit { SlotPolicy::FirstFit } else { SlotPolicy::KeepMost });
        for (i, (choice, count, release)) in ops.iter().enumerate() {
            let before = held_per_node(&s, &known).map_err(TestCaseError::fail)?;
            let p = h200().profile_for(
                [1, 2, 3, 4, 7][*choice],
                [18432, 35840, 72704, 72704, 144384][*choice],
            ).unwrap();
            let oracle = before.values().any(|(m, c)| oracle_fits(*m, *c, p, *count));
            let got = s.place(&vgpus(&format!("vm{i}"), &[(CHOICES[*choice], *count)]), Policy::Binpack);
            prop_assert_eq!(got.is_ok(), oracle, "{} x {}: {:?} beside {:?}", count, p.name, got, before);
            held_per_node(&s, &known).map_err(TestCaseError::fail)?;
            if *release == 0 {
                if let Some(m) = s.allocations().first().map(|a| a.machine.clone()) {
                    s.release(&m).unwrap();
                }
            }
        }
    }
}
