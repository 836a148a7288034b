#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! Allocations in the platform guide's short shape (`parent`, `profile`, `framebufferMiB`,
//! `uuid` per device): completed from the node's topology when the fleet is read.

use gpu_core::{AllocatedDevice, Fleet, Machine, VgpuFramework};
use gpu_sched::testing::{a2_node, l40s_node};
use gpu_sched::{FleetState, Policy};
use serde_json::{Value, json};

/// A fleet document of one L40S node (4 VFs) and one A2 node, with `allocations`.
fn fleet_text(allocations: Value) -> String {
    let mut doc = serde_json::to_value(Fleet {
        nodes: vec![l40s_node("l40s", 1, 4), a2_node("a2", 1, 2)],
        ..Fleet::default()
    })
    .unwrap();
    doc["allocations"] = allocations;
    doc.to_string()
}

fn short(parent: &str, profile: &str, fb: Option<u64>) -> Value {
    let mut d = json!({
        "parent": parent,
        "profile": profile,
        "uuid": "6d1c5a3e-8f1b-4c52-9a7e-1f2d3c4b5a69",
    });
    if let Some(fb) = fb {
        d["framebufferMiB"] = json!(fb);
    }
    d
}

fn one(node: &str, devices: Vec<Value>) -> Value {
    json!([{"machine": "vm-1", "node": node, "devices": devices}])
}

#[test]
fn a_short_device_is_completed_from_the_nodes_topology() {
    let text = fleet_text(one(
        "l40s",
        vec![short("0000:10:00.4", "1155", Some(24576))],
    ));
    let fleet = Fleet::from_text(&text).unwrap();
    let d = &fleet.allocations[0].devices[0];
    match d {
        AllocatedDevice::Vgpu {
            request,
            index,
            parent,
            gpu,
            framework,
            profile,
            profile_name,
            framebuffer_mib,
            ..
        } => {
            assert_eq!(request, "gpu");
            assert_eq!(*index, 0);
            assert_eq!(parent.to_string(), "0000:10:00.4");
            assert_eq!(gpu.map(|g| g.to_string()).as_deref(), Some("0000:10:00.0"));
            assert_eq!(*framework, VgpuFramework::VendorVfio);
            assert_eq!(profile.as_str(), "1155");
            assert_eq!(profile_name, "NVIDIA L40S-24Q");
            assert_eq!(*framebuffer_mib, Some(24576));
        }
        other => panic!("expected a vGPU, got {other:?}"),
    }
}

#[test]
fn a_short_allocation_holds_its_vgpu_like_a_full_one() {
    // Two 24Q fill the L40S: with one held by the short allocation, only one more fits.
    let text = fleet_text(one("l40s", vec![short("0000:10:00.4", "1155", None)]));
    let mut s = FleetState::new(Fleet::from_text(&text).unwrap()).unwrap();
    let m = |name: &str| {
        Machine::from_text(&format!(
            "name: {name}\ndevices: [{{name: gpu, profile: L40S-24Q}}]"
        ))
        .unwrap()
    };
    let a = s.place(&m("vm-2"), Policy::Binpack).unwrap();
    assert_eq!(a.node, "l40s");
    assert!(s.place(&m("vm-3"), Policy::Binpack).is_err());
}

#[test]
fn several_short_devices_are_indexed_per_request() {
    let mut second = short("0000:10:00.5", "1150", None);
    second["uuid"] = json!("7e2d6b4f-9a2c-4d63-8b8f-2a3e4d5c6b7a");
    let mut third = short("0000:10:00.6", "1150", None);
    third["uuid"] = json!("8f3e7c5a-ab3d-4e74-9c9a-3b4f5e6d7c8b");
    third["request"] = json!("extra");
    let text = fleet_text(one(
        "l40s",
        vec![short("0000:10:00.4", "1150", None), second, third],
    ));
    let fleet = Fleet::from_text(&text).unwrap();
    let keys: Vec<(String, u32)> = fleet.allocations[0]
        .devices
        .iter()
        .map(|d| match d {
            AllocatedDevice::Vgpu { request, index, .. } => (request.clone(), *index),
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(
        keys,
        [("gpu".into(), 0), ("gpu".into(), 1), ("extra".into(), 0)]
    );
}

#[test]
fn the_full_shape_still_reads_and_round_trips() {
    let text = fleet_text(one("l40s", vec![short("0000:10:00.4", "1155", None)]));
    let fleet = Fleet::from_text(&text).unwrap();
    let again = Fleet::from_text(&serde_json::to_string(&fleet).unwrap()).unwrap();
    assert_eq!(again, fleet);
}

fn error_of(allocations: Value) -> String {
    Fleet::from_text(&fleet_text(allocations))
        .unwrap_err()
        .to_string()
}

#[test]
fn a_parent_not_in_the_topology_is_named() {
    let e = error_of(one("l40s", vec![short("0000:10:01.7", "1155", None)]));
    assert!(e.contains("Machine \"vm-1\": device 0"), "{e}");
    assert!(
        e.contains("node \"l40s\" has no vGPU parent 0000:10:01.7"),
        "{e}"
    );
}

#[test]
fn a_profile_the_parent_does_not_offer_is_named() {
    let e = error_of(one("l40s", vec![short("0000:10:00.4", "nvidia-746", None)]));
    assert!(
        e.contains("neither lists nor holds profile \"nvidia-746\""),
        "{e}"
    );
}

#[test]
fn a_framebuffer_other_than_the_profiles_is_refused() {
    let e = error_of(one("l40s", vec![short("0000:10:00.4", "1155", Some(4096))]));
    assert!(
        e.contains("framebufferMiB 4096 does not match profile \"NVIDIA L40S-24Q\" (24576 MiB)"),
        "{e}"
    );
}

#[test]
fn a_node_missing_from_the_fleet_is_named() {
    let e = error_of(one("gone", vec![short("0000:10:00.4", "1155", None)]));
    assert!(
        e.contains("node \"gone\" is not in the fleet's nodes"),
        "{e}"
    );
}

#[test]
fn an_unknown_key_in_a_short_device_is_an_error() {
    let mut d = short("0000:10:00.4", "1155", None);
    d["colour"] = json!("red");
    let e = error_of(one("l40s", vec![d]));
    assert!(e.contains("colour") && e.contains("short shape"), "{e}");
}
