//! Assessing GPUs on fake host trees: missing and garbled files, NVML absent, fake telemetry,
//! parents inheriting their GPU's health, memory from telemetry, and the baseline file.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;

use gpu_core::{Gpu, HealthState, NodeTopology, Parent, ParentId, PciAddress, VgpuFramework};
use gpu_health::{
    BASELINE_PATH, Baseline, BaselineSource, FakeTelemetry, GpuTelemetry, HealthOptions, Policy,
    Reading, WidthBasis, assess, grade_topology, updated_baseline,
};
use gpu_sysfs::RealHost;
use gpu_sysfs::testing::{PciSpec, TreeBuilder};

const CLEAN_COR: &str = "RxErr 0\nBadTLP 0\nTOTAL_ERR_COR 0\n";
const CLEAN_NONFATAL: &str = "CmpltTO 0\nMalfTLP 0\nTOTAL_ERR_NONFATAL 0\n";
const CLEAN_FATAL: &str = "DLP 0\nSDES 0\nTOTAL_ERR_FATAL 0\n";

fn addr(s: &str) -> PciAddress {
    s.parse().unwrap()
}

fn gpu(name: &str, a: &str, device: u16) -> Gpu {
    Gpu::new(name, addr(a), 0x10de, device, 0x030200)
}

/// A GPU function with link files and the three AER files.
fn add_gpu(b: &mut TreeBuilder, a: &str, device: u16, width: (u32, u32), aer: [&str; 3]) {
    b.pci(
        a,
        PciSpec::new(0x10de, device, 0x030200)
            .driver("nvidia")
            .link(width.0, width.1, "16.0 GT/s PCIe", "16.0 GT/s PCIe"),
    );
    b.attr(a, "aer_dev_correctable", aer[0]);
    b.attr(a, "aer_dev_nonfatal", aer[1]);
    b.attr(a, "aer_dev_fatal", aer[2]);
}

fn offline() -> HealthOptions {
    HealthOptions::without_telemetry(Policy::default()).baseline(BaselineSource::None)
}

#[test]
fn a_clean_gpu_without_nvml_is_graded_from_sysfs_and_says_nvml_is_missing() {
    let mut b = TreeBuilder::new();
    add_gpu(
        &mut b,
        "0000:3b:00.0",
        0x1eb8,
        (16, 16),
        [CLEAN_COR, CLEAN_NONFATAL, CLEAN_FATAL],
    );
    let t = b.finish().unwrap();
    let host = RealHost::new(t.root()).unwrap();
    let mut opts = offline();
    opts.telemetry_note = Some("NVML unavailable: libnvidia-ml.so.1 could not be loaded".into());
    let r = &assess(&host, &[gpu("nvidia0", "0000:3b:00.0", 0x1eb8)], &opts)[0];
    assert_eq!(r.health.state, HealthState::Healthy);
    assert!(r.health.reasons.is_empty());
    assert_eq!(
        r.warnings,
        ["NVML unavailable: libnvidia-ml.so.1 could not be loaded"]
    );
    let t = r.signals.telemetry.as_ref().unwrap();
    assert!(matches!(t.ecc_uncorrected_volatile, Reading::Unknown(_)));
    assert_eq!(r.memory_mib, None);
}

#[test]
fn a_gpu_with_no_files_at_all_is_unknown() {
    let mut b = TreeBuilder::new();
    b.pci("0000:03:00.0", PciSpec::new(0x1002, 0x7448, 0x030000));
    let t = b.finish().unwrap();
    let host = RealHost::new(t.root()).unwrap();
    let g = Gpu::new("radeon0", addr("0000:03:00.0"), 0x1002, 0x7448, 0x030000);
    let r = &assess(&host, &[g], &offline())[0];
    assert_eq!(r.health.state, HealthState::Unknown);
    assert_eq!(r.health.reasons, ["no health signal could be read"]);
    assert_eq!(r.signals.aer.fatal, Reading::Unsupported);
    assert_eq!(r.signals.link.current_width, Reading::Unsupported);
    assert!(
        r.signals.telemetry.is_none(),
        "NVML is never asked about a Radeon"
    );
    assert!(r.warnings.is_empty());
}

#[test]
fn a_gpu_that_is_not_on_the_host_is_unknown() {
    let t = TreeBuilder::new().finish().unwrap();
    let host = RealHost::new(t.root()).unwrap();
    let r = &assess(&host, &[gpu("nvidia0", "0000:99:00.0", 0x1eb8)], &offline())[0];
    assert_eq!(r.health.state, HealthState::Unknown);
}

#[test]
fn garbage_in_a_file_makes_that_signal_unknown_with_a_warning_naming_it() {
    let mut b = TreeBuilder::new();
    add_gpu(
        &mut b,
        "0000:3b:00.0",
        0x1eb8,
        (16, 16),
        [CLEAN_COR, "CmpltTO lots\n", "DLP 1\nTOTAL_ERR_FATAL 1\n"],
    );
    b.attr("0000:3b:00.0", "current_link_width", "x16\n");
    let t = b.finish().unwrap();
    let host = RealHost::new(t.root()).unwrap();
    let r = &assess(&host, &[gpu("nvidia0", "0000:3b:00.0", 0x1eb8)], &offline())[0];
    // The fatal file still reads: garbage elsewhere does not hide it.
    assert_eq!(r.health.state, HealthState::Unhealthy);
    assert_eq!(r.health.reasons[0], "AER fatal 1 (DLP 1)");
    // ... and the garbled one is a reason too, never silently fine.
    assert!(
        r.health.reasons[1].starts_with("AER counters unreadable: aer_dev_nonfatal: "),
        "{:?}",
        r.health.reasons
    );
    assert!(matches!(r.signals.aer.nonfatal, Reading::Unknown(_)));
    assert!(
        r.warnings.contains(
            &"aer_dev_nonfatal: line 1: expected `NAME COUNT`, found \"CmpltTO lots\"".to_owned()
        ),
        "{:?}",
        r.warnings
    );
    assert!(
        r.warnings
            .iter()
            .any(|w| w.starts_with("current_link_width: expected a lane count")),
        "{:?}",
        r.warnings
    );
}

#[test]
fn an_unreadable_file_makes_that_signal_unknown() {
    let mut b = TreeBuilder::new();
    add_gpu(
        &mut b,
        "0000:3b:00.0",
        0x1eb8,
        (16, 16),
        [CLEAN_COR, CLEAN_NONFATAL, CLEAN_FATAL],
    );
    let t = b.finish().unwrap();
    // A directory where a file should be: reading fails with EISDIR.
    let f = t
        .root()
        .join(TreeBuilder::pci_dir(&addr("0000:3b:00.0")))
        .join("aer_dev_fatal");
    std::fs::remove_file(&f).unwrap();
    std::fs::create_dir(&f).unwrap();
    let host = RealHost::new(t.root()).unwrap();
    let r = &assess(&host, &[gpu("nvidia0", "0000:3b:00.0", 0x1eb8)], &offline())[0];
    assert!(
        matches!(&r.signals.aer.fatal, Reading::Unknown(w) if w.starts_with("aer_dev_fatal: "))
    );
    // The fatal counters cannot be told: not Healthy on the word of the other files.
    assert_eq!(r.health.state, HealthState::Degraded);
}

#[test]
fn aer_counters_of_minus_five_or_two_to_the_64_are_not_graded_healthy() {
    for bad in [
        "RxErr -5\nTOTAL_ERR_COR -5\n",
        "RxErr 18446744073709551616\n",
    ] {
        let mut b = TreeBuilder::new();
        add_gpu(
            &mut b,
            "0000:3b:00.0",
            0x1eb8,
            (16, 16),
            [bad, CLEAN_NONFATAL, CLEAN_FATAL],
        );
        let t = b.finish().unwrap();
        let host = RealHost::new(t.root()).unwrap();
        let r = &assess(&host, &[gpu("nvidia0", "0000:3b:00.0", 0x1eb8)], &offline())[0];
        assert_ne!(r.health.state, HealthState::Healthy, "{bad:?}");
        assert!(
            r.health
                .reasons
                .iter()
                .any(|w| w.contains("aer_dev_correctable")),
            "{:?}",
            r.health.reasons
        );
    }
}

#[test]
fn telemetry_grades_nvidia_gpus_and_fills_memory() {
    let mut b = TreeBuilder::new();
    add_gpu(
        &mut b,
        "0000:3b:00.0",
        0x1eb8,
        (16, 16),
        [CLEAN_COR, CLEAN_NONFATAL, CLEAN_FATAL],
    );
    add_gpu(
        &mut b,
        "0000:5e:00.0",
        0x1eb8,
        (16, 16),
        [CLEAN_COR, CLEAN_NONFATAL, CLEAN_FATAL],
    );
    let t = b.finish().unwrap();
    let host = RealHost::new(t.root()).unwrap();
    let fake = FakeTelemetry::new()
        .with_nominal(addr("0000:3b:00.0"), 15360, |_| {})
        .with_nominal(addr("0000:5e:00.0"), 15360, |t| {
            t.ecc_uncorrected_volatile = Reading::Value(3);
        });
    let opts = HealthOptions::with_telemetry(Policy::default(), Arc::new(fake))
        .baseline(BaselineSource::None);
    let gpus = [
        gpu("nvidia0", "0000:3b:00.0", 0x1eb8),
        gpu("nvidia1", "0000:5e:00.0", 0x1eb8),
    ];
    let r = assess(&host, &gpus, &opts);
    assert_eq!(r[0].health.state, HealthState::Healthy);
    assert_eq!(r[0].memory_mib, Some(15360));
    assert_eq!(r[0].telemetry_source.as_deref(), Some("fake"));
    assert_eq!(r[1].health.state, HealthState::Unhealthy);
    assert_eq!(r[1].health.reasons, ["uncorrectable ECC 3 (volatile)"]);
}

#[test]
fn a_gpu_bound_to_vfio_pci_is_not_asked_of_nvml() {
    let mut b = TreeBuilder::new();
    add_gpu(
        &mut b,
        "0000:3b:00.0",
        0x1eb8,
        (16, 16),
        [CLEAN_COR, CLEAN_NONFATAL, CLEAN_FATAL],
    );
    let t = b.finish().unwrap();
    let host = RealHost::new(t.root()).unwrap();
    let fake = FakeTelemetry::new().with_nominal(addr("0000:3b:00.0"), 15360, |t| {
        t.ecc_uncorrected_volatile = Reading::Value(9);
    });
    let opts = HealthOptions::with_telemetry(Policy::default(), Arc::new(fake))
        .baseline(BaselineSource::None);
    let mut g = gpu("nvidia0", "0000:3b:00.0", 0x1eb8);
    g.driver = Some("vfio-pci".into());
    let r = &assess(&host, &[g], &opts)[0];
    assert!(r.signals.telemetry.is_none());
    assert_eq!(r.health.state, HealthState::Healthy);
}

#[test]
fn telemetry_that_cannot_read_anything_leaves_a_gpu_to_its_sysfs_signals() {
    let mut b = TreeBuilder::new();
    add_gpu(
        &mut b,
        "0000:3b:00.0",
        0x1eb8,
        (16, 16),
        [CLEAN_COR, CLEAN_NONFATAL, CLEAN_FATAL],
    );
    let t = b.finish().unwrap();
    let host = RealHost::new(t.root()).unwrap();
    let fake = FakeTelemetry::new().with(addr("0000:3b:00.0"), GpuTelemetry::unsupported());
    let opts = HealthOptions::with_telemetry(Policy::default(), Arc::new(fake))
        .baseline(BaselineSource::None);
    let r = &assess(&host, &[gpu("nvidia0", "0000:3b:00.0", 0x1eb8)], &opts)[0];
    assert_eq!(r.health.state, HealthState::Healthy);
    assert!(
        r.warnings.is_empty(),
        "Unsupported is not a problem: {:?}",
        r.warnings
    );
}

#[test]
fn parents_take_the_health_of_their_physical_gpu() {
    let mut b = TreeBuilder::new();
    add_gpu(
        &mut b,
        "0000:3b:00.0",
        0x20f1,
        (16, 16),
        [CLEAN_COR, CLEAN_NONFATAL, "DLP 2\nTOTAL_ERR_FATAL 2\n"],
    );
    let t = b.finish().unwrap();
    let host = RealHost::new(t.root()).unwrap();
    let mut topo = NodeTopology::new("n1");
    topo.gpus.push(gpu("nvidia0", "0000:3b:00.0", 0x20f1));
    for (vf, g) in [("0000:3b:00.4", Some("0000:3b:00.0")), ("mbochs", None)] {
        topo.mediated_devices.parents.push(Parent {
            id: vf.parse::<ParentId>().unwrap(),
            gpu: g.map(addr),
            framework: VgpuFramework::Mdev,
            health: gpu_core::Health::unknown(),
            profiles: vec![],
            instances: vec![],
            warnings: vec![],
        });
    }
    let fake = FakeTelemetry::new().with_nominal(addr("0000:3b:00.0"), 40960, |_| {});
    let opts = HealthOptions::with_telemetry(Policy::default(), Arc::new(fake))
        .baseline(BaselineSource::None);
    grade_topology(&host, &mut topo, &opts);
    assert_eq!(topo.gpus[0].health.state, HealthState::Unhealthy);
    assert_eq!(topo.gpus[0].memory_mib, Some(40960));
    assert_eq!(topo.mediated_devices.parents[0].health, topo.gpus[0].health);
    assert_eq!(
        topo.mediated_devices.parents[1].health.state,
        HealthState::Unknown,
        "a virtual parent has no physical GPU to inherit from"
    );
}

#[test]
fn the_baseline_file_under_the_root_sets_the_expected_width_and_aer_history() {
    let mut b = TreeBuilder::new();
    add_gpu(
        &mut b,
        "0000:3b:00.0",
        0x1eb8,
        (8, 16),
        [CLEAN_COR, "CmpltTO 2\nTOTAL_ERR_NONFATAL 2\n", CLEAN_FATAL],
    );
    b.file(
        BASELINE_PATH,
        r#"{"devices": {"0000:3b:00.0": {"vendorId": "10de", "deviceId": "1eb8", "linkWidth": 8, "aerNonfatal": 2}}}"#,
    );
    let t = b.finish().unwrap();
    let host = RealHost::new(t.root()).unwrap();
    let opts = HealthOptions::without_telemetry(Policy::default());
    let g = [gpu("nvidia0", "0000:3b:00.0", 0x1eb8)];
    let r = &assess(&host, &g, &opts)[0];
    // It trained at x8 before too, and no non-fatal error is new.
    assert_eq!(r.health.state, HealthState::Healthy, "{:?}", r.health);
    assert_eq!(
        r.expected_link_width.as_ref().unwrap().basis,
        WidthBasis::Baseline
    );
}

#[test]
fn a_baseline_of_another_device_at_the_same_address_is_ignored() {
    let mut b = TreeBuilder::new();
    add_gpu(
        &mut b,
        "0000:3b:00.0",
        0x1eb8,
        (8, 16),
        [CLEAN_COR, CLEAN_NONFATAL, CLEAN_FATAL],
    );
    b.file(
        BASELINE_PATH,
        r#"{"devices": {"0000:3b:00.0": {"vendorId": "10de", "deviceId": "20f1", "linkWidth": 8}}}"#,
    );
    let t = b.finish().unwrap();
    let host = RealHost::new(t.root()).unwrap();
    let opts = HealthOptions::without_telemetry(Policy::default());
    let r = &assess(&host, &[gpu("nvidia0", "0000:3b:00.0", 0x1eb8)], &opts)[0];
    assert_eq!(r.health.reasons, ["link x8 of x16"]);
}

#[test]
fn a_garbled_baseline_is_ignored_with_a_warning() {
    let mut b = TreeBuilder::new();
    add_gpu(
        &mut b,
        "0000:3b:00.0",
        0x1eb8,
        (16, 16),
        [CLEAN_COR, CLEAN_NONFATAL, CLEAN_FATAL],
    );
    b.file(BASELINE_PATH, "{\"devices\": [");
    let t = b.finish().unwrap();
    let host = RealHost::new(t.root()).unwrap();
    let opts = HealthOptions::without_telemetry(Policy::default());
    let r = &assess(&host, &[gpu("nvidia0", "0000:3b:00.0", 0x1eb8)], &opts)[0];
    assert_eq!(r.health.state, HealthState::Healthy);
    assert!(
        r.warnings
            .iter()
            .any(|w| w.starts_with(&format!("baseline ignored: {BASELINE_PATH}: "))),
        "{:?}",
        r.warnings
    );
}

#[test]
fn a_garbled_baseline_fails_to_load_as_an_invalid_config_naming_the_file() {
    let mut b = TreeBuilder::new();
    b.file(BASELINE_PATH, "{\"devices\": [");
    let t = b.finish().unwrap();
    let host = RealHost::new(t.root()).unwrap();
    let e = Baseline::load(&host).unwrap_err();
    assert!(
        matches!(&e, gpu_health::HealthError::BaselineDecode { path: Some(p), .. } if p.to_str() == Some(BASELINE_PATH)),
        "{e:?}"
    );
    assert_eq!(e.kind(), gpu_core::ErrorKind::InvalidConfig);
    let decoder = serde_json::from_str::<Baseline>("{\"devices\": [").unwrap_err();
    assert_eq!(e.to_string(), format!("{BASELINE_PATH}: {decoder}"));
    assert_eq!(
        Baseline::from_json("{\"devices\": [")
            .unwrap_err()
            .to_string(),
        decoder.to_string(),
        "text given directly is named by the decoder's message alone"
    );
}

#[test]
fn a_recorded_baseline_keeps_the_widest_link_and_the_latest_counters() {
    let mut b = TreeBuilder::new();
    add_gpu(
        &mut b,
        "0000:3b:00.0",
        0x1eb8,
        (8, 16),
        [CLEAN_COR, "CmpltTO 4\nTOTAL_ERR_NONFATAL 4\n", CLEAN_FATAL],
    );
    let t = b.finish().unwrap();
    let host = RealHost::new(t.root()).unwrap();
    let before = Baseline::from_json(
        r#"{"devices": {"0000:3b:00.0": {"vendorId": "10de", "deviceId": "1eb8", "linkWidth": 16, "aerNonfatal": 1}}}"#,
    )
    .unwrap();
    let gpus = [gpu("nvidia0", "0000:3b:00.0", 0x1eb8)];
    let opts = offline().baseline(BaselineSource::Given(before.clone()));
    let reports = assess(&host, &gpus, &opts);
    assert_eq!(reports[0].health.state, HealthState::Degraded);
    assert_eq!(
        reports[0].health.reasons,
        [
            "AER non-fatal +3 since baseline, 4 in all (CmpltTO 4)",
            "link x8 of x16"
        ]
    );
    let after = updated_baseline(Some(&before), &gpus, &reports);
    let e = &after.devices[&addr("0000:3b:00.0")];
    assert_eq!(
        e.link_width,
        Some(16),
        "a dropped link never lowers the baseline"
    );
    assert_eq!(e.aer_nonfatal, Some(4));
    assert_eq!(e.aer_correctable, Some(0));
    after.save(&host).unwrap();
    assert_eq!(Baseline::load(&host).unwrap(), Some(after));
}
