#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! NVIDIA's own configs planned against the real A2 capture (harvester/pcidevices recording, see
//! `tests/data/README.md`), discovered through the real discovery code.

use gpu_core::layout::{LayoutFile, Step, plan_vgpu_config};
use gpu_core::{MdevUuid, PciAddress};
use gpu_sysfs::RealHost;
use gpu_sysfs::apply::{assert_config, observe};
use gpu_sysfs::discover::DiscoverOptions;

const EXAMPLE: &str = include_str!("../../gpu-core/tests/data/nvidia-configs/config-example.yaml");

/// The A2 capture with its VF type directories, written out as a tree.
fn a2_capture() -> tempfile::TempDir {
    gpu_sysfs::testing::fixtures::a2_tree().unwrap()
}

#[test]
fn a2_4q_on_the_real_a2_capture_keeps_its_4q_and_replaces_the_4c_and_4a() {
    let dir = a2_capture();
    let host = RealHost::new(dir.path()).unwrap();
    let topo = observe(&host, &DiscoverOptions::new("a2host")).unwrap();
    let plan = plan_vgpu_config(EXAMPLE, "A2-4Q", &topo).unwrap();
    let pf: PciAddress = "0000:08:00.0".parse().unwrap();
    let slot = |i| MdevUuid::for_layout_slot("a2host", &pf, i).to_string();
    let steps: Vec<String> = plan
        .steps
        .iter()
        .map(|s| match s {
            Step::Remove { instance, .. } => format!(
                "- {} {}",
                instance.type_id.as_ref().unwrap(),
                instance.uuid.unwrap()
            ),
            Step::Create { instance, .. } => format!(
                "+ {} {} on {}",
                instance.type_id.as_ref().unwrap(),
                instance.uuid.unwrap(),
                instance.parent
            ),
            Step::EnableSriov { gpu } => format!("* {gpu}"),
        })
        .collect();
    assert_eq!(
        steps,
        [
            "- nvidia-754 f715f63c-0d00-4007-9c5a-b07b0c6c05de".to_owned(),
            "- nvidia-751 3deab9a4-200a-4c54-99b1-5eb0722d1d81".to_owned(),
            format!("+ nvidia-746 {} on 0000:08:00.4", slot(0)),
            format!("+ nvidia-746 {} on 0000:08:00.5", slot(1)),
            format!("+ nvidia-746 {} on 0000:08:00.6", slot(2)),
        ]
    );
    let kept: Vec<String> = plan.gpus[0]
        .keep
        .iter()
        .map(|k| k.uuid.unwrap().to_string())
        .collect();
    assert_eq!(kept, ["c728e022-f16f-434b-ad2c-9665ee634d3d"]);
}

#[test]
fn asserting_on_the_real_a2_capture_reports_the_diff() {
    let dir = a2_capture();
    let host = RealHost::new(dir.path()).unwrap();
    let file = LayoutFile::parse(EXAMPLE).unwrap();
    let a = assert_config(
        &host,
        file.select(Some("A2-4Q")).unwrap(),
        &DiscoverOptions::new("a2host"),
    )
    .unwrap();
    assert!(!a.applied);
    assert_eq!(
        a.diff,
        [
            "nvidia0 (0000:08:00.0): A2-4Q: have 1, want 4",
            "nvidia0 (0000:08:00.0): A2-4A: have 1, want 0",
            "nvidia0 (0000:08:00.0): A2-4C: have 1, want 0",
        ]
    );
    // NVIDIA's "default" config picks the A2 entry of the two that share 0x25B6 (A16 and A2).
    let topo = observe(&host, &DiscoverOptions::new("a2host")).unwrap();
    let plan = plan_vgpu_config(EXAMPLE, "default", &topo).unwrap();
    assert_eq!(plan.gpus[0].types[0].name, "A2-8Q");
    assert_eq!(plan.steps.len(), 3 + 2);
}
