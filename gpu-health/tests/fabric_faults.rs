//! NVLink faults Fabric Manager reports, graded: the partitions with a member whose links failed
//! are degraded (so placement and claims skip them), and the GPU is graded Degraded.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;

use gpu_core::HealthState;
use gpu_core::fabric::FabricMode;
use gpu_fabric::FabricManager;
use gpu_fabric::fake::{FakeFabric, FakeState};
use gpu_sysfs::discover::{DiscoverOptions, discover};
use gpu_sysfs::{RealHost, umockdev};

#[test]
fn failed_nvlinks_degrade_their_partitions_and_grade_the_gpu() {
    let example = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../examples/hosts/hgx-h100-nvswitch.umockdev");
    let replay = umockdev::materialize(&example).unwrap();
    let mut t = discover(
        &RealHost::new(replay.root()).unwrap(),
        &DiscoverOptions::new("n"),
    )
    .unwrap();
    let gpus: Vec<_> = t.gpus.iter().map(|g| g.address).collect();
    let fake = FakeFabric::new(FakeState::hgx8(&gpus, FabricMode::SharedNvswitch).unwrap());
    fake.fail_nvlinks(gpus[2], false, &[3, 7]);
    let fm: Result<Arc<dyn FabricManager>, _> = Ok(Arc::new(fake));
    gpu_health::fabric::compose_fabric(&mut t, &fm);

    let f = t.fabric.as_ref().unwrap();
    let degraded: Vec<u32> = f
        .partitions
        .iter()
        .filter(|p| !p.is_healthy())
        .map(|p| p.id)
        .collect();
    // nvidia2 (module 3) is in partitions 1 (all), 3 (modules 3, 4, 7, 8), 4 (1, 3) and 10.
    assert_eq!(degraded, [1, 3, 4, 10]);
    assert_eq!(
        f.partition(4).unwrap().degraded.as_deref(),
        Some("nvidia2: 2 of 18 NVLinks down")
    );
    // Placement and claims offer only healthy partitions.
    assert!(f.would_do(&[gpus[0], gpus[1]]).iter().all(|p| p.id != 4));
    let g = t.gpu_by_address(&gpus[2]).unwrap();
    assert_eq!(g.health.state, HealthState::Degraded);
    assert!(
        g.health.reasons.iter().any(|r| r == "2 of 18 NVLinks down"),
        "{:?}",
        g.health.reasons
    );
    assert_eq!(
        t.gpu_by_address(&gpus[0]).unwrap().health.reasons,
        Vec::<String>::new()
    );
}

#[test]
fn a_failed_nvswitch_link_degrades_every_partition() {
    let example = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../examples/hosts/hgx-h100-nvswitch.umockdev");
    let replay = umockdev::materialize(&example).unwrap();
    let mut t = discover(
        &RealHost::new(replay.root()).unwrap(),
        &DiscoverOptions::new("n"),
    )
    .unwrap();
    let gpus: Vec<_> = t.gpus.iter().map(|g| g.address).collect();
    let fake = FakeFabric::new(FakeState::hgx8(&gpus, FabricMode::SharedNvswitch).unwrap());
    fake.fail_nvlinks("0000:07:00.0".parse().unwrap(), true, &[12]);
    let fm: Result<Arc<dyn FabricManager>, _> = Ok(Arc::new(fake));
    gpu_health::fabric::compose_fabric(&mut t, &fm);
    let f = t.fabric.as_ref().unwrap();
    assert!(f.partitions.iter().all(|p| !p.is_healthy()));
    assert!(
        f.partitions[0]
            .degraded
            .as_deref()
            .unwrap()
            .contains("NVSwitch 0000:07:00.0: NVLink ports [12] failed")
    );
}
