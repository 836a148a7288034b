use gpu_core::{Gpu, Health, Pool, Profile};
use serde_json::json;

use super::*;

fn ada_node() -> NodeTopology {
    let addr: PciAddress = "0000:17:00.0".parse().unwrap_or_else(|_| unreachable!());
    let mut t = NodeTopology::new("ws-1");
    let mut g = Gpu::new("nvidia0", addr, 0x10de, 0x26b1, 0x030200);
    g.health = Health::healthy();
    t.gpus.push(g);
    let profile = |id: &str, name: &str, fb: u64| Profile {
        id: VgpuTypeId::from_str_unchecked(id),
        name: name.into(),
        framebuffer_mib: Some(fb),
        max_instances: None,
        available_instances: 4,
        reported_instances: None,
        device_api: "vfio-pci".into(),
        mig_slices: None,
        mig_memory_gib: None,
        description: None,
    };
    t.mediated_devices.parents.push(Parent {
        id: ParentId::Pci(addr),
        gpu: Some(addr),
        framework: VgpuFramework::Mdev,
        health: Health::healthy(),
        profiles: vec![
            profile("nvidia-1001", "NVIDIA RTX6000-Ada-4Q", 4096),
            profile("nvidia-1002", "NVIDIA RTX6000-Ada-8Q", 8192),
        ],
        instances: vec![],
        warnings: vec![],
    });
    t.mediated_devices.pools.push(Pool {
        gpu: ParentId::Pci(addr),
        parents: vec![ParentId::Pci(addr)],
        total_mib: 49152,
        used_mib: 0,
        size_locked_mib: None,
        mixed_size: true,
        mig_slices_total: None,
        mig_slices_used: None,
        mig_slots: None,
    });
    t
}

fn allocation(device: &str, reserved: Option<&str>, profile: &str) -> DeviceAllocationResult {
    let mut result = json!({
        "request": "vgpu", "driver": "gpu.gpuslice.dev", "pool": "ws-1",
        "device": device, "shareID": "5f0b4e3a-9c1d-4c7e-8a55-2f6d0b9e1a77",
    });
    if let Some(r) = reserved {
        result["consumedCapacity"] = json!({ "framebuffer": r });
    }
    serde_json::from_value(json!({
        "results": [result],
        "config": [{"requests": ["vgpu"], "opaque": {
            "driver": "gpu.gpuslice.dev", "parameters": {"profile": profile}}}],
    }))
    .unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn a_mixed_size_share_creates_the_profile_that_fits_its_reservation() {
    let t = ada_node();
    let a = allocation("vgpu-0000-17-00-0-mixed", Some("8Gi"), "RTX6000-Ada-8Q");
    let plan = plan_prepare(&a, "uid", "gpu.gpuslice.dev", &t).unwrap_or_else(|e| panic!("{e}"));
    match &plan[..] {
        [PrepareAction::CreateMdev { type_id, uuid, .. }] => {
            assert_eq!(type_id.as_str(), "nvidia-1002");
            assert_eq!(uuid.to_string(), "5f0b4e3a-9c1d-4c7e-8a55-2f6d0b9e1a77");
        }
        other => panic!("{other:?}"),
    }
    let a = allocation("vgpu-0000-17-00-0-mixed", Some("4Gi"), "RTX6000-Ada-8Q");
    let e = plan_prepare(&a, "uid", "gpu.gpuslice.dev", &t).unwrap_err();
    assert!(e.to_string().contains("does not fit the 4Gi"), "{e}");
}

#[test]
fn a_whole_gpu_result_binds_it_and_other_drivers_are_ignored() {
    let t = ada_node();
    let mut a = allocation("gpu-0000-17-00-0", None, "unused");
    a.results.push(DeviceResult {
        request: "nic".into(),
        driver: "nic.example.com".into(),
        pool: "elsewhere".into(),
        device: "eth0".into(),
        share_id: None,
        consumed_capacity: BTreeMap::new(),
    });
    let plan = plan_prepare(&a, "uid", "gpu.gpuslice.dev", &t).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(plan.len(), 1);
    assert!(
        matches!(&plan[0], PrepareAction::BindGpu { address, .. } if address.to_string() == "0000:17:00.0")
    );
}

#[test]
fn a_gpu_that_was_never_published_is_refused_and_nothing_is_bound() {
    let mut t = ada_node();
    t.gpus[0].state = GpuState::InUse;
    t.gpus[0].state_reason = Some("bound to vfio-pci".into());
    t.gpus[0].driver = Some("vfio-pci".into());
    let a = allocation("gpu-0000-17-00-0", None, "unused");
    let e = plan_prepare(&a, "uid", "gpu.gpuslice.dev", &t).unwrap_err();
    assert_eq!(
        e.to_string(),
        "request vgpu: device gpu-0000-17-00-0 (GPU 0000:17:00.0) is not published: it is \
         in-use (bound to vfio-pci); nothing was changed"
    );
}

#[test]
fn without_a_share_id_the_uuid_is_stable_per_claim_request_and_device() {
    let r = DeviceResult {
        request: "vgpu".into(),
        driver: "d".into(),
        pool: "p".into(),
        device: "vgpu-0000-17-00-0-mixed".into(),
        share_id: None,
        consumed_capacity: BTreeMap::new(),
    };
    assert_eq!(instance_uuid("a", &r, 0), instance_uuid("a", &r, 0));
    assert_ne!(instance_uuid("a", &r, 0), instance_uuid("b", &r, 0));
    assert_ne!(instance_uuid("a", &r, 0), instance_uuid("a", &r, 1));
}
