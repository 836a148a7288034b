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
use gpu_sysfs::discover::Change;
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

/// The host's boot ID, relative to the root: a reboot changes it, and vGPUs and vfio-pci
/// bindings do not survive a reboot.
pub const BOOT_ID: &str = "proc/sys/kernel/random/boot_id";

/// The boot ID of `host`, `None` when the root has none (a test tree, a copy of a host, a
/// container without `/proc`) or the file does not hold one: reboots are then not seen, and
/// records are trusted as made in this boot.
pub fn boot_id(host: &dyn Host) -> Option<String> {
    let text = host.read_string(BOOT_ID).ok()?;
    let id = text.trim();
    let valid =
        !id.is_empty() && id.len() <= 64 && id.bytes().all(|b| b.is_ascii_hexdigit() || b == b'-');
    valid.then(|| id.to_ascii_lowercase())
}

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

/// The sysfs directories of the device an action makes (a GPU with its companion functions).
fn device_dirs(host: &dyn Host, a: &PrepareAction) -> Vec<String> {
    match a {
        PrepareAction::BindGpu { address, .. } => actuate::card_functions(host, address)
            .unwrap_or_else(|_| vec![*address])
            .iter()
            .map(|f| format!("sys/bus/pci/devices/{f}"))
            .collect(),
        PrepareAction::CreateMdev { uuid, .. } => vec![format!("sys/bus/mdev/devices/{uuid}")],
        PrepareAction::SetVfType { vf, .. } => vec![format!("sys/bus/pci/devices/{vf}")],
    }
}

/// Whether the device of `a` is already as the action would make it: the mdev of that UUID
/// exists, the VF holds the type, the GPU and its companion functions are on vfio-pci. A
/// prepare asks this before its first write, so the record says which devices it will make
/// (undone by unprepare) and which it found (left in place), even if it is killed midway.
pub fn in_place(host: &dyn Host, a: &PrepareAction) -> bool {
    match a {
        PrepareAction::BindGpu { .. } => device_dirs(host, a).iter().all(|d| {
            host.resolve_link(&format!("{d}/driver"))
                .is_ok_and(|t| t.rsplit('/').next() == Some("vfio-pci"))
        }),
        PrepareAction::CreateMdev { uuid, .. } => {
            host.exists(&format!("sys/bus/mdev/devices/{uuid}"))
        }
        PrepareAction::SetVfType { vf, type_id, .. } => type_id
            .vendor_vfio_number()
            .is_some_and(|n| actuate::current_type(host, vf).is_ok_and(|c| c == n)),
    }
}

/// The first device of `actions` a process (a VM) holds open, as the actuation layer's
/// refusal: an unprepare checks every device before it undoes any, so a refused unprepare
/// changes nothing.
///
/// # Errors
/// `in-use`, naming the device and the holder, prefixed `claim <uid>: `.
pub fn refuse_held(host: &dyn Host, uid: &str, actions: &[PrepareAction]) -> Result<()> {
    for a in actions {
        for dir in device_dirs(host, a) {
            if let Some(h) = actuate::holder_of(host, &dir) {
                let device = identity(a);
                return Err(IntegrationError::Host {
                    what: device.clone(),
                    context: format!("claim {uid}: "),
                    source: Box::new(ActuateError::InUse {
                        device,
                        holder: h.to_string(),
                        node: h.node,
                    }),
                    also: "; nothing was changed".to_owned(),
                });
            }
        }
    }
    Ok(())
}

/// A recorded plan that failed: the error, and whether everything the claim made was undone.
#[derive(Debug)]
pub struct PlanFailed {
    /// The failed action (prefixed `claim <uid>: `), with what could not be undone.
    pub error: IntegrationError,
    /// True when every undo succeeded: the claim holds nothing on the host.
    pub undone: bool,
}

/// Runs the actions of a recorded plan (every one of them the claim's to make: a device made
/// by an earlier, interrupted call is left as it is). When one fails, what this claim made is
/// undone: the actions before it, or with `resume` (finishing an interrupted call, which may
/// have got further) every action of the plan, each undo being a no-op for a device not there.
///
/// # Errors
/// [`PlanFailed`]: the failed action and whether the undo was complete.
pub fn run_plan(host: &dyn Host, claim: &PreparedClaim, resume: bool) -> Result<(), PlanFailed> {
    for (i, action) in claim.actions.iter().enumerate() {
        if let Err(mut e) = apply(host, action) {
            let made = if resume {
                &claim.actions[..]
            } else {
                &claim.actions[..i]
            };
            let undo_errors = undo(host, made, false);
            if let IntegrationError::Host { also, .. } = &mut e {
                if !undo_errors.is_empty() {
                    *also = format!(
                        "; undoing the earlier steps also failed: {}",
                        joined(&undo_errors)
                    );
                }
            }
            return Err(PlanFailed {
                error: e.context(format!("claim {}", claim.claim_uid)),
                undone: undo_errors.is_empty(),
            });
        }
    }
    Ok(())
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
