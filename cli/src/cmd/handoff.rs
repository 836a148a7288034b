//! What an export hands to a VM, checked ([`gpu_node::handoff`]): the allocation a file holds,
//! the node it is checked against (this host, or a fleet file's node), and the one hand-off
//! check every export shares. `export qemu|libvirt` and `export vm` both come here.

use std::path::Path;

use gpu_core::Allocation;
use gpu_integrations::cloud_init;
use gpu_integrations::handoff::VmDevice;
pub use gpu_node::handoff::CheckedNode as Target;

use crate::common::{Global, front};

/// The node to check against ([`gpu_node::front::Front::handoff_target`]): the fleet file's
/// node named `want` (or `--node`, or its only node), else this host.
pub fn target(g: &Global, inventory: Option<&Path>, want: Option<&str>) -> anyhow::Result<Target> {
    Ok(front(g).handoff_target(inventory, want.or(g.node.as_deref()))?)
}

/// The allocation of a file: the only one, or `machine`'s.
pub fn read_allocation(
    g: &Global,
    path: &Path,
    machine: Option<&str>,
) -> anyhow::Result<Allocation> {
    Ok(front(g).read_allocation(path, machine)?)
}

/// The one check of `allocation` against `target` ([`Target::allocation`]), warnings printed on
/// stderr; the devices.
pub fn checked_allocation(
    target: &Target,
    allocation: &Allocation,
    force: bool,
) -> anyhow::Result<Vec<VmDevice>> {
    let (devices, warnings) = target.allocation(allocation, force)?;
    crate::common::warn(&warnings);
    Ok(devices)
}

/// The guest licensing files of the NVIDIA client configuration token at `path`, as NVIDIA
/// vGPU (`FeatureType=1`).
pub fn license(path: &Path) -> anyhow::Result<cloud_init::CloudConfig> {
    Ok(gpu_node::front::guest_license(
        Some(path),
        cloud_init::FeatureType::Vgpu,
    )?)
}
