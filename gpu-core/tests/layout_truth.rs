#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! Layout input that says one thing and could be read as another is refused before anything is
//! planned: padded type names.

use gpu_core::NodeTopology;
use gpu_core::layout::plan_vgpu_config;

#[test]
fn a_padded_nvidia_type_name_is_refused_naming_it() {
    let text = "version: v1\nvgpu-configs:\n  c:\n    - devices: all\n      vgpu-devices:\n        \" A100-5C\": 1\n";
    let e = plan_vgpu_config(text, "c", &NodeTopology::new("n")).unwrap_err();
    let msg = e.to_string();
    assert!(
        msg.contains("\" A100-5C\"") && msg.contains("whitespace"),
        "{msg}"
    );
}

#[test]
fn a_padded_pin_and_a_padded_driver_type_are_refused_naming_them() {
    let pin = "version: v1\nvgpu-configs:\n  c:\n    \"0000:26:00.4\": \"L40S-24Q \"\n";
    let e = plan_vgpu_config(pin, "c", &NodeTopology::new("n")).unwrap_err();
    assert!(
        e.to_string()
            .contains("\"L40S-24Q \" has leading or trailing whitespace"),
        "{e}"
    );
    let driver = "version: v1\nvgpu-configs:\n  c:\n    mbochs: {\" mbochs-small\": 1}\n";
    let e = plan_vgpu_config(driver, "c", &NodeTopology::new("n")).unwrap_err();
    assert!(
        e.to_string().contains("\" mbochs-small\" has leading"),
        "{e}"
    );
}

/// A node whose one NVIDIA GPU has no vGPU interface: no parents, no SR-IOV.
fn gpu_without_vgpus() -> NodeTopology {
    let mut t = NodeTopology::new("n");
    let mut g = gpu_core::Gpu::new(
        "nvidia0",
        "0000:1a:00.0".parse().unwrap(),
        0x10de,
        0x2335,
        0x030200,
    );
    g.driver = Some("nvidia".into());
    t.gpus.push(g);
    t
}

#[test]
fn no_vgpus_cannot_be_asserted_of_a_gpu_without_a_vgpu_interface() {
    for text in [
        "version: v1\nvgpu-configs:\n  c:\n    - devices: all\n      vgpu-devices: {}\n",
        "version: v1\nvgpu-configs:\n  c:\n    \"0000:1a:00.0\": {}\n",
    ] {
        let e = plan_vgpu_config(text, "c", &gpu_without_vgpus()).unwrap_err();
        assert!(
            matches!(e, gpu_core::layout::LayoutError::NotVgpuCapable { .. }),
            "{text}: {e:?}"
        );
        assert!(e.to_string().contains("has no vGPU parents"), "{e}");
    }
}

#[test]
fn clearing_a_gpu_without_a_vgpu_interface_plans_nothing() {
    let text =
        "version: v1\nvgpu-configs:\n  c:\n    - devices: all\n      vgpu-devices: {A2-4Q: 1}\n";
    let opts = gpu_core::layout::PlanOptions {
        mode: gpu_core::layout::Mode::Clear,
        force: false,
    };
    let file = gpu_core::layout::LayoutFile::parse(text).unwrap();
    let config = file.select(Some("c")).unwrap();
    let plan = gpu_core::layout::plan_layout(config, &gpu_without_vgpus(), &opts).unwrap();
    assert!(plan.steps.is_empty());
}

/// A full H200 (PF 0000:19:00.0): VF 0000:19:00.4 holds the whole card as H200X-141C (1428),
/// VF 0000:19:00.5 is free, and neither lists a type (the card is full).
fn full_h200() -> NodeTopology {
    use gpu_core::{Instance, Parent, ParentId, Pool, VgpuFramework, VgpuTypeId};
    let pf: gpu_core::PciAddress = "0000:19:00.0".parse().unwrap();
    let mut t = NodeTopology::new("h200");
    let mut g = gpu_core::Gpu::new("nvidia0", pf, 0x10de, 0x2335, 0x030200);
    g.driver = Some("nvidia".into());
    g.vgpu_framework = Some(VgpuFramework::VendorVfio);
    t.gpus.push(g);
    for (vf, held) in [("0000:19:00.4", true), ("0000:19:00.5", false)] {
        let vf: gpu_core::PciAddress = vf.parse().unwrap();
        t.mediated_devices.parents.push(Parent {
            id: ParentId::Pci(vf),
            gpu: Some(pf),
            framework: VgpuFramework::VendorVfio,
            health: Default::default(),
            profiles: vec![],
            instances: if held {
                vec![Instance {
                    uuid: None,
                    address: Some(vf),
                    profile: VgpuTypeId::from_str_unchecked("1428"),
                    profile_name: Some("NVIDIA H200X-141C".into()),
                    framebuffer_mib: Some(141 * 1024),
                    in_use: Some(false),
                    placement_id: None,
                }]
            } else {
                vec![]
            },
            warnings: vec![],
        });
    }
    t.mediated_devices.pools.push(Pool {
        gpu: ParentId::Pci(pf),
        parents: vec![],
        total_mib: 141 * 1024,
        used_mib: 141 * 1024,
        size_locked_mib: Some(141 * 1024),
        mixed_size: false,
        mig_slices_total: None,
        mig_slices_used: None,
        mig_slots: None,
    });
    t
}

fn pin(ty: &str) -> String {
    format!("version: v1\nvgpu-configs:\n  c:\n    \"0000:19:00.4\": {ty}\n")
}

#[test]
fn a_pin_by_type_id_gets_the_same_plan_as_the_pin_by_its_name() {
    let names: gpu_core::layout::TypeNames = [(1418u32, "NVIDIA H200X-2-35C".to_owned())]
        .into_iter()
        .collect();
    let plan = |text: &str| {
        let file = gpu_core::layout::LayoutFile::parse(text).unwrap();
        let config = file.select(Some("c")).unwrap();
        gpu_core::layout::plan_layout_named(config, &full_h200(), &Default::default(), &names)
    };
    let by_name = plan(&pin("H200X-2-35C")).unwrap();
    let by_id = plan(&pin("1418")).unwrap();
    assert_eq!(by_id.steps, by_name.steps);
    assert!(!by_id.steps.is_empty());
}

#[test]
fn a_pin_by_an_id_nothing_names_is_refused_saying_to_pin_it_by_name() {
    let e = plan_vgpu_config(&pin("1418"), "c", &full_h200()).unwrap_err();
    assert!(e.to_string().contains("pin it by name"), "{e}");
}

/// H200 MIG-backed types as the driver lists them: (ID, name, MiB, compute slices).
const H200_MIG: [(u32, &str, u64, u8); 4] = [
    (1414, "NVIDIA H200X-1-18C", 18 * 1024, 1),
    (1418, "NVIDIA H200X-2-35C", 35 * 1024, 2),
    (1421, "NVIDIA H200X-3-71C", 71 * 1024, 3),
    (1424, "NVIDIA H200X-4-71C", 71 * 1024, 4),
];

/// An H200 (PF 0000:1a:00.0) with 8 VFs: the first `held.len()` hold those types (IDs of
/// [`H200_MIG`]); the free VFs list every MIG type when `lists`, nothing otherwise. With
/// `pool`, a pool with the card's slice count and no slot record.
fn h200_mig(held: &[u32], lists: bool, pool: bool) -> NodeTopology {
    use gpu_core::{Instance, Parent, ParentId, Pool, Profile, VgpuFramework, VgpuTypeId};
    let pf: gpu_core::PciAddress = "0000:1a:00.0".parse().unwrap();
    let mut t = NodeTopology::new("h200");
    let mut g = gpu_core::Gpu::new("nvidia0", pf, 0x10de, 0x2335, 0x030200);
    g.driver = Some("nvidia".into());
    g.vgpu_framework = Some(VgpuFramework::VendorVfio);
    t.gpus.push(g);
    let ty = |id: u32| *H200_MIG.iter().find(|x| x.0 == id).unwrap();
    for n in 0..8u8 {
        let vf =
            gpu_core::PciAddress::new(0, 0x1a, if n < 4 { 0 } else { 1 }, (n + 4) % 8).unwrap();
        let current = held.get(usize::from(n)).copied();
        let profiles = match (current, lists) {
            (None, true) => H200_MIG
                .iter()
                .map(|(id, name, fb, s)| Profile {
                    id: VgpuTypeId::from_str_unchecked(&id.to_string()),
                    name: (*name).to_owned(),
                    framebuffer_mib: Some(*fb),
                    max_instances: Some(1),
                    available_instances: 1,
                    reported_instances: Some(1),
                    device_api: "vfio-pci".into(),
                    mig_slices: Some(*s),
                    mig_memory_gib: None,
                    description: None,
                })
                .collect(),
            _ => vec![],
        };
        let instances = current
            .map(|id| {
                let (id, name, fb, _) = ty(id);
                vec![Instance {
                    uuid: None,
                    address: Some(vf),
                    profile: VgpuTypeId::from_str_unchecked(&id.to_string()),
                    profile_name: Some(name.to_owned()),
                    framebuffer_mib: Some(fb),
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
    if pool {
        t.mediated_devices.pools.push(Pool {
            gpu: ParentId::Pci(pf),
            parents: vec![],
            total_mib: 141 * 1024,
            used_mib: 0,
            size_locked_mib: None,
            mixed_size: false,
            mig_slices_total: Some(7),
            mig_slices_used: Some(held.iter().map(|id| u32::from(ty(*id).3) as u8).sum()),
            mig_slots: None,
        });
    }
    t
}

fn layout(types: &str) -> String {
    format!(
        "version: v1\nvgpu-configs:\n  c:\n    - devices: all\n      vgpu-devices: {{{types}}}\n"
    )
}

/// Where the driver puts each created GPU instance (lowest free allowed start, the planner's
/// documented assumption), in the plan's order; false when one finds no start.
fn driver_places_all(plan: &gpu_core::layout::Plan) -> bool {
    let g = gpu_core::MigGeometry::for_device(0x2335).unwrap();
    let mut occ = gpu_core::MigOccupancy::empty();
    for s in &plan.steps {
        let gpu_core::layout::Step::Create { instance, .. } = s else {
            continue;
        };
        let name = instance.type_name.clone().unwrap_or_default();
        let parsed = gpu_core::nvidia::VgpuTypeName::parse(&name).unwrap();
        let m = g
            .profile_for(parsed.mig_slices.unwrap(), parsed.framebuffer_mib())
            .unwrap();
        match g.fits(occ, m) {
            Some(start) => occ.hold(start, m),
            None => return false,
        }
    }
    true
}

#[test]
fn a_mig_layout_that_some_placement_holds_is_planned_in_an_order_the_driver_places_validly() {
    // 3g at 4, 2g at 0, 1g at 2 and 3 is valid; largest first at the lowest start is not.
    let text = layout("H200X-3-71C: 1, H200X-2-35C: 1, H200X-1-18C: 2");
    let with_slots = {
        let mut t = h200_mig(&[], true, true);
        let g = gpu_core::MigGeometry::for_device(0x2335).unwrap();
        t.mediated_devices.pools[0].mig_slots =
            Some(std::sync::Arc::new(gpu_core::MigSlots::new(g)));
        t
    };
    let hosts = [
        ("no pool", h200_mig(&[], true, false)),
        ("a pool", h200_mig(&[], true, true)),
        ("a pool with slots", with_slots),
    ];
    for (pool, host) in hosts {
        let plan = plan_vgpu_config(&text, "c", &host).unwrap();
        let creates = plan
            .steps
            .iter()
            .filter(|s| matches!(s, gpu_core::layout::Step::Create { .. }))
            .count();
        assert_eq!(creates, 4);
        assert!(driver_places_all(&plan), "pool {pool}: {:?}", plan.steps);
    }
}

#[test]
fn a_mig_layout_no_placement_holds_is_still_refused() {
    let text = layout("H200X-3-71C: 2, H200X-1-18C: 1");
    let e = plan_vgpu_config(&text, "c", &h200_mig(&[], true, false)).unwrap_err();
    assert!(
        matches!(e, gpu_core::layout::LayoutError::DoesNotFit { .. }),
        "{e:?}"
    );
}

#[test]
fn existing_mig_instances_of_unknown_slot_are_planned_where_they_block_the_most() {
    // Three kept 1g whose slots nothing says (no pool, no NVML, empty lists) may sit at 0, 2
    // and 4, which leaves a 2g no start: the 2g is refused, saying why.
    let text = layout("H200X-1-18C: 3, H200X-2-35C: 1");
    let e = plan_vgpu_config(&text, "c", &h200_mig(&[1414, 1414, 1414], false, false)).unwrap_err();
    let msg = e.to_string();
    assert!(
        matches!(e, gpu_core::layout::LayoutError::DoesNotFit { .. }),
        "{e:?}"
    );
    assert!(msg.contains("block the most"), "{msg}");
}

#[test]
fn a_mig_name_that_is_no_type_of_the_board_is_refused_before_anything_is_cleared() {
    // A partly used H200 (a 1g held, the lists offering what still fits): H200X-3-40C names a
    // 3-slice instance of 40 GB, which the H200 does not have (its 3g holds 71 GB).
    let e = plan_vgpu_config(
        &layout("H200X-3-40C: 1"),
        "c",
        &h200_mig(&[1414], true, true),
    )
    .unwrap_err();
    let msg = e.to_string();
    assert!(
        msg.contains("\"H200X-3-40C\" is not a type of the H200") && msg.contains("3g.71gb"),
        "{msg}"
    );
}
