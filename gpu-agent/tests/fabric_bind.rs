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

fn bind(a: &support::Running, body: &str) -> support::Reply {
    request(&a.socket, "POST", "/v1/gpus/bind", Some(body))
}

/// A sandbox Fabric Manager with the HGX set in `mode`, kept in a temporary directory.
fn fake_fm(mode: FabricMode, change: impl FnOnce(&mut FakeState)) -> tempfile::TempDir {
    let fm = tempfile::tempdir().unwrap();
    let mut state = FakeState::hgx8(&gpus(), mode).unwrap();
    change(&mut state);
    std::fs::write(
        fm.path().join(SANDBOX_STATE),
        serde_json::to_vec(&state).unwrap(),
    )
    .unwrap();
    fm
}

/// nvidia2 (module 3) with NVLink ports 3 and 7 failed, as Fabric Manager reports them.
fn fail_nvidia2(s: &mut FakeState) {
    let f = gpu_fabric::fake::FakeFabric::new(s.clone());
    f.fail_nvlinks(gpus()[2], false, &[3, 7]);
    *s = f.state();
}

#[test]
fn nvlink_faults_fabric_manager_reports_reach_the_health_stream_and_refuse_the_partition() {
    let k = kernel();
    let fm = fake_fm(FabricMode::SharedNvswitch, |_| {});
    let source = FabricSource::Sandbox(fm.path().to_path_buf());
    let a = start_with(Arc::clone(&k), |c| c.fabric = source);
    let h = request(&a.socket, "GET", "/v1/health", None);
    assert_ne!(
        h.json()["gpus"][2]["health"]["state"],
        "Degraded",
        "{}",
        h.body
    );

    // FM now reports two failed NVLinks of nvidia2.
    let mut s: FakeState =
        serde_json::from_slice(&std::fs::read(fm.path().join(SANDBOX_STATE)).unwrap()).unwrap();
    fail_nvidia2(&mut s);
    std::fs::write(
        fm.path().join(SANDBOX_STATE),
        serde_json::to_vec(&s).unwrap(),
    )
    .unwrap();
    a.agent.refresh().unwrap();
    let e = support::wait_event(&a.agent, std::time::Duration::from_secs(5), |e| {
        e.kind == gpu_agent::EventKind::HealthChanged && e.data["gpu"] == "nvidia2"
    })
    .expect("a health event for nvidia2");
    assert_eq!(e.data["health"]["state"], "Degraded");
    assert!(
        e.data["reason"]
            .as_str()
            .unwrap()
            .contains("2 of 18 NVLinks down"),
        "{}",
        e.data
    );
    let h = request(&a.socket, "GET", "/v1/health", None);
    assert_eq!(
        h.json()["gpus"][2]["health"]["state"],
        "Degraded",
        "{}",
        h.body
    );
    let t = request(&a.socket, "GET", "/v1/topology", None);
    assert!(
        t.json()["fabric"]["partitions"][3]["degraded"]
            .as_str()
            .unwrap()
            .contains("nvidia2: 2 of 18 NVLinks down")
    );
    // The degraded partition is not handed out.
    let before = k.snapshot().unwrap();
    let r = bind(&a, r#"{"gpus": ["nvidia0", "nvidia2"]}"#);
    assert_eq!(r.status, 409, "{}", r.body);
    assert_eq!(r.kind(), "unhealthy");
    assert_eq!(k.snapshot().unwrap(), before, "nothing written");
}

#[test]
fn at_start_the_agent_gives_a_restarted_fabric_manager_the_partitions_gpuslice_activated() {
    use gpu_sysfs::Host;
    let k = kernel();
    // gpuslice recorded partition 4 active; FM restarted and lists none.
    k.create_dir_all("var/lib/gpuslice/node").unwrap();
    k.write_atomic(gpu_node::fabric::ACTIVE_FILE, br#"{"active": [4]}"#)
        .unwrap();
    let fm = fake_fm(FabricMode::SharedNvswitch, |_| {});
    let source = FabricSource::Sandbox(fm.path().to_path_buf());
    let _a = start_with(Arc::clone(&k), |c| c.fabric = source);
    assert!(partition_active(fm.path(), 4));
    assert!(!partition_active(fm.path(), 5));
}

#[test]
fn a_vgpu_set_is_asked_of_the_agent_with_a_profile_and_needs_fabric_manager_in_vgpu_mode() {
    let k = kernel();
    let fm = fake_fm(FabricMode::SharedNvswitch, |_| {});
    let source = FabricSource::Sandbox(fm.path().to_path_buf());
    let a = start_with(Arc::clone(&k), |c| c.fabric = source);
    let r = bind(
        &a,
        r#"{"gpus": ["nvidia0", "nvidia2"], "profile": "H100XM-80C"}"#,
    );
    assert_eq!(r.kind(), "unsupported", "{}", r.body);
    assert!(
        r.body.contains("needs Fabric Manager in vGPU mode"),
        "{}",
        r.body
    );
}
