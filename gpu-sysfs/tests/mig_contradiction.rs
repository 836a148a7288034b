#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! When sysfs contradicts itself (a VF holds a 1g MIG-backed vGPU while the free VFs still list
//! a 7g, which no placement beside it leaves room for), discovery says so on the GPU, naming the
//! VFs and both readings, and keeps what exists; a layout is planned on what is held.

use gpu_core::layout::{LayoutFile, PlanOptions, plan_layout};
use gpu_sysfs::RealHost;
use gpu_sysfs::discover::{DiscoverOptions, discover};
use gpu_sysfs::testing::fixtures::{H200_TYPES, h200_mig_host, h200_vf};

#[test]
fn a_list_that_contradicts_the_held_type_is_named_and_what_exists_is_kept() {
    let every: Vec<u32> = H200_TYPES.iter().map(|(id, _)| *id).collect();
    let tree = h200_mig_host(&[(0, 1414)], &every).unwrap();
    let host = RealHost::new(tree.root()).unwrap();
    let t = discover(&host, &DiscoverOptions::new("h200")).unwrap();
    let warnings = t.gpus[0].warnings.join("\n");
    assert!(
        warnings.contains("sysfs contradicts itself")
            && warnings.contains(&format!(
                "VF {} holds NVIDIA H200X-1-18C (1414)",
                h200_vf(0, 0)
            ))
            && warnings.contains(&h200_vf(0, 1))
            && warnings.contains("7g.141gb"),
        "{warnings}"
    );

    // The held 1g is kept and one more planned, not refused with "0 of 8 memory slices held".
    let text = "version: v1\nvgpu-configs:\n  c:\n    - devices: all\n      vgpu-devices: {H200X-1-18C: 2}\n";
    let file = LayoutFile::parse(text).unwrap();
    let plan = plan_layout(file.select(Some("c")).unwrap(), &t, &PlanOptions::default()).unwrap();
    assert_eq!(plan.gpus[0].keep.len(), 1, "{:?}", plan.gpus[0]);
    assert_eq!(plan.gpus[0].create.len(), 1, "{:?}", plan.gpus[0]);
}
