#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! Placement, accounting and refusal messages, one behaviour per test.

use gpu_core::{
    AllocatedDevice, Allocation, AllocationStatus, Fleet, GpuState, Health, HealthState, Instance,
    Machine, MdevUuid, NodeTopology, ParentId,
};
use gpu_sched::testing::{a2_node, h200_node, l40s_node, mbochs_node, whole_node};
use gpu_sched::{FleetState, Policy, ReasonKind, SchedError};

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

fn vgpu(name: &str, profile: &str, count: u32) -> Machine {
    machine(&format!(
        "name: {name}\ndevices: [{{name: gpu, profile: \"{profile}\", count: {count}}}]"
    ))
}

fn whole(name: &str, extra: &str) -> Machine {
    machine(&format!("name: {name}\ndevices: [{{name: gpu{extra}}}]"))
}

fn refusal_text(e: SchedError) -> String {
    match e {
        SchedError::Unsatisfiable(r) => r.render(),
        other => panic!("expected a refusal, got {other:?}"),
    }
}

/// mbochs after one large instance exists: 48/12/3 left, pool 192 of 256 MiB free.
fn mbochs_with_one_large(node: &str) -> NodeTopology {
    let mut n = mbochs_node(node);
    let p = &mut n.mediated_devices.parents[0];
    p.profiles[0].available_instances = 48;
    p.profiles[1].available_instances = 12;
    p.profiles[2].available_instances = 3;
    p.instances.push(Instance {
        uuid: Some(MdevUuid::for_machine("old", "gpu", 0)),
        address: None,
        profile: p.profiles[2].id.clone(),
        profile_name: None,
        framebuffer_mib: Some(64),
        in_use: Some(true),
        placement_id: None,
    });
    n.mediated_devices.pools[0].used_mib = 64;
    n.mediated_devices.pools[0].size_locked_mib = Some(64);
    n.mediated_devices.pools[0].mixed_size = true;
    n
}

#[test]
fn refusal_reads_like_the_issue_example() {
    let s = fleet(vec![
        mbochs_with_one_large("a"),
        whole_node("b", 2),
        whole_node("c", 2),
    ]);
    let e = s.try_place(&vgpu("m", "mbochs-large", 4), Policy::Binpack);
    assert_eq!(
        refusal_text(e.unwrap_err()),
        "0/3 nodes available: 2 node(s): ProfileNotOffered: needs 4 gpu profile mbochs-large, not offered; 1 node(s): TopologyUnsatisfiable: needs 4 gpu profile mbochs-large, 3 free"
    );
}

#[test]
fn refusal_is_structured_data_with_camel_case_keys() {
    let s = fleet(vec![mbochs_with_one_large("a")]);
    let e = s
        .try_place(&vgpu("m", "mbochs-large", 4), Policy::Binpack)
        .unwrap_err();
    let r = e.refusal().unwrap();
    assert_eq!(r.nodes_total, 1);
    let reason = &r.nodes()[0].reasons[0];
    assert_eq!(reason.kind, ReasonKind::TopologyUnsatisfiable);
    assert_eq!((reason.needed, reason.free), (4, 3));
    let json = serde_json::to_value(r).unwrap();
    assert_eq!(json["nodesTotal"], 1);
    assert_eq!(
        json["nodes"][0]["reasons"][0]["kind"],
        "TopologyUnsatisfiable"
    );
    assert_eq!(json["nodes"][0]["reasons"][0]["profile"], "mbochs-large");
}

#[test]
fn a_refusal_keeps_nodes_that_say_the_same_together_and_lists_them_in_node_order() {
    let mut nodes: Vec<NodeTopology> = (0..6).map(|i| whole_node(&format!("w{i}"), 2)).collect();
    nodes.push(mbochs_with_one_large("m0"));
    nodes.push(mbochs_with_one_large("m1"));
    let mut s = fleet(nodes);
    // A placement changes one mbochs node; its answer then differs from its twin's.
    s.place(&vgpu("small", "mbochs-large", 1), Policy::Binpack)
        .unwrap();
    let e = s
        .try_place(&vgpu("m", "mbochs-large", 4), Policy::Binpack)
        .unwrap_err();
    let r = e.refusal().unwrap();
    assert_eq!((r.nodes_total, r.refused_count()), (8, 8));
    let names: Vec<String> = r.nodes().into_iter().map(|n| n.node).collect();
    assert_eq!(names, ["w0", "w1", "w2", "w3", "w4", "w5", "m0", "m1"]);
    let free = |n: &str| r.reasons_of(n).map(|rs| rs[0].free);
    assert_eq!((free("m0"), free("m1")), (Some(2), Some(3)));
    assert_eq!(
        r.reasons_of("w3").map(|rs| rs[0].kind),
        Some(ReasonKind::ProfileNotOffered)
    );
    assert_eq!(r.reasons_of("nowhere"), None);
    assert_eq!(
        r.render(),
        "0/8 nodes available: 6 node(s): ProfileNotOffered: needs 4 gpu profile mbochs-large, not offered; 1 node(s): TopologyUnsatisfiable: needs 4 gpu profile mbochs-large, 2 free; 1 node(s): TopologyUnsatisfiable: needs 4 gpu profile mbochs-large, 3 free"
    );
}

#[test]
fn an_empty_fleet_says_so() {
    let s = fleet(vec![]);
    let e = s.try_place(&vgpu("m", "A2-4Q", 1), Policy::Binpack);
    assert_eq!(
        refusal_text(e.unwrap_err()),
        "0/0 nodes available: the fleet has no nodes"
    );
}

#[test]
fn parent_types_share_capacity_in_proportion_to_their_counts() {
    let mut s = fleet(vec![mbochs_node("a")]);
    s.place(&vgpu("m1", "mbochs-medium", 1), Policy::Binpack)
        .unwrap();
    // 256 - 16 = 240 MiB: 60 small or 3 large still fit.
    assert_eq!(s.free_instances("mbochs-small"), vec![("a".into(), 60)]);
    assert_eq!(s.free_instances("mbochs-large"), vec![("a".into(), 3)]);
    let e = s
        .try_place(&vgpu("m2", "mbochs-large", 4), Policy::Binpack)
        .unwrap_err();
    assert!(
        refusal_text(e).ends_with("needs 4 gpu profile mbochs-large, 3 free"),
        "message"
    );
}

#[test]
fn same_size_rule_refuses_another_size_on_a_locked_gpu() {
    let mut s = fleet(vec![a2_node("a", 1, 8)]);
    let a = s.place(&vgpu("m1", "A2-4Q", 1), Policy::Binpack).unwrap();
    assert_eq!(a.node, "a");
    let e = s
        .try_place(&vgpu("m2", "A2-2Q", 1), Policy::Binpack)
        .unwrap_err();
    assert_eq!(
        refusal_text(e),
        "0/1 nodes available: 1 node(s): TopologyUnsatisfiable: needs 1 gpu profile A2-2Q, 0 free (excluded: 1 size-locked)"
    );
    // The same size still fits: 16 GiB holds four 4 GiB vGPUs, and 4C shares the 4 GiB lock.
    s.place(&vgpu("m3", "A2-4C", 3), Policy::Binpack).unwrap();
    let e = s
        .try_place(&vgpu("m4", "A2-4Q", 1), Policy::Binpack)
        .unwrap_err();
    assert_eq!(
        refusal_text(e),
        "0/1 nodes available: 1 node(s): TopologyUnsatisfiable: needs 1 gpu profile A2-4Q, 0 free (excluded: 1 pool full)"
    );
}

#[test]
fn every_vf_used_reads_as_no_free_parent() {
    let mut s = fleet(vec![a2_node("a", 1, 2)]);
    s.place(&vgpu("m1", "A2-1Q", 2), Policy::Binpack).unwrap();
    let e = s
        .try_place(&vgpu("m2", "A2-1Q", 1), Policy::Binpack)
        .unwrap_err();
    assert!(
        refusal_text(e).ends_with("needs 1 gpu profile A2-1Q, 0 free (excluded: 1 no free parent)")
    );
}

#[test]
fn a_vf_alone_in_its_pool_takes_one_vgpu() {
    // One VF enabled: the parent is its pool's only one, and 14 GiB stay free after a 2Q,
    // but the VF reads 1 for every type: a second vGPU does not fit on it.
    let mut s = fleet(vec![a2_node("a", 1, 1)]);
    s.place(&vgpu("m1", "A2-2Q", 1), Policy::Binpack).unwrap();
    for p in ["A2-2Q", "A2-1Q"] {
        let e = s.try_place(&vgpu("m2", p, 1), Policy::Binpack).unwrap_err();
        let text = refusal_text(e);
        assert!(text.contains(", 0 free"), "{p}: {text}");
    }
    assert!(
        s.try_place(&vgpu("m2", "A2-2Q", 2), Policy::Binpack)
            .is_err()
    );
    // Released, the VF takes one again.
    s.release("m1").unwrap();
    s.place(&vgpu("m3", "A2-4Q", 1), Policy::Binpack).unwrap();
}

#[test]
fn profiles_match_by_id_or_name_ignoring_case_and_prefix() {
    let s = fleet(vec![a2_node("a", 1, 4), l40s_node("b", 1, 4)]);
    for p in [
        "nvidia-746",
        "A2-4Q",
        "a2-4q",
        "NVIDIA A2-4Q",
        "GRID A2-4Q",
        "grid a2-4q",
    ] {
        let a = s.try_place(&vgpu("m", p, 1), Policy::Binpack).unwrap();
        assert_eq!(a.node, "a", "{p}");
        match &a.devices[0] {
            AllocatedDevice::Vgpu {
                profile,
                profile_name,
                ..
            } => {
                assert_eq!(profile.as_str(), "nvidia-746");
                assert_eq!(profile_name, "NVIDIA A2-4Q");
            }
            d => panic!("{d:?}"),
        }
    }
    let a = s.try_place(&vgpu("m", "1155", 1), Policy::Binpack).unwrap();
    assert_eq!(a.node, "b");
}

#[test]
fn a_mig_suffix_is_dropped_only_when_the_exact_name_is_unknown() {
    let s = fleet(vec![h200_node("a", 1, 7)]);
    let a = s
        .try_place(&vgpu("m", "H200X-1-18CME", 1), Policy::Binpack)
        .unwrap();
    assert_eq!(a.node, "a");
}

#[test]
fn vgpu_output_has_parent_profile_framebuffer_and_a_stable_uuid() {
    let mut s = fleet(vec![a2_node("a", 1, 4)]);
    let a = s.place(&vgpu("vm1", "A2-4Q", 2), Policy::Binpack).unwrap();
    assert_eq!(a.status, AllocationStatus::Pending);
    assert_eq!(a.devices.len(), 2);
    for (i, d) in a.devices.iter().enumerate() {
        match d {
            AllocatedDevice::Vgpu {
                request,
                index,
                parent,
                gpu,
                framebuffer_mib,
                uuid,
                ..
            } => {
                assert_eq!(request, "gpu");
                assert_eq!(*index as usize, i);
                assert_eq!(gpu.unwrap().to_string(), "0000:10:00.0");
                assert_eq!(*framebuffer_mib, Some(4096));
                assert_eq!(*uuid, MdevUuid::for_machine("vm1", "gpu", i as u32));
                // The first free VFs, in address order.
                let want = ["0000:10:00.4", "0000:10:00.5"][i];
                assert_eq!(parent.to_string(), want);
            }
            d => panic!("{d:?}"),
        }
    }
}

#[test]
fn binpack_fills_the_partly_used_gpu_and_spread_the_empty_one() {
    let mut s = fleet(vec![a2_node("a", 2, 8)]);
    s.place(&vgpu("m1", "A2-4Q", 1), Policy::Binpack).unwrap();
    let gpu_of = |a: &Allocation| match &a.devices[0] {
        AllocatedDevice::Vgpu { gpu, .. } => gpu.unwrap().to_string(),
        d => panic!("{d:?}"),
    };
    let b = s
        .try_place(&vgpu("m2", "A2-4Q", 1), Policy::Binpack)
        .unwrap();
    assert_eq!(gpu_of(&b), "0000:10:00.0");
    let sp = s
        .try_place(&vgpu("m2", "A2-4Q", 1), Policy::Spread)
        .unwrap();
    assert_eq!(gpu_of(&sp), "0000:20:00.0");
}

#[test]
fn binpack_prefers_the_fuller_node_and_spread_the_emptier() {
    let s = fleet(vec![mbochs_node("empty"), mbochs_with_one_large("used")]);
    let b = s
        .try_place(&vgpu("m", "mbochs-small", 1), Policy::Binpack)
        .unwrap();
    assert_eq!(b.node, "used");
    let sp = s
        .try_place(&vgpu("m", "mbochs-small", 1), Policy::Spread)
        .unwrap();
    assert_eq!(sp.node, "empty");
}

#[test]
fn unhealthy_gpus_are_never_handed_out() {
    let mut n = whole_node("a", 2);
    n.gpus[0].health = Health {
        state: HealthState::Unhealthy,
        reasons: vec!["fatal AER".into()],
    };
    let s = fleet(vec![n]);
    let a = s.try_place(&whole("m", ""), Policy::Binpack).unwrap();
    match &a.devices[0] {
        AllocatedDevice::Gpu { name, .. } => assert_eq!(name, "nvidia1"),
        d => panic!("{d:?}"),
    }
    let e = s
        .try_place(&whole("m", ", count: 2"), Policy::Binpack)
        .unwrap_err();
    assert_eq!(
        refusal_text(e),
        "0/1 nodes available: 1 node(s): InsufficientGpus: needs 2 gpu GPU(s), 1 free (excluded: 1 unhealthy)"
    );
}

#[test]
fn unhealthy_parents_offer_nothing() {
    let mut n = a2_node("a", 2, 2);
    n.gpus[0].health.state = HealthState::Unhealthy;
    let s = fleet(vec![n]);
    let e = s
        .try_place(&vgpu("m", "A2-16Q", 2), Policy::Binpack)
        .unwrap_err();
    assert!(
        refusal_text(e).ends_with("needs 2 gpu profile A2-16Q, 1 free (excluded: 1 unhealthy)")
    );
}

#[test]
fn degraded_gpus_are_used_last_and_marked() {
    let mut n = whole_node("a", 2);
    n.gpus[0].health = Health {
        state: HealthState::Degraded,
        reasons: vec!["link x8 of x16".into()],
    };
    let mut s = fleet(vec![n]);
    let first = s.place_detailed(&whole("m1", ""), Policy::Binpack).unwrap();
    assert!(first.degraded.is_empty());
    let second = s.place_detailed(&whole("m2", ""), Policy::Binpack).unwrap();
    assert_eq!(second.degraded.len(), 1);
    assert_eq!(second.degraded[0].device, "nvidia0");
    assert_eq!(second.degraded[0].reasons, ["link x8 of x16"]);
    let json = serde_json::to_value(&second).unwrap();
    assert_eq!(json["machine"], "m2");
    assert_eq!(json["degraded"][0]["device"], "nvidia0");
}

#[test]
fn whole_gpu_filters_each_name_what_they_excluded() {
    let mut n = whole_node("a", 6);
    n.gpus[0].state = GpuState::Blocked;
    n.gpus[1].state = GpuState::InUse;
    n.gpus[2].memory_mib = Some(16384);
    n.gpus[3].model = "A100".into();
    n.gpus[4].class = gpu_core::ClassCode(0x030000);
    let s = fleet(vec![n]);
    let e = s
        .try_place(
            &machine(
                "name: m\ndevices: [{name: big, class: accelerator, model: H100, minMemory: 80Gi, count: 2}]",
            ),
            Policy::Binpack,
        )
        .unwrap_err();
    assert_eq!(
        refusal_text(e),
        "0/1 nodes available: 1 node(s): InsufficientGpus: needs 2 big GPU(s), 1 free (excluded: 1 wrong class, 1 wrong model, 1 too small, 1 blocked, 1 in use)"
    );
    let e = s
        .try_place(&whole("m", ", vendor: amd"), Policy::Binpack)
        .unwrap_err();
    assert!(refusal_text(e).ends_with("0 free (excluded: 6 wrong vendor)"));
}

#[test]
fn numa_alignment_keeps_a_request_on_one_numa_node() {
    let s = fleet(vec![whole_node("a", 8)]);
    let a = s
        .try_place(&whole("m", ", count: 4, alignment: numa"), Policy::Binpack)
        .unwrap();
    let numa: Vec<_> = a
        .devices
        .iter()
        .map(|d| match d {
            AllocatedDevice::Gpu { address, .. } => address.bus() < 0x80,
            d => panic!("{d:?}"),
        })
        .collect();
    assert!(numa.iter().all(|x| *x == numa[0]));
    let e = s
        .try_place(&whole("m", ", count: 5, alignment: numa"), Policy::Binpack)
        .unwrap_err();
    assert_eq!(
        refusal_text(e),
        "0/1 nodes available: 1 node(s): InsufficientGpus: needs 5 gpu GPU(s) on one NUMA node, 4 free (excluded: 4 wrong NUMA)"
    );
}

#[test]
fn numa_alignment_keeps_vgpus_on_one_numa_node_too() {
    // 8 H200s, 4 per socket; a 4-slice MIG vGPU takes most of a GPU, so one fits per GPU.
    let s = fleet(vec![h200_node("a", 8, 7)]);
    let m = |count: u32| {
        machine(&format!(
            "name: m\ndevices: [{{name: gpu, profile: H200X-4-71C, count: {count}, alignment: numa}}]"
        ))
    };
    for policy in [Policy::Binpack, Policy::Spread] {
        let a = s.try_place(&m(4), policy).unwrap();
        let sockets: Vec<bool> = a
            .devices
            .iter()
            .map(|d| match d {
                AllocatedDevice::Vgpu { gpu: Some(g), .. } => g.bus() < 0x80,
                d => panic!("{d:?}"),
            })
            .collect();
        assert_eq!(sockets.len(), 4);
        assert!(
            sockets.iter().all(|x| *x == sockets[0]),
            "{policy}: {sockets:?}"
        );
        let e = s.try_place(&m(5), policy).unwrap_err();
        assert_eq!(
            refusal_text(e),
            "0/1 nodes available: 1 node(s): TopologyUnsatisfiable: needs 5 gpu profile H200X-4-71C on one NUMA node, 4 free (excluded: 4 wrong NUMA)"
        );
    }
    // Without alignment the same five spread over both sockets.
    let free = machine("name: m\ndevices: [{name: gpu, profile: H200X-4-71C, count: 5}]");
    assert_eq!(
        s.try_place(&free, Policy::Binpack).unwrap().devices.len(),
        5
    );
}

#[test]
fn named_gpus_families_and_addresses_are_honoured() {
    let s = fleet(vec![whole_node("a", 4)]);
    let name_of = |a: &Allocation| -> Vec<String> {
        a.devices
            .iter()
            .map(|d| match d {
                AllocatedDevice::Gpu { name, .. } => name.clone(),
                d => panic!("{d:?}"),
            })
            .collect()
    };
    let a = s
        .try_place(&whole("m", ", gpus: [nvidia2]"), Policy::Binpack)
        .unwrap();
    assert_eq!(name_of(&a), ["nvidia2"]);
    let a = s
        .try_place(&whole("m", ", gpus: [\"0000:30:00.0\"]"), Policy::Binpack)
        .unwrap();
    assert_eq!(name_of(&a), ["nvidia2"]);
    let a = s
        .try_place(&whole("m", ", gpus: [nvidia3, nvidia]"), Policy::Binpack)
        .unwrap();
    assert_eq!(name_of(&a), ["nvidia0", "nvidia3"]);
    let e = s
        .try_place(&whole("m", ", gpus: [nvidia9]"), Policy::Binpack)
        .unwrap_err();
    assert_eq!(
        refusal_text(e),
        "0/1 nodes available: 1 node(s): GpuNotFound: needs gpu GPU nvidia9, not on node"
    );
    let e = s
        .try_place(&whole("m", ", gpus: [radeon]"), Policy::Binpack)
        .unwrap_err();
    let text = refusal_text(e);
    assert!(
        text.ends_with("needs 1 gpu GPU(s) of radeon, 0 free (excluded: 4 other family)"),
        "{text}"
    );
}

#[test]
fn whole_gpus_carry_their_companion_functions() {
    let s = fleet(vec![whole_node("a", 1)]);
    let a = s.try_place(&whole("m", ""), Policy::Binpack).unwrap();
    match &a.devices[0] {
        AllocatedDevice::Gpu {
            functions,
            memory_mib,
            ..
        } => {
            assert_eq!(functions.len(), 1);
            assert_eq!(functions[0].to_string(), "0000:10:00.1");
            assert_eq!(*memory_mib, Some(81920));
        }
        d => panic!("{d:?}"),
    }
}

#[test]
fn requests_that_fit_alone_but_not_together_are_a_conflict() {
    let s = fleet(vec![whole_node("a", 1)]);
    let m = machine("name: m\ndevices: [{name: a}, {name: b}]");
    let e = s.try_place(&m, Policy::Binpack).unwrap_err();
    assert_eq!(
        refusal_text(e),
        "0/1 nodes available: 1 node(s): ConflictingRequests: requests a, b fit one at a time but not together"
    );
}

#[test]
fn a_whole_gpu_request_and_a_vgpu_request_share_a_node_without_sharing_a_gpu() {
    // A host whose GPUs can go either way: whole, or as vGPU parents.
    let mut n = a2_node("a", 2, 4);
    for g in &mut n.gpus {
        g.state = GpuState::Free;
    }
    let mut s = fleet(vec![n]);
    let m = machine("name: m\ndevices: [{name: v, profile: A2-16Q}, {name: w}]");
    let a = s.place(&m, Policy::Binpack).unwrap();
    let (mut vg, mut wg) = (None, None);
    for d in &a.devices {
        match d {
            AllocatedDevice::Vgpu { gpu, .. } => vg = *gpu,
            AllocatedDevice::Gpu { address, .. } => wg = Some(*address),
        }
    }
    assert_ne!(vg.unwrap(), wg.unwrap());
    // Nothing is left: one GPU is held whole, the other is full.
    assert!(
        s.try_place(&vgpu("x", "A2-1Q", 1), Policy::Binpack)
            .is_err()
    );
    assert!(s.try_place(&whole("y", ""), Policy::Binpack).is_err());
}

#[test]
fn a_machine_lands_on_one_node_or_none() {
    let mut s = fleet(vec![mbochs_node("a"), whole_node("b", 1)]);
    let m = machine("name: m\ndevices: [{name: v, profile: mbochs-small}, {name: w}]");
    let e = s.place(&m, Policy::Binpack).unwrap_err();
    assert!(matches!(e, SchedError::Unsatisfiable(_)));
    assert!(s.allocations().is_empty());
    assert_eq!(s.free_instances("mbochs-small"), vec![("a".into(), 64)]);
}

#[test]
fn eight_whole_gpus_and_fifty_six_mig_slices_fit_one_node() {
    let s = fleet(vec![whole_node("a", 8)]);
    let a = s
        .try_place(&whole("m", ", count: 8"), Policy::Binpack)
        .unwrap();
    assert_eq!(a.devices.len(), 8);
    let mut s = fleet(vec![h200_node("h", 8, 7)]);
    let a = s
        .place(&vgpu("m", "H200X-1-18C", 56), Policy::Binpack)
        .unwrap();
    assert_eq!(a.devices.len(), 56);
    let e = s
        .try_place(&vgpu("n", "H200X-1-18C", 1), Policy::Binpack)
        .unwrap_err();
    assert!(refusal_text(e).contains("0 free"));
}

#[test]
fn mig_slices_are_counted_per_gpu() {
    let mut s = fleet(vec![h200_node("h", 1, 7)]);
    s.place(&vgpu("a", "H200X-4-71C", 1), Policy::Binpack)
        .unwrap();
    s.place(&vgpu("b", "H200X-3-71C", 1), Policy::Binpack)
        .unwrap();
    let e = s
        .try_place(&vgpu("c", "H200X-1-18C", 1), Policy::Binpack)
        .unwrap_err();
    assert!(
        refusal_text(e)
            .ends_with("needs 1 gpu profile H200X-1-18C, 0 free (excluded: 1 pool full)")
    );
}

#[test]
fn templates_are_applied_and_unknown_ones_rejected() {
    let mut f = Fleet {
        nodes: vec![a2_node("a", 1, 4)],
        ..Fleet::default()
    };
    f.templates.insert(
        "small-vgpu".into(),
        gpu_core::DeviceRequest {
            name: "t".into(),
            profile: Some("A2-4Q".into()),
            count: Some(2),
            ..Default::default()
        },
    );
    let s = FleetState::new(f).unwrap();
    let a = s
        .try_place(
            &machine("name: m\ndevices: [{name: gpu, use: small-vgpu}]"),
            Policy::Binpack,
        )
        .unwrap();
    assert_eq!(a.devices.len(), 2);
    let e = s
        .try_place(
            &machine("name: m\ndevices: [{name: gpu, use: nope}]"),
            Policy::Binpack,
        )
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        "invalid request \"m\": device request \"gpu\" uses unknown template \"nope\" (known: small-vgpu)"
    );
}

#[test]
fn invalid_requests_are_rejected_before_placement() {
    let mut s = fleet(vec![a2_node("a", 1, 4)]);
    let bad = Machine {
        name: "m".into(),
        devices: vec![gpu_core::DeviceRequest {
            name: "x".into(),
            profile: Some("A2-4Q".into()),
            gpus: vec!["nvidia0".into()],
            ..Default::default()
        }],
        ..Machine::default()
    };
    let e = s.place(&bad, Policy::Binpack).unwrap_err();
    assert!(matches!(e, SchedError::InvalidRequest { .. }), "{e}");
    assert!(e.to_string().contains("cannot be combined"), "{e}");
    let e = s
        .place(&whole("m", ", gpus: [banana]"), Policy::Binpack)
        .unwrap_err();
    assert!(e.to_string().contains("neither a GPU name"), "{e}");
    let e = s
        .place(
            &whole("m", ", count: 1, gpus: [nvidia0, nvidia1, nvidia]"),
            Policy::Binpack,
        )
        .unwrap_err();
    assert!(e.to_string().contains("less than"), "{e}");
}

#[test]
fn changing_a_placed_machine_is_rejected() {
    let mut s = fleet(vec![a2_node("a", 1, 4)]);
    s.place(&vgpu("m", "A2-4Q", 1), Policy::Binpack).unwrap();
    let e = s
        .place(&vgpu("m", "A2-4Q", 2), Policy::Binpack)
        .unwrap_err();
    assert!(
        e.to_string().contains("already placed on node \"a\""),
        "{e}"
    );
    assert!(e.to_string().contains("plan a migration"), "{e}");
}

#[test]
fn release_returns_capacity_and_unknown_machines_are_errors() {
    let mut s = fleet(vec![mbochs_node("a")]);
    s.place(&vgpu("m", "mbochs-large", 4), Policy::Binpack)
        .unwrap();
    assert!(
        s.try_place(&vgpu("n", "mbochs-small", 1), Policy::Binpack)
            .is_err()
    );
    s.mark_created("m").unwrap();
    assert_eq!(s.allocations()[0].status, AllocationStatus::Created);
    let a = s.release("m").unwrap();
    assert_eq!(a.machine, "m");
    assert_eq!(s.free_instances("mbochs-small"), vec![("a".into(), 64)]);
    assert!(matches!(
        s.release("m"),
        Err(SchedError::UnknownMachine { .. })
    ));
    assert!(matches!(
        s.mark_created("zz"),
        Err(SchedError::UnknownMachine { .. })
    ));
    assert!(matches!(
        s.remove_node("zz"),
        Err(SchedError::UnknownNode { .. })
    ));
}

#[test]
fn instances_the_snapshot_shows_are_not_charged_twice() {
    let n = mbochs_with_one_large("a");
    let uuid = MdevUuid::for_machine("old", "gpu", 0);
    let alloc = |status, uuid| Allocation {
        machine: "old".into(),
        node: "a".into(),
        status,
        devices: vec![AllocatedDevice::Vgpu {
            request: "gpu".into(),
            index: 0,
            parent: ParentId::Named("mbochs".into()),
            gpu: None,
            framework: gpu_core::VgpuFramework::Mdev,
            profile: "mbochs-large".parse().unwrap(),
            profile_name: "mbochs-large".into(),
            framebuffer_mib: Some(64),
            mig_slices: None,
            uuid,
            gpu_instance_start: None,
            placement_id: None,
        }],
    };
    let shown = FleetState::new(Fleet {
        nodes: vec![n.clone()],
        allocations: vec![alloc(AllocationStatus::Created, uuid)],
        ..Fleet::default()
    })
    .unwrap();
    assert_eq!(shown.free_instances("mbochs-large"), vec![("a".into(), 3)]);
    let other = MdevUuid::for_machine("new", "gpu", 0);
    let pending = FleetState::new(Fleet {
        nodes: vec![n],
        allocations: vec![alloc(AllocationStatus::Pending, other)],
        ..Fleet::default()
    })
    .unwrap();
    assert_eq!(
        pending.free_instances("mbochs-large"),
        vec![("a".into(), 2)]
    );
}

#[test]
fn a_new_snapshot_of_a_node_recharges_its_allocations() {
    let mut s = fleet(vec![whole_node("a", 2)]);
    s.place(&whole("m", ""), Policy::Binpack).unwrap();
    assert_eq!(s.free_gpus(), vec![("a".into(), 1)]);
    s.add_node(whole_node("a", 2)).unwrap();
    assert_eq!(s.free_gpus(), vec![("a".into(), 1)]);
    let topo = s.remove_node("a").unwrap();
    assert_eq!(topo.gpus.len(), 2);
    assert_eq!(s.allocations().len(), 1);
    s.add_node(topo).unwrap();
    assert_eq!(s.free_gpus(), vec![("a".into(), 1)]);
    let f = s.to_fleet();
    assert_eq!((f.nodes.len(), f.allocations.len()), (1, 1));
}

#[test]
fn try_place_changes_nothing_and_is_deterministic() {
    let s = fleet(vec![a2_node("b", 2, 4), a2_node("a", 2, 4)]);
    let one = s
        .try_place(&vgpu("m", "A2-2Q", 3), Policy::Binpack)
        .unwrap();
    let two = s
        .try_place(&vgpu("m", "A2-2Q", 3), Policy::Binpack)
        .unwrap();
    assert_eq!(one, two);
    assert_eq!(one.node, "b");
    assert!(s.allocations().is_empty());
}

#[test]
fn firstfit_takes_the_first_node_and_the_first_gpu_that_fit_without_scoring() {
    // Node b is partly used, so binpack goes there; firstfit takes a, the first in node order,
    // and on it the first GPU, where binpack and spread would weigh use and room.
    let mut s = fleet(vec![a2_node("a", 2, 4), a2_node("b", 2, 4)]);
    let filler = vgpu("filler", "A2-4Q", 1);
    let b_first = s.try_place(&filler, Policy::Spread).unwrap();
    assert_eq!(b_first.node, "a");
    let mut f = FleetState::new(Fleet {
        nodes: vec![a2_node("a", 2, 4), a2_node("b", 2, 4)],
        allocations: vec![Allocation {
            node: "b".into(),
            ..b_first.clone()
        }],
        ..Fleet::default()
    })
    .unwrap();
    let m = vgpu("m", "A2-4Q", 1);
    assert_eq!(f.try_place(&m, Policy::Binpack).unwrap().node, "b");
    let a = f.place(&m, Policy::FirstFit).unwrap();
    assert_eq!(a.node, "a");
    match &a.devices[0] {
        AllocatedDevice::Vgpu { gpu: Some(g), .. } => assert_eq!(g.bus(), 0x10),
        d => panic!("{d:?}"),
    }
    let _ = s.place(&filler, Policy::Spread).unwrap();
    // Whole GPUs: the first free one in node order, where binpack fills the partly used node.
    let mut w = fleet(vec![whole_node("a", 2), whole_node("b", 2)]);
    let mut held = w
        .place(&whole("x", ", gpus: [nvidia0]"), Policy::Binpack)
        .unwrap();
    held.node = "b".into();
    w = FleetState::new(Fleet {
        nodes: vec![whole_node("a", 2), whole_node("b", 2)],
        allocations: vec![held],
        ..Fleet::default()
    })
    .unwrap();
    assert_eq!(
        w.try_place(&whole("y", ""), Policy::Binpack).unwrap().node,
        "b"
    );
    let y = w.try_place(&whole("y", ""), Policy::FirstFit).unwrap();
    assert_eq!(y.node, "a");
    match &y.devices[0] {
        AllocatedDevice::Gpu { name, .. } => assert_eq!(name, "nvidia0"),
        d => panic!("{d:?}"),
    }
}

#[test]
fn a_target_node_places_there_or_refuses_with_that_nodes_reasons() {
    let s = fleet(vec![
        a2_node("a", 1, 4),
        a2_node("b", 1, 4),
        mbochs_node("c"),
    ]);
    let m = |node: &str, count: u32| {
        machine(&format!(
            "name: m\ntargetNode: {node}\ndevices: [{{name: gpu, profile: A2-4Q, count: {count}}}]"
        ))
    };
    assert_eq!(s.try_place(&m("b", 1), Policy::Binpack).unwrap().node, "b");
    let e = s.try_place(&m("c", 1), Policy::Binpack).unwrap_err();
    assert_eq!(
        refusal_text(e),
        "0/1 nodes available: node c: ProfileNotOffered: needs 1 gpu profile A2-4Q, not offered"
    );
    let e = s.try_place(&m("b", 5), Policy::Binpack).unwrap_err();
    assert!(refusal_text(e).starts_with(
        "0/1 nodes available: node b: TopologyUnsatisfiable: needs 5 gpu profile A2-4Q, 4 free"
    ));
    assert!(matches!(
        s.try_place(&m("zz", 1), Policy::Binpack),
        Err(SchedError::UnknownNode { node }) if node == "zz"
    ));
    let json = serde_json::to_value(m("b", 1)).unwrap();
    assert_eq!(json["targetNode"], "b");
}

#[test]
fn policy_parses_and_serializes_in_lowercase() {
    assert_eq!("binpack".parse::<Policy>().unwrap(), Policy::Binpack);
    assert_eq!("Spread".parse::<Policy>().unwrap(), Policy::Spread);
    assert_eq!("FirstFit".parse::<Policy>().unwrap(), Policy::FirstFit);
    assert!("best-fit".parse::<Policy>().is_err());
    assert_eq!(
        serde_json::to_string(&Policy::FirstFit).unwrap(),
        "\"firstfit\""
    );
    assert_eq!(
        serde_json::to_string(&Policy::Spread).unwrap(),
        "\"spread\""
    );
    assert_eq!(Policy::default(), Policy::Binpack);
}

#[test]
fn duplicate_nodes_make_an_invalid_fleet() {
    let e = FleetState::new(Fleet {
        nodes: vec![whole_node("a", 1), whole_node("a", 1)],
        ..Fleet::default()
    })
    .unwrap_err();
    assert!(matches!(e, SchedError::InvalidFleet { .. }), "{e}");
}

#[test]
fn mig_backed_vgpus_are_refused_on_a_gpu_holding_time_sliced_ones() {
    let mut n = h200_node("h", 1, 7);
    n.mediated_devices.pools[0].used_mib = 4096;
    let s = fleet(vec![n]);
    let e = s
        .try_place(&vgpu("m", "H200X-1-18C", 1), Policy::Binpack)
        .unwrap_err();
    assert_eq!(
        refusal_text(e),
        "0/1 nodes available: 1 node(s): TopologyUnsatisfiable: needs 1 gpu profile H200X-1-18C, 0 free (excluded: 1 mode conflict)"
    );
}

#[test]
fn vgpu_requests_filter_by_the_parent_gpu_vendor_model_class_and_memory() {
    let s = fleet(vec![a2_node("a", 1, 4), mbochs_node("b")]);
    let e = s
        .try_place(
            &machine("name: m\ndevices: [{name: gpu, profile: A2-4Q, vendor: amd}]"),
            Policy::Binpack,
        )
        .unwrap_err();
    assert!(
        refusal_text(e).contains("needs 1 gpu profile A2-4Q, 0 free (excluded: 1 wrong vendor)")
    );
    let e = s
        .try_place(
            &machine("name: m\ndevices: [{name: gpu, profile: A2-4Q, model: L40S}]"),
            Policy::Binpack,
        )
        .unwrap_err();
    assert!(refusal_text(e).contains("(excluded: 1 wrong model)"));
    let e = s
        .try_place(
            &machine("name: m\ndevices: [{name: gpu, profile: A2-4Q, minMemory: 8Gi}]"),
            Policy::Binpack,
        )
        .unwrap_err();
    assert!(refusal_text(e).contains("(excluded: 1 too small)"));
    // A virtual parent has no GPU: an accelerator class cannot be proven.
    let e = s
        .try_place(
            &machine("name: m\ndevices: [{name: gpu, profile: mbochs-small, class: accelerator}]"),
            Policy::Binpack,
        )
        .unwrap_err();
    assert!(refusal_text(e).contains("(excluded: 1 wrong class)"));
}

#[test]
fn a_gpu_held_whole_offers_no_vgpus() {
    let mut n = a2_node("a", 1, 4);
    n.gpus[0].state = GpuState::Free;
    let mut s = fleet(vec![n]);
    s.place(&whole("w", ""), Policy::Binpack).unwrap();
    let e = s
        .try_place(&vgpu("m", "A2-4Q", 1), Policy::Binpack)
        .unwrap_err();
    assert!(refusal_text(e).ends_with("0 free (excluded: 1 in use)"));
}

#[test]
fn a_template_that_uses_a_template_is_rejected() {
    let mut f = Fleet {
        nodes: vec![a2_node("a", 1, 4)],
        ..Fleet::default()
    };
    f.templates.insert(
        "outer".into(),
        gpu_core::DeviceRequest {
            name: "t".into(),
            template: Some("inner".into()),
            ..Default::default()
        },
    );
    let s = FleetState::new(f).unwrap();
    let e = s
        .try_place(
            &machine("name: m\ndevices: [{name: gpu, use: outer}]"),
            Policy::Binpack,
        )
        .unwrap_err();
    assert!(e.to_string().contains("itself uses a template"), "{e}");
}

#[test]
fn templates_can_be_added_after_loading() {
    let mut s = fleet(vec![a2_node("a", 1, 4)]);
    s.set_template(
        "desk",
        gpu_core::DeviceRequest {
            name: "desk".into(),
            profile: Some("A2-2Q".into()),
            ..Default::default()
        },
    )
    .unwrap();
    assert!(s.templates().contains_key("desk"));
    let a = s
        .try_place(
            &machine("name: m\ndevices: [{name: gpu, use: desk}]"),
            Policy::Binpack,
        )
        .unwrap();
    assert_eq!(a.devices.len(), 1);
    assert!(
        s.set_template(
            "bad name!",
            gpu_core::DeviceRequest {
                name: "x".into(),
                ..Default::default()
            }
        )
        .is_err()
    );
}

#[test]
fn a_profile_name_with_different_ids_per_driver_matches_on_every_node() {
    // Type IDs are per driver version: the same name can carry another ID on another node.
    let mut newer = a2_node("b", 1, 4);
    for p in &mut newer.mediated_devices.parents {
        for pr in &mut p.profiles {
            let n = pr.id.number().unwrap();
            pr.id = format!("nvidia-{}", n + 100).parse().unwrap();
        }
    }
    let mut s = fleet(vec![a2_node("a", 1, 4), newer]);
    for i in 0..8 {
        s.place(&vgpu(&format!("m{i}"), "A2-4Q", 1), Policy::Binpack)
            .unwrap();
    }
    let nodes: Vec<String> = s.allocations().into_iter().map(|a| a.node).collect();
    assert_eq!(nodes.iter().filter(|n| *n == "b").count(), 4);
    let e = s
        .try_place(&vgpu("m9", "A2-4Q", 1), Policy::Binpack)
        .unwrap_err();
    assert!(refusal_text(e).starts_with("0/2 nodes available: 2 node(s): TopologyUnsatisfiable"));
    // By ID, only the node with that ID matches.
    s.release("m0").unwrap();
    let a = s
        .try_place(&vgpu("m9", "nvidia-846", 1), Policy::Binpack)
        .unwrap_err();
    assert!(refusal_text(a).contains("ProfileNotOffered"));
}

#[test]
fn fleet_state_can_be_shared_across_threads() {
    fn assert_send_sync<T: Send + Sync + Clone>() {}
    assert_send_sync::<FleetState>();
    assert_send_sync::<SchedError>();
}

#[test]
fn ties_go_to_the_first_node_in_the_fleets_order_under_both_policies() {
    let s = fleet(vec![mbochs_node("b"), mbochs_node("a"), mbochs_node("c")]);
    for policy in [Policy::Binpack, Policy::Spread] {
        let a = s.try_place(&vgpu("m", "mbochs-small", 1), policy).unwrap();
        assert_eq!(a.node, "b", "{policy}");
    }
}

#[test]
fn degraded_gpus_are_used_last_across_the_fleet() {
    // Binpack prefers the fuller node "a", but its only free GPU is Degraded.
    let mut a = whole_node("a", 2);
    a.gpus[0].state = GpuState::InUse;
    a.gpus[1].health.state = HealthState::Degraded;
    let mut s = fleet(vec![a, whole_node("b", 2)]);
    for policy in [Policy::Binpack, Policy::Spread] {
        let p = s.try_place_detailed(&whole("m", ""), policy).unwrap();
        assert_eq!(p.allocation.node, "b", "{policy}");
        assert!(p.degraded.is_empty());
    }
    s.place(&whole("m1", ", count: 2"), Policy::Binpack)
        .unwrap();
    // Only the Degraded GPU is left: it is used, and marked.
    let p = s.place_detailed(&whole("m2", ""), Policy::Binpack).unwrap();
    assert_eq!(p.allocation.node, "a");
    assert_eq!(p.degraded.len(), 1);
}

#[test]
fn the_same_size_rule_applies_to_nvidia_gpus_only() {
    // mbochs after one small instance, with the pool as a snapshot may lock it to 4 MiB.
    let mut n = mbochs_node("a");
    let p = &mut n.mediated_devices.parents[0];
    p.profiles[0].available_instances = 63;
    p.profiles[1].available_instances = 15;
    p.profiles[2].available_instances = 3;
    let pool = &mut n.mediated_devices.pools[0];
    pool.used_mib = 4;
    pool.size_locked_mib = Some(4);
    pool.mixed_size = false;
    let mut s = fleet(vec![n]);
    s.place(&vgpu("m", "mbochs-medium", 1), Policy::Binpack)
        .unwrap();
    s.place(&vgpu("l", "mbochs-large", 2), Policy::Binpack)
        .unwrap();
}

// Unplacing a Machine (the inverse of a placement), and a profile no node offers: an invalid
// request naming the nearest names the fleet offers, never a capacity refusal.

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

/// CI seed `cc 1564da0a…` of `reordering_nodes_and_gpus_does_not_change_feasibility`: nvidia0
/// has three A2 parents and nvidia1 one; a Machine asking for one whole GPU and two A2-2Q fits
/// only with nvidia1 taken whole. The whole GPU used to be chosen by address alone, so the
/// node's GPU order decided whether the Machine fitted.
#[test]
fn a_whole_gpu_is_taken_where_it_costs_the_machines_vgpus_least() {
    let uneven = || {
        let mut n = a2_node("n0", 2, 3);
        for g in &mut n.gpus {
            g.state = GpuState::Free;
        }
        let nvidia1 = n.gpus[1].address;
        let mut kept = 0;
        n.mediated_devices.parents.retain(|p| {
            if p.gpu != Some(nvidia1) {
                return true;
            }
            kept += 1;
            kept == 1
        });
        let left: Vec<ParentId> = n
            .mediated_devices
            .parents
            .iter()
            .filter(|p| p.gpu == Some(nvidia1))
            .map(|p| p.id.clone())
            .collect();
        assert_eq!(left.len(), 1);
        n.mediated_devices.pools[1].parents = left;
        n
    };
    let m =
        machine("name: m5\ndevices: [{name: w}, {name: v2, profile: \"GRID A2-2Q\", count: 2}]");
    let mut reversed = uneven();
    reversed.gpus.reverse();
    reversed.mediated_devices.parents.reverse();
    reversed.mediated_devices.pools.reverse();
    for policy in [Policy::Binpack, Policy::Spread, Policy::FirstFit] {
        for n in [uneven(), reversed.clone()] {
            let a = fleet(vec![n])
                .try_place(&m, policy)
                .unwrap_or_else(|e| panic!("{policy:?}: {e}"));
            let mut whole = Vec::new();
            for d in &a.devices {
                if let AllocatedDevice::Gpu { name, .. } = d {
                    whole.push(name.as_str());
                }
            }
            assert_eq!(whole, ["nvidia1"], "{policy:?}");
        }
    }
}
