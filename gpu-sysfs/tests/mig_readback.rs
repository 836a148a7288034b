#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! After each MIG-backed vGPU it writes, `vgpu apply` reads back (NVML, here its fake) where the
//! driver put the GPU instance and re-checks the rest of the GPU's creations: a driver that
//! places as documented gets the whole layout; one that places elsewhere is met by another
//! order where one lands, and otherwise the apply stops before a write that could not fit.

use std::sync::Arc;

use gpu_core::layout::LayoutFile;
use gpu_core::mig::MigGeometry;
use gpu_sysfs::apply::{ApplyError, ApplyOptions, ApplyStatus, apply_layout};
use gpu_sysfs::testing::FakeKernel;
use gpu_sysfs::testing::mig_nvml::{FakeMigNvml, MigPlacing};

const H200_TYPES: &[(u32, &str)] = &[
    (1414, "NVIDIA H200X-1-18C"),
    (1417, "NVIDIA H200X-2-35C"),
    (1420, "NVIDIA H200X-3-71C"),
    (1428, "NVIDIA H200X-141C"),
];

/// Applies `types` (a `vgpu-devices` mapping) on an empty four-VF H200 whose NVML places new
/// GPU instances by `placing`; returns the outcome and the type writes made.
fn apply_with(placing: MigPlacing, types: &str) -> (Result<ApplyStatus, ApplyError>, Vec<String>) {
    let k = Arc::new(FakeKernel::vendor_vfio_host(0x2335, 141 * 1024, H200_TYPES, 4).unwrap());
    let nvml = FakeMigNvml::new(
        k.clone(),
        "0000:26:00.0".parse().unwrap(),
        MigGeometry::for_device(0x2335).unwrap(),
        H200_TYPES,
        placing,
    );
    let text = format!(
        "version: v1\nvgpu-configs:\n  c:\n    - devices: all\n      vgpu-devices: {types}\n"
    );
    let file = LayoutFile::parse(&text).unwrap();
    let mut opts = ApplyOptions::new("h200");
    opts.discover.resolver = Some(Arc::new(nvml));
    let r =
        apply_layout(&*k, file.select(Some("c")).unwrap(), &opts, &mut |_| {}).map(|r| r.status);
    let sets = k
        .writes()
        .iter()
        .filter(|w| w.path.ends_with("current_vgpu_type") && w.errno.is_none())
        .map(|w| format!("{} {}", w.path, w.data.trim()))
        .collect();
    (r, sets)
}

#[test]
fn with_the_documented_placement_the_whole_mig_layout_is_created() {
    let (r, sets) = apply_with(
        MigPlacing::Lowest,
        "{H200X-3-71C: 1, H200X-2-35C: 1, H200X-1-18C: 2}",
    );
    assert_eq!(r.unwrap(), ApplyStatus::Applied);
    assert_eq!(sets.len(), 4, "{sets:?}");
}

#[test]
fn a_placement_the_plan_did_not_assume_stops_the_apply_before_a_write_that_cannot_fit() {
    let (r, sets) = apply_with(
        MigPlacing::Highest,
        "{H200X-3-71C: 1, H200X-2-35C: 1, H200X-1-18C: 2}",
    );
    let e = r.unwrap_err();
    let ApplyError::Failed { report } = &e else {
        panic!("expected a stop after a write, got {e}");
    };
    assert_eq!(report.status, ApplyStatus::RolledBack, "{e}");
    let msg = e.to_string();
    assert!(msg.contains("read back through NVML"), "{msg}");
    let made = sets.iter().filter(|s| !s.ends_with(" 0")).count();
    assert!(
        made < 4,
        "stopped before the write that could not fit: {sets:?}"
    );
}
