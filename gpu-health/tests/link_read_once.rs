//! The composition reads each PCIe link file once: discovery reads it, and the health grading
//! judges the link from what discovery read.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use gpu_health::{HealthOptions, Policy, Reading, node_topology_with_reports};
use gpu_sysfs::RealHost;
use gpu_sysfs::discover::DiscoverOptions;
use gpu_sysfs::testing::{CountingHost, PciSpec, TreeBuilder};

const LINK_FILES: [&str; 4] = [
    "current_link_width",
    "max_link_width",
    "current_link_speed",
    "max_link_speed",
];

#[test]
fn composing_a_node_reads_each_link_file_once_and_grades_what_it_read() {
    let mut b = TreeBuilder::new();
    // A GPU whose link runs narrower than the chip advertises, and one whose width file lies.
    b.pci(
        "0000:3b:00.0",
        PciSpec::new(0x10de, 0x1eb8, 0x030200)
            .driver("nvidia")
            .link(8, 16, "8.0 GT/s PCIe", "8.0 GT/s PCIe"),
    )
    .pci(
        "0000:5e:00.0",
        PciSpec::new(0x10de, 0x1eb8, 0x030200)
            .driver("nvidia")
            .link(16, 16, "8.0 GT/s PCIe", "8.0 GT/s PCIe"),
    );
    let tree = b.finish().unwrap();
    std::fs::write(
        tree.root()
            .join("sys/bus/pci/devices/0000:5e:00.0/current_link_width"),
        "x16\n",
    )
    .unwrap();
    let host = CountingHost::new(RealHost::new(tree.root()).unwrap());
    let opts = HealthOptions::without_telemetry(Policy::default());
    let (topology, reports) =
        node_topology_with_reports(&host, &DiscoverOptions::new("n1"), &opts).unwrap();

    for gpu in ["0000:3b:00.0", "0000:5e:00.0"] {
        for file in LINK_FILES {
            let path = format!("sys/bus/pci/devices/{gpu}/{file}");
            assert_eq!(host.reads_of(&path), 1, "{path} in {:?}", host.reads());
        }
    }
    let narrow = &reports[0].signals.link;
    assert_eq!(narrow.current_width, Reading::Value(8));
    assert_eq!(narrow.max_width, Reading::Value(16));
    assert_eq!(narrow.current_speed_gts, Reading::Value(8.0));
    assert_eq!(
        topology.gpus[0].link.as_ref().unwrap().current_width,
        Some(8)
    );
    // The malformed file is Unknown to health and a warning of discovery, from the one read.
    let lying = &reports[1].signals.link;
    assert!(
        matches!(&lying.current_width, Reading::Unknown(why) if why.starts_with("current_link_width: expected a lane count")),
        "{lying:?}"
    );
    assert_eq!(lying.max_width, Reading::Value(16));
    assert!(
        topology.gpus[1]
            .warnings
            .iter()
            .any(|w| w.contains("current_link_width")),
        "{:?}",
        topology.gpus[1].warnings
    );
}
