#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! Migration, drain and evacuation plans.

use gpu_core::{AllocatedDevice, Fleet, HealthState, Machine, NodeTopology};
use gpu_sched::testing::{a2_node, mbochs_node, whole_node};
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

fn names(devices: &[AllocatedDevice]) -> Vec<String> {
    devices
        .iter()
        .map(|d| match d {
            AllocatedDevice::Gpu { name, .. } => name.clone(),
            AllocatedDevice::Vgpu { parent, .. } => parent.to_string(),
        })
        .collect()
}

#[test]
fn migration_picks_a_gpu_of_the_same_family_or_the_named_one() {
    let mut s = fleet(vec![whole_node("a", 2), whole_node("b", 4)]);
    let m = machine("name: vm\ndevices: [{name: gpu, gpus: [nvidia1]}]");
    let a = s.place(&m, Policy::Binpack).unwrap();
    assert_eq!(a.node, "a");
    let plan = s.plan_migration("vm", "b", &[]).unwrap();
    assert_eq!((plan.from.as_str(), plan.to.as_str()), ("a", "b"));
    assert_eq!(names(&plan.allocation.devices), ["nvidia0"]);
    assert_eq!(plan.moves.len(), 1);
    let plan = s.plan_migration("vm", "b", &["nvidia3".into()]).unwrap();
    assert_eq!(names(&plan.allocation.devices), ["nvidia3"]);
    // Planning changed nothing.
    assert_eq!(s.allocations()[0].node, "a");
}

#[test]
fn migration_keeps_vgpu_profiles_and_uuids() {
    let mut s = fleet(vec![a2_node("a", 1, 4), a2_node("b", 1, 4)]);
    let m = machine("name: vm\ndevices: [{name: gpu, profile: A2-8Q, count: 2}]");
    let a = s.place(&m, Policy::Binpack).unwrap();
    let plan = s.plan_migration("vm", "b", &[]).unwrap();
    for (before, after) in a.devices.iter().zip(&plan.allocation.devices) {
        match (before, after) {
            (
                AllocatedDevice::Vgpu {
                    uuid: u1,
                    profile: p1,
                    ..
                },
                AllocatedDevice::Vgpu {
                    uuid: u2,
                    profile: p2,
                    ..
                },
            ) => {
                assert_eq!(u1, u2);
                assert_eq!(p1, p2);
            }
            other => panic!("{other:?}"),
        }
    }
}

#[test]
fn migration_refusals_name_the_destination() {
    let mut s = fleet(vec![whole_node("a", 1), a2_node("b", 1, 2)]);
    s.place(
        &machine("name: vm\ndevices: [{name: gpu, vendor: nvidia, model: H100}]"),
        Policy::Binpack,
    )
    .unwrap();
    let e = s.plan_migration("vm", "b", &[]).unwrap_err();
    let r = e.refusal().unwrap();
    assert_eq!(r.nodes_total, 1);
    assert_eq!(r.nodes()[0].node, "b");
    assert!(r.render().contains("InsufficientGpus"), "{}", r.render());
    assert!(matches!(
        s.plan_migration("vm", "a", &[]),
        Err(SchedError::InvalidRequest { .. })
    ));
    assert!(matches!(
        s.plan_migration("vm", "zz", &[]),
        Err(SchedError::UnknownNode { .. })
    ));
    assert!(matches!(
        s.plan_migration("nobody", "b", &[]),
        Err(SchedError::UnknownMachine { .. })
    ));
    let e = s
        .plan_migration("vm", "b", &["nvidia0".into(), "nvidia1".into()])
        .unwrap_err();
    assert!(e.to_string().contains("2 GPU name(s) given"), "{e}");
}

#[test]
fn drain_moves_what_fits_and_says_why_the_rest_stays() {
    let mut s = fleet(vec![whole_node("a", 3), whole_node("b", 1)]);
    for vm in ["vm1", "vm2"] {
        s.place(
            &machine(&format!("name: {vm}\ndevices: [{{name: gpu}}]")),
            Policy::Binpack,
        )
        .unwrap();
    }
    // Best fit: vm1 takes the single free GPU of b, vm2 goes to a.
    let on_a: Vec<_> = s
        .allocations()
        .into_iter()
        .filter(|a| a.node == "a")
        .collect();
    assert_eq!(on_a.len(), 1);
    s.place(
        &machine("name: vm3\ndevices: [{name: gpu}]"),
        Policy::Binpack,
    )
    .unwrap();
    let plan = s.plan_drain("a").unwrap();
    assert_eq!(plan.node, "a");
    // Two Machines on a, no room left on b.
    assert_eq!(plan.moves.len(), 0);
    assert_eq!(plan.stay.len(), 2);
    assert!(
        plan.stay[0].reason.contains("InsufficientGpus"),
        "{}",
        plan.stay[0].reason
    );
    s.release("vm1").unwrap();
    let plan = s.plan_drain("a").unwrap();
    assert_eq!(plan.moves.len(), 1);
    assert_eq!(plan.moves[0].to, "b");
    assert_eq!(plan.stay.len(), 1);
    assert!(!plan.is_complete());
    assert!(matches!(
        s.plan_drain("zz"),
        Err(SchedError::UnknownNode { .. })
    ));
}

#[test]
fn evacuation_lists_machines_on_unhealthy_gpus_with_a_destination() {
    let mut s = fleet(vec![whole_node("a", 2)]);
    s.place(
        &machine("name: vm1\ndevices: [{name: gpu, gpus: [nvidia0]}]"),
        Policy::Binpack,
    )
    .unwrap();
    assert!(s.plan_evacuation().machines.is_empty());
    let mut sick = whole_node("a", 2);
    sick.gpus[0].health.state = HealthState::Unhealthy;
    sick.gpus[0].health.reasons = vec!["uncorrectable ECC".into()];
    s.add_node(sick).unwrap();
    let plan = s.plan_evacuation();
    assert_eq!(plan.machines.len(), 1);
    let ev = &plan.machines[0];
    assert_eq!(ev.machine, "vm1");
    assert_eq!(ev.affected[0].device, "nvidia0");
    assert_eq!(ev.affected[0].reasons, ["uncorrectable ECC"]);
    let p = ev.plan.as_ref().unwrap();
    assert_eq!(p.to, "a");
    assert_eq!(names(&p.allocation.devices), ["nvidia1"]);
}

#[test]
fn evacuation_without_room_carries_the_refusal() {
    let mut s = fleet(vec![whole_node("a", 1)]);
    s.place(
        &machine("name: vm1\ndevices: [{name: gpu}]"),
        Policy::Binpack,
    )
    .unwrap();
    let mut sick = whole_node("a", 1);
    sick.gpus[0].health.state = HealthState::Unhealthy;
    s.add_node(sick).unwrap();
    let plan = s.plan_evacuation();
    let ev = &plan.machines[0];
    assert!(ev.plan.is_none());
    let text = ev.refusal.as_ref().unwrap().render();
    assert!(text.contains("1 unhealthy"), "{text}");
    let json = serde_json::to_value(&plan).unwrap();
    assert_eq!(json["machines"][0]["machine"], "vm1");
}

#[test]
fn evacuation_lists_machines_whose_gpu_left_the_inventory() {
    let mut s = fleet(vec![whole_node("a", 2)]);
    s.place(
        &machine("name: vm1\ndevices: [{name: gpu, gpus: [nvidia1]}]"),
        Policy::Binpack,
    )
    .unwrap();
    // A new snapshot without the GPU (it fell off the bus).
    s.add_node(whole_node("a", 1)).unwrap();
    let plan = s.plan_evacuation();
    assert_eq!(plan.machines.len(), 1);
    let ev = &plan.machines[0];
    assert_eq!(ev.affected[0].health, HealthState::Unknown);
    assert!(ev.affected[0].device.contains("nvidia1"));
    assert_eq!(ev.affected[0].reasons, ["not in the node's inventory"]);
    assert_eq!(
        names(&ev.plan.as_ref().unwrap().allocation.devices),
        ["nvidia0"]
    );
}

/// A node with one free AMD card.
fn radeon_node(node: &str) -> NodeTopology {
    let mut n = NodeTopology::new(node);
    let a: gpu_core::PciAddress = "0000:41:00.0".parse().unwrap();
    let mut g = gpu_core::Gpu::new("radeon0", a, 0x1002, 0x73bf, 0x030000);
    g.model = "Navi 21".to_owned();
    g.driver = Some("vfio-pci".to_owned());
    g.state = gpu_core::GpuState::Free;
    g.health = gpu_core::Health::healthy();
    n.gpus.push(g);
    n
}

#[test]
fn a_drain_refusal_names_the_family_asked_for_and_the_card_of_another_family() {
    let mut s = fleet(vec![whole_node("a", 1), radeon_node("b")]);
    s.place(&machine("name: vm\ndevices: [{name: g}]"), Policy::Binpack)
        .unwrap();
    let plan = s.plan_drain("a").unwrap();
    assert_eq!(plan.stay.len(), 1);
    let why = &plan.stay[0].reason;
    assert!(
        why.contains("needs 1 g GPU(s) of nvidia, 0 free (excluded: 1 other family)"),
        "{why}"
    );
    let refusal = plan.stay[0].refusal.as_ref().unwrap();
    let reason = &refusal.reasons_of("b").unwrap()[0];
    assert_eq!(reason.gpus, ["nvidia"]);
    assert_eq!(reason.excluded[0].filter, gpu_sched::Filter::OtherFamily);
}

#[test]
fn a_refusal_on_the_one_target_node_names_it() {
    let mut s = fleet(vec![
        whole_node("a", 1),
        a2_node("b", 1, 2),
        whole_node("c", 1),
        mbochs_node("d"),
    ]);
    // Offered in the fleet (by d), not on b.
    let m = machine("name: vm\ndevices: [{name: gpu, profile: mbochs-small}]\ntargetNode: b");
    let e = s.place(&m, Policy::Binpack).unwrap_err();
    let text = e.to_string();
    assert!(text.contains(": node b: ProfileNotOffered"), "{text}");
    assert!(!text.contains("1 node(s)"), "{text}");
    assert_eq!(e.refusal().unwrap().target.as_deref(), Some("b"));
    s.place(
        &machine("name: vm2\ndevices: [{name: gpu, vendor: nvidia, model: H100}]"),
        Policy::Binpack,
    )
    .unwrap();
    let e = s.plan_migration("vm2", "b", &[]).unwrap_err();
    assert!(e.to_string().contains("node b: InsufficientGpus"), "{e}");
}
