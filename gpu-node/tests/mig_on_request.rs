#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! MIG on request through the one writer, on the fake kernel (an H200 in the vendor-specific
//! VFIO framework whose VFs list and take MIG-backed types as the fake NVML's GPU instances
//! allow) and the fake NVML: `Node::realize` makes a missing GPU instance (at the allocation's
//! start when it names one) and undoes it on failure; `vgpu create` turns MIG mode on or off
//! where nothing uses the GPU.

use std::sync::Arc;

use gpu_core::mig::MigGeometry;
use gpu_core::{Allocation, ClassifiedError, ErrorKind, PciAddress};
use gpu_node::mig::MigError;
use gpu_node::mig::realize::InstanceStarts;
use gpu_node::{Node, RealizeError};
use gpu_nvml::fake::{FakeGpu, FakeNvml};
use gpu_nvml::{MigMode, MigModes, NvmlDevices, Placement};
use gpu_sysfs::discover::DiscoverOptions;
use gpu_sysfs::testing::FakeKernel;
use gpu_sysfs::testing::fixtures::{h200_mig_kernel, h200_names, h200_pf, h200_vf};
use gpu_sysfs::testing::{PciSpec, TreeBuilder};

fn pf() -> PciAddress {
    h200_pf(0).parse().unwrap()
}

fn nvml(mode: MigMode) -> Arc<FakeNvml> {
    let g = MigGeometry::for_device(0x2335).unwrap();
    Arc::new(FakeNvml::new().with_gpu(pf(), FakeGpu::mig(g).with_mig_mode(mode)))
}

fn options() -> DiscoverOptions {
    let mut o = DiscoverOptions::new("n");
    o.resolver = Some(Arc::new(h200_names()));
    o
}

/// Machine `vm1` with one vGPU of type `id` (`name`) on VF `vf` of the H200.
fn allocation(vgpus: &[(u32, u32, &str)]) -> Allocation {
    let devices: Vec<serde_json::Value> = vgpus
        .iter()
        .enumerate()
        .map(|(i, (vf, id, name))| {
            serde_json::json!({
                "kind": "vgpu", "request": "gpu", "index": i,
                "parent": h200_vf(0, *vf), "gpu": h200_pf(0), "framework": "vendor-vfio",
                "profile": id.to_string(), "profileName": name,
                "uuid": format!("00000000-0000-0000-0000-00000000000{i}"),
            })
        })
        .collect();
    serde_json::from_value(serde_json::json!({
        "machine": "vm1", "node": "n", "devices": devices,
    }))
    .unwrap()
}

/// The type VF `n` holds (0: none), as the actuation layer reads it.
fn vf_type(k: &FakeKernel, n: u32) -> String {
    let vf: PciAddress = h200_vf(0, n).parse().unwrap();
    gpu_sysfs::actuate::current_type(k, &vf)
        .unwrap()
        .to_string()
}

fn starts(n: &FakeNvml) -> Vec<(u32, u32)> {
    n.gpu_instances(&pf())
        .unwrap()
        .iter()
        .map(|g| (g.profile_id, g.placement.start))
        .collect()
}

#[test]
fn realize_makes_the_missing_gpu_instance_of_a_mig_backed_vgpu_and_remove_destroys_it() {
    let n = nvml(MigMode::Enabled);
    let k = h200_mig_kernel(&[], Arc::clone(&n)).unwrap();
    let opts = options();
    let node = Node::new(&k, &opts).with_nvml(Some(&*n));
    let a = allocation(&[(0, 1418, "NVIDIA H200X-3-71C")]);
    assert!(starts(&n).is_empty());
    let done = node.realize(&a).unwrap();
    assert!(done.changed);
    assert_eq!(vf_type(&k, 0), "1418");
    // 3g.71gb (profile ID 9) at the start that keeps the most later placements.
    assert_eq!(starts(&n), [(9, 4)]);
    let record = gpu_node::mig::owned::read(&k);
    assert_eq!(record.len(), 1, "recorded as gpuslice's");
    // Realized again: nothing written, nothing made.
    let writes = n.writes().len();
    assert!(!node.realize(&a).unwrap().changed);
    assert_eq!(n.writes().len(), writes);
    // `vgpu remove` of the VF destroys the instance made for it.
    let vf: PciAddress = h200_vf(0, 0).parse().unwrap();
    let (_, destroyed) = node
        .remove_vgpu_with_mig(&node.mig(&*n), &gpu_node::VgpuId::Vf(vf), false)
        .unwrap();
    assert!(destroyed.is_some());
    assert!(starts(&n).is_empty());
}

#[test]
fn without_nvml_realize_refuses_a_type_no_vf_lists_as_before() {
    let n = nvml(MigMode::Enabled);
    let k = h200_mig_kernel(&[], Arc::clone(&n)).unwrap();
    let opts = options();
    let node = Node::new(&k, &opts);
    let e = node
        .realize(&allocation(&[(0, 1418, "NVIDIA H200X-3-71C")]))
        .unwrap_err();
    assert!(matches!(e, RealizeError::UnknownProfile { .. }), "{e}");
    assert!(k.writes().is_empty() && n.writes().is_empty());
}

#[test]
fn realize_makes_the_instance_at_the_allocations_start() {
    let n = nvml(MigMode::Enabled);
    let k = h200_mig_kernel(&[], Arc::clone(&n)).unwrap();
    let opts = options();
    let node = Node::new(&k, &opts).with_nvml(Some(&*n));
    let a = allocation(&[(0, 1418, "NVIDIA H200X-3-71C")]);
    node.realize_starting(&a, &InstanceStarts::default().with(0, 0))
        .unwrap();
    assert_eq!(starts(&n), [(9, 0)], "at start 0, not the keep-most 4");
}

#[test]
fn realize_makes_the_instance_at_the_start_the_allocation_carries() {
    let n = nvml(MigMode::Enabled);
    let k = h200_mig_kernel(&[], Arc::clone(&n)).unwrap();
    let opts = options();
    let node = Node::new(&k, &opts).with_nvml(Some(&*n));
    let mut a = allocation(&[(0, 1418, "NVIDIA H200X-3-71C")]);
    if let gpu_core::AllocatedDevice::Vgpu {
        gpu_instance_start, ..
    } = &mut a.devices[0]
    {
        *gpu_instance_start = Some(0);
    }
    assert_eq!(InstanceStarts::of(&a), InstanceStarts::default().with(0, 0));
    node.realize(&a).unwrap();
    assert_eq!(
        starts(&n),
        [(9, 0)],
        "gpuInstanceStart 0, not the keep-most 4"
    );
}

#[test]
fn a_start_that_is_taken_or_not_legal_is_refused_naming_it_before_any_write() {
    let n = nvml(MigMode::Enabled);
    n.create_gpu_instance(&pf(), 15, Placement { start: 0, size: 2 })
        .unwrap();
    let k = h200_mig_kernel(&[], Arc::clone(&n)).unwrap();
    let opts = options();
    let node = Node::new(&k, &opts).with_nvml(Some(&*n));
    let a = allocation(&[(0, 1418, "NVIDIA H200X-3-71C")]);
    let before = n.writes().len();
    let e = node
        .realize_starting(&a, &InstanceStarts::default().with(0, 0))
        .unwrap_err();
    let RealizeError::Mig { source, .. } = &e else {
        panic!("{e:?}")
    };
    assert!(
        matches!(**source, MigError::StartTaken { start: 0, .. }),
        "{e}"
    );
    assert!(gpu_core::error_chain(&e).contains("start 0"), "{e}");
    assert_eq!(e.kind(), ErrorKind::InUse);
    let e = node
        .realize_starting(&a, &InstanceStarts::default().with(0, 2))
        .unwrap_err();
    let text = gpu_core::error_chain(&e);
    assert!(
        text.contains("2 is not a legal start") && text.contains("0,4"),
        "{text}"
    );
    assert_eq!(e.kind(), ErrorKind::InvalidArgument);
    assert_eq!(n.writes().len(), before, "nothing made");
    assert!(k.writes().is_empty(), "{:?}", k.writes());
}

#[test]
fn a_realize_that_cannot_fit_is_refused_before_any_write_and_a_failed_one_destroys_its_instances() {
    let n = nvml(MigMode::Enabled);
    let k = h200_mig_kernel(&[], Arc::clone(&n)).unwrap();
    let opts = options();
    let node = Node::new(&k, &opts).with_nvml(Some(&*n));
    // Two 3g vGPUs and a 7g: the 7g cannot fit beside them: refused before any write.
    let a = allocation(&[
        (0, 1418, "NVIDIA H200X-3-71C"),
        (1, 1418, "NVIDIA H200X-3-71C"),
        (2, 1420, "NVIDIA H200X-7-141C"),
    ]);
    let e = node.realize(&a).unwrap_err();
    assert!(matches!(e, RealizeError::Mig { .. }), "{e}");
    assert!(gpu_core::error_chain(&e).contains("no room"), "{e}");
    assert_eq!(e.kind(), ErrorKind::Exhausted);
    assert!(starts(&n).is_empty() && k.writes().is_empty());
    // Two 3g vGPUs fit; find the write of the second VF's type on a first host ...
    let two = allocation(&[
        (0, 1418, "NVIDIA H200X-3-71C"),
        (1, 1418, "NVIDIA H200X-3-71C"),
    ]);
    node.realize(&two).unwrap();
    assert_eq!(starts(&n), [(9, 0), (9, 4)], "one instance per vGPU");
    let second = format!("{}/nvidia/current_vgpu_type", h200_vf(0, 1));
    let at = k
        .writes()
        .iter()
        .position(|w| w.path.ends_with(&second))
        .unwrap()
        + 1;
    // ... then on a fresh one whose kernel refuses that write: all this call made is undone.
    let n = nvml(MigMode::Enabled);
    let k = h200_mig_kernel(&[], Arc::clone(&n))
        .unwrap()
        .failing_at(at, 5);
    let node = Node::new(&k, &opts).with_nvml(Some(&*n));
    let e = node.realize(&two).unwrap_err();
    assert!(matches!(e, RealizeError::Write { .. }), "{e}");
    assert!(starts(&n).is_empty(), "{:?}", starts(&n));
    assert_eq!(vf_type(&k, 0), "0");
    assert!(gpu_node::mig::owned::read(&k).is_empty());
}

/// An H100 SXM (10de:2330) on `nvidia`, SR-IOV capable with no VFs yet.
fn h100_tree() -> gpu_sysfs::testing::builder::Tree {
    let mut b = TreeBuilder::new();
    b.pci(
        "0000:41:00.0",
        PciSpec::new(0x10de, 0x2330, 0x030200).driver("nvidia"),
    );
    b.finish().unwrap()
}

#[test]
fn a_mig_backed_type_turns_mig_mode_on_where_nothing_uses_the_gpu_and_a_time_sliced_one_off() {
    let t = h100_tree();
    let host = gpu_sysfs::RealHost::new(t.root()).unwrap();
    let gpu: PciAddress = "0000:41:00.0".parse().unwrap();
    let g = MigGeometry::for_device(0x2330).unwrap();
    let n = FakeNvml::new().with_gpu(gpu, FakeGpu::mig(g).with_mig_mode(MigMode::Disabled));
    let opts = DiscoverOptions::new("n");
    let node = Node::new(&host, &opts);
    let mig = node.mig(&n);
    let made = mig
        .before_vgpu(&gpu, "NVIDIA H100XM-3-40C")
        .unwrap()
        .unwrap();
    assert_eq!(
        n.mig_mode(&gpu).unwrap(),
        MigModes::settled(MigMode::Enabled)
    );
    assert_eq!((made.profile.as_str(), made.start), ("3g.40gb", 4));
    // A time-sliced type now: gpuslice's instance goes, then MIG mode.
    assert_eq!(mig.before_vgpu(&gpu, "NVIDIA H100XM-80C").unwrap(), None);
    assert_eq!(
        n.mig_mode(&gpu).unwrap(),
        MigModes::settled(MigMode::Disabled)
    );
    assert!(n.gpu_instances(&gpu).is_err() || n.gpu_instances(&gpu).unwrap().is_empty());
    // Someone else's instance keeps MIG mode on: refused naming it, nothing written.
    mig.set_mode(&gpu, MigMode::Enabled).unwrap();
    n.create_gpu_instance(&gpu, 19, Placement { start: 0, size: 1 })
        .unwrap();
    let writes = n.writes().len();
    let e = mig.before_vgpu(&gpu, "NVIDIA H100XM-80C").unwrap_err();
    assert!(e.to_string().contains("did not make"), "{e}");
    assert_eq!(n.writes().len(), writes);
}

#[test]
fn mig_mode_that_waits_for_a_reset_is_said_and_nothing_more_is_made() {
    let t = h100_tree();
    let host = gpu_sysfs::RealHost::new(t.root()).unwrap();
    let gpu: PciAddress = "0000:41:00.0".parse().unwrap();
    let g = MigGeometry::for_device(0x2330).unwrap();
    let n = FakeNvml::new().with_gpu(gpu, FakeGpu::mig(g).needing_reset());
    let opts = DiscoverOptions::new("n");
    let node = Node::new(&host, &opts);
    let e = node
        .mig(&n)
        .before_vgpu(&gpu, "NVIDIA H100XM-3-40C")
        .unwrap_err();
    assert!(matches!(e, MigError::PendingReset { .. }), "{e}");
    assert!(e.to_string().contains("nvidia-smi -r"), "{e}");
    assert!(
        n.gpu_instances(&gpu).is_err() || n.gpu_instances(&gpu).unwrap().is_empty(),
        "no instance made on a mode not in force"
    );
}

/// The H200's MIG-backed and time-sliced types as its driver lists them as supported
/// (`nvmlDeviceGetSupportedVgpus`), with their GPU-instance profiles.
fn nvml_with_types(mode: MigMode) -> Arc<FakeNvml> {
    let g = MigGeometry::for_device(0x2335).unwrap();
    let t = |id: u32, name: &str, gib: u64, profile: Option<u32>| {
        let t = gpu_nvml::fake::FakeVgpuType::new(id, name, gib * 1024, 1, &[]);
        match profile {
            Some(p) => t.mig_backed(p),
            None => t,
        }
    };
    let types = vec![
        t(1414, "NVIDIA H200X-1-18C", 18, Some(19)),
        t(1418, "NVIDIA H200X-3-71C", 71, Some(9)),
        t(1420, "NVIDIA H200X-7-141C", 141, Some(0)),
        t(1427, "NVIDIA H200X-71C", 71, None),
    ];
    Arc::new(FakeNvml::new().with_gpu(
        pf(),
        FakeGpu::mig(g).with_mig_mode(mode).with_vgpu_types(types),
    ))
}

fn discover_with(k: &FakeKernel, n: &Arc<FakeNvml>) -> gpu_core::NodeTopology {
    let mut o = DiscoverOptions::new("n");
    let devices: Arc<dyn NvmlDevices> = Arc::clone(n) as Arc<dyn NvmlDevices>;
    o.resolver = Some(Arc::new(gpu_health::NvmlResolver::over(devices)));
    gpu_sysfs::discover::discover(k, &o).unwrap()
}

#[test]
fn mig_backed_types_without_an_instance_are_listed_as_needing_one_from_what_nvml_supports() {
    let n = nvml_with_types(MigMode::Enabled);
    let k = h200_mig_kernel(&[], Arc::clone(&n)).unwrap();
    let topo = discover_with(&k, &n);
    let json = serde_json::to_value(&topo).unwrap();
    let m = &json["gpus"][0]["migBackedTypes"];
    assert_eq!(m["source"], "nvml", "{m}");
    let names: Vec<(&str, bool)> = m["types"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| {
            (
                t["name"].as_str().unwrap(),
                t["needsGpuInstance"].as_bool().unwrap(),
            )
        })
        .collect();
    // The time-sliced type is not MIG-backed; no instance exists: every MIG-backed one needs one.
    assert_eq!(
        names,
        [
            ("NVIDIA H200X-1-18C", true),
            ("NVIDIA H200X-3-71C", true),
            ("NVIDIA H200X-7-141C", true)
        ]
    );
    // `vgpu types`: a free VF lists them too, none available until the instance is made.
    let listing = gpu_core::vgpu_types::vgpu_types(&topo, None);
    let first = listing
        .iter()
        .find(|p| p.parent.to_string() == h200_vf(0, 0))
        .unwrap();
    let t = first
        .types
        .iter()
        .find(|t| t.id.as_str() == "1418")
        .unwrap();
    assert!(t.needs_gpu_instance && t.available_instances == 0, "{t:?}");
    let text = gpu_core::text::vgpu_types(&listing);
    assert!(text.contains("Needs a GPU instance: yes"), "{text}");
    // With a 3g instance made, its type is listed by the VFs and no longer needs one.
    n.create_gpu_instance(&pf(), 9, Placement { start: 4, size: 4 })
        .unwrap();
    let topo = discover_with(&k, &n);
    let m = topo.gpus[0].mig_backed_types.as_ref().unwrap();
    let three = m.types.iter().find(|t| t.id.as_str() == "1418").unwrap();
    assert!(!three.needs_gpu_instance, "{three:?}");
}

#[test]
fn mig_backed_types_are_listed_while_mig_mode_is_off_and_unknown_without_nvml() {
    let n = nvml_with_types(MigMode::Disabled);
    let k = h200_mig_kernel(&[], Arc::clone(&n)).unwrap();
    let topo = discover_with(&k, &n);
    let m = topo.gpus[0].mig_backed_types.as_ref().unwrap();
    assert_eq!(m.types.len(), 3);
    assert!(m.types.iter().all(|t| t.needs_gpu_instance), "{m:?}");
    // No NVML to ask: said unknown, nothing listed, nothing guessed.
    let bare = gpu_sysfs::discover::discover(&k, &DiscoverOptions::new("n")).unwrap();
    let m = bare.gpus[0].mig_backed_types.as_ref().unwrap();
    assert_eq!((m.source.as_str(), m.types.len()), ("unknown", 0));
}
