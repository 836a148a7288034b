#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! Placement on what discovery reports for a real A2 host: three 4 GiB vGPUs exist, every free
//! VF reports one instance of each 4 GiB type, and only one more fits on the card.

use gpu_core::{
    AllocatedDevice, Allocation, AllocationStatus, Fleet, Machine, MdevUuid, NodeTopology,
};
use gpu_sched::{FleetState, Policy, SchedError};

fn real_a2() -> NodeTopology {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/a2-real-node.json");
    NodeTopology::from_text(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn machine(name: &str, profile: &str) -> Machine {
    Machine::from_text(&format!(
        "name: {name}\ndevices: [{{name: gpu, profile: \"{profile}\"}}]"
    ))
    .unwrap()
}

fn refusal(e: SchedError) -> String {
    e.refusal().unwrap().render()
}

#[test]
fn one_more_4g_vgpu_fits_and_then_the_card_is_full() {
    let mut s = FleetState::new(Fleet {
        nodes: vec![real_a2()],
        ..Fleet::default()
    })
    .unwrap();
    let a = s.place(&machine("vm1", "A2-4Q"), Policy::Binpack).unwrap();
    match &a.devices[0] {
        AllocatedDevice::Vgpu { parent, .. } => assert_eq!(parent.to_string(), "0000:08:00.5"),
        d => panic!("{d:?}"),
    }
    assert_eq!(
        refusal(
            s.try_place(&machine("vm2", "A2-4C"), Policy::Binpack)
                .unwrap_err()
        ),
        "0/1 nodes available: 1 node(s): TopologyUnsatisfiable: needs 1 gpu profile A2-4C, 0 free (excluded: 1 pool full)"
    );
}

#[test]
fn other_sizes_are_refused_by_the_same_size_rule() {
    let s = FleetState::new(Fleet {
        nodes: vec![real_a2()],
        ..Fleet::default()
    })
    .unwrap();
    // Free VFs report 0 for the 2 GiB types already, so no parent offers one.
    assert_eq!(
        refusal(
            s.try_place(&machine("vm", "A2-2Q"), Policy::Binpack)
                .unwrap_err()
        ),
        "0/1 nodes available: 1 node(s): TopologyUnsatisfiable: needs 1 gpu profile A2-2Q, 0 free (excluded: 1 no free parent)"
    );
    let whole = Machine::from_text("name: vm\ndevices: [{name: gpu}]").unwrap();
    assert_eq!(
        refusal(s.try_place(&whole, Policy::Binpack).unwrap_err()),
        "0/1 nodes available: 1 node(s): InsufficientGpus: needs 1 gpu GPU(s), 0 free (excluded: 1 blocked, 1 in use)"
    );
}

#[test]
fn a_created_allocation_of_an_existing_mdev_is_not_charged_again() {
    let node = real_a2();
    let existing = node
        .mediated_devices
        .parents
        .iter()
        .find(|p| !p.instances.is_empty())
        .unwrap();
    let inst = &existing.instances[0];
    let alloc = Allocation {
        machine: "old".into(),
        node: node.node.clone(),
        status: AllocationStatus::Created,
        devices: vec![AllocatedDevice::Vgpu {
            request: "gpu".into(),
            index: 0,
            parent: existing.id.clone(),
            gpu: existing.gpu,
            framework: existing.framework,
            profile: inst.profile.clone(),
            profile_name: "NVIDIA A2-4C".into(),
            framebuffer_mib: Some(4096),
            mig_slices: None,
            uuid: inst.uuid.unwrap_or(MdevUuid::for_machine("x", "y", 0)),
            gpu_instance_start: None,
            placement_id: None,
        }],
    };
    let s = FleetState::new(Fleet {
        nodes: vec![node],
        allocations: vec![alloc],
        ..Fleet::default()
    })
    .unwrap();
    assert_eq!(s.free_instances("A2-4Q"), vec![("test-node".into(), 1)]);
}
