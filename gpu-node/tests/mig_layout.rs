#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! `vgpu apply` / `vgpu clear` and MIG through the one writer (`Node::apply_layout` with the
//! node's NVML): on the fake kernel (an H200 in the vendor-specific VFIO framework whose VFs
//! list and take MIG-backed types as the fake NVML's GPU instances allow) and the fake NVML.

use std::sync::Arc;

use gpu_core::PciAddress;
use gpu_core::layout::{LayoutConfig, LayoutFile, Mode};
use gpu_core::mig::MigGeometry;
use gpu_node::mig::MigError;
use gpu_node::{LayoutWrite, Node, NodeError};
use gpu_nvml::fake::{FakeGpu, FakeNvml};
use gpu_nvml::{MigMode, NvmlDevices, Placement};
use gpu_sysfs::discover::DiscoverOptions;
use gpu_sysfs::testing::FakeKernel;
use gpu_sysfs::testing::fixtures::{h200_mig_kernel, h200_names, h200_pf, h200_vf};

const T3G: u32 = 1418;

fn pf() -> PciAddress {
    h200_pf(0).parse().unwrap()
}

fn nvml(mode: MigMode) -> Arc<FakeNvml> {
    let g = MigGeometry::for_device(0x2335).unwrap();
    Arc::new(FakeNvml::new().with_gpu(pf(), FakeGpu::mig(g).with_mig_mode(mode)))
}

/// The H200 of the fixtures with `busy` VFs holding types; its driver's MIG state is the fake
/// NVML's.
fn kernel(busy: &[(u32, u32)], n: &Arc<FakeNvml>) -> FakeKernel {
    h200_mig_kernel(busy, Arc::clone(n)).unwrap()
}

/// Discovery names every H200 type as NVML would (a VF holding a type lists none).
fn options() -> DiscoverOptions {
    let mut o = DiscoverOptions::new("n");
    o.resolver = Some(Arc::new(h200_names()));
    o
}

fn config(yaml: &str) -> LayoutConfig {
    let f = LayoutFile::parse(yaml).unwrap();
    f.select(Some("c")).unwrap().clone()
}

fn vf_type(k: &FakeKernel, n: u32) -> String {
    std::fs::read_to_string(k.root().join(format!(
        "sys/bus/pci/devices/{}/nvidia/current_vgpu_type",
        h200_vf(0, n)
    )))
    .unwrap()
    .trim()
    .to_owned()
}

fn apply(
    node: &Node<'_>,
    c: &LayoutConfig,
    mode: Mode,
) -> Result<gpu_sysfs::apply::ApplyReport, NodeError> {
    let how = LayoutWrite {
        mode,
        ..LayoutWrite::default()
    };
    node.apply_layout(c, &how, &mut |_| {})
}

const TIME_SLICED: &str = "version: v1\nvgpu-configs:\n  c:\n    - devices: all\n      vgpu-devices:\n        \"NVIDIA H200X-71C\": 2\n";
const TWO_3G: &str = "version: v1\nvgpu-configs:\n  c:\n    - devices: all\n      vgpu-devices:\n        \"NVIDIA H200X-3-71C\": 2\n";

/// Two MIG-backed vGPUs in their GPU instances (made by someone else).
fn two_mig_vgpus() -> Arc<FakeNvml> {
    let n = nvml(MigMode::Enabled);
    for start in [0, 4] {
        n.create_gpu_instance(&pf(), 9, Placement { start, size: 4 })
            .unwrap();
    }
    n
}

#[test]
fn without_the_check_a_time_sliced_layout_on_a_mig_gpu_clears_both_vgpus_before_it_fails() {
    // The bug as measured (issue 47): no NVML given, the layout clears and then the driver
    // refuses the time-sliced type on a GPU in MIG mode.
    let n = two_mig_vgpus();
    let k = kernel(&[(0, T3G), (1, T3G)], &n);
    let opts = options();
    let node = Node::new(&k, &opts);
    let e = apply(&node, &config(TIME_SLICED), Mode::Apply).unwrap_err();
    assert!(e.to_string().contains("NVIDIA H200X-71C"), "{e}");
    assert!(
        !k.writes().is_empty(),
        "the clear was written before the failure"
    );
}

#[test]
fn a_time_sliced_layout_on_a_gpu_in_mig_mode_with_vgpus_is_refused_before_anything_is_cleared() {
    let n = two_mig_vgpus();
    let k = kernel(&[(0, T3G), (1, T3G)], &n);
    let opts = options();
    let node = Node::new(&k, &opts).with_nvml(Some(&*n));
    let e = apply(&node, &config(TIME_SLICED), Mode::Apply).unwrap_err();
    let NodeError::Mig(m) = &e else {
        panic!("{e:?}")
    };
    assert!(matches!(**m, MigError::InUse { .. }), "{m:?}");
    let text = e.to_string();
    assert!(
        text.contains(&h200_pf(0)) && text.contains("MIG mode"),
        "{text}"
    );
    assert!(text.contains("NVIDIA H200X-71C"), "{text}");
    assert!(k.writes().is_empty(), "{:?}", k.writes());
    assert!(
        n.writes().len() == 2,
        "only the test's instances: {:?}",
        n.writes()
    );
    assert_eq!(
        (vf_type(&k, 0), vf_type(&k, 1)),
        ("1418".into(), "1418".into())
    );
}

#[test]
fn a_layout_of_mig_backed_types_gets_its_gpu_instances_and_its_clear_takes_them_away() {
    let n = nvml(MigMode::Enabled);
    let k = kernel(&[], &n);
    let opts = options();
    let node = Node::new(&k, &opts).with_nvml(Some(&*n));
    let c = config(TWO_3G);
    let report = apply(&node, &c, Mode::Apply).unwrap();
    let starts: Vec<u32> = n
        .gpu_instances(&pf())
        .unwrap()
        .iter()
        .map(|gi| gi.placement.start)
        .collect();
    assert_eq!(starts, [0, 4], "two 3g instances, at the only two starts");
    assert!(
        report
            .plan
            .warnings
            .iter()
            .any(|w| w.contains("made at start")),
        "{:?}",
        report.plan.warnings
    );
    assert_eq!(
        (vf_type(&k, 0), vf_type(&k, 1)),
        ("1418".into(), "1418".into())
    );
    // Someone else's 1g instance is never touched by the clear.
    let report = apply(&node, &c, Mode::Clear).unwrap();
    assert!(
        n.gpu_instances(&pf()).unwrap().is_empty(),
        "{:?}",
        report.plan.warnings
    );
    assert_eq!(vf_type(&k, 0), "0");
}

#[test]
fn a_mig_backed_layout_on_a_gpu_with_mig_off_and_vgpus_is_refused_before_any_write() {
    let n = nvml(MigMode::Disabled);
    let k = kernel(&[(0, 1427)], &n);
    let opts = options();
    let node = Node::new(&k, &opts).with_nvml(Some(&*n));
    let e = apply(&node, &config(TWO_3G), Mode::Apply).unwrap_err();
    let text = e.to_string();
    assert!(
        text.contains("MIG-backed") && text.contains(&h200_pf(0)),
        "{text}"
    );
    assert!(k.writes().is_empty() && n.writes().is_empty());
}
