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

/// The bundled HGX host's topology and its GPUs' addresses (module-ID order).
fn hgx_topology() -> (gpu_core::NodeTopology, Vec<gpu_core::PciAddress>) {
    let example = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../examples/hosts/hgx-h100-nvswitch.umockdev");
    let replay = umockdev::materialize(&example).unwrap();
    let t = discover(
        &RealHost::new(replay.root()).unwrap(),
        &DiscoverOptions::new("n"),
    )
    .unwrap();
    let gpus = t.gpus.iter().map(|g| g.address).collect();
    (t, gpus)
}

/// An NVML whose GPU `gpus[i]` is module `modules[i]`.
fn nvml_modules(gpus: &[gpu_core::PciAddress], modules: &[u32]) -> gpu_nvml::fake::FakeNvml {
    gpus.iter()
        .zip(modules)
        .fold(gpu_nvml::fake::FakeNvml::new(), |n, (a, m)| {
            n.with_gpu(*a, gpu_nvml::fake::FakeGpu::new(81_559).with_module_id(*m))
        })
}

#[test]
fn members_fabric_manager_names_by_module_id_only_get_nvmls_address() {
    let (mut t, gpus) = hgx_topology();
    let mut state = FakeState::hgx8(&gpus, FabricMode::SharedNvswitch).unwrap();
    for g in state.partitions.iter_mut().flat_map(|p| p.gpus.iter_mut()) {
        g.pci_bus_id = None;
    }
    let fm: Result<Arc<dyn FabricManager>, _> = Ok(Arc::new(FakeFabric::new(state)));
    // Without NVML no member can be named: no partition is listed.
    gpu_health::fabric::compose_fabric(&mut t, &fm);
    assert!(t.fabric.as_ref().unwrap().partitions.is_empty());
    // NVML's module IDs: module m is gpus[m - 1].
    let nvml = nvml_modules(&gpus, &[1, 2, 3, 4, 5, 6, 7, 8]);
    gpu_health::fabric::compose_fabric_with(&mut t, &fm, Some(&nvml));
    let f = t.fabric.as_ref().unwrap();
    assert_eq!(f.partitions.len(), 15);
    let p4 = f.partition(4).unwrap();
    assert_eq!(p4.addresses, [gpus[0], gpus[2]]);
    assert_eq!(p4.gpus, ["nvidia0", "nvidia2"]);
}

#[test]
fn a_member_whose_fabric_manager_and_nvml_addresses_differ_is_refused_not_guessed() {
    let (mut t, gpus) = hgx_topology();
    let state = FakeState::hgx8(&gpus, FabricMode::SharedNvswitch).unwrap();
    let fm: Result<Arc<dyn FabricManager>, _> = Ok(Arc::new(FakeFabric::new(state)));
    // NVML swaps modules 3 and 4.
    let nvml = nvml_modules(&gpus, &[1, 2, 4, 3, 5, 6, 7, 8]);
    gpu_health::fabric::compose_fabric_with(&mut t, &fm, Some(&nvml));
    let f = t.fabric.as_ref().unwrap();
    assert!(!f.fabric_manager.is_reachable());
    assert!(f.partitions.is_empty());
    let why = f.fabric_manager.reason.as_deref().unwrap();
    assert!(
        why.contains(&format!(
            "disagree on module 3: {} to Fabric Manager, {} to NVML",
            gpus[2], gpus[3]
        )),
        "{why}"
    );
    // Nothing of several GPUs is handed out.
    assert!(f.partition_for_set(&[gpus[0], gpus[2]]).is_err());
}
