//! The host the agent reads and writes through (its read tracker wrapped around the real root)
//! behaves as the root itself: state files are written atomically, also in new directories, and
//! read whole up to the caller's limit, as the CLI's writes and reads of the same files are.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;

use gpu_agent::{Agent, AgentConfig};
use gpu_sysfs::RealHost;

#[test]
fn the_agents_host_writes_state_files_atomically_and_reads_them_whole() {
    let root = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(root.path().join("sys/bus/pci/devices")).unwrap();
    let host = RealHost::new(root.path()).unwrap();
    let mut config = AgentConfig::new("node-a");
    config.state_dir = Some(root.path().join("state"));
    let agent = Agent::open(Arc::new(host), config).unwrap();
    let h = agent.host();

    // The remembered type names and the health baseline are written this way.
    h.write_atomic("var/lib/gpuslice/vgpu-type-names.json", b"{\"a\":1}")
        .unwrap();
    assert_eq!(
        std::fs::read(root.path().join("var/lib/gpuslice/vgpu-type-names.json")).unwrap(),
        b"{\"a\":1}"
    );
    // A shorter document replaces a longer one whole (a plain write would leave its tail).
    h.write_atomic("var/lib/gpuslice/vgpu-type-names.json", b"{}")
        .unwrap();
    assert_eq!(
        std::fs::read(root.path().join("var/lib/gpuslice/vgpu-type-names.json")).unwrap(),
        b"{}"
    );
    // A baseline of 8 GPUs is larger than a sysfs attribute (16 KiB).
    let big = vec![b' '; 64 * 1024];
    std::fs::write(
        root.path().join("var/lib/gpuslice/health-baseline.json"),
        &big,
    )
    .unwrap();
    assert_eq!(
        h.read_bounded("var/lib/gpuslice/health-baseline.json", 16 << 20)
            .unwrap()
            .len(),
        big.len()
    );
}
