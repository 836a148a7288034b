//! MIG on request through the agent: `POST /v1/vgpus` of a MIG-backed type whose GPU instance
//! does not exist makes it through gpu-node's one function (as `vgpu create` does), on the fake
//! kernel and the fake NVML of one H200 in MIG mode.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::sync::Arc;

use gpu_core::PciAddress;
use gpu_core::mig::MigGeometry;
use gpu_nvml::fake::{FakeGpu, FakeNvml};
use gpu_nvml::{MigMode, NvmlDevices};
use gpu_sysfs::resolver::InMemoryResolver;
use gpu_sysfs::testing::fixtures::{H200_TYPES, h200_mig_kernel, h200_pf};
use support::{request, start_with};

fn pf() -> PciAddress {
    h200_pf(0).parse().unwrap()
}

#[test]
fn a_mig_backed_type_without_its_instance_gets_one_made_and_without_nvml_is_refused() {
    let g = MigGeometry::for_device(0x2335).unwrap();
    let n =
        Arc::new(FakeNvml::new().with_gpu(pf(), FakeGpu::mig(g).with_mig_mode(MigMode::Enabled)));
    let body = format!(r#"{{"parent":"{}","profile":"H200X-3-71C"}}"#, h200_pf(0));
    let names = || {
        let mut r = InMemoryResolver::new();
        for (id, name) in H200_TYPES {
            r = r.with(id, name);
        }
        Arc::new(r)
    };

    // Without the NVML: no VF lists the type (no instance), refused, nothing made.
    let k = Arc::new(h200_mig_kernel(&[], Arc::clone(&n)).unwrap());
    let a = start_with(Arc::clone(&k), |c| c.discover.resolver = Some(names()));
    let c = request(&a.socket, "POST", "/v1/vgpus", Some(&body));
    assert!(c.status >= 400, "{}", c.body);
    assert!(n.gpu_instances(&pf()).unwrap().is_empty());
    a.stop();

    // With it: the 3g instance is made first, then the vGPU in it.
    let k = Arc::new(h200_mig_kernel(&[], Arc::clone(&n)).unwrap());
    let nvml: Arc<dyn NvmlDevices> = n.clone();
    let a = start_with(Arc::clone(&k), |c| {
        c.discover.resolver = Some(names());
        c.mig = Some(gpu_agent::MigNvml(nvml));
    });
    let c = request(&a.socket, "POST", "/v1/vgpus", Some(&body));
    assert_eq!(c.status, 201, "{}", c.body);
    let gis = n.gpu_instances(&pf()).unwrap();
    assert_eq!(gis.len(), 1, "{gis:?}");
    assert_eq!((gis[0].slice_count, gis[0].placement.size), (3, 4));
    a.stop();
}

#[test]
fn the_agents_realize_makes_the_missing_gpu_instance_at_the_allocations_start() {
    let g = MigGeometry::for_device(0x2335).unwrap();
    let n =
        Arc::new(FakeNvml::new().with_gpu(pf(), FakeGpu::mig(g).with_mig_mode(MigMode::Enabled)));
    let k = Arc::new(h200_mig_kernel(&[], Arc::clone(&n)).unwrap());
    let nvml: Arc<dyn NvmlDevices> = n.clone();
    let a = start_with(Arc::clone(&k), |c| {
        let mut r = InMemoryResolver::new();
        for (id, name) in H200_TYPES {
            r = r.with(id, name);
        }
        c.discover.resolver = Some(Arc::new(r));
        c.mig = Some(gpu_agent::MigNvml(nvml));
    });
    let vf = gpu_sysfs::testing::fixtures::h200_vf(0, 0);
    let body = serde_json::json!({
        "machine": "vm1", "node": "node-a", "devices": [{
            "kind": "vgpu", "request": "gpu", "index": 0, "parent": vf, "gpu": h200_pf(0),
            "framework": "vendor-vfio", "profile": "1418", "profileName": "NVIDIA H200X-3-71C",
            "uuid": "00000000-0000-0000-0000-000000000001", "gpuInstanceStart": 0}]})
    .to_string();
    let r = request(&a.socket, "POST", "/v1/realize", Some(&body));
    assert_eq!(r.status, 201, "{}", r.body);
    let gis = n.gpu_instances(&pf()).unwrap();
    assert_eq!(gis.len(), 1, "{gis:?}");
    assert_eq!((gis[0].placement.start, gis[0].placement.size), (0, 4));
    a.stop();
}
