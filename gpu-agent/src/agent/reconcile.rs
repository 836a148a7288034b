//! Reconcile at start: each recorded promise checked against the host, re-created when missing.

use gpu_core::ParentId;
use gpu_node::Target;
use gpu_sysfs::actuate;
use serde::Serialize;

use super::Agent;
use crate::error::{ApiError, chain};
use crate::state::{Device, Phase, Promise};

/// What reconcile found for one promise.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Outcome {
    /// The device was there as recorded.
    Present,
    /// It was missing and was created again with the same identity.
    Recreated,
    /// It was missing and cannot be created again (the message says why); the promise is kept.
    Failed,
    /// The identity is used by another device; the promise is kept, nothing was changed.
    Conflict,
    /// An interrupted create that could not be finished; the promise was dropped.
    Dropped,
    /// A removal recorded as `removing` whose device is gone: the promise was forgotten (a
    /// device the user asked to remove is never re-created).
    Removed,
}

impl Outcome {
    /// The outcome as the JSON spells it (`present`, `recreated`, ...).
    pub fn as_str(&self) -> &'static str {
        match self {
            Outcome::Present => "present",
            Outcome::Recreated => "recreated",
            Outcome::Failed => "failed",
            Outcome::Conflict => "conflict",
            Outcome::Dropped => "dropped",
            Outcome::Removed => "removed",
        }
    }
}

/// One promise and what reconcile did about it.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Reconciled {
    /// The promise.
    pub promise: Promise,
    /// What was found or done.
    pub outcome: Outcome,
    /// Why, for `failed`, `conflict` and `dropped`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

impl Agent {
    /// Re-creates the recorded devices that are missing, and finishes the records of
    /// interrupted creates and removals, under the layout lock. Blocking. A state file that
    /// cannot be written now is left as it is (logged): the next start finishes it, and a
    /// device recorded as `removing` is never re-created.
    ///
    /// # Errors
    /// The lock or the state file's read failing; each promise's own failure is in the report.
    pub fn reconcile_blocking(&self) -> Result<Vec<Reconciled>, ApiError> {
        // Every change goes through the node's one writer, holding the host-wide lock.
        let node = self.node();
        let locked = node.lock()?;
        let _state = self.store.lock()?;
        let mut state = self.load()?;
        let before = state.clone();
        let host = self.host.as_ref();
        let mut report = Vec::new();
        let mut keep = Vec::new();
        for mut p in std::mem::take(&mut state.promises) {
            if p.phase == Phase::Removing {
                let (outcome, message) = finish_removal(host, &p.device);
                if outcome == Outcome::Present {
                    p.phase = Phase::Created;
                    keep.push(p.clone());
                }
                report.push(Reconciled {
                    promise: p,
                    outcome,
                    message,
                });
                continue;
            }
            let (outcome, message) = match &p.device {
                Device::Mdev {
                    uuid,
                    parent,
                    type_id,
                } => {
                    let existing = actuate::list_instances(host)
                        .ok()
                        .and_then(|l| l.into_iter().find(|i| i.uuid == *uuid));
                    match existing {
                        Some(i) if i.parent == *parent && i.type_id == *type_id => {
                            (Outcome::Present, None)
                        }
                        Some(i) if p.phase == Phase::Pending && i.type_id == *type_id => {
                            // An interrupted create on a GPU picked this VF.
                            p.device = Device::Mdev {
                                uuid: *uuid,
                                parent: i.parent,
                                type_id: i.type_id,
                            };
                            (Outcome::Present, None)
                        }
                        Some(i) => (
                            Outcome::Conflict,
                            Some(format!(
                                "mdev {uuid} exists as {} on {}, not {type_id} on {parent}",
                                i.type_id, i.parent
                            )),
                        ),
                        None => match recreate_mdev(&locked, host, parent, type_id, uuid) {
                            Ok(_) => (Outcome::Recreated, None),
                            Err(e) => (Outcome::Failed, Some(chain(&e))),
                        },
                    }
                }
                Device::VendorVfio { vf, type_num } => match actuate::current_type(host, vf) {
                    Ok(t) if t == *type_num => (Outcome::Present, None),
                    Ok(0) => match locked.create_vgpu(&vf_target(vf, *type_num), None, false) {
                        Ok(_) => (Outcome::Recreated, None),
                        Err(e) => (Outcome::Failed, Some(chain(&e))),
                    },
                    Ok(t) => (
                        Outcome::Conflict,
                        Some(format!("VF {vf} has type {t}, not {type_num}")),
                    ),
                    Err(e) => (Outcome::Failed, Some(chain(&e))),
                },
            };
            let outcome = match outcome {
                Outcome::Failed | Outcome::Conflict if p.phase == Phase::Pending => {
                    Outcome::Dropped
                }
                o => o,
            };
            if outcome != Outcome::Dropped {
                if matches!(outcome, Outcome::Present | Outcome::Recreated) {
                    p.phase = Phase::Created;
                }
                keep.push(p.clone());
            }
            if let Some(m) = &message {
                crate::log!(
                    "gpuslice agent: reconcile {}: {:?}: {m}",
                    p.device.id(),
                    outcome
                );
            }
            report.push(Reconciled {
                promise: p,
                outcome,
                message,
            });
        }
        state.promises = keep;
        if state != before {
            if let Err(e) = self.store.save(&state) {
                crate::log!(
                    "gpuslice agent: reconcile: {}; the next start finishes the records",
                    e.message
                );
            }
        }
        Ok(report)
    }
}

/// Creates the recorded mdev `uuid` again through the node's writer: on `parent` as it is, or,
/// for a GPU that is no mdev parent itself, on the VF [`gpu_node::choose_target`] picks (the one
/// holding `uuid` with this type, else the first with room).
fn recreate_mdev(
    locked: &gpu_node::Locked<'_, '_>,
    host: &dyn gpu_sysfs::Host,
    parent: &ParentId,
    type_id: &gpu_core::VgpuTypeId,
    uuid: &gpu_core::MdevUuid,
) -> Result<gpu_sysfs::actuate::Created, gpu_node::NodeError> {
    let on_gpu =
        matches!(parent, ParentId::Pci(_)) && !host.exists(&format!("sys/class/mdev_bus/{parent}"));
    let target = if on_gpu {
        // The recorded parent is an address: never a GPU name to look up.
        let named = |gpu: &str| -> Result<gpu_core::PciAddress, gpu_node::NodeError> {
            let e = actuate::ActuateError::NotAParent {
                parent: parent.to_string(),
                gpu: gpu.to_owned(),
            };
            Err(gpu_node::NodeError::Choose(Box::new(e)))
        };
        locked
            .choose_target(parent, type_id.as_str(), Some(uuid), named)?
            .for_uuid(host, Some(uuid))?
    } else {
        Target::Mdev {
            parent: parent.clone(),
            type_id: type_id.clone(),
            on_gpu: None,
        }
    };
    locked.create_vgpu(&target, Some(*uuid), false)
}

/// Where a recorded vendor-VFIO vGPU goes back: its VF, with its type.
fn vf_target(vf: &gpu_core::PciAddress, type_num: u32) -> Target {
    Target::VendorVfio { vf: *vf, type_num }
}

/// A removal recorded before it was done: the device gone is the removal done (`removed`); the
/// device still there is a removal that did not happen (`present`, the promise kept).
fn finish_removal(host: &dyn gpu_sysfs::Host, device: &Device) -> (Outcome, Option<String>) {
    let still_there = match device {
        Device::Mdev { uuid, .. } => actuate::list_instances(host)
            .map(|l| l.iter().any(|i| i.uuid == *uuid))
            .unwrap_or_else(|_| host.exists(&format!("sys/bus/mdev/devices/{uuid}"))),
        Device::VendorVfio { vf, type_num } => {
            actuate::current_type(host, vf).is_ok_and(|t| t == *type_num)
        }
    };
    if still_there {
        (
            Outcome::Present,
            Some(format!(
                "{} was being removed when the agent stopped, and is still there; its promise \
                 is kept (remove it again to remove it)",
                device.id()
            )),
        )
    } else {
        (Outcome::Removed, None)
    }
}

impl Agent {
    /// A create on a GPU whose VFs are mdev parents records the VF it picked: a retry naming the
    /// GPU is the same promise when the recorded VF is one of that GPU's.
    pub(super) fn picked_on_gpu(&self, recorded: &Device, requested: &Device) -> bool {
        match (recorded, requested) {
            (
                Device::Mdev {
                    parent: ParentId::Pci(vf),
                    type_id: t1,
                    ..
                },
                Device::Mdev {
                    parent: ParentId::Pci(gpu),
                    type_id: t2,
                    ..
                },
            ) => t1 == t2 && actuate::vfs_of(self.host.as_ref(), gpu).contains(vf),
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_outcome_is_named_as_its_json_spells_it() {
        for o in [
            Outcome::Present,
            Outcome::Recreated,
            Outcome::Failed,
            Outcome::Conflict,
            Outcome::Dropped,
            Outcome::Removed,
        ] {
            assert_eq!(serde_json::to_value(&o).ok(), Some(o.as_str().into()));
        }
    }
}
