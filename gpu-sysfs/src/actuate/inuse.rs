//! Is a device's VFIO node open by a process?
//!
//! A VM holds a device through `/dev/vfio/<iommu group>` (legacy group interface) or
//! `/dev/vfio/devices/vfioN` (the per-device cdev). Removing an mdev, clearing a VF or unbinding a
//! function a VM holds either blocks in the kernel until the VM lets go, or takes the device from
//! under a running guest; both lose the user's VM. So the file descriptors of every process
//! (`/proc/<pid>/fd/*`, links to what they have open) are checked first.

use serde::{Deserialize, Serialize};

use super::{ActuateError, Result, link_name};
use crate::host::Host;

/// A process holding a VFIO node open.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Holder {
    /// Process ID.
    pub pid: u32,
    /// Its command name (`/proc/<pid>/comm`), when readable.
    pub command: Option<String>,
    /// The node it has open (`/dev/vfio/7`).
    pub node: String,
}

impl std::fmt::Display for Holder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.command {
            Some(c) => write!(f, "pid {} ({c})", self.pid),
            None => write!(f, "pid {}", self.pid),
        }
    }
}

/// The `/dev/vfio` nodes through which a device can be opened: its IOMMU group's node and its
/// VFIO cdev, from the device directory `dir` (`sys/bus/pci/devices/<bdf>`, `sys/bus/mdev/devices/<uuid>`).
pub fn vfio_nodes(host: &dyn Host, dir: &str) -> Vec<String> {
    let mut nodes = Vec::new();
    if let Some(g) = link_name(host, &format!("{dir}/iommu_group")) {
        nodes.push(format!("/dev/vfio/{g}"));
    }
    if let Ok(entries) = host.list(&format!("{dir}/vfio-dev")) {
        for e in entries.into_iter().filter(|e| e.starts_with("vfio")) {
            nodes.push(format!("/dev/vfio/devices/{e}"));
        }
    }
    nodes
}

/// The first process that has one of the device's VFIO nodes open, if any. Processes that vanish
/// or cannot be read while scanning are skipped; a host without `/proc` under the root has none.
pub fn holder_of(host: &dyn Host, dir: &str) -> Option<Holder> {
    let nodes = vfio_nodes(host, dir);
    if nodes.is_empty() {
        return None;
    }
    let mut pids: Vec<u32> = host
        .list("proc")
        .ok()?
        .iter()
        .filter_map(|p| p.parse().ok())
        .collect();
    pids.sort_unstable();
    for pid in pids {
        let Ok(fds) = host.list(&format!("proc/{pid}/fd")) else {
            continue;
        };
        for fd in fds {
            let Ok(target) = host.read_link(&format!("proc/{pid}/fd/{fd}")) else {
                continue;
            };
            let t = target.to_string_lossy();
            if let Some(node) = nodes.iter().find(|n| **n == t) {
                let command = host.read_string(&format!("proc/{pid}/comm")).ok();
                return Some(Holder {
                    pid,
                    command,
                    node: node.clone(),
                });
            }
        }
    }
    None
}

/// Fails with [`ActuateError::InUse`] when the device is held open, unless `force`.
pub(crate) fn refuse_if_open(host: &dyn Host, device: &str, dir: &str, force: bool) -> Result<()> {
    if force {
        return Ok(());
    }
    match holder_of(host, dir) {
        Some(h) => Err(ActuateError::InUse {
            device: device.to_owned(),
            holder: h.to_string(),
            node: h.node,
        }),
        None => Ok(()),
    }
}
