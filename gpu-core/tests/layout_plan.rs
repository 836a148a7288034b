#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! Planning layouts against hosts: the real A2 capture, T4 pairs, MIG suffixes, vendor-VFIO
//! L40S hosts, NVIDIA's index rules, capacity refusals and in-use instances.

use gpu_core::layout::{
    LayoutError, LayoutFile, Mode, Plan, PlanOptions, Step, assert_layout, plan_layout,
    plan_vgpu_config,
};
use gpu_core::topology::{PciId, Sriov};
use gpu_core::{
    Gpu, Instance, MdevUuid, NodeTopology, Parent, ParentId, PciAddress, Pool, Profile,
    VgpuFramework, VgpuTypeId,
};

const EXAMPLE: &str = include_str!("data/nvidia-configs/config-example.yaml");
const T4: &str = include_str!("data/nvidia-configs/config-t4.yaml");

fn addr(s: &str) -> PciAddress {
    s.parse().unwrap()
}

fn uuid(s: &str) -> MdevUuid {
    s.parse().unwrap()
}

fn profile(id: &str, name: &str, fb: u64, available: u32) -> Profile {
    Profile {
        id: VgpuTypeId::from_str_unchecked(id),
        name: name.to_owned(),
        framebuffer_mib: Some(fb),
        max_instances: None,
        available_instances: available,
        reported_instances: None,
        device_api: "vfio-pci".into(),
        mig_slices: None,
        mig_memory_gib: None,
        description: None,
    }
}

fn mdev(u: &str, type_id: &str, name: &str, fb: u64) -> Instance {
    Instance {
        uuid: Some(uuid(u)),
        address: None,
        profile: VgpuTypeId::from_str_unchecked(type_id),
        profile_name: Some(name.to_owned()),
        framebuffer_mib: Some(fb),
        in_use: Some(false),
        placement_id: None,
    }
}

/// The A2 types of the real capture (`a2-vf-0000-08-01.7/mdev_supported_types`).
const A2_TYPES: [(u32, &str, u64); 15] = [
    (742, "A2-1B", 1024),
    (743, "A2-2B", 2048),
    (744, "A2-1Q", 1024),
    (745, "A2-2Q", 2048),
    (746, "A2-4Q", 4096),
    (747, "A2-8Q", 8192),
    (748, "A2-16Q", 16384),
    (749, "A2-1A", 1024),
    (750, "A2-2A", 2048),
    (751, "A2-4A", 4096),
    (752, "A2-8A", 8192),
    (753, "A2-16A", 16384),
    (754, "A2-4C", 4096),
    (755, "A2-8C", 8192),
    (756, "A2-16C", 16384),
];

fn pool(gpu: PciAddress, parents: Vec<ParentId>, total: u64, used: u64) -> Pool {
    Pool {
        gpu: ParentId::Pci(gpu),
        parents,
        total_mib: total,
        used_mib: used,
        size_locked_mib: None,
        mixed_size: false,
        mig_slices_total: None,
        mig_slices_used: None,
        mig_slots: None,
    }
}

/// The real A2 host (harvester/pcidevices capture): 16 GB, 16 VFs 08:00.4..08:02.3, and three
/// live 4 GB vGPUs: A2-4C on 08:00.4, A2-4A on 08:00.6, A2-4Q on 08:02.0.
fn a2_host() -> NodeTopology {
    a2_with(&[
        (0, "f715f63c-0d00-4007-9c5a-b07b0c6c05de".into(), 754),
        (2, "3deab9a4-200a-4c54-99b1-5eb0722d1d81".into(), 751),
        (12, "c728e022-f16f-434b-ad2c-9665ee634d3d".into(), 746),
    ])
}

/// An A2 with the capture's 15 types on 16 VFs and `live` vGPUs `(VF index, UUID, type number)`;
/// free VFs report 1 for the types that still fit the pool, as the driver does.
fn a2_with(live: &[(usize, String, u32)]) -> NodeTopology {
    let pf = addr("0000:08:00.0");
    let size_of = |id: u32| A2_TYPES.iter().find(|t| t.0 == id).unwrap().2;
    let used: u64 = live.iter().map(|l| size_of(l.2)).sum();
    let locked = live.first().map(|l| size_of(l.2));
    let vfs: Vec<PciAddress> = (0..16u8)
        .map(|i| {
            let rid = 4 + i;
            PciAddress::new(0, 8, rid >> 3, rid & 7).unwrap()
        })
        .collect();
    let mut t = NodeTopology::new("a2host");
    let mut gpu = Gpu::new("nvidia0", pf, 0x10de, 0x25b6, 0x030200);
    gpu.driver = Some("nvidia".into());
    gpu.sriov = Some(Sriov {
        total_vfs: 16,
        num_vfs: 16,
        vfs: vfs.clone(),
        vf_device_id: None,
        ..Sriov::default()
    });
    gpu.vgpu_framework = Some(VgpuFramework::Mdev);
    gpu.memory_mib = Some(16384);
    t.gpus.push(gpu);
    for (i, vf) in vfs.iter().enumerate() {
        let busy = live.iter().find(|l| l.0 == i);
        let profiles = A2_TYPES
            .iter()
            .map(|(id, name, fb)| {
                let fits = used + fb <= 16384 && locked.is_none_or(|l| l == *fb);
                let avail = u32::from(busy.is_none() && fits);
                profile(
                    &format!("nvidia-{id}"),
                    &format!("NVIDIA {name}"),
                    *fb,
                    avail,
                )
            })
            .collect();
        let instances = busy
            .map(|(_, u, id)| {
                let name = A2_TYPES.iter().find(|t| t.0 == *id).unwrap().1;
                vec![mdev(
                    u,
                    &format!("nvidia-{id}"),
                    &format!("NVIDIA {name}"),
                    size_of(*id),
                )]
            })
            .unwrap_or_default();
        t.mediated_devices.parents.push(Parent {
            id: ParentId::Pci(*vf),
            gpu: Some(pf),
            framework: VgpuFramework::Mdev,
            health: Default::default(),
            profiles,
            instances,
            warnings: vec![],
        });
    }
    let mut p = pool(
        pf,
        vfs.iter().map(|v| ParentId::Pci(*v)).collect(),
        16384,
        used,
    );
    p.size_locked_mib = locked;
    t.mediated_devices.pools.push(p);
    t
}

fn creates(plan: &Plan) -> Vec<(String, String, Option<MdevUuid>)> {
    plan.steps
        .iter()
        .filter_map(|s| match s {
            Step::Create { instance, .. } => Some((
                instance.parent.to_string(),
                instance
                    .type_id
                    .as_ref()
                    .map(ToString::to_string)
                    .unwrap_or_default(),
                instance.uuid,
            )),
            _ => None,
        })
        .collect()
}

fn removes(plan: &Plan) -> Vec<String> {
    plan.steps
        .iter()
        .filter_map(|s| match s {
            Step::Remove { instance, .. } => Some(instance.label()),
            _ => None,
        })
        .collect()
}

/// Applies a plan to a topology the way the kernel would, for idempotency checks.
fn applied(mut t: NodeTopology, plan: &Plan) -> NodeTopology {
    for s in &plan.steps {
        match s {
            Step::Remove { instance, .. } => {
                for p in &mut t.mediated_devices.parents {
                    if p.id == instance.parent {
                        // An mdev goes by UUID; a vendor-VFIO VF holds one instance.
                        match instance.uuid {
                            Some(u) => p.instances.retain(|i| i.uuid != Some(u)),
                            None => p.instances.clear(),
                        }
                    }
                }
            }
            Step::Create { instance, .. } => {
                for p in &mut t.mediated_devices.parents {
                    if p.id == instance.parent {
                        p.instances.push(Instance {
                            uuid: instance.uuid,
                            address: instance.parent.pci().filter(|_| instance.uuid.is_none()),
                            profile: instance.type_id.clone().unwrap(),
                            profile_name: instance.type_name.clone(),
                            framebuffer_mib: instance.framebuffer_mib,
                            in_use: Some(false),
                            placement_id: None,
                        });
                    }
                }
            }
            Step::EnableSriov { .. } => panic!("not modelled"),
        }
    }
    for pool in &mut t.mediated_devices.pools {
        let used: u64 = t
            .mediated_devices
            .parents
            .iter()
            .filter(|p| p.pool_key() == pool.gpu)
            .flat_map(|p| p.instances.iter())
            .map(|i| i.framebuffer_mib.unwrap_or(0))
            .sum();
        pool.used_mib = used;
        pool.size_locked_mib = t
            .mediated_devices
            .parents
            .iter()
            .filter(|p| p.pool_key() == pool.gpu)
            .flat_map(|p| p.instances.iter())
            .find_map(|i| i.framebuffer_mib);
    }
    t
}

#[test]
fn a2_4q_on_the_real_a2_capture_keeps_the_4q_and_replaces_the_others() {
    let plan = plan_vgpu_config(EXAMPLE, "A2-4Q", &a2_host()).unwrap();
    assert_eq!(
        removes(&plan),
        [
            "f715f63c-0d00-4007-9c5a-b07b0c6c05de",
            "3deab9a4-200a-4c54-99b1-5eb0722d1d81"
        ]
    );
    let pf = addr("0000:08:00.0");
    let slot = |i| Some(MdevUuid::for_layout_slot("a2host", &pf, i));
    assert_eq!(
        creates(&plan),
        [
            ("0000:08:00.4".into(), "nvidia-746".into(), slot(0)),
            ("0000:08:00.5".into(), "nvidia-746".into(), slot(1)),
            ("0000:08:00.6".into(), "nvidia-746".into(), slot(2)),
        ]
    );
    let g = &plan.gpus[0];
    assert_eq!(
        (g.index, g.entry.as_str()),
        (Some(0), "vgpu-configs.A2-4Q[0]")
    );
    assert_eq!(g.keep.len(), 1);
    assert_eq!(
        g.keep[0].uuid,
        Some(uuid("c728e022-f16f-434b-ad2c-9665ee634d3d"))
    );
    let diff: Vec<(String, u32, u32)> = g
        .types
        .iter()
        .map(|t| (t.name.clone(), t.have, t.want))
        .collect();
    assert_eq!(
        diff,
        [
            ("A2-4Q".into(), 1, 4),
            ("A2-4A".into(), 1, 0),
            ("A2-4C".into(), 1, 0)
        ]
    );
    let assertion = assert_layout(
        LayoutFile::parse(EXAMPLE)
            .unwrap()
            .select(Some("A2-4Q"))
            .unwrap(),
        &a2_host(),
    )
    .unwrap();
    assert!(!assertion.applied);
    assert!(
        assertion
            .diff
            .contains(&"nvidia0 (0000:08:00.0): A2-4Q: have 1, want 4".to_owned()),
        "{:?}",
        assertion.diff
    );
}

#[test]
fn planning_an_applied_layout_again_writes_nothing() {
    let host = a2_host();
    let plan = plan_vgpu_config(EXAMPLE, "A2-4Q", &host).unwrap();
    let after = applied(host, &plan);
    let again = plan_vgpu_config(EXAMPLE, "A2-4Q", &after).unwrap();
    assert!(again.is_noop(), "{:?}", again.steps);
    let cfg = LayoutFile::parse(EXAMPLE).unwrap();
    assert!(
        assert_layout(cfg.select(Some("A2-4Q")).unwrap(), &after)
            .unwrap()
            .applied
    );
}

#[test]
fn a_layout_that_does_not_fit_is_refused_with_the_numbers() {
    let text =
        "version: v1\nvgpu-configs:\n  big:\n    - devices: all\n      vgpu-devices: {A2-8Q: 3}\n";
    let e = plan_vgpu_config(text, "big", &a2_host()).unwrap_err();
    let LayoutError::DoesNotFit { want, fit, .. } = &e else {
        panic!("{e:?}")
    };
    assert_eq!((*want, *fit), (3, 2));
    assert_eq!(e.kind().as_str(), "does-not-fit");
    let msg = e.to_string();
    assert!(
        msg.contains("8192 MiB") && msg.contains("0 MiB free") && msg.contains("16384 MiB total"),
        "{msg}"
    );
    let two =
        "version: v1\nvgpu-configs:\n  big:\n    - devices: all\n      vgpu-devices: {A2-8Q: 2}\n";
    let plan = plan_vgpu_config(two, "big", &a2_host()).unwrap();
    assert_eq!(removes(&plan).len(), 3);
    assert_eq!(creates(&plan).len(), 2);
}

#[test]
fn instances_in_use_are_never_planned_for_removal_without_force() {
    let mut host = a2_host();
    host.mediated_devices.parents[0].instances[0].in_use = Some(true);
    let cfg = LayoutFile::parse(EXAMPLE).unwrap();
    let a2 = cfg.select(Some("A2-4Q")).unwrap();
    let plan = plan_layout(a2, &host, &PlanOptions::default()).unwrap();
    assert!(plan.is_noop());
    let refused: Vec<_> = plan.refused().collect();
    assert_eq!(refused.len(), 1);
    assert!(
        refused[0]
            .refused
            .as_deref()
            .unwrap()
            .contains("f715f63c-0d00-4007-9c5a-b07b0c6c05de"),
        "{:?}",
        refused[0].refused
    );
    let forced = plan_layout(
        a2,
        &host,
        &PlanOptions {
            force: true,
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!(removes(&forced).len(), 2);
}

#[test]
fn kept_instances_prefer_the_ones_a_vm_uses() {
    let mut host = a2_host();
    // Two A2-4Q, only the second in use; the config wants one.
    host.mediated_devices.parents[1].instances = vec![mdev(
        "11111111-2222-3333-4444-555555555555",
        "nvidia-746",
        "NVIDIA A2-4Q",
        4096,
    )];
    host.mediated_devices.parents[1].instances[0].in_use = Some(true);
    host.mediated_devices.pools[0].used_mib = 16384;
    let text =
        "version: v1\nvgpu-configs:\n  one:\n    - devices: all\n      vgpu-devices: {A2-4Q: 1}\n";
    let plan = plan_vgpu_config(text, "one", &host).unwrap();
    assert_eq!(
        plan.gpus[0].keep[0].uuid,
        Some(uuid("11111111-2222-3333-4444-555555555555"))
    );
    assert!(plan.refused().next().is_none());
}

#[test]
fn clearing_removes_every_instance_of_the_selected_gpus() {
    let cfg = LayoutFile::parse(EXAMPLE).unwrap();
    let plan = plan_layout(
        cfg.select(Some("A2-4Q")).unwrap(),
        &a2_host(),
        &PlanOptions {
            mode: Mode::Clear,
            force: false,
        },
    )
    .unwrap();
    assert_eq!(removes(&plan).len(), 3);
    assert!(creates(&plan).is_empty());
}

fn t4(name: &str, a: &str, instances: Vec<Instance>) -> (Gpu, Parent) {
    let mut g = Gpu::new(name, addr(a), 0x10de, 0x1eb8, 0x030200);
    g.driver = Some("nvidia".into());
    g.vgpu_framework = Some(VgpuFramework::Mdev);
    let types = [
        (222, "GRID T4-1Q", 1024u64),
        (223, "GRID T4-2Q", 2048),
        (224, "GRID T4-4Q", 4096),
        (225, "GRID T4-8Q", 8192),
        (226, "GRID T4-16Q", 16384),
    ];
    let parent = Parent {
        id: ParentId::Pci(addr(a)),
        gpu: Some(addr(a)),
        framework: VgpuFramework::Mdev,
        health: Default::default(),
        profiles: types
            .iter()
            .map(|(id, n, fb)| profile(&format!("nvidia-{id}"), n, *fb, (16384 / fb) as u32))
            .collect(),
        instances,
        warnings: vec![],
    };
    (g, parent)
}

/// Two T4s at 0000:81:00.0 and 0000:0a:00.0 (listed out of order), an NVIDIA "other display"
/// function, a Matrox BMC VGA, and an Intel iGPU: NVIDIA's index 0 is 0a:00.0, index 1 is 81:00.0.
fn two_t4_host() -> NodeTopology {
    let mut t = NodeTopology::new("t4host");
    t.gpus.push(Gpu::new(
        "intel0",
        addr("0000:00:02.0"),
        0x8086,
        0x3e92,
        0x030000,
    ));
    t.gpus.push(Gpu::new(
        "matrox0",
        addr("0000:03:00.0"),
        0x102b,
        0x0533,
        0x030000,
    ));
    t.gpus.push(Gpu::new(
        "nvidia0",
        addr("0000:05:00.0"),
        0x10de,
        0x1234,
        0x038000,
    ));
    for (name, a) in [("nvidia2", "0000:81:00.0"), ("nvidia1", "0000:0a:00.0")] {
        let (g, p) = t4(name, a, vec![]);
        t.gpus.push(g);
        t.mediated_devices.parents.push(p);
        t.mediated_devices
            .pools
            .push(pool(addr(a), vec![ParentId::Pci(addr(a))], 16384, 0));
    }
    t
}

#[test]
fn gpu_indices_count_nvidia_display_devices_in_address_order() {
    let plan = plan_vgpu_config(T4, "T4-small", &two_t4_host()).unwrap();
    let per_gpu: Vec<(String, Option<u32>, usize, String)> = plan
        .gpus
        .iter()
        .map(|g| {
            (
                g.gpu.to_string(),
                g.index,
                g.create.len(),
                g.create[0].type_name.clone().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        per_gpu,
        [
            ("0000:0a:00.0".into(), Some(0), 16, "GRID T4-1Q".into()),
            ("0000:81:00.0".into(), Some(1), 8, "GRID T4-2Q".into())
        ]
    );
    // One T4 parent holds many instances, each with its own slot UUID.
    let uuids: std::collections::BTreeSet<_> = plan.gpus[0]
        .create
        .iter()
        .map(|c| c.uuid.unwrap())
        .collect();
    assert_eq!(uuids.len(), 16);
}

#[test]
fn missing_indices_are_ignored_with_a_warning_as_nvidias_tool_does() {
    let mut host = two_t4_host();
    host.gpus.retain(|g| g.address != addr("0000:81:00.0"));
    host.mediated_devices
        .parents
        .retain(|p| p.gpu != Some(addr("0000:81:00.0")));
    let plan = plan_vgpu_config(T4, "T4-large", &host).unwrap();
    assert_eq!(plan.gpus.len(), 1);
    assert!(
        plan.warnings[0].contains("GPU index 1 does not exist"),
        "{:?}",
        plan.warnings
    );
}

#[test]
fn assert_looks_only_at_the_gpus_the_config_selects() {
    let mut host = two_t4_host();
    // GPU index 0 holds the T4-small layout; index 1 holds something else entirely.
    let a = "0000:0a:00.0";
    let slot = |i| MdevUuid::for_layout_slot("t4host", &addr(a), i).to_string();
    for p in &mut host.mediated_devices.parents {
        if p.id == ParentId::Pci(addr(a)) {
            p.instances = (0..16)
                .map(|i| mdev(&slot(i), "nvidia-222", "GRID T4-1Q", 1024))
                .collect();
        } else {
            p.instances = vec![mdev(
                "99999999-2222-3333-4444-555555555555",
                "nvidia-226",
                "GRID T4-16Q",
                16384,
            )];
        }
    }
    let only_first = "version: v1\nvgpu-configs:\n  first:\n    - devices: [0]\n      vgpu-devices: {T4-1Q: 16}\n";
    let cfg = LayoutFile::parse(only_first).unwrap();
    let a1 = assert_layout(cfg.select(None).unwrap(), &host).unwrap();
    assert!(a1.applied, "{:?}", a1.diff);
    assert_eq!(a1.gpus.len(), 1);
    let both = LayoutFile::parse(T4).unwrap();
    let a2 = assert_layout(both.select(Some("T4-small")).unwrap(), &host).unwrap();
    assert!(!a2.applied);
    assert_eq!(
        a2.diff,
        [
            "nvidia2 (0000:81:00.0): T4-2Q: have 0, want 8",
            "nvidia2 (0000:81:00.0): T4-16Q: have 1, want 0"
        ]
    );
}

/// An A100 PCIe (0x20f1) on SR-IOV VFs whose driver lists MIG types without their suffixes.
fn a100_host(existing: Option<&str>) -> NodeTopology {
    let pf = addr("0000:3b:00.0");
    let mut t = NodeTopology::new("a100host");
    let mut g = Gpu::new("nvidia0", pf, 0x10de, 0x20f1, 0x030200);
    g.driver = Some("nvidia".into());
    t.gpus.push(g);
    for i in 0..4u8 {
        let vf = PciAddress::new(0, 0x3b, 0, 4 + i).unwrap();
        let mut mig = profile("nvidia-699", "GRID A100-1-5C", 4864, 1);
        mig.mig_slices = Some(1);
        let mut mig2 = profile("nvidia-700", "GRID A100-2-10C", 9984, 1);
        mig2.mig_slices = Some(2);
        let instances = match (i, existing) {
            (0, Some(u)) => vec![mdev(u, "nvidia-699", "GRID A100-1-5C", 4864)],
            _ => vec![],
        };
        t.mediated_devices.parents.push(Parent {
            id: ParentId::Pci(vf),
            gpu: Some(pf),
            framework: VgpuFramework::Mdev,
            health: Default::default(),
            profiles: vec![mig, mig2],
            instances,
            warnings: vec![],
        });
    }
    let mut p = pool(pf, vec![], 40960, 0);
    p.mig_slices_total = Some(7);
    p.mig_slices_used = Some(u8::from(existing.is_some()));
    t.mediated_devices.pools.push(p);
    t
}

#[test]
fn a_mig_suffix_matches_the_base_type_when_the_driver_lists_only_that() {
    let text = "version: v1\nvgpu-configs:\n  me:\n    - devices: all\n      vgpu-devices: {A100-1-5CME: 1}\n";
    let host = a100_host(Some("aaaaaaaa-2222-3333-4444-555555555555"));
    let plan = plan_vgpu_config(text, "me", &host).unwrap();
    assert!(plan.is_noop(), "{:?}", plan.steps);
    let cfg = LayoutFile::parse(text).unwrap();
    assert!(
        assert_layout(cfg.select(None).unwrap(), &host)
            .unwrap()
            .applied
    );
    let fresh = plan_vgpu_config(text, "me", &a100_host(None)).unwrap();
    assert_eq!(creates(&fresh)[0].1, "nvidia-699");
}

#[test]
fn two_names_collapsing_to_one_driver_type_are_an_error_naming_both() {
    let text = "version: v1\nvgpu-configs:\n  c:\n    - devices: all\n      vgpu-devices: {A100-1-5CME: 1, A100-1-5C: 2}\n";
    let e = plan_vgpu_config(text, "c", &a100_host(None)).unwrap_err();
    let LayoutError::DuplicateType {
        first,
        second,
        resolved,
        ..
    } = &e
    else {
        panic!("{e:?}")
    };
    assert_eq!(
        (first.as_str(), second.as_str(), resolved.as_str()),
        ("A100-1-5CME", "A100-1-5C", "A100-1-5C")
    );
}

#[test]
fn mig_backed_layouts_are_placed_largest_first_and_counted_in_slices() {
    let text = "version: v1\nvgpu-configs:\n  c:\n    - devices: all\n      vgpu-devices: {A100-1-5C: 2, A100-2-10C: 2}\n";
    let plan = plan_vgpu_config(text, "c", &a100_host(None)).unwrap();
    let order: Vec<String> = creates(&plan).into_iter().map(|c| c.1).collect();
    assert_eq!(
        order,
        ["nvidia-700", "nvidia-700", "nvidia-699", "nvidia-699"]
    );
    let too_many = "version: v1\nvgpu-configs:\n  c:\n    - devices: all\n      vgpu-devices: {A100-2-10C: 4}\n";
    let e = plan_vgpu_config(too_many, "c", &a100_host(None)).unwrap_err();
    assert!(e.to_string().contains("needs 2 MIG slices, 1 free"), "{e}");
}

#[test]
fn unknown_types_name_what_the_gpu_offers() {
    let e = plan_vgpu_config(EXAMPLE, "T4-1Q", &a2_host()).unwrap_err();
    assert!(matches!(e, LayoutError::UnknownType { .. }), "{e:?}");
    assert!(
        e.to_string().contains("\"T4-1Q\"") && e.to_string().contains("A2-4Q"),
        "{e}"
    );
}

#[test]
fn nvidias_default_config_picks_each_boards_entry_by_device_filter() {
    // A16 and A2 share 0x25B6: the A2 entry is chosen because the board offers its type.
    let plan = plan_vgpu_config(EXAMPLE, "default", &a2_host()).unwrap();
    assert_eq!(plan.gpus.len(), 1);
    assert_eq!(plan.gpus[0].types[0].name, "A2-8Q");
    // RTX 8000 and RTX 6000 share 0x1E78: the entry whose type the board offers is chosen.
    let mut t = NodeTopology::new("rtx");
    let a = addr("0000:17:00.0");
    let mut g = Gpu::new("nvidia0", a, 0x10de, 0x1e78, 0x030000);
    g.driver = Some("nvidia".into());
    t.gpus.push(g);
    t.mediated_devices.parents.push(Parent {
        id: ParentId::Pci(a),
        gpu: Some(a),
        framework: VgpuFramework::Mdev,
        health: Default::default(),
        profiles: vec![profile("nvidia-400", "GRID RTX6000P-12Q", 12288, 2)],
        instances: vec![],
        warnings: vec![],
    });
    t.mediated_devices.pools.push(pool(a, vec![], 24576, 0));
    let plan = plan_vgpu_config(EXAMPLE, "default", &t).unwrap();
    assert_eq!(plan.gpus[0].entry, "vgpu-configs.default[7]");
    assert_eq!(creates(&plan).len(), 2);
}

/// An L40S in the vendor-specific VFIO framework with `n` VFs; `types` set on the first VFs.
fn l40s_host(types: &[u32]) -> NodeTopology {
    let pf = addr("0000:26:00.0");
    let mut t = NodeTopology::new("l40s");
    let mut g = Gpu::new("nvidia0", pf, 0x10de, 0x26b9, 0x030200);
    g.driver = Some("nvidia".into());
    g.vgpu_framework = Some(VgpuFramework::VendorVfio);
    t.gpus.push(g);
    let names = [
        (1155u32, "NVIDIA L40S-24Q", 24576u64),
        (1154, "NVIDIA L40S-16Q", 16384),
        (1153, "NVIDIA L40S-12Q", 12288),
    ];
    let used: u64 = types
        .iter()
        .map(|id| names.iter().find(|n| n.0 == *id).unwrap().2)
        .sum();
    for i in 0..8u8 {
        let vf = PciAddress::new(0, 0x26, 0, 4 + (i % 4)).unwrap();
        let vf = if i < 4 {
            vf
        } else {
            PciAddress::new(0, 0x26, 1, i - 4).unwrap()
        };
        let current = types.get(i as usize);
        // A full GPU lists no creatable types at all.
        let profiles = if used >= 49152 || current.is_some() {
            vec![]
        } else {
            names
                .iter()
                .map(|(id, n, fb)| profile(&id.to_string(), n, *fb, 1))
                .collect()
        };
        let instances = current
            .map(|id| {
                let (_, n, fb) = names.iter().find(|x| x.0 == *id).unwrap();
                vec![Instance {
                    uuid: None,
                    address: Some(vf),
                    profile: VgpuTypeId::from_str_unchecked(&id.to_string()),
                    profile_name: Some((*n).to_owned()),
                    framebuffer_mib: Some(*fb),
                    in_use: Some(false),
                    placement_id: None,
                }]
            })
            .unwrap_or_default();
        t.mediated_devices.parents.push(Parent {
            id: ParentId::Pci(vf),
            gpu: Some(pf),
            framework: VgpuFramework::VendorVfio,
            health: Default::default(),
            profiles,
            instances,
            warnings: vec![],
        });
    }
    let mut p = pool(pf, vec![], 49152, used);
    p.size_locked_mib = types
        .first()
        .map(|id| names.iter().find(|n| n.0 == *id).unwrap().2);
    t.mediated_devices.pools.push(p);
    t
}

#[test]
fn vendor_vfio_layouts_set_types_on_free_vfs() {
    let plan = plan_vgpu_config(EXAMPLE, "L40S-24Q", &l40s_host(&[])).unwrap();
    let c = creates(&plan);
    assert_eq!(
        c,
        [
            ("0000:26:00.4".into(), "1155".into(), None),
            ("0000:26:00.5".into(), "1155".into(), None)
        ]
    );
    assert!(
        plan_vgpu_config(EXAMPLE, "L40S-24Q", &l40s_host(&[1155, 1155]))
            .unwrap()
            .is_noop()
    );
}

#[test]
fn a_type_goes_to_a_vf_whose_own_list_offers_it_and_a_vf_listing_nothing_is_skipped() {
    let mut host = l40s_host(&[]);
    let silent = addr("0000:26:00.4");
    for p in &mut host.mediated_devices.parents {
        if p.id == ParentId::Pci(silent) {
            p.profiles.clear();
        }
    }
    let plan = plan_vgpu_config(EXAMPLE, "L40S-24Q", &host).unwrap();
    assert_eq!(
        creates(&plan),
        [
            ("0000:26:00.5".into(), "1155".into(), None),
            ("0000:26:00.6".into(), "1155".into(), None)
        ]
    );
}

#[test]
fn a_full_vendor_vfio_gpu_resolves_new_types_by_name_at_write_time() {
    let plan = plan_vgpu_config(EXAMPLE, "L40S-12Q", &l40s_host(&[1155, 1155])).unwrap();
    assert_eq!(removes(&plan), ["0000:26:00.4", "0000:26:00.5"]);
    let c = creates(&plan);
    assert_eq!(c.len(), 4);
    assert!(c.iter().all(|(_, id, _)| id.is_empty()), "{c:?}");
    let e = plan_vgpu_config(EXAMPLE, "A2-4Q", &l40s_host(&[1155, 1155])).unwrap_err();
    assert!(matches!(e, LayoutError::WrongBoard { .. }), "{e:?}");
    assert_eq!(
        e.to_string(),
        "nvidia0 (0000:26:00.0): vGPU type \"A2-4Q\" is for the A2 board, not this GPU's (L40S); \
         nothing was written"
    );
}

#[test]
fn vf_pins_set_exactly_the_named_vfs() {
    let text = "version: v1\nvgpu-configs:\n  pinned:\n    \"0000:26:00.4\": 1155\n    \"0000:26:00.6\": L40S-24Q\n";
    let plan = plan_vgpu_config(text, "pinned", &l40s_host(&[])).unwrap();
    assert_eq!(
        creates(&plan),
        [
            ("0000:26:00.4".into(), "1155".into(), None),
            ("0000:26:00.6".into(), "1155".into(), None)
        ]
    );
    let retype = "version: v1\nvgpu-configs:\n  p:\n    \"0000:26:00.4\": 0\n";
    let plan = plan_vgpu_config(retype, "p", &l40s_host(&[1155])).unwrap();
    assert_eq!(removes(&plan), ["0000:26:00.4"]);
    let gpu_key = "version: v1\nvgpu-configs:\n  p:\n    \"0000:26:00.0\": 1155\n";
    let e = plan_vgpu_config(gpu_key, "p", &l40s_host(&[])).unwrap_err();
    assert!(e.to_string().contains("is a GPU, not a VF"), "{e}");
}

#[test]
fn a_gpu_without_vfs_gets_sriov_enabled_first() {
    let mut host = l40s_host(&[]);
    host.mediated_devices.parents.clear();
    host.mediated_devices.pools.clear();
    host.gpus[0].vgpu_framework = None;
    host.gpus[0].sriov = Some(Sriov {
        total_vfs: 32,
        num_vfs: 0,
        vfs: vec![],
        vf_device_id: None,
        ..Sriov::default()
    });
    let plan = plan_vgpu_config(EXAMPLE, "L40S-24Q", &host).unwrap();
    assert!(plan.needs_sriov());
    assert_eq!(
        plan.steps,
        [Step::EnableSriov {
            gpu: addr("0000:26:00.0")
        }]
    );
    let cfg = LayoutFile::parse(EXAMPLE).unwrap();
    let a = assert_layout(cfg.select(Some("L40S-24Q")).unwrap(), &host).unwrap();
    assert!(!a.applied);
}

#[test]
fn a_gpu_on_another_driver_is_reported_and_skipped() {
    let mut host = a2_host();
    host.mediated_devices.parents.clear();
    host.gpus[0].sriov = None;
    host.gpus[0].driver = Some("vfio-pci".into());
    let plan = plan_vgpu_config(EXAMPLE, "A2-4Q", &host).unwrap();
    assert!(plan.steps.is_empty(), "{:?}", plan.steps);
    let why = plan.gpus[0].refused.clone().unwrap_or_default();
    assert!(
        why.contains("0000:08:00.0 is bound to vfio-pci, not to nvidia"),
        "{why}"
    );
}

#[test]
fn sriov_is_never_enabled_on_a_gpu_passed_through_to_a_vm() {
    let mut host = l40s_host(&[]);
    host.mediated_devices.parents.clear();
    host.mediated_devices.pools.clear();
    host.gpus[0].vgpu_framework = None;
    host.gpus[0].driver = Some("vfio-pci".into());
    host.gpus[0].sriov = Some(Sriov {
        total_vfs: 32,
        num_vfs: 0,
        vfs: vec![],
        vf_device_id: None,
        ..Sriov::default()
    });
    let plan = plan_vgpu_config(EXAMPLE, "L40S-24Q", &host).unwrap();
    assert!(!plan.needs_sriov());
    assert!(plan.steps.is_empty(), "{:?}", plan.steps);
    assert!(plan.refused().count() == 1);
}

#[test]
fn a_gpu_that_cannot_hold_vgpus_is_named() {
    let mut host = a2_host();
    host.mediated_devices.parents.clear();
    host.gpus[0].sriov = None;
    let e = plan_vgpu_config(EXAMPLE, "A2-4Q", &host).unwrap_err();
    assert!(e.to_string().contains("has no vGPU parents"), "{e}");
}

#[test]
fn plans_serialize_with_camel_case_keys() {
    let plan = plan_vgpu_config(EXAMPLE, "A2-4Q", &a2_host()).unwrap();
    let json = serde_json::to_value(&plan).unwrap();
    assert_eq!(json["steps"][0]["op"], "remove");
    assert_eq!(json["steps"][2]["op"], "create");
    assert_eq!(json["steps"][2]["instance"]["typeId"], "nvidia-746");
    assert_eq!(json["steps"][2]["instance"]["framebufferMiB"], 4096);
    assert_eq!(json["gpus"][0]["types"][0]["have"], 1);
    let back: Plan = serde_json::from_value(json).unwrap();
    assert_eq!(back, plan);
    assert_eq!(PciId(0x10de).to_string(), "10de");
}

#[test]
fn the_per_gpu_form_plans_only_the_listed_gpus() {
    let text = "version: v1\nvgpu-configs:\n  lab:\n    \"0000:81:00.0\": {T4-2Q: 8}\n    \"0000:0a:00.0\": {}\n";
    let plan = plan_vgpu_config(text, "lab", &two_t4_host()).unwrap();
    let per_gpu: Vec<(String, usize)> = plan
        .gpus
        .iter()
        .map(|g| (g.gpu.to_string(), g.create.len()))
        .collect();
    assert_eq!(
        per_gpu,
        [("0000:0a:00.0".into(), 0), ("0000:81:00.0".into(), 8)]
    );
    let missing = "version: v1\nvgpu-configs:\n  lab:\n    \"0000:99:00.0\": {T4-2Q: 8}\n";
    let e = plan_vgpu_config(missing, "lab", &two_t4_host()).unwrap_err();
    assert!(
        e.to_string()
            .contains("0000:99:00.0 is not a GPU of this host"),
        "{e}"
    );
}

mod properties {
    use super::*;
    use proptest::prelude::*;

    /// A2 types by framebuffer size, so generated layouts respect the same-size rule.
    fn types_of_size(fb: u64) -> Vec<(u32, &'static str)> {
        A2_TYPES
            .iter()
            .filter(|t| t.2 == fb)
            .map(|t| (t.0, t.1))
            .collect()
    }

    /// Live vGPUs of one size on the first VFs, and a wanted layout of one (maybe other) size.
    /// Live vGPUs `(VF index, UUID, type)`, wanted `(name, count)`, and the wanted size in MiB.
    type Case = (Vec<(usize, String, u32)>, Vec<(String, u32)>, u64);

    fn case() -> impl Strategy<Value = Case> {
        let sizes = prop_oneof![
            Just(1024u64),
            Just(2048),
            Just(4096),
            Just(8192),
            Just(16384)
        ];
        (sizes.clone(), sizes, any::<u64>(), 1u32..=18, 1u32..=18).prop_map(
            |(have_fb, want_fb, seed, live_n, want_n)| {
                let have_types = types_of_size(have_fb);
                let cap = (16384 / have_fb) as u32;
                let live: Vec<(usize, String, u32)> = (0..live_n.min(cap))
                    .map(|i| {
                        let t = have_types[(seed as usize + i as usize) % have_types.len()].0;
                        let u = format!("00000000-0000-4000-8000-{:012x}", i);
                        (i as usize, u, t)
                    })
                    .collect();
                let want_types = types_of_size(want_fb);
                let first = want_types[seed as usize % want_types.len()].1;
                let mut want = vec![(first.to_owned(), want_n.div_ceil(2))];
                let second = want_types[(seed as usize + 1) % want_types.len()].1;
                if second != first && want_n > 1 {
                    want.push((second.to_owned(), want_n / 2));
                }
                (live, want, want_fb)
            },
        )
    }

    fn config(want: &[(String, u32)]) -> String {
        let mut text = String::from(
            "version: v1\nvgpu-configs:\n  c:\n    - devices: all\n      vgpu-devices:\n",
        );
        for (name, n) in want {
            text.push_str(&format!("        {name}: {n}\n"));
        }
        text
    }

    proptest! {
        /// A plan is refused exactly when the layout exceeds the card (16 GB, 16 VFs); an accepted
        /// plan, once carried out, asserts as applied and plans to nothing.
        #[test]
        fn plans_fit_exactly_when_the_card_holds_them_and_are_idempotent(
            (live, want, fb) in case()
        ) {
            let host = a2_with(&live);
            let text = config(&want);
            let total: u32 = want.iter().map(|w| w.1).sum();
            let fits = u64::from(total) * fb <= 16384 && total <= 16;
            match plan_vgpu_config(&text, "c", &host) {
                Ok(plan) => {
                    prop_assert!(fits, "accepted a layout that does not fit: {want:?}");
                    let after = applied(host, &plan);
                    let again = plan_vgpu_config(&text, "c", &after).unwrap();
                    prop_assert!(again.is_noop(), "{:?}", again.steps);
                    let cfg = LayoutFile::parse(&text).unwrap();
                    let a = assert_layout(cfg.select(None).unwrap(), &after).unwrap();
                    prop_assert!(a.applied, "{:?}", a.diff);
                    let used: u64 = after.mediated_devices.pools[0].used_mib;
                    prop_assert!(used <= 16384);
                }
                Err(LayoutError::DoesNotFit { .. }) => {
                    prop_assert!(!fits, "refused a layout that fits: {want:?} over {live:?}");
                }
                Err(e) => prop_assert!(false, "{e}"),
            }
        }

        /// Whatever is kept is never removed and created again: the writes are the difference.
        #[test]
        fn plans_write_only_the_difference((live, want, _fb) in case()) {
            let host = a2_with(&live);
            if let Ok(plan) = plan_vgpu_config(&config(&want), "c", &host) {
                let g = &plan.gpus[0];
                prop_assert_eq!(g.keep.len() + g.remove.len(), live.len());
                let wanted: u32 = want.iter().map(|w| w.1).sum();
                prop_assert_eq!(g.keep.len() + g.create.len(), wanted as usize);
                for k in &g.keep {
                    prop_assert!(!g.remove.iter().any(|r| r.uuid == k.uuid));
                }
            }
        }
    }
}

/// The kernel's mbochs sample driver as discovery sees it: one virtual parent, no framebuffer
/// sizes, so only the driver's counts describe its shared 256 MB pool.
fn mbochs_host(small: u32, medium: u32, large: u32, instances: Vec<Instance>) -> NodeTopology {
    let mut t = NodeTopology::new("lab");
    let p = |id: &str, n| Profile {
        framebuffer_mib: None,
        ..profile(id, id, 0, n)
    };
    t.mediated_devices.parents.push(Parent {
        id: ParentId::Named("mbochs".into()),
        gpu: None,
        framework: VgpuFramework::Mdev,
        health: Default::default(),
        profiles: vec![
            p("mbochs-large", large),
            p("mbochs-medium", medium),
            p("mbochs-small", small),
        ],
        instances,
        warnings: vec![],
    });
    t
}

#[test]
fn a_virtual_parent_is_planned_by_name_with_parent_slot_uuids() {
    let host = mbochs_host(64, 16, 4, vec![]);
    let text =
        "version: v1\nvgpu-configs:\n  lab:\n    mbochs: {mbochs-small: 3, mbochs-medium: 2}\n";
    let plan = plan_vgpu_config(text, "lab", &host).unwrap();
    assert_eq!(plan.gpus.len(), 1);
    assert_eq!(plan.gpus[0].label(), "mbochs");
    let creates: Vec<(String, String, String)> = plan
        .steps
        .iter()
        .map(|s| match s {
            Step::Create { gpu, instance } => (
                gpu.to_string(),
                instance.type_label(),
                instance.uuid.unwrap().to_string(),
            ),
            other => panic!("only creations expected, got {other:?}"),
        })
        .collect();
    let slot = |i| MdevUuid::for_named_parent_slot("lab", "mbochs", i).to_string();
    assert_eq!(
        creates,
        [
            ("mbochs".into(), "mbochs-medium".into(), slot(0)),
            ("mbochs".into(), "mbochs-medium".into(), slot(1)),
            ("mbochs".into(), "mbochs-small".into(), slot(2)),
            ("mbochs".into(), "mbochs-small".into(), slot(3)),
            ("mbochs".into(), "mbochs-small".into(), slot(4)),
        ]
    );
    assert!(plan.warnings.is_empty(), "{:?}", plan.warnings);
}

#[test]
fn a_virtual_parents_types_share_its_pool() {
    // After one small instance the driver shows 63/15/3: four large no longer fit.
    let one_small = vec![Instance {
        framebuffer_mib: None,
        ..mdev(
            "11111111-2222-4333-8444-555555555555",
            "mbochs-small",
            "mbochs-small",
            0,
        )
    }];
    let host = mbochs_host(63, 15, 3, one_small);
    let text = "version: v1\nvgpu-configs:\n  big:\n    mbochs: {mbochs-small: 1, mbochs-large: 4}\n  ok:\n    mbochs: {mbochs-small: 1, mbochs-large: 3}\n  mixed:\n    mbochs: {mbochs-large: 2, mbochs-medium: 8}\n";
    let e = plan_vgpu_config(text, "big", &host).unwrap_err();
    assert_eq!(
        e.to_string(),
        "mbochs: 4 × mbochs-large do not fit: 3 fit, then the pool is full (the driver reports \
         3 mbochs-large, 15 mbochs-medium, 63 mbochs-small available; the types of mbochs share \
         one pool)"
    );
    let ok = plan_vgpu_config(text, "ok", &host).unwrap();
    assert_eq!(ok.steps.len(), 3, "the small one is kept");
    // Removing the small one frees the 4 MB that 2 × 64 MB + 8 × 16 MB need, but 63/15/3 do
    // not say how much it frees: accepted, with the counts re-read at each write.
    let mixed = plan_vgpu_config(text, "mixed", &host).unwrap();
    assert_eq!(mixed.steps.len(), 11);
    assert!(
        mixed.warnings.iter().any(|w| w.contains("re-read")),
        "{:?}",
        mixed.warnings
    );
}

#[test]
fn an_empty_virtual_parent_is_read_as_its_counts_dividing_the_pool() {
    let host = mbochs_host(64, 16, 4, vec![]);
    let text = "version: v1
vgpu-configs:
  full:
    mbochs: {mbochs-large: 2, mbochs-medium: 8}
  over:
    mbochs: {mbochs-large: 2, mbochs-medium: 8, mbochs-small: 1}
";
    let full = plan_vgpu_config(text, "full", &host).unwrap();
    assert_eq!(full.steps.len(), 10);
    assert!(full.warnings.is_empty(), "{:?}", full.warnings);
    let e = plan_vgpu_config(text, "over", &host).unwrap_err();
    assert!(
        e.to_string().contains("1 × mbochs-small do not fit: 0 fit"),
        "{e}"
    );
}

/// An H200 SXM (vendor VFIO, 141 GB, 7 MIG slices) with 8 free VFs listing its MIG-backed types,
/// and `live` MIG-backed vGPUs `(type number, name, MiB, slices)` on its first VFs.
fn h200_host(live: &[(u32, &str, u64, u8)]) -> NodeTopology {
    let pf = addr("0000:1a:00.0");
    let mut t = NodeTopology::new("h200");
    let mut g = Gpu::new("nvidia0", pf, 0x10de, 0x2335, 0x030200);
    g.driver = Some("nvidia".into());
    g.vgpu_framework = Some(VgpuFramework::VendorVfio);
    t.gpus.push(g);
    let types = [
        (1414u32, "NVIDIA H200X-1-18C", 18 * 1024u64, 1u8),
        (1417, "NVIDIA H200X-3-71C", 71 * 1024, 3),
        (1428, "NVIDIA H200X-141C", 141 * 1024, 0),
    ];
    for i in 0..8u8 {
        let vf = PciAddress::new(0, 0x1a, 0, i).unwrap();
        let vf = PciAddress::new(0, 0x1a, 1 + i / 8, i % 8).unwrap_or(vf);
        let current = live.get(i as usize);
        let profiles = if current.is_some() {
            vec![]
        } else {
            types
                .iter()
                .filter(|x| x.3 > 0)
                .map(|(id, n, fb, s)| {
                    let mut p = profile(&id.to_string(), n, *fb, 1);
                    p.mig_slices = Some(*s);
                    p
                })
                .collect()
        };
        let instances = current
            .map(|(id, n, fb, _)| {
                vec![Instance {
                    uuid: None,
                    address: Some(vf),
                    profile: VgpuTypeId::from_str_unchecked(&id.to_string()),
                    profile_name: Some((*n).to_owned()),
                    framebuffer_mib: Some(*fb),
                    in_use: Some(false),
                    placement_id: None,
                }]
            })
            .unwrap_or_default();
        t.mediated_devices.parents.push(Parent {
            id: ParentId::Pci(vf),
            gpu: Some(pf),
            framework: VgpuFramework::VendorVfio,
            health: Default::default(),
            profiles,
            instances,
            warnings: vec![],
        });
    }
    let used_mib: u64 = live.iter().map(|l| l.2).sum();
    let mut p = pool(pf, vec![], 141 * 1024, used_mib);
    p.mig_slices_total = Some(7);
    p.mig_slices_used = Some(live.iter().map(|l| l.3).sum());
    t.mediated_devices.pools.push(p);
    t
}

const H200_LAYOUTS: &str = "version: v1
vgpu-configs:
  two-3g-one-1g:
    - devices: all
      vgpu-devices:
        H200X-3-71C: 2
        H200X-1-18C: 1
  one-3g:
    - devices: all
      vgpu-devices:
        H200X-1-18C: 2
        H200X-3-71C: 1
  seven-1g:
    - devices: all
      vgpu-devices:
        H200X-1-18C: 7
";

#[test]
fn two_3g_and_a_1g_need_nine_of_eight_memory_slices_and_are_refused() {
    let e = plan_vgpu_config(H200_LAYOUTS, "two-3g-one-1g", &h200_host(&[])).unwrap_err();
    assert!(matches!(e, LayoutError::DoesNotFit { .. }), "{e:?}");
    let msg = e.to_string();
    assert!(
        msg.contains("H200X-1-18C") && msg.contains("8 of 8 memory slices are held"),
        "{msg}"
    );
}

#[test]
fn mig_slots_decide_what_fits_not_slice_counts() {
    assert!(plan_vgpu_config(H200_LAYOUTS, "seven-1g", &h200_host(&[])).is_ok());
    assert!(plan_vgpu_config(H200_LAYOUTS, "one-3g", &h200_host(&[])).is_ok());
}

#[test]
fn an_inferred_mig_total_is_a_lower_bound_where_the_geometry_is_known() {
    let mut host = h200_host(&[]);
    // The VFs list only a 1g type, so discovery without NVML inferred one free slice.
    host.mediated_devices.pools[0].mig_slices_total = Some(1);
    let text = "version: v1\nvgpu-configs:\n  c:\n    - devices: all\n      vgpu-devices:\n        H200X-1-18C: 2\n";
    let plan = plan_vgpu_config(text, "c", &host).unwrap();
    assert_eq!(creates(&plan).len(), 2);
}

/// [`h200_host`] with a 4g type (`H200X-4-71C`) on its free VFs and the pool's GPU-instance slots
/// holding the live vGPUs' GPU instances at the given memory-slice starts (as NVML reports them).
fn h200_host_with_slots(live: &[(u32, &str, u64, u8)], starts: &[(&str, u8)]) -> NodeTopology {
    let mut t = h200_host(live);
    for p in &mut t.mediated_devices.parents {
        if p.instances.is_empty() {
            let mut four = profile("1419", "NVIDIA H200X-4-71C", 71 * 1024, 1);
            four.mig_slices = Some(4);
            p.profiles.push(four);
        }
    }
    let mut slots = gpu_core::MigSlots::new(gpu_core::MigGeometry::for_device(0x2335).unwrap());
    for (profile, start) in starts {
        slots.placed.push(gpu_core::MigPlaced {
            profile: (*profile).into(),
            start: *start,
        });
    }
    t.mediated_devices.pools[0].mig_slots = Some(std::sync::Arc::new(slots));
    t
}

const ONE_1G_ONE_4G: &str = "version: v1
vgpu-configs:
  c:
    - devices: all
      vgpu-devices:
        H200X-1-18C: 1
        H200X-4-71C: 1
";

const ONE_G: (u32, &str, u64, u8) = (1414, "NVIDIA H200X-1-18C", 18 * 1024, 1);

#[test]
fn a_kept_1g_that_nvml_places_at_slot_6_leaves_the_4g_its_slots_0_to_3() {
    // Guessing the kept 1g at the lowest start (0) would refuse the 4g, whose only start is 0.
    let host = h200_host_with_slots(&[ONE_G], &[("1g.18gb", 6)]);
    let plan = plan_vgpu_config(ONE_1G_ONE_4G, "c", &host).unwrap();
    assert!(removes(&plan).is_empty(), "{:?}", plan.steps);
    let made = creates(&plan);
    assert_eq!(made.len(), 1, "{made:?}");
    assert_eq!(made[0].1, "1419");
}

#[test]
fn a_kept_1g_at_slot_0_refuses_the_4g_with_the_slots_it_holds() {
    let host = h200_host_with_slots(&[ONE_G], &[("1g.18gb", 0)]);
    let e = plan_vgpu_config(ONE_1G_ONE_4G, "c", &host).unwrap_err();
    assert!(matches!(e, LayoutError::DoesNotFit { .. }), "{e:?}");
    assert!(e.to_string().contains("H200X-4-71C"), "{e}");
}

#[test]
fn removing_one_of_two_placed_1g_leaves_the_other_where_it_may_be_so_no_4g_is_promised() {
    // The two 1g sit at 0 and 4; the plan removes one of them, but which GPU instance that vGPU
    // used is not known, so the 1g left may be the one at 0: the 4g is refused, not guessed.
    let host = h200_host_with_slots(&[ONE_G, ONE_G], &[("1g.18gb", 0), ("1g.18gb", 4)]);
    let e = plan_vgpu_config(ONE_1G_ONE_4G, "c", &host).unwrap_err();
    assert!(matches!(e, LayoutError::DoesNotFit { .. }), "{e:?}");
    // With the one left at 4 known (a single 1g placed there), the same layout fits.
    let host = h200_host_with_slots(&[ONE_G], &[("1g.18gb", 4)]);
    assert!(plan_vgpu_config(ONE_1G_ONE_4G, "c", &host).is_ok());
}
