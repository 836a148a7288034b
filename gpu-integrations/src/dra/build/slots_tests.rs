//! Mixed-size GPUs published with counters per placement slot, and MIG-backed placements
//! published for GPU instances that do not exist yet.

use std::collections::BTreeMap;

use gpu_core::{
    Gpu, GpuState, Instance, NodeTopology, Parent, ParentId, PciAddress, Pool, Profile,
    VgpuFramework, VgpuTypeId,
};

use super::*;
use crate::dra::rules::check;

const GIB: u64 = 1024;

fn profile(id: u32, gib: u64, mig: Option<u8>) -> Profile {
    Profile {
        id: VgpuTypeId::from_str_unchecked(&id.to_string()),
        name: match mig {
            Some(s) => format!("NVIDIA H100XM-{s}-{gib}C"),
            None => format!("NVIDIA L40S-{gib}Q"),
        },
        framebuffer_mib: Some(gib * GIB),
        max_instances: None,
        available_instances: 1,
        reported_instances: None,
        device_api: "vfio-pci".into(),
        mig_slices: mig,
        mig_memory_gib: None,
        description: None,
    }
}

fn addr(bus: u8, f: u8) -> PciAddress {
    PciAddress::new(0, bus, 0, f).unwrap()
}

/// A 48 GiB GPU with four VFs offering 12Q, 24Q and 48Q; `made`: (VF, type, placement) of
/// vGPUs made outside Kubernetes.
fn mixed_gpu(made: &[(u8, u32, Option<u32>)]) -> NodeTopology {
    let gpu = addr(0x26, 0);
    let mut t = NodeTopology::new("node-a");
    let mut g = Gpu::new("nvidia0", gpu, 0x10de, 0x26b9, 0x030200);
    g.memory_mib = Some(48 * GIB);
    g.vgpu_framework = Some(VgpuFramework::VendorVfio);
    let profiles = vec![
        profile(1153, 12, None),
        profile(1155, 24, None),
        profile(1156, 48, None),
    ];
    let mut used = 0;
    for n in 1..=4u8 {
        let vf = addr(0x26, n);
        let instances: Vec<Instance> = made
            .iter()
            .filter(|(v, _, _)| *v == n)
            .map(|(_, ty, placement)| {
                let gib = match ty {
                    1153 => 12,
                    1155 => 24,
                    _ => 48,
                };
                used += gib * GIB;
                Instance {
                    uuid: None,
                    address: Some(vf),
                    profile: VgpuTypeId::from_str_unchecked(&ty.to_string()),
                    profile_name: None,
                    framebuffer_mib: Some(gib * GIB),
                    in_use: None,
                    placement_id: *placement,
                }
            })
            .collect();
        t.mediated_devices.parents.push(Parent {
            id: ParentId::Pci(vf),
            gpu: Some(gpu),
            framework: VgpuFramework::VendorVfio,
            health: g.health.clone(),
            profiles: profiles.clone(),
            instances,
            warnings: vec![],
        });
    }
    if used > 0 {
        g.state = GpuState::InUse;
    }
    t.mediated_devices.pools.push(Pool {
        gpu: ParentId::Pci(gpu),
        parents: vec![],
        total_mib: 48 * GIB,
        used_mib: used,
        size_locked_mib: None,
        mixed_size: true,
        mig_slices_total: None,
        mig_slices_used: None,
        mig_slots: None,
    });
    t.gpus.push(g);
    t
}

/// The driver's placements on a lattice of 4 slots of 12 GiB: 12Q at 0..3, 24Q at 0 and 2,
/// 48Q at 0.
fn placements() -> BTreeMap<PciAddress, GpuPlacements> {
    let of = |size, ids: &[u32]| TypePlacements {
        placement_size: size,
        placement_ids: ids.to_vec(),
    };
    let gpu = BTreeMap::from([
        ("1153".to_owned(), of(1, &[0, 1, 2, 3])),
        ("1155".to_owned(), of(2, &[0, 2])),
        ("1156".to_owned(), of(4, &[0])),
    ]);
    BTreeMap::from([(addr(0x26, 0), gpu)])
}

const VERSIONS: [K8sVersion; 4] = [
    K8sVersion::V1_34,
    K8sVersion::V1_35,
    K8sVersion::V1_36_2,
    K8sVersion::V1_37,
];

/// The node's slices for `version` with `placements`, checked against the version's rules.
fn export(
    t: &NodeTopology,
    version: K8sVersion,
    placements: BTreeMap<PciAddress, GpuPlacements>,
) -> NodeSlices {
    let opts = DraOptions {
        version,
        mixed_placements: placements,
        ..DraOptions::default()
    };
    let s = node_slices(t, &opts).unwrap();
    assert!(check(&s.slices, version).is_empty(), "{version}");
    s
}

fn devices(s: &NodeSlices) -> Vec<&Device> {
    s.slices.iter().flat_map(|x| &x.spec.devices).collect()
}

/// The slot counters a device consumes.
fn slots_of(d: &Device) -> Vec<String> {
    d.consumes_counters
        .iter()
        .flat_map(|c| c.counters.keys())
        .filter(|k| k.starts_with(SLOT_COUNTER))
        .cloned()
        .collect()
}

#[test]
fn a_mixed_size_gpu_gets_a_counter_per_slot_and_a_device_per_placement_in_every_version() {
    let t = mixed_gpu(&[]);
    for version in VERSIONS {
        let s = export(&t, version, placements());
        let set = s
            .slices
            .iter()
            .flat_map(|x| &x.spec.shared_counters)
            .next()
            .unwrap();
        let slot_counters: Vec<&String> = set
            .counters
            .keys()
            .filter(|k| k.starts_with(SLOT_COUNTER))
            .collect();
        assert_eq!(slot_counters.len(), 4, "{version}: one per slot");
        let names: Vec<&str> = devices(&s).iter().map(|d| d.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "gpu-0000-26-00-0",
                "vgpu-0000-26-00-0-49152mi-0",
                "vgpu-0000-26-00-0-24576mi-0",
                "vgpu-0000-26-00-0-24576mi-2",
                "vgpu-0000-26-00-0-12288mi-0",
                "vgpu-0000-26-00-0-12288mi-1",
                "vgpu-0000-26-00-0-12288mi-2",
                "vgpu-0000-26-00-0-12288mi-3",
            ],
            "{version}"
        );
        let d24 = devices(&s)
            .into_iter()
            .find(|d| d.name.ends_with("24576mi-2"))
            .unwrap();
        assert_eq!(
            slots_of(d24),
            ["placement-slot-2", "placement-slot-3"],
            "{version}"
        );
        assert_eq!(
            d24.attributes.get("placementId"),
            Some(&DeviceAttribute::Int(2))
        );
    }
}

/// The scheduler cannot over-promise: any two devices whose runs overlap share a slot counter,
/// each counter holds one, so they are never allocated together; the framebuffer encodings
/// could (a 24Q at 1..3 beside two 12Q at 0 and 3 fits the framebuffer but not the lattice).
#[test]
fn two_placements_that_overlap_can_never_be_allocated_together() {
    let t = mixed_gpu(&[]);
    let s = export(&t, K8sVersion::V1_36_2, placements());
    let run = |d: &Device| -> Option<(i64, i64)> {
        let id = match d.attributes.get("placementId")? {
            DeviceAttribute::Int(i) => *i,
            _ => return None,
        };
        let size = match d.attributes.get("placementSize")? {
            DeviceAttribute::Int(i) => *i,
            _ => return None,
        };
        Some((id, id + size))
    };
    let placed: Vec<(&Device, (i64, i64))> = devices(&s)
        .into_iter()
        .filter_map(|d| Some((d, run(d)?)))
        .collect();
    assert_eq!(placed.len(), 7);
    for (a, ra) in &placed {
        for (b, rb) in &placed {
            if a.name == b.name {
                continue;
            }
            let overlap = ra.0 < rb.1 && rb.0 < ra.1;
            let shared = slots_of(a).iter().any(|c| slots_of(b).contains(c));
            assert_eq!(overlap, shared, "{} and {}", a.name, b.name);
        }
    }
}

#[test]
fn a_vgpu_made_outside_kubernetes_holds_the_slots_of_its_placement() {
    // A 12Q at placement 1: 12Q at 0, 2, 3 and a 24Q at 2 are left; no 48Q, no 24Q at 0.
    let t = mixed_gpu(&[(1, 1153, Some(1))]);
    for version in VERSIONS {
        let s = export(&t, version, placements());
        let names: Vec<&str> = devices(&s).iter().map(|d| d.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "vgpu-0000-26-00-0-24576mi-2",
                "vgpu-0000-26-00-0-12288mi-0",
                "vgpu-0000-26-00-0-12288mi-2",
                "vgpu-0000-26-00-0-12288mi-3",
            ],
            "{version}"
        );
    }
}

#[test]
fn a_vgpu_at_an_unknown_placement_leaves_the_gpu_unpromised() {
    let t = mixed_gpu(&[(1, 1153, None)]);
    let s = export(&t, K8sVersion::V1_36_2, placements());
    assert!(devices(&s).is_empty(), "{:?}", devices(&s));
    assert!(
        s.warnings.iter().any(|w| w.contains("placement of vGPU")),
        "{:?}",
        s.warnings
    );
}

#[test]
fn without_the_drivers_placements_a_mixed_gpu_keeps_the_framebuffer_encoding() {
    let t = mixed_gpu(&[]);
    let opts = DraOptions {
        version: K8sVersion::V1_36_2,
        ..DraOptions::default()
    };
    let s = node_slices(&t, &opts).unwrap();
    let names: Vec<&str> = devices(&s).iter().map(|d| d.name.as_str()).collect();
    assert_eq!(names, ["gpu-0000-26-00-0", "vgpu-0000-26-00-0-mixed"]);
}

#[test]
fn a_lattice_wider_than_the_counters_allowed_leaves_the_smallest_sizes_out_named() {
    // 60 slots of 1 GiB: 1Q at every slot does not fit 32 counters; 2Q and 30Q, grouped by two
    // slots per counter (30 and the framebuffer), do.
    let mut t = mixed_gpu(&[]);
    t.gpus[0].memory_mib = Some(60 * GIB);
    t.mediated_devices.pools[0].total_mib = 60 * GIB;
    for p in &mut t.mediated_devices.parents {
        p.profiles = vec![
            profile(1, 1, None),
            profile(2, 2, None),
            profile(3, 30, None),
        ];
    }
    let of = |size: u32, step: u32| TypePlacements {
        placement_size: size,
        placement_ids: (0..60 / step).map(|i| i * step).collect(),
    };
    let placements = BTreeMap::from([(
        addr(0x26, 0),
        BTreeMap::from([
            ("1".to_owned(), of(1, 1)),
            ("2".to_owned(), of(2, 2)),
            ("3".to_owned(), of(30, 30)),
        ]),
    )]);
    for version in [K8sVersion::V1_35, K8sVersion::V1_36_2] {
        let s = export(&t, version, placements.clone());
        assert!(
            s.warnings
                .iter()
                .any(|w| w.contains("NVIDIA L40S-1Q not published")),
            "{:?}",
            s.warnings
        );
        let set = &s.slices[0].spec.shared_counters[0];
        assert_eq!(
            set.counters.len(),
            31,
            "framebuffer and 30 counters of 2 slots"
        );
        assert_eq!(
            devices(&s).len(),
            1 + 30 + 2,
            "the GPU, 2Q at 30 places, 30Q at 2"
        );
    }
}

/// A MIG-capable GPU whose VFs list MIG-backed types while no GPU instance exists yet: every
/// placement of each profile is published with its memory-slice counters, so a claim can
/// get one that `dra prepare` makes the instance for.
#[test]
fn mig_backed_placements_are_published_for_instances_that_do_not_exist_yet() {
    let gpu = addr(0x18, 0);
    let mut t = NodeTopology::new("node-a");
    let mut g = Gpu::new("nvidia0", gpu, 0x10de, 0x2330, 0x030200);
    g.memory_mib = Some(80 * GIB);
    g.vgpu_framework = Some(VgpuFramework::VendorVfio);
    let profiles = vec![
        profile(1001, 10, Some(1)),
        profile(1003, 40, Some(3)),
        profile(1007, 80, Some(7)),
    ];
    for n in 1..=2u8 {
        t.mediated_devices.parents.push(Parent {
            id: ParentId::Pci(addr(0x18, n)),
            gpu: Some(gpu),
            framework: VgpuFramework::VendorVfio,
            health: g.health.clone(),
            profiles: profiles.clone(),
            instances: vec![],
            warnings: vec![],
        });
    }
    t.mediated_devices.pools.push(Pool {
        gpu: ParentId::Pci(gpu),
        parents: vec![],
        total_mib: 80 * GIB,
        used_mib: 0,
        size_locked_mib: None,
        mixed_size: false,
        mig_slices_total: Some(7),
        mig_slices_used: Some(0),
        mig_slots: None,
    });
    t.gpus.push(g);
    for version in VERSIONS {
        let opts = DraOptions {
            version,
            ..DraOptions::default()
        };
        let s = node_slices(&t, &opts).unwrap();
        assert!(check(&s.slices, version).is_empty(), "{version}");
        let set = &s
            .slices
            .iter()
            .flat_map(|x| &x.spec.shared_counters)
            .next()
            .unwrap();
        let memory: Vec<&String> = set
            .counters
            .keys()
            .filter(|k| k.starts_with("memory-slice-"))
            .collect();
        assert_eq!(memory.len(), 8, "{version}: H100's 8 memory slices");
        let mig: Vec<&str> = devices(&s)
            .iter()
            .map(|d| d.name.as_str())
            .filter(|n| n.starts_with("mig-"))
            .collect();
        // H100 (MIG user guide): 1g at 0..6, 3g at 0 and 4, 7g at 0.
        assert_eq!(mig.len(), 7 + 2 + 1, "{version}: {mig:?}");
        let three_at_4 = devices(&s)
            .into_iter()
            .find(|d| d.name == "mig-0000-18-00-0-3g-40960mi-s4")
            .unwrap();
        let used: Vec<&String> = three_at_4.consumes_counters[0]
            .counters
            .keys()
            .filter(|k| k.starts_with("memory-slice-"))
            .collect();
        assert_eq!(
            used,
            [
                "memory-slice-4",
                "memory-slice-5",
                "memory-slice-6",
                "memory-slice-7"
            ],
            "{version}"
        );
    }
}
