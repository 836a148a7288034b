//! What an export hands to a VM, checked ([`gpu_node::handoff`]): the allocation a file holds,
//! the node it is checked against (this host, or a fleet file's node), and the one hand-off
//! check every export shares. `export qemu|libvirt` and `export vm` both come here.

use std::path::Path;

use anyhow::Context;
use gpu_core::Allocation;
use gpu_integrations::cloud_init;
use gpu_integrations::handoff::VmDevice;
pub use gpu_node::handoff::CheckedNode as Target;

use crate::common::{Global, read_input};

/// The node to check against: the fleet file's node named `want` (or `--node`, or its only
/// node), else this host, discovered.
pub fn target(g: &Global, inventory: Option<&Path>, want: Option<&str>) -> anyhow::Result<Target> {
    let Some(path) = inventory else {
        let node = g.node_name();
        gpu_core::validate_name(&node).context("--node")?;
        let composed = crate::common::open_node(g, &gpu_health::NodeRequest::new(node))?;
        return Ok(Target::this_host(composed));
    };
    let (nodes, _) = crate::common::load_nodes(g, Some(path))?;
    Ok(Target::of_fleet(nodes, path, want.or(g.node.as_deref()))?)
}

/// Reads the allocation of a file ([`gpu_node::handoff::one_allocation`]): the only one, or
/// `machine`'s.
pub fn read_allocation(path: &Path, machine: Option<&str>) -> anyhow::Result<Allocation> {
    let text = read_input(path, "allocation")?;
    Ok(gpu_node::handoff::one_allocation(&text, machine, path)?)
}

/// The one check of `allocation` against `target` ([`Target::allocation`]), warnings printed on
/// stderr; the devices.
pub fn checked_allocation(
    target: &Target,
    allocation: &Allocation,
    force: bool,
) -> anyhow::Result<Vec<VmDevice>> {
    let (devices, warnings) = target.allocation(allocation, force)?;
    warn(&warnings);
    Ok(devices)
}

/// Prints the warnings of a check on stderr.
pub fn warn(warnings: &[String]) {
    for w in warnings {
        eprintln!("gpuslice: warning: {w}");
    }
}

/// The guest licensing files of the NVIDIA client configuration token at `path`, as NVIDIA
/// vGPU (`FeatureType=1`).
pub fn license(path: &Path) -> anyhow::Result<cloud_init::CloudConfig> {
    guest_license(Some(path), cloud_init::FeatureType::Vgpu)
}

/// The guest licensing files for `feature`, with the token at `path` when one is given.
pub fn guest_license(
    path: Option<&Path>,
    feature: cloud_init::FeatureType,
) -> anyhow::Result<cloud_init::CloudConfig> {
    let token = match path {
        Some(p) => Some(
            std::fs::read(p)
                .with_context(|| format!("cannot read license token {}", p.display()))?,
        ),
        None => None,
    };
    let name = path.and_then(|p| p.file_name()?.to_str());
    cloud_init::guest_files(token.as_deref().map(|t| (t, name)), feature).with_context(
        || match path {
            Some(p) => format!("license token {}", p.display()),
            None => "export cloud-init".to_owned(),
        },
    )
}
