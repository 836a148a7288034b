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
