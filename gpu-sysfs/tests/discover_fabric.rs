//! NVSwitches found by discovery: the bundled HGX H100 host's four switches make a fabric whose
//! Fabric Manager was not asked; a host without switches has no fabric at all.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use gpu_core::fabric::FabricManagerState;
use gpu_sysfs::discover::{DiscoverOptions, discover, fabric::NOT_ASKED};
use gpu_sysfs::{RealHost, umockdev};

fn discover_example(name: &str) -> gpu_core::NodeTopology {
    let example = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../examples/hosts")
        .join(name);
    let replay = umockdev::materialize(&example).unwrap();
    discover(
        &RealHost::new(replay.root()).unwrap(),
        &DiscoverOptions::new("n"),
    )
    .unwrap()
}

#[test]
fn the_hgx_hosts_nvswitches_are_a_fabric_and_are_not_gpus() {
    let t = discover_example("hgx-h100-nvswitch.umockdev");
    let fabric = t.fabric.expect("the HGX host has NVSwitches");
    let switches: Vec<String> = fabric.nvswitches.iter().map(ToString::to_string).collect();
    assert_eq!(
        switches,
        [
            "0000:05:00.0",
            "0000:06:00.0",
            "0000:07:00.0",
            "0000:08:00.0"
        ]
    );
    assert_eq!(fabric.fabric_manager.state, FabricManagerState::Unreachable);
    assert_eq!(fabric.fabric_manager.reason.as_deref(), Some(NOT_ASKED));
    assert!(fabric.partitions.is_empty());
    assert_eq!(t.gpus.len(), 8);
    assert!(
        t.gpus
            .iter()
            .all(|g| !fabric.nvswitches.contains(&g.address))
    );
}

#[test]
fn a_host_without_nvswitches_has_no_fabric() {
    assert_eq!(discover_example("a2-sriov-mdev.umockdev").fabric, None);
}
