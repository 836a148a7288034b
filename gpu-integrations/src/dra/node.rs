//! Carrying out a planned prepare on the host, and undoing it: the node side of
//! `gpuslice dra prepare|unprepare` after [`super::prepare::plan_prepare`] decided what must exist.
//!
//! A prepare runs its actions in order through the actuation layer; when one fails, the ones it
//! already made are undone (newest first) and the error says what could not be undone. Only what
//! the call changed is recorded for unprepare: a device already in the wanted state is held by the
//! claim but left as it is afterwards.

use gpu_core::{NodeTopology, PciAddress};
use gpu_sysfs::Host;
use gpu_sysfs::actuate::{self, ActuateError};
use serde::Serialize;

use super::prepare::{PrepareAction, PreparedClaim};
use crate::error::{IntegrationError, Result, error};
use crate::handoff::{self, VmDevice, VmHandoff};

/// Carries out one action; true when it changed the host (false: already in that state).
///
/// # Errors
/// The actuation layer's refusal; a VF type that is not a vendor-VFIO number.
pub fn apply(host: &dyn Host, a: &PrepareAction) -> Result<bool> {
    let changed = match a {
        PrepareAction::BindGpu { address, .. } => actuate::bind_gpu(host, address)
            .map(|b| b.changed())
            .map_err(|e| IntegrationError::host(address, e))?,
        PrepareAction::CreateMdev {
            parent,
            type_id,
            uuid,
            ..
        } => {
            let req = actuate::MdevCreate {
                parent: parent.clone(),
                type_id: type_id.clone(),
                uuid: *uuid,
            };
            actuate::create_mdev(host, &req)
                .map(|m| m.changed)
                .map_err(|e| IntegrationError::host(uuid, e))?
        }
        PrepareAction::SetVfType { vf, type_id, .. } => {
            let Some(num) = type_id.vendor_vfio_number() else {
                return Err(error!(Invalid, type_id;
                    "type {type_id} of VF {vf} is not a vendor-VFIO number"
                ));
            };
            actuate::set_vf_type(host, vf, num, false)
                .map(|s| s.changed)
                .map_err(|e| IntegrationError::host(vf, e))?
        }
    };
    Ok(changed)
}

/// Undoes `actions` (newest first), going on past failures; returns the failures.
pub fn undo(host: &dyn Host, actions: &[PrepareAction], force: bool) -> Vec<ActuateError> {
    actions
        .iter()
        .rev()
        .filter_map(|a| {
            match a {
                PrepareAction::BindGpu { address, .. } => {
                    actuate::release_gpu(host, address, force).map(|_| ())
                }
                PrepareAction::CreateMdev { uuid, .. } => {
                    actuate::remove_mdev(host, uuid, force).map(|_| ())
                }
                PrepareAction::SetVfType { vf, .. } => {
                    actuate::clear_vf(host, vf, force).map(|_| ())
                }
            }
            .err()
        })
        .collect()
}

fn joined(errors: &[ActuateError]) -> String {
    errors
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}

/// Runs the actions of `planned`; returns the claim to record: `actions` what this call changed,
/// `found` what was already in place. When an action fails, the ones made before it are undone.
///
/// # Errors
/// The failed action (prefixed `claim <uid>: `), with what could not be undone.
pub fn prepare(host: &dyn Host, planned: PreparedClaim) -> Result<PreparedClaim> {
    let mut done = Vec::new();
    let mut found = Vec::new();
    for action in &planned.actions {
        match apply(host, action) {
            Ok(true) => done.push(action.clone()),
            Ok(false) => found.push(action.clone()),
            Err(e) => {
                let undo_errors = undo(host, &done, false);
                let mut e = e;
                if let IntegrationError::Host { also, .. } = &mut e {
                    if !undo_errors.is_empty() {
                        *also = format!(
                            "; undoing the earlier steps also failed: {}",
                            joined(&undo_errors)
                        );
                    }
                }
                return Err(e.context(format!("claim {}", planned.claim_uid)));
            }
        }
    }
    Ok(PreparedClaim {
        actions: done,
        found,
        ..planned
    })
}

/// Undoes what prepare recorded for `claim` (`force`: even while a VM holds a device open);
/// returns the devices removed or released.
///
/// # Errors
/// Every undo that failed (the others are still undone), prefixed `claim <uid>: `.
pub fn unprepare(host: &dyn Host, claim: &PreparedClaim, force: bool) -> Result<Vec<String>> {
    let mut errors = undo(host, &claim.actions, force).into_iter();
    if let Some(first) = errors.next() {
        let rest: Vec<ActuateError> = errors.collect();
        return Err(IntegrationError::Host {
            what: format!("claim {}", claim.claim_uid),
            context: format!("claim {}: ", claim.claim_uid),
            source: Box::new(first),
            also: rest.iter().map(|e| format!("; {e}")).collect(),
        });
    }
    Ok(claim
        .actions
        .iter()
        .map(|x| match x {
            PrepareAction::BindGpu { address, .. } => address.to_string(),
            PrepareAction::CreateMdev { uuid, .. } => uuid.to_string(),
            PrepareAction::SetVfType { vf, .. } => vf.to_string(),
        })
        .collect())
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
