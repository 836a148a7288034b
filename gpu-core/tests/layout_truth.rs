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
