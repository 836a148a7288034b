#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! Writes fleet files of `N` nodes of one discovered host (an L40S with 16 vendor-VFIO VFs on the
//! fake kernel, discovered through `gpu_health::open_node`, the call the bindings' `discover`
//! makes) in the compact form (`shapes`) and the full form, for timing `gpuslice` loading them:
//!
//! ```console
//! $ cargo run --release -p gpuslice-benches --example fleet_files -- /dev/shm/fleets 10000
//! $ /usr/bin/time -v gpuslice plan evacuate --inventory /dev/shm/fleets/compact.yaml
//! $ /usr/bin/time -v gpuslice --max-document-mib 300 plan evacuate --inventory /dev/shm/fleets/full.json
//! ```

use std::path::PathBuf;

fn main() {
    let mut args = std::env::args().skip(1);
    let dir = PathBuf::from(args.next().unwrap_or_else(|| "/dev/shm/fleets".into()));
    let n: usize = args.next().map_or(10_000, |a| a.parse().unwrap());
    std::fs::create_dir_all(&dir).unwrap();
    let kernel = gpu_sysfs::testing::FakeKernel::l40s_vendor_vfio_host(16).unwrap();
    let topology = gpu_health::open_node(
        kernel.root(),
        &gpu_health::NodeRequest::new("proto".to_owned()),
    )
    .unwrap()
    .topology;
    let shape = gpu_core::HostShape::of(&topology);
    let fleet = gpu_core::Fleet {
        nodes: (0..n)
            .map(|i| shape.clone().named(format!("l40s-{i:05}")))
            .collect(),
        ..gpu_core::Fleet::default()
    };
    let compact = fleet.to_text(false).unwrap();
    std::fs::write(dir.join("compact.yaml"), &compact).unwrap();
    let full = fleet.to_text_full(true).unwrap();
    std::fs::write(dir.join("full.json"), &full).unwrap();
    println!(
        "{n} nodes of {} GPUs, {} parents: compact {} bytes, full {} bytes",
        topology.gpus.len(),
        topology.mediated_devices.parents.len(),
        compact.len(),
        full.len()
    );
}
