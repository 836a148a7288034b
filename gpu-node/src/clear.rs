//! Clearing vGPUs without a layout: every vGPU of some GPUs, or of the whole host
//! ([`Node::clear_vgpus`]), with the in-use rules of one removal checked for all of them before
//! the first is removed.

use gpu_core::{ParentId, PciAddress};
use gpu_sysfs::Host;
use gpu_sysfs::actuate::{ActuateError, Holder, VgpuListing};
use serde::Serialize;

use crate::NodeError;
use crate::node::{Node, Removed, VgpuId};

/// Which vGPUs [`Node::clear_vgpus`] removes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClearScope {
    /// Every vGPU on the host: mdev instances on any parent (virtual ones too) and every
    /// vendor-VFIO VF with a type.
    All,
    /// The vGPUs of these physical GPUs: mdev instances on the GPU or on its VFs, and its
    /// vendor-VFIO VFs with a type.
    Gpus(Vec<PciAddress>),
}

impl std::fmt::Display for ClearScope {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ClearScope::All => f.write_str("the host"),
            ClearScope::Gpus(g) => {
                let names: Vec<String> = g.iter().map(ToString::to_string).collect();
                f.write_str(&names.join(", "))
            }
        }
    }
}

/// What [`Node::clear_vgpus`] did (or, in a dry run, would do).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Cleared {
    /// The vGPUs selected, as messages name them (`mdev <uuid>`, `VF <address>`), in the order
    /// they are removed (mdevs, then VFs); empty when there is nothing to clear.
    pub devices: Vec<String>,
    /// The removals; empty in a dry run and when there was nothing to clear.
    pub removed: Vec<Removed>,
    /// True when nothing was written because it was asked so.
    pub dry_run: bool,
}

/// One vGPU the scope selects, and who holds it open.
struct Selected {
    id: VgpuId,
    /// How messages name it (`mdev <uuid>`, `VF <address>`), as a single removal does.
    device: String,
    held_by: Option<Holder>,
}

impl Node<'_> {
    /// Removes every vGPU of `scope`. Every one is checked first: one a process (a VM) holds
    /// open is refused, naming the holder, unless `force`, and then nothing is removed. The
    /// removals run under the host-wide lock, on what the host holds once the lock is taken. A
    /// dry run checks the same and writes nothing.
    ///
    /// # Errors
    /// [`NodeError::List`]; [`NodeError::Clear`] naming a vGPU in use (nothing written);
    /// [`NodeError::Lock`]; [`NodeError::RemoveMdev`], [`NodeError::ClearVf`] for a removal
    /// that failed (those before it stay removed).
    pub fn clear_vgpus(
        &self,
        scope: &ClearScope,
        force: bool,
        dry_run: bool,
    ) -> Result<Cleared, NodeError> {
        let chosen = select(self.host(), &self.list_vgpus()?, scope);
        refuse_held(&chosen, scope, force)?;
        let devices = |c: &[Selected]| c.iter().map(|s| s.device.clone()).collect();
        if chosen.is_empty() || dry_run {
            return Ok(Cleared {
                devices: devices(&chosen),
                removed: vec![],
                dry_run,
            });
        }
        let locked = self.lock()?;
        // Another writer may have changed the host before the lock was ours.
        let chosen = select(self.host(), &self.list_vgpus()?, scope);
        refuse_held(&chosen, scope, force)?;
        let mut removed = Vec::with_capacity(chosen.len());
        for s in &chosen {
            removed.push(locked.remove_vgpu(&s.id, force)?);
        }
        Ok(Cleared {
            devices: devices(&chosen),
            removed,
            dry_run,
        })
    }
}

fn refuse_held(chosen: &[Selected], scope: &ClearScope, force: bool) -> Result<(), NodeError> {
    if force {
        return Ok(());
    }
    match chosen
        .iter()
        .find_map(|s| s.held_by.as_ref().map(|h| (s, h)))
    {
        Some((s, h)) => Err(NodeError::Clear {
            scope: scope.to_string(),
            source: Box::new(ActuateError::InUse {
                device: s.device.clone(),
                holder: h.to_string(),
                node: h.node.clone(),
            }),
        }),
        None => Ok(()),
    }
}

/// The vGPUs of `listing` that `scope` selects.
fn select(host: &dyn Host, listing: &VgpuListing, scope: &ClearScope) -> Vec<Selected> {
    let wanted = |gpu: Option<PciAddress>| match scope {
        ClearScope::All => true,
        ClearScope::Gpus(g) => gpu.is_some_and(|a| g.contains(&a)),
    };
    let mdevs = listing
        .mdevs
        .iter()
        .filter(|m| wanted(gpu_of_parent(host, &m.parent)))
        .map(|m| Selected {
            id: VgpuId::Mdev(m.uuid),
            device: format!("mdev {}", m.uuid),
            held_by: m.held_by.clone(),
        });
    let vfs = listing
        .vendor_vfio
        .iter()
        .filter(|v| wanted(v.pf))
        .map(|v| Selected {
            id: VgpuId::Vf(v.vf),
            device: format!("VF {}", v.vf),
            held_by: v.held_by.clone(),
        });
    mdevs.chain(vfs).collect()
}

/// The physical GPU of an mdev parent: the PF of a VF (its `physfn` link), the function itself
/// otherwise; none for a virtual parent.
fn gpu_of_parent(host: &dyn Host, parent: &ParentId) -> Option<PciAddress> {
    let a = parent.pci()?;
    let physfn = format!("sys/bus/pci/devices/{a}/physfn");
    match host.read_link(&physfn) {
        Ok(target) => target
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| n.parse().ok()),
        Err(_) => Some(a),
    }
}
