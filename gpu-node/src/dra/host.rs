//! Carrying out a planned prepare on the host, and undoing it, after
//! [`gpu_integrations::dra::prepare::plan_prepare`] decided what must exist.
//!
//! A prepare runs its actions in order through the actuation layer; when one fails, the ones it
//! already made are undone (newest first) and the error says what could not be undone. Only what
//! the call changed is recorded for unprepare: a device already in the wanted state is held by the
//! claim but left as it is afterwards.

use gpu_integrations::dra::node::identity;
use gpu_integrations::dra::prepare::{PrepareAction, PreparedClaim};
use gpu_integrations::{IntegrationError, Result};
use gpu_sysfs::Host;
use gpu_sysfs::actuate::{self, ActuateError};

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
                return Err(IntegrationError::Invalid {
                    what: type_id.to_string(),
                    why: format!("type {type_id} of VF {vf} is not a vendor-VFIO number"),
                });
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
