//! The one call that composes discovery and health into a node's topology, shared by the CLI
//! and the bindings.

use gpu_core::NodeTopology;
use gpu_sysfs::Host;
use gpu_sysfs::discover::{DiscoverOptions, discover};

use crate::assess::{GpuHealthReport, HealthOptions, grade_topology};
use crate::error::HealthError;

/// Discovers the node (GPUs, vGPU parents, profiles, instances, pools), grades every GPU's
/// health, copies it to the vGPU parents of that GPU, and fills `memoryMiB` from telemetry when
/// it was read.
///
/// # Errors
/// [`HealthError::Discovery`] when discovery fails (a root without `sys/bus/pci/devices`);
/// health itself never fails, it grades what it cannot read as Unknown.
pub fn node_topology(
    host: &dyn Host,
    opts: &DiscoverOptions,
    health: &HealthOptions,
) -> Result<NodeTopology, HealthError> {
    node_topology_with_reports(host, opts, health).map(|(topology, _)| topology)
}

/// [`node_topology`], also returning each GPU's full health report (the signals read, the
/// expected link width and the warnings), in the topology's GPU order.
///
/// # Errors
/// [`HealthError::Discovery`] when discovery fails.
pub fn node_topology_with_reports(
    host: &dyn Host,
    opts: &DiscoverOptions,
    health: &HealthOptions,
) -> Result<(NodeTopology, Vec<GpuHealthReport>), HealthError> {
    let mut topology = discover(host, opts)?;
    let reports = grade_topology(host, &mut topology, health);
    Ok((topology, reports))
}
