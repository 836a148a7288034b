//! `POST /v1/gpus/bind` and `/release` with several GPUs: on an NVSwitch host the set must be one
//! fabric partition's members, activated with the bind and deactivated after the release; a set
//! that is no partition is refused before any write.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::sync::Arc;

use gpu_core::PciAddress;
use gpu_core::fabric::FabricMode;
use gpu_fabric::fake::FakeState;
use gpu_health::fabric::{FabricSource, SANDBOX_STATE};
use gpu_sysfs::testing::{FakeKernel, PciSpec, TreeBuilder};
use support::{request, start_with};

const BUSES: [u8; 8] = [0x18, 0x2a, 0x3a, 0x5d, 0x9a, 0xab, 0xba, 0xdb];

fn gpus() -> Vec<PciAddress> {
    BUSES
        .iter()
        .map(|b| format!("0000:{b:02x}:00.0").parse().unwrap())
        .collect()
}

/// Eight H100 SXM GPUs on `nvidia`, each alone in its IOMMU group, and one NVSwitch.
fn kernel() -> Arc<FakeKernel> {
    let mut b = TreeBuilder::new();
    for (i, g) in gpus().iter().enumerate() {
        b.pci(
            &g.to_string(),
            PciSpec::new(0x10de, 0x2330, 0x030200)
                .driver("nvidia")
                .group(10 + i as u32),
        );
    }
    b.pci(
        "0000:05:00.0",
        PciSpec::new(0x10de, 0x22a3, 0x068000)
            .driver("nvidia")
            .group(5),
    );
    Arc::new(FakeKernel::new(b.finish().unwrap()).unwrap())
}

fn partition_active(dir: &std::path::Path, id: u32) -> bool {
    let text = std::fs::read(dir.join(SANDBOX_STATE)).unwrap();
    let s: FakeState = serde_json::from_slice(&text).unwrap();
    s.partitions.iter().any(|p| p.id == id && p.active)
}

#[test]
fn a_partitions_gpus_are_bound_as_one_set_and_a_set_that_is_no_partition_is_refused() {
    let k = kernel();
    let fm = tempfile::tempdir().unwrap();
    let state = FakeState::hgx8(&gpus(), FabricMode::SharedNvswitch).unwrap();
    std::fs::write(
        fm.path().join(SANDBOX_STATE),
        serde_json::to_vec(&state).unwrap(),
    )
    .unwrap();
    let source = FabricSource::Sandbox(fm.path().to_path_buf());
    let a = start_with(Arc::clone(&k), |c| c.fabric = source);

    let t = request(&a.socket, "GET", "/v1/topology", None);
    assert_eq!(t.json()["fabric"]["fabricManager"]["state"], "reachable");
    assert_eq!(t.json()["fabric"]["partitions"][3]["gpus"][1], "nvidia2");

    let before = k.snapshot().unwrap();
    let r = request(
        &a.socket,
        "POST",
        "/v1/gpus/bind",
        Some(r#"{"gpus": ["nvidia0", "nvidia1"]}"#),
    );
    assert_eq!(r.status, 400, "{}", r.body);
    assert_eq!(r.kind(), "invalid-request");
    let msg = r.json()["error"]["message"].as_str().unwrap().to_owned();
    assert!(msg.contains("partition 4 (nvidia0, nvidia2)"), "{msg}");
    assert_eq!(k.snapshot().unwrap(), before, "nothing written");

    let r = request(
        &a.socket,
        "POST",
        "/v1/gpus/bind",
        Some(r#"{"gpus": ["nvidia0", "0000:3a:00.0"]}"#),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.json()["partition"]["partition"]["id"], 4);
    assert_eq!(r.json()["gpus"].as_array().unwrap().len(), 2);
    assert!(partition_active(fm.path(), 4));

    let r = request(
        &a.socket,
        "POST",
        "/v1/gpus/release",
        Some(r#"{"gpus": ["nvidia0", "nvidia2"]}"#),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(!partition_active(fm.path(), 4));
}
