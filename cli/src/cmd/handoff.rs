//! What an export hands to a VM, checked: the allocation a file holds, the node it is checked
//! against (this host, or a fleet file's node), and the one hand-off check
//! ([`gpu_integrations::handoff::check_allocation`] / [`gpu_integrations::handoff::check_devices`])
//! every export shares. `export qemu|libvirt` and `export vm` both come here.

use std::path::Path;

use anyhow::{Context, bail};
use gpu_core::{Allocation, NodeTopology};
use gpu_integrations::handoff::{self, VmDevice};

use crate::common::{Global, read_input};

/// The node a hand-off is checked against, and this host when it is this host (for the
/// processes holding devices open).
pub struct Target {
    /// The node's topology.
    pub node: NodeTopology,
    /// This host, when the node is this host.
    pub host: Option<gpu_sysfs::OpenedRoot>,
}

impl Target {
    /// The host to look for holders on.
    pub fn host(&self) -> Option<&dyn gpu_sysfs::Host> {
        self.host.as_ref().map(|h| h.host())
    }
}

/// The node to check against: the fleet file's node named `want` (or `--node`, or its only
/// node), else this host, discovered.
///
/// # Errors
/// A fleet file that cannot be read or lacks the node; a host that cannot be discovered.
pub fn target(g: &Global, inventory: Option<&Path>, want: Option<&str>) -> anyhow::Result<Target> {
    let Some(path) = inventory else {
        let node = g.node_name();
        gpu_core::validate_name(&node).context("--node")?;
        let req = gpu_health::NodeRequest::new(node);
        let composed = crate::common::open_node(g, &req)?;
        return Ok(Target {
            node: composed.topology,
            host: Some(composed.host),
        });
    };
    let (nodes, _) = crate::common::load_nodes(g, Some(path))?;
    let want = want.or(g.node.as_deref());
    let node = match (want, nodes.len()) {
        (Some(name), _) => nodes
            .into_iter()
            .find(|n| n.node == name)
            .with_context(|| format!("node {name} is not in the fleet file {}", path.display()))?,
        (None, 1) => nodes.into_iter().next().context("empty fleet")?,
        (None, n) => bail!("the fleet has {n} nodes; name one with --node"),
    };
    Ok(Target { node, host: None })
}

/// Reads the allocation of a file (see [`handoff::allocations_in`]): the only one, or
/// `machine`'s.
///
/// # Errors
/// A file that cannot be read or decoded, or holds no allocation or several (without `machine`).
pub fn read_allocation(path: &Path, machine: Option<&str>) -> anyhow::Result<Allocation> {
    let text = read_input(path, "allocation")?;
    let mut allocations = handoff::allocations_in(&text, machine)
        .with_context(|| format!("allocation file {}", path.display()))?;
    match allocations.len() {
        1 => Ok(allocations.remove(0)),
        0 => bail!(
            "allocation file {} holds no allocation{}",
            path.display(),
            machine
                .map(|m| format!(" for machine {m}"))
                .unwrap_or_default()
        ),
        n => bail!(
            "allocation file {} holds {n} allocations; pick one with --machine",
            path.display()
        ),
    }
}

/// The one check of `allocation` against `target` for a hand-off now: the allocation fits the
/// node, and each device exists and is not another owner's (`force`: warned only). Prints the
/// warnings on stderr and returns the devices.
///
/// # Errors
/// The check's refusal, with a hint where the node is this host under another name.
pub fn checked_allocation(
    target: &Target,
    allocation: &Allocation,
    force: bool,
) -> anyhow::Result<Vec<VmDevice>> {
    if target.host.is_some() && allocation.node != target.node.node {
        bail!(
            "the allocation of Machine {} is for node {}, but this host is node {} (pass --node \
             {} if that is this host's name, or --inventory FLEET)",
            allocation.machine,
            allocation.node,
            target.node.node,
            allocation.node
        );
    }
    let (devices, warnings) =
        handoff::allocation_handoff(allocation, &target.node, target.host(), force)?;
    warn(&warnings);
    Ok(devices)
}

/// [`handoff::check_devices`] on `devices`, warnings printed on stderr.
///
/// # Errors
/// The check's refusal.
pub fn checked_devices(target: &Target, devices: &[VmDevice], force: bool) -> anyhow::Result<()> {
    let warnings = handoff::check_devices(&target.node, devices, target.host(), force)?;
    warn(&warnings);
    Ok(())
}

fn warn(warnings: &[String]) {
    for w in warnings {
        eprintln!("gpuslice: warning: {w}");
    }
}
