#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! GPU memory accounting: whole GPUs and every vGPU, pending and created, MIG-backed included.

use gpu_core::{Fleet, Instance, Machine};
use gpu_sched::testing::{h200_node, whole_node};
use gpu_sched::{FleetState, Policy, vram_usage};

fn machine(yaml: &str) -> Machine {
    Machine::from_text(yaml).unwrap()
}

#[test]
fn an_existing_mig_backed_vgpu_counts_its_framebuffer() {
    let mut n = h200_node("a", 1, 7);
    let p = &mut n.mediated_devices.parents[0];
    p.instances.push(Instance {
        uuid: None,
        address: None,
        profile: p.profiles[0].id.clone(),
        profile_name: None,
        framebuffer_mib: None,
        in_use: Some(true),
        placement_id: None,
    });
    let u = vram_usage(&n, &[]);
    assert_eq!(u.total_mib, 144384);
    assert_eq!(u.allocated_mib, 18432);
}

#[test]
fn pending_and_created_whole_gpus_and_vgpus_are_counted_once() {
    let mut s = FleetState::new(Fleet {
        nodes: vec![whole_node("w", 2), h200_node("h", 1, 7)],
        ..Fleet::default()
    })
    .unwrap();
    let whole = machine("name: p\ndevices: [{name: gpu, count: 1}]");
    s.place(&whole, Policy::Binpack).unwrap();
    let created = machine("name: c\ndevices: [{name: gpu, count: 1}]");
    s.place(&created, Policy::Binpack).unwrap();
    s.mark_created("c").unwrap();
    let mig = machine("name: m\ndevices: [{name: gpu, profile: H200X-2-35C, count: 2}]");
    s.place(&mig, Policy::Binpack).unwrap();
    s.mark_created("m").unwrap();
    let allocations = s.allocations();
    let w = s.node("w").unwrap();
    assert_eq!(vram_usage(&w, &allocations).allocated_mib, 2 * 81920);
    let h = s.node("h").unwrap();
    assert_eq!(vram_usage(&h, &allocations).allocated_mib, 2 * 35840);
    // Once the snapshot shows one of the instances, it is not counted twice.
    let mut seen = h.clone();
    let a = s.allocation("m").unwrap();
    if let gpu_core::AllocatedDevice::Vgpu {
        parent,
        uuid,
        profile,
        ..
    } = &a.devices[0]
    {
        let p = seen
            .mediated_devices
            .parents
            .iter_mut()
            .find(|p| p.id == *parent)
            .unwrap();
        p.instances.push(Instance {
            uuid: Some(*uuid),
            address: None,
            profile: profile.clone(),
            profile_name: None,
            framebuffer_mib: Some(35840),
            in_use: Some(false),
            placement_id: None,
        });
    }
    assert_eq!(vram_usage(&seen, &allocations).allocated_mib, 2 * 35840);
}
