//! `node_topology`: discovery plus health, with every vGPU parent carrying its GPU's verdict.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;

use gpu_core::{HealthState, ParentId, VgpuFramework};
use gpu_health::{
    BaselineSource, FakeTelemetry, HealthOptions, NvmlTelemetry, Policy, Reading, node_topology,
};
use gpu_sysfs::RealHost;
use gpu_sysfs::discover::DiscoverOptions;
use gpu_sysfs::testing::{MdevTypeSpec, PciSpec, TreeBuilder};

#[test]
fn mdev_and_vendor_vfio_parents_carry_the_health_of_their_physical_gpu() {
    let mut b = TreeBuilder::new();
    // An A2 in the mdev framework whose link is fine but which logged a fatal AER error.
    let a2 = PciSpec::new(0x10de, 0x25b6, 0x030200)
        .subsystem(0x10de, 0x157e)
        .driver("nvidia")
        .group(20)
        .link(8, 16, "2.5 GT/s PCIe", "16.0 GT/s PCIe");
    b.pci("0000:08:00.0", a2)
        .sriov(
            "0000:08:00.0",
            2,
            16,
            4,
            1,
            PciSpec::new(0x10de, 0x25b6, 0x030200).driver("nvidia"),
            Some(21),
        )
        .mdev_parent(
            "0000:08:00.4",
            &[MdevTypeSpec::new(
                "nvidia-746",
                "NVIDIA A2-4Q",
                1,
                Some("num_heads=4, frl_config=60, framebuffer=4096M, max_resolution=7680x4320, max_instance=4"),
            )],
        )
        .attr("0000:08:00.0", "aer_dev_fatal", "DLP 1\nTOTAL_ERR_FATAL 1\n");
    // An L40S in the vendor-specific VFIO framework, healthy.
    b.pci(
        "0000:26:00.0",
        PciSpec::new(0x10de, 0x26b9, 0x030200)
            .driver("nvidia")
            .group(40)
            .link(16, 16, "2.5 GT/s PCIe", "16.0 GT/s PCIe"),
    )
    .sriov(
        "0000:26:00.0",
        1,
        32,
        4,
        1,
        PciSpec::new(0x10de, 0x26b9, 0x030200).driver("nvidia"),
        Some(41),
    )
    .vendor_vfio_vf("0000:26:00.4", &[(1155, "NVIDIA L40S-24Q")], 0);
    let t = b.finish().unwrap();
    let host = RealHost::new(t.root()).unwrap();
    let fake = FakeTelemetry::new()
        .with_nominal("0000:08:00.0".parse().unwrap(), 15356, |_| {})
        .with_nominal("0000:26:00.0".parse().unwrap(), 46068, |_| {});
    let opts = HealthOptions::with_telemetry(Policy::default(), Arc::new(fake))
        .baseline(BaselineSource::None);
    let topo = node_topology(&host, &DiscoverOptions::new("n1"), &opts).unwrap();

    let a2 = topo
        .gpu_by_address(&"0000:08:00.0".parse().unwrap())
        .unwrap();
    assert_eq!(a2.health.state, HealthState::Unhealthy);
    assert_eq!(a2.health.reasons, ["AER fatal 1 (DLP 1)"]);
    assert_eq!(a2.memory_mib, Some(15356));
    let l40s = topo
        .gpu_by_address(&"0000:26:00.0".parse().unwrap())
        .unwrap();
    assert_eq!(l40s.health.state, HealthState::Healthy, "{:?}", l40s.health);
    assert_eq!(l40s.memory_mib, Some(46068));

    let parent = |id: &str| topo.parent(&id.parse::<ParentId>().unwrap()).unwrap();
    let mdev = parent("0000:08:00.4");
    assert_eq!(mdev.framework, VgpuFramework::Mdev);
    assert_eq!(mdev.health, a2.health);
    let vf = parent("0000:26:00.4");
    assert_eq!(vf.framework, VgpuFramework::VendorVfio);
    assert_eq!(vf.health, l40s.health);
    assert!(
        topo.mediated_devices
            .parents
            .iter()
            .all(|p| p.health.state != HealthState::Unknown),
        "every parent of a physical GPU is graded"
    );
}

#[test]
fn default_options_fall_back_to_no_telemetry_when_nvml_is_missing() {
    if NvmlTelemetry::open(None).is_ok() {
        println!("SKIPPED: this machine has a working NVML");
        return;
    }
    let opts = HealthOptions::default();
    assert!(opts.telemetry.is_none());
    let note = opts.telemetry_note.clone().unwrap();
    assert!(note.starts_with("NVML unavailable: "), "{note}");

    let mut b = TreeBuilder::new();
    b.pci(
        "0000:3b:00.0",
        PciSpec::new(0x10de, 0x1eb8, 0x030200)
            .driver("nvidia")
            .group(1)
            .link(16, 16, "8.0 GT/s PCIe", "8.0 GT/s PCIe"),
    );
    let t = b.finish().unwrap();
    let host = RealHost::new(t.root()).unwrap();
    let topo = node_topology(&host, &DiscoverOptions::new("n1"), &opts).unwrap();
    let g = &topo.gpus[0];
    assert_eq!(
        g.health.state,
        HealthState::Healthy,
        "graded from sysfs alone"
    );
    let report = &gpu_health::assess(&host, &topo.gpus, &opts)[0];
    assert!(report.warnings.contains(&note));
    assert!(matches!(
        report.signals.telemetry.as_ref().unwrap().temperature_c,
        Reading::Unknown(_)
    ));
}
