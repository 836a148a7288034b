//! The link rule on the real A2 capture (x8 of x16 at 2.5 of 16 GT/s on a healthy, idle card) and
//! on modelled cards whose width really dropped, through the composed discovery + health call.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::Path;
use std::sync::Arc;

use gpu_core::{HealthState, NodeTopology};
use gpu_health::policy::{LinkFallback, PolicyFormat};
use gpu_health::{
    BaselineSource, ExpectedWidth, FakeTelemetry, HealthOptions, Policy, Reading, WidthBasis,
    assess, node_topology,
};
use gpu_sysfs::RealHost;
use gpu_sysfs::discover::DiscoverOptions;
use gpu_sysfs::testing::{PciSpec, TreeBuilder};

fn a2_host() -> (gpu_sysfs::umockdev::Replay, RealHost) {
    let rec = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/a2-pf.umockdev");
    let replay = gpu_sysfs::umockdev::materialize(&rec).unwrap();
    let host = RealHost::new(replay.root()).unwrap();
    (replay, host)
}

fn topology(host: &RealHost, opts: &HealthOptions) -> NodeTopology {
    node_topology(host, &DiscoverOptions::new("a2-host"), opts).unwrap()
}

fn offline(policy: Policy) -> HealthOptions {
    HealthOptions::without_telemetry(policy).baseline(BaselineSource::None)
}

#[test]
fn the_real_a2_at_x8_of_x16_and_idle_speed_is_healthy() {
    let (_replay, host) = a2_host();
    let topo = topology(&host, &offline(Policy::default()));
    let a2 = topo.gpu_by_name("nvidia0").unwrap();
    assert_eq!(a2.address.to_string(), "0000:08:00.0");
    assert_eq!(a2.health.state, HealthState::Healthy, "{:?}", a2.health);
    assert!(a2.health.reasons.is_empty());

    let report = &assess(&host, &topo.gpus, &offline(Policy::default()))[0];
    assert_eq!(report.signals.link.current_width, Reading::Value(8));
    assert_eq!(report.signals.link.max_width, Reading::Value(16));
    assert_eq!(report.signals.link.current_speed_gts, Reading::Value(2.5));
    assert_eq!(report.signals.link.max_speed_gts, Reading::Value(16.0));
    assert_eq!(
        report.expected_link_width,
        Some(ExpectedWidth {
            lanes: 8,
            basis: WidthBasis::Board { model: "A2".into() }
        })
    );
    assert_eq!(report.signals.aer.fatal.value().unwrap().counts.len(), 18);
}

#[test]
fn the_naive_maximum_rule_would_have_misfired_on_the_a2() {
    // Take the A2 out of the board table by declaring it x16: the maximum is all that is left,
    // and the healthy card reads Degraded. This is the rule the board table exists to avoid.
    let naive = Policy::from_str_as(
        "[[link.boards]]\nmodel = \"A2\"\nvendor = \"10de\"\ndevice = \"25b6\"\nsubsystemVendor = \"10de\"\nsubsystemDevice = \"157e\"\nwidth = 16\n",
        PolicyFormat::Toml,
        "naive.toml",
    )
    .unwrap();
    let (_replay, host) = a2_host();
    let a2 = &topology(&host, &offline(naive)).gpus[0];
    assert_eq!(a2.health.state, HealthState::Degraded);
    assert_eq!(a2.health.reasons, ["link x8 of x16"]);
}

#[test]
fn the_a2_with_nvml_gets_its_memory_and_its_health_from_both_sources() {
    let (_replay, host) = a2_host();
    let a2 = "0000:08:00.0".parse().unwrap();
    let fake = FakeTelemetry::new().with_nominal(a2, 15356, |t| {
        t.temperature_c = Reading::Value(92);
    });
    let opts = HealthOptions::with_telemetry(Policy::default(), Arc::new(fake))
        .baseline(BaselineSource::None);
    let topo = topology(&host, &opts);
    assert_eq!(topo.gpus[0].memory_mib, Some(15356));
    assert_eq!(
        topo.gpus[0].health.reasons,
        ["temperature 92C at or above slowdown 90C"]
    );
}

/// A host with one T4-like x16 card per given (current, max) width.
fn cards(widths: &[(u32, u32)], speed: &str) -> gpu_sysfs::testing::builder::Tree {
    let mut b = TreeBuilder::new();
    for (i, (cur, max)) in widths.iter().enumerate() {
        b.pci(
            &format!("0000:{:02x}:00.0", 0x3b + i),
            PciSpec::new(0x10de, 0x1eb8, 0x030200)
                .subsystem(0x10de, 0x12a2)
                .driver("nvidia")
                .group(10 + i as u32)
                .link(*cur, *max, speed, "8.0 GT/s PCIe"),
        );
    }
    b.finish().unwrap()
}

#[test]
fn an_x16_card_that_trained_at_x8_is_degraded() {
    let t = cards(&[(8, 16)], "8.0 GT/s PCIe");
    let host = RealHost::new(t.root()).unwrap();
    let g = &topology(&host, &offline(Policy::default())).gpus[0];
    assert_eq!(g.health.state, HealthState::Degraded);
    assert_eq!(g.health.reasons, ["link x8 of x16"]);
}

#[test]
fn an_x16_card_at_full_width_but_idle_speed_is_healthy() {
    let t = cards(&[(16, 16)], "2.5 GT/s PCIe");
    let host = RealHost::new(t.root()).unwrap();
    let g = &topology(&host, &offline(Policy::default())).gpus[0];
    assert_eq!(g.health.state, HealthState::Healthy, "{:?}", g.health);
}

#[test]
fn a_card_narrower_than_its_same_model_peers_is_degraded_even_without_a_fallback() {
    let t = cards(&[(16, 16), (8, 16), (16, 16)], "8.0 GT/s PCIe");
    let host = RealHost::new(t.root()).unwrap();
    let mut p = Policy::default();
    p.link.fallback = LinkFallback::None;
    let topo = topology(&host, &offline(p.clone()));
    let states: Vec<_> = topo.gpus.iter().map(|g| g.health.state).collect();
    assert_eq!(
        states,
        [
            HealthState::Healthy,
            HealthState::Degraded,
            HealthState::Healthy
        ]
    );
    assert_eq!(topo.gpus[1].health.reasons, ["link x8 of x16"]);
    let r = assess(&host, &topo.gpus, &offline(p));
    assert_eq!(
        r[1].expected_link_width.as_ref().unwrap().basis,
        WidthBasis::Peers
    );
}

#[test]
fn a_card_whose_baseline_says_x16_is_degraded_at_x8() {
    let t = cards(&[(8, 16)], "8.0 GT/s PCIe");
    let host = RealHost::new(t.root()).unwrap();
    let mut p = Policy::default();
    p.link.fallback = LinkFallback::None;
    let base = gpu_health::Baseline::from_json(
        r#"{"devices": {"0000:3b:00.0": {"vendorId": "10de", "deviceId": "1eb8", "linkWidth": 16}}}"#,
    )
    .unwrap();
    let opts = HealthOptions::without_telemetry(p).baseline(BaselineSource::Given(base));
    let g = &topology(&host, &opts).gpus[0];
    assert_eq!(g.health.reasons, ["link x8 of x16"]);
}

#[test]
fn a_root_without_pci_devices_is_a_discovery_error() {
    let dir = tempfile::tempdir().unwrap();
    let host = RealHost::new(dir.path()).unwrap();
    let e = node_topology(
        &host,
        &DiscoverOptions::new("x"),
        &offline(Policy::default()),
    )
    .unwrap_err();
    assert!(matches!(e, gpu_health::HealthError::Discovery(_)), "{e}");
}
