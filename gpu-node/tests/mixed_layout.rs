#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! Mixed sizes from a layout through the one writer (`Node::apply_layout` with the node's
//! NVML), on the fake kernel's L40S and the fake NVML: an entry's `mixed-sizes: true` turns the
//! idle GPU's mode on only once the whole mix is placed on the driver's lattice; a mix that
//! does not fit it is refused naming the type and the placements left, before any write.

use gpu_core::PciAddress;
use gpu_core::layout::{LayoutConfig, LayoutFile, Mode};
use gpu_node::{LayoutWrite, Node};
use gpu_nvml::fake::{FakeGpu, FakeNvml, FakeVgpuType};
use gpu_nvml::{NvmlDevices, VgpuMode, VgpuScheduler};
use gpu_sysfs::discover::DiscoverOptions;
use gpu_sysfs::testing::FakeKernel;

fn pf() -> PciAddress {
    "0000:26:00.0".parse().unwrap()
}

/// The L40S's 24Q at 0/24 and a 12Q the driver places only at 12 and 24 (48 slots): one 24Q
/// and two 12Q fit the framebuffer, not the lattice.
fn nvml(scheduler: VgpuScheduler) -> FakeNvml {
    let types = vec![
        FakeVgpuType::new(1155, "NVIDIA L40S-24Q", 24576, 24, &[0, 24]),
        FakeVgpuType::new(1153, "NVIDIA L40S-12Q", 12288, 12, &[12, 24]),
    ];
    FakeNvml::new().with_gpu(
        pf(),
        FakeGpu::new(46068)
            .with_vgpu_types(types)
            .with_scheduler(scheduler)
            .mixed_size(VgpuMode::Homogeneous),
    )
}

fn config(counts: &str) -> LayoutConfig {
    let yaml = format!(
        "version: v1\nvgpu-configs:\n  c:\n    - devices: all\n      mixed-sizes: true\n      vgpu-devices:\n{counts}"
    );
    LayoutFile::parse(&yaml)
        .unwrap()
        .select(Some("c"))
        .unwrap()
        .clone()
}

/// Applies a `mixed-sizes: true` layout of `counts` through a node given the fake NVML.
fn apply(
    k: &FakeKernel,
    n: &FakeNvml,
    counts: &str,
) -> Result<gpu_sysfs::apply::ApplyReport, gpu_node::NodeError> {
    let opts = DiscoverOptions::new("node-a");
    let node = Node::new(k, &opts).with_nvml(Some(n));
    let how = LayoutWrite {
        mode: Mode::Apply,
        ..LayoutWrite::default()
    };
    node.apply_layout(&config(counts), &how, &mut |_| {})
}

#[test]
fn a_mix_that_does_not_fit_the_lattice_is_refused_naming_the_type_and_what_is_left() {
    let k = FakeKernel::l40s_vendor_vfio_host(4).unwrap();
    let n = nvml(VgpuScheduler::BestEffort);
    let e = apply(&k, &n, "        L40S-24Q: 1\n        L40S-12Q: 2\n").unwrap_err();
    let text = e.to_string();
    assert!(
        text.contains("vGPU type 1153 does not fit GPU 0000:26:00.0")
            && text.contains("placements [12, 24]")
            && text.contains("placements left: none"),
        "{text}"
    );
    assert!(n.writes().is_empty(), "the mode is not touched");
    assert!(k.writes().is_empty(), "nothing written");
    assert_eq!(
        n.vgpu_heterogeneous_mode(&pf()).unwrap(),
        VgpuMode::Homogeneous
    );
}

#[test]
fn a_mix_that_fits_turns_the_mode_on_before_the_first_type() {
    let k = FakeKernel::l40s_vendor_vfio_host(4).unwrap();
    let n = nvml(VgpuScheduler::BestEffort);
    // The kernel's side of the mode (the two fakes do not talk).
    k.set_mixed_size(pf()).unwrap();
    apply(&k, &n, "        L40S-24Q: 1\n        L40S-12Q: 1\n").unwrap();
    assert_eq!(
        n.writes(),
        vec!["nvmlDeviceSetVgpuHeterogeneousMode 0000:26:00.0 Heterogeneous".to_owned()]
    );
}

#[test]
fn a_scheduler_nvidia_does_not_allow_refuses_the_layout_before_any_write() {
    let k = FakeKernel::l40s_vendor_vfio_host(4).unwrap();
    let n = nvml(VgpuScheduler::FixedShare);
    let e = apply(&k, &n, "        L40S-24Q: 1\n        L40S-12Q: 1\n").unwrap_err();
    assert!(e.to_string().contains("fixed share"), "{e}");
    assert!(n.writes().is_empty() && k.writes().is_empty());
}
