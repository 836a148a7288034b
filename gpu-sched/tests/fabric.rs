#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! Placement on NVSwitch nodes: whole-GPU Machines get the members of one free partition, the
//! choice keeps larger partitions whole, refusals say which partitions were busy.
//!
//! The HGX node of `gpu_sched::testing::hgx_node`: nvidia0..7 are modules 1..8; partition 1 is
//! all eight, 2 is nvidia0, 1, 4, 5 and 3 is nvidia2, 3, 6, 7; pairs 4 (nvidia0, 2), 5 (nvidia1, 3),
//! 6 (nvidia4, 6), 7 (nvidia5, 7); 8..15 one GPU each.

use gpu_core::{Allocation, FabricManager, FabricMode, Fleet, Machine, NodeTopology};
use gpu_sched::testing::{hgx_node, whole_node};
use gpu_sched::{FleetState, Policy, ReasonKind, SchedError};

fn fleet(nodes: Vec<NodeTopology>) -> FleetState {
    FleetState::new(Fleet {
        nodes,
        ..Fleet::default()
    })
    .unwrap()
}

fn gpus(name: &str, count: u32, extra: &str) -> Machine {
    Machine::from_text(&format!(
        "name: {name}\ndevices: [{{name: gpu, count: {count}, gpus: [nvidia]{extra}}}]"
    ))
    .unwrap()
}

fn named(name: &str, list: &str) -> Machine {
    Machine::from_text(&format!(
        "name: {name}\ndevices: [{{name: gpu, gpus: [{list}]}}]"
    ))
    .unwrap()
}

fn names(a: &Allocation) -> Vec<String> {
    let mut v: Vec<String> = a
        .devices
        .iter()
        .map(|d| match d {
            gpu_core::AllocatedDevice::Gpu { name, .. } => name.clone(),
            other => panic!("expected a whole GPU, got {other:?}"),
        })
        .collect();
    v.sort();
    v
}

fn refusal(e: SchedError) -> gpu_sched::Refusal {
    match e {
        SchedError::Unsatisfiable(r) => r,
        other => panic!("expected a refusal, got {other:?}"),
    }
}

#[test]
fn a_four_gpu_machine_gets_the_members_of_one_partition() {
    let mut s = fleet(vec![hgx_node("a")]);
    let a = s.place(&gpus("m", 4, ""), Policy::Binpack).unwrap();
    assert_eq!(names(&a), ["nvidia0", "nvidia1", "nvidia4", "nvidia5"]);
    let b = s.place(&gpus("n", 4, ""), Policy::Binpack).unwrap();
    assert_eq!(names(&b), ["nvidia2", "nvidia3", "nvidia6", "nvidia7"]);
}

#[test]
fn a_single_gpu_goes_where_it_keeps_a_four_gpu_partition_whole() {
    // nvidia2 (partition 3) is taken: the next GPU goes to partition 3 too, so partition 2
    // stays whole for a 4-GPU Machine. First-fit takes nvidia0 and breaks it.
    let mut s = fleet(vec![hgx_node("a")]);
    s.place(&named("held", "nvidia2"), Policy::Binpack).unwrap();
    let one = s.try_place(&gpus("one", 1, ""), Policy::FirstFit).unwrap();
    assert_eq!(names(&one), ["nvidia0"]);
    let one = s.place(&gpus("one", 1, ""), Policy::Binpack).unwrap();
    assert_eq!(names(&one), ["nvidia3"]);
    let four = s.place(&gpus("four", 4, ""), Policy::Binpack).unwrap();
    assert_eq!(names(&four), ["nvidia0", "nvidia1", "nvidia4", "nvidia5"]);
}

#[test]
fn a_set_of_named_gpus_must_be_one_partition() {
    let s = fleet(vec![hgx_node("a")]);
    let ok = s
        .try_place(&named("m", "nvidia7, nvidia5"), Policy::Binpack)
        .unwrap();
    assert_eq!(names(&ok), ["nvidia5", "nvidia7"]);
    let e = s
        .try_place(&named("m", "nvidia0, nvidia1"), Policy::Binpack)
        .unwrap_err();
    let r = refusal(e);
    assert_eq!(
        r.render(),
        "0/1 nodes available: 1 node(s): NoFreePartition: needs 2 gpu GPU(s) as one NVSwitch partition, none free (no 2-GPU partition holds nvidia0, nvidia1; would do: partition 4 (nvidia0, nvidia2), partition 5 (nvidia1, nvidia3), partition 6 (nvidia4, nvidia6), partition 7 (nvidia5, nvidia7)) (excluded: 6 other family)"
    );
    let e = s.try_place(&gpus("m", 3, ""), Policy::Binpack).unwrap_err();
    assert!(
        refusal(e)
            .render()
            .contains("(no 3-GPU partition on the node; sizes 1, 2, 4, 8)"),
    );
}

#[test]
fn a_refusal_names_the_busy_partitions_node_by_node() {
    let mut s = fleet(vec![hgx_node("a"), whole_node("b", 2)]);
    for (m, gpu) in [("x", "nvidia0"), ("y", "nvidia7")] {
        let on_a = Machine {
            target_node: Some("a".into()),
            ..named(m, gpu)
        };
        s.place(&on_a, Policy::Binpack).unwrap();
    }
    let e = s.try_place(&gpus("m", 4, ""), Policy::Binpack).unwrap_err();
    let r = refusal(e);
    let nodes = r.nodes();
    let a = nodes.iter().find(|n| n.node == "a").unwrap();
    assert_eq!(a.reasons[0].kind, ReasonKind::NoFreePartition);
    assert_eq!(a.reasons[0].free, 6);
    assert_eq!(
        a.reasons[0].partitions,
        [
            "partition 2 (nvidia0, nvidia1, nvidia4, nvidia5): nvidia0 in use or filtered out",
            "partition 3 (nvidia2, nvidia3, nvidia6, nvidia7): nvidia7 in use or filtered out",
        ]
    );
    let json = serde_json::to_value(&r).unwrap();
    assert_eq!(json["nodes"][0]["reasons"][0]["kind"], "NoFreePartition");
    assert!(r.render().contains(
        "NoFreePartition: needs 4 gpu GPU(s) as one NVSwitch partition, none free (partition 2"
    ));
    // Two free GPUs that are a partition still do.
    let on_a = Machine {
        target_node: Some("a".into()),
        ..gpus("p", 2, "")
    };
    let pair = s.try_place(&on_a, Policy::Binpack).unwrap();
    assert_eq!(pair.node, "a");
    assert_eq!(names(&pair), ["nvidia1", "nvidia3"]);
}

#[test]
fn a_degraded_partition_is_not_handed_out() {
    let mut n = hgx_node("a");
    let f = n.fabric.as_mut().unwrap();
    f.partitions[1].degraded = Some("NVLink 3 of nvidia4 failed".into());
    let s = fleet(vec![n]);
    let four = s.try_place(&gpus("m", 4, ""), Policy::Binpack).unwrap();
    assert_eq!(names(&four), ["nvidia2", "nvidia3", "nvidia6", "nvidia7"]);
}

#[test]
fn without_fabric_manager_no_set_of_several_gpus_is_handed_out() {
    let mut n = hgx_node("a");
    let f = n.fabric.as_mut().unwrap();
    f.fabric_manager = FabricManager::unreachable("libnvfm.so.1 not found");
    f.partitions.clear();
    let s = fleet(vec![n]);
    let e = s.try_place(&gpus("m", 2, ""), Policy::Binpack).unwrap_err();
    assert_eq!(
        refusal(e).render(),
        "0/1 nodes available: 1 node(s): FabricUnreachable: needs 2 gpu GPU(s) joined by NVLink, Fabric Manager cannot be reached (libnvfm.so.1 not found)"
    );
    assert!(s.try_place(&gpus("m", 1, ""), Policy::Binpack).is_ok());
}

#[test]
fn bare_metal_mode_and_nodes_without_fabric_place_as_before() {
    let mut n = hgx_node("a");
    n.fabric.as_mut().unwrap().fabric_manager = FabricManager::reachable(FabricMode::BareMetal);
    for node in [n, whole_node("a", 8)] {
        let s = fleet(vec![node]);
        let four = s.try_place(&gpus("m", 4, ""), Policy::Binpack).unwrap();
        assert_eq!(names(&four), ["nvidia0", "nvidia1", "nvidia2", "nvidia3"]);
    }
}

#[test]
fn a_migration_and_a_drain_land_on_a_partition() {
    let mut s = fleet(vec![hgx_node("a"), hgx_node("b")]);
    s.place(&named("x", "nvidia1"), Policy::Binpack).unwrap();
    let m = Machine {
        target_node: Some("a".into()),
        ..gpus("m", 2, "")
    };
    s.place(&m, Policy::Binpack).unwrap();
    // On b nvidia1 is held: the pair goes where partitions stay whole.
    s.place(
        &Machine {
            target_node: Some("b".into()),
            ..named("z", "nvidia1")
        },
        Policy::Binpack,
    )
    .unwrap();
    let plan = s.plan_migration("m", "b", &[]).unwrap();
    assert_eq!(plan.to, "b");
    let got = names(&plan.allocation);
    assert!(
        [
            ["nvidia0", "nvidia2"],
            ["nvidia4", "nvidia6"],
            ["nvidia5", "nvidia7"]
        ]
        .iter()
        .any(|p| got == *p),
        "{got:?} is no free pair partition"
    );
    let e = s
        .plan_migration("m", "b", &["nvidia0".into(), "nvidia3".into()])
        .unwrap_err();
    assert_eq!(
        refusal(e).nodes()[0].reasons[0].kind,
        ReasonKind::NoFreePartition
    );
    let drain = s.plan_drain("a").unwrap();
    for mv in &drain.moves {
        let set = names(&mv.allocation);
        let node = hgx_node("b");
        let addrs: Vec<_> = set
            .iter()
            .map(|n| node.gpus.iter().find(|g| g.name == *n).unwrap().address)
            .collect();
        assert!(
            node.fabric.as_ref().unwrap().exact(&addrs).is_some(),
            "{set:?} is no partition"
        );
    }
    assert!(drain.stay.is_empty(), "{:?}", drain.stay);
}

/// Whole GPUs of one Machine as a set: on an NVSwitch node its whole-GPU requests are one set,
/// so they get one partition of their total size, never a partition each.
#[test]
fn a_machines_whole_gpu_requests_share_one_partition() {
    let s = fleet(vec![hgx_node("a")]);
    let set = |a: &Allocation| {
        let node = hgx_node("a");
        let addrs: Vec<_> = names(a)
            .iter()
            .map(|n| node.gpus.iter().find(|g| g.name == *n).unwrap().address)
            .collect();
        node.fabric
            .as_ref()
            .unwrap()
            .exact(&addrs)
            .map(|p| p.size())
    };
    for policy in [Policy::Binpack, Policy::Spread, Policy::FirstFit] {
        let two = Machine::from_text(
            "name: m\ndevices: [{name: a, gpus: [nvidia]}, {name: b, gpus: [nvidia]}]",
        )
        .unwrap();
        let a = s.try_place(&two, policy).unwrap();
        assert_eq!(set(&a), Some(2), "{policy:?}: {:?}", names(&a));
        let four = Machine::from_text(
            "name: m\ndevices: [{name: a, count: 2, gpus: [nvidia]}, {name: b, count: 2, gpus: [nvidia]}]",
        )
        .unwrap();
        let a = s.try_place(&four, policy).unwrap();
        assert_eq!(set(&a), Some(4), "{policy:?}: {:?}", names(&a));
        // A named GPU fixes the partition; the other request takes the rest of it.
        let named_pair = Machine::from_text(
            "name: m\ndevices: [{name: a, gpus: [nvidia5]}, {name: b, gpus: [nvidia]}]",
        )
        .unwrap();
        let a = s.try_place(&named_pair, policy).unwrap();
        assert_eq!(names(&a), ["nvidia5", "nvidia7"], "{policy:?}");
    }
    // Three whole GPUs in all: no 3-GPU partition, so the node says no.
    let three = Machine::from_text(
        "name: m\ndevices: [{name: a, count: 2, gpus: [nvidia]}, {name: b, gpus: [nvidia]}]",
    )
    .unwrap();
    let e = s.try_place(&three, Policy::Binpack).unwrap_err();
    assert_eq!(
        refusal(e).render(),
        "0/1 nodes available: 1 node(s): ConflictingRequests: requests a, b fit one at a time but not together"
    );
}

/// Binpack's node order knows partitions: a pair goes to the node where it breaks no whole
/// 4-GPU partition (b, 6 free GPUs), not to the node with the fewest free GPUs (a, 5 free,
/// whose every free pair would break its last whole 4-GPU partition), so a 4-GPU Machine
/// still fits afterwards.
#[test]
fn binpack_prefers_the_node_where_a_machine_breaks_no_larger_partition() {
    let mut s = fleet(vec![hgx_node("a"), hgx_node("b")]);
    for (node, held) in [
        ("a", ["nvidia0", "nvidia1", "nvidia4"].as_slice()),
        ("b", ["nvidia0", "nvidia2"].as_slice()),
    ] {
        for g in held {
            let m = Machine {
                target_node: Some(node.into()),
                ..named(&format!("{node}-{g}"), g)
            };
            s.place(&m, Policy::Binpack).unwrap();
        }
    }
    let pair = s.place(&gpus("pair", 2, ""), Policy::Binpack).unwrap();
    assert_eq!(pair.node, "b");
    let four = s.place(&gpus("four", 4, ""), Policy::Binpack).unwrap();
    assert_eq!(four.node, "a");
    assert_eq!(names(&four), ["nvidia2", "nvidia3", "nvidia6", "nvidia7"]);
    // The index follows releases too: with the pair gone, b's pairs are free again.
    s.release("pair").unwrap();
    let again = s.place(&gpus("again", 2, ""), Policy::Binpack).unwrap();
    assert_eq!(again.node, "b");
}
