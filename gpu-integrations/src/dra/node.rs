//! What a planned prepare means for the node, without touching it: the identity of each device
//! an action makes, what discovery reads again after it, and the answer `gpuslice dra prepare`
//! prints (the QEMU and libvirt hand-off). Carrying the plan out on the host, and undoing it, is
//! the one writer's (`gpu_node::dra`).

use gpu_core::{NodeTopology, PciAddress};
use gpu_sysfs::discover::Change;
use serde::Serialize;

use super::prepare::{PrepareAction, PreparedClaim};
use crate::handoff::{self, VmDevice, VmHandoff};

/// The host identity of the device an action makes (a GPU's or VF's address, an mdev UUID):
/// two records naming one identity claim one device.
pub fn identity(a: &PrepareAction) -> String {
    match a {
        PrepareAction::BindGpu { address, .. } => address.to_string(),
        PrepareAction::CreateMdev { uuid, .. } => uuid.to_string(),
        PrepareAction::SetVfType { vf, .. } => vf.to_string(),
    }
}

/// What discovery reads again after `a` ran or was undone: the mdev parent of a vGPU (with
/// the pool it shares), the PCI function of a bound GPU or a VF.
pub fn change_of(a: &PrepareAction) -> Change {
    match a {
        PrepareAction::BindGpu { address, .. } => Change::Pci(*address),
        PrepareAction::CreateMdev { parent, .. } => Change::MdevParent(parent.to_string()),
        PrepareAction::SetVfType { vf, .. } => Change::Pci(*vf),
    }
}

/// What `dra prepare` answers the kubelet plugin wrapper: the claim's changes and the devices to
/// hand to the VM.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PrepareAnswer {
    /// The claim's UID.
    pub claim_uid: String,
    /// The node.
    pub node: String,
    /// The changes prepare made (or plans, for a dry run).
    pub actions: Vec<PrepareAction>,
    /// Devices the claim holds that were already in place before prepare (unprepare leaves them).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub found: Vec<PrepareAction>,
    /// QEMU arguments and libvirt XML for all devices the claim holds, found ones included.
    #[serde(flatten)]
    pub handoff: VmHandoff,
    /// True when this call changed nothing (already prepared, or a dry run).
    pub unchanged: bool,
}

impl PrepareAnswer {
    /// The answer for `claim`; `node` reads the node's topology (only when a GPU was bound,
    /// for its companion functions).
    pub fn new(
        claim: &PreparedClaim,
        unchanged: bool,
        node: impl FnOnce() -> Option<NodeTopology>,
    ) -> Self {
        PrepareAnswer {
            claim_uid: claim.claim_uid.clone(),
            node: claim.node.clone(),
            actions: claim.actions.clone(),
            found: claim.found.clone(),
            handoff: VmHandoff::of(&vm_devices(
                &claim.held().cloned().collect::<Vec<_>>(),
                node,
            )),
            unchanged,
        }
    }
}

/// The devices a VM is handed for `actions`: a bound GPU with its companion functions as `node`
/// shows them (read once, only when a GPU was bound; the GPU alone when it cannot be read),
/// an mdev by UUID, a VF by address.
pub fn vm_devices(
    actions: &[PrepareAction],
    node: impl FnOnce() -> Option<NodeTopology>,
) -> Vec<VmDevice> {
    let mut node = Some(node);
    let mut topology: Option<NodeTopology> = None;
    let mut functions = |address: PciAddress| {
        if let Some(read) = node.take() {
            topology = read();
        }
        topology
            .as_ref()
            .and_then(|t| handoff::address_devices(t, &address).ok())
            .unwrap_or_else(|| vec![VmDevice::Pci { address }])
    };
    let mut out = Vec::new();
    for a in actions {
        match a {
            PrepareAction::BindGpu { address, .. } => out.extend(functions(*address)),
            PrepareAction::CreateMdev { uuid, .. } => out.push(VmDevice::Mdev { uuid: *uuid }),
            PrepareAction::SetVfType { vf, .. } => out.push(VmDevice::Pci { address: *vf }),
        }
    }
    out
}
