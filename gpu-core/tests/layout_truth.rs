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
