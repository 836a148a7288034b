//! Mediated devices: create an instance of a type on a parent under a given UUID, remove it.
//!
//! A Machine's instance UUID is stable ([`MdevUuid::for_machine`]), so starting the Machine again
//! asks for the same UUID: finding it already there with the same type and parent is success,
//! not an error. The kernel checks UUIDs across all parents (`EEXIST`), so the same UUID with
//! another type or parent is reported with both sides named.

use serde::{Deserialize, Serialize};

use gpu_core::{MdevUuid, ParentId, VgpuTypeId, nvidia};

use super::handoff::Handoff;
use super::inuse::{holder_of, refuse_if_open};
use super::{ActuateError, Result, link_name, write};
use crate::host::Host;

/// What to create: an instance of `type_id` on `parent` named `uuid`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MdevCreate {
    /// The mdev parent (`0000:08:00.4`, `mbochs`).
    pub parent: ParentId,
    /// The type directory name (`nvidia-746`, `mbochs-small`).
    pub type_id: VgpuTypeId,
    /// The instance UUID.
    pub uuid: MdevUuid,
}

/// An mdev instance that exists after [`create_mdev`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MdevInstance {
    /// The instance UUID.
    pub uuid: MdevUuid,
    /// Its parent.
    pub parent: ParentId,
    /// Its type.
    pub type_id: VgpuTypeId,
    /// The type's `name`, when readable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub type_name: Option<String>,
    /// True when this call created it; false when it was already there.
    pub changed: bool,
    /// `/sys/bus/mdev/devices/<uuid>`.
    pub sysfs_path: String,
    /// How to hand it to a VM.
    pub handoff: Handoff,
    /// The process holding it open, when one does (only reported by [`list_instances`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub held_by: Option<super::Holder>,
}

/// The outcome of [`remove_mdev`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MdevRemoved {
    /// The instance UUID.
    pub uuid: MdevUuid,
    /// Its parent, when it existed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent: Option<ParentId>,
    /// Its type, when it existed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub type_id: Option<VgpuTypeId>,
    /// True when this call removed it; false when there was no such instance.
    pub changed: bool,
    /// Why an instance of that UUID could not be reached when there is an entry for it (a link
    /// leading outside the root, a parent that cannot be read): it is not reported as absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub warning: Option<String>,
}

fn instance_link(uuid: &MdevUuid) -> String {
    format!("sys/bus/mdev/devices/{uuid}")
}

fn parent_link(parent: &ParentId) -> String {
    format!("sys/class/mdev_bus/{parent}")
}

fn require_parent(host: &dyn Host, parent: &ParentId) -> Result<String> {
    let p = parent_link(parent);
    if host.exists(&p) {
        Ok(p)
    } else {
        Err(ActuateError::NotFound {
            what: format!("mdev parent {parent}"),
            path: format!("/{p}"),
        })
    }
}

/// The types a parent offers: `(type directory, name)`, in directory order.
///
/// # Errors
/// [`ActuateError::NotFound`] when the parent is not registered with mdev;
/// [`ActuateError::Read`] when its type directory cannot be listed.
pub fn mdev_types(host: &dyn Host, parent: &ParentId) -> Result<Vec<(VgpuTypeId, Option<String>)>> {
    let p = require_parent(host, parent)?;
    let dir = format!("{p}/mdev_supported_types");
    let entries = host.list(&dir).map_err(|e| ActuateError::read(&dir, e))?;
    Ok(entries
        .into_iter()
        .filter_map(|e| e.parse::<VgpuTypeId>().ok())
        .map(|id| {
            let name = host.read_string(&format!("{dir}/{id}/name")).ok();
            (id, name)
        })
        .collect())
}

/// Resolves a profile given as a type directory (`nvidia-746`), a type number (`746`) or a type
/// name (`A2-4Q`, `NVIDIA A2-4Q`, `mbochs-small`) to the parent's type directory.
///
/// # Errors
/// [`ActuateError::UnknownProfile`] listing what the parent offers; errors of [`mdev_types`].
pub fn resolve_mdev_profile(
    host: &dyn Host,
    parent: &ParentId,
    profile: &str,
) -> Result<VgpuTypeId> {
    let types = mdev_types(host, parent)?;
    let p = profile.trim();
    let found = types
        .iter()
        .find(|(id, _)| id.as_str() == p)
        .or_else(|| {
            types
                .iter()
                .find(|(_, n)| n.as_deref().is_some_and(|n| nvidia::names_match(n, p)))
        })
        .or_else(|| {
            let num: u32 = p.parse().ok()?;
            types.iter().find(|(id, _)| id.number() == Some(num))
        });
    match found {
        Some((id, _)) => Ok(id.clone()),
        None => Err(ActuateError::UnknownProfile {
            parent: parent.to_string(),
            profile: profile.to_owned(),
            offered: offered(&types),
        }),
    }
}

fn offered(types: &[(VgpuTypeId, Option<String>)]) -> String {
    if types.is_empty() {
        return "nothing".to_owned();
    }
    types
        .iter()
        .map(|(id, n)| match n {
            Some(n) if n != id.as_str() => format!("{id} ({n})"),
            _ => id.to_string(),
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// Where an existing instance is: its parent (the name under `sys/class/mdev_bus` whose
/// directory holds it) and its type.
fn locate(host: &dyn Host, uuid: &MdevUuid) -> Option<(ParentId, VgpuTypeId)> {
    let link = instance_link(uuid);
    let dir = host.canonicalize(&link).ok()?;
    let type_id: VgpuTypeId = link_name(host, &format!("{link}/mdev_type"))?
        .parse()
        .ok()?;
    let parent_dir = dir.rsplit_once('/')?.0.to_owned();
    let parents = host.list("sys/class/mdev_bus").ok()?;
    let parent = parents.into_iter().find(|p| {
        host.canonicalize(&format!("sys/class/mdev_bus/{p}"))
            .is_ok_and(|c| c == parent_dir)
    });
    let parent = match parent {
        Some(p) => p.parse().ok()?,
        // The parent's view is gone (driver unloaded): name it by its directory.
        None => parent_dir.rsplit('/').next()?.parse().ok()?,
    };
    Some((parent, type_id))
}

fn instance(
    host: &dyn Host,
    uuid: MdevUuid,
    parent: ParentId,
    type_id: VgpuTypeId,
    changed: bool,
) -> MdevInstance {
    let type_name = host
        .read_string(&format!("{}/mdev_type/name", instance_link(&uuid)))
        .ok();
    MdevInstance {
        sysfs_path: format!("/{}", instance_link(&uuid)),
        handoff: Handoff::mdev_on(host, &uuid),
        uuid,
        parent,
        type_id,
        type_name,
        changed,
        held_by: None,
    }
}

/// Creates an instance of `req.type_id` on `req.parent` named `req.uuid`.
///
/// Idempotent: when an instance with this UUID, type and parent exists, it is returned with
/// `changed: false` and nothing is written.
///
/// # Errors
/// - [`ActuateError::NotFound`]: no such parent or type;
/// - [`ActuateError::ExistsOtherType`]: the UUID is used by an instance of another type or parent;
/// - [`ActuateError::Exhausted`]: no capacity left (`ENOSPC`, `EUSERS`);
/// - [`ActuateError::Exists`], [`ActuateError::InvalidArgument`], [`ActuateError::Unexpected`]:
///   other refusals of the write to `create`;
/// - [`ActuateError::NotApplied`]: the write succeeded but no instance appeared.
pub fn create_mdev(host: &dyn Host, req: &MdevCreate) -> Result<MdevInstance> {
    let p = require_parent(host, &req.parent)?;
    let tdir = format!("{p}/mdev_supported_types/{}", req.type_id);
    if !host.exists(&tdir) {
        let types = mdev_types(host, &req.parent)?;
        return Err(ActuateError::UnknownProfile {
            parent: req.parent.to_string(),
            profile: req.type_id.to_string(),
            offered: offered(&types),
        });
    }
    if host.exists(&instance_link(&req.uuid)) {
        return match locate(host, &req.uuid) {
            Some((parent, type_id)) if parent == req.parent && type_id == req.type_id => {
                Ok(instance(host, req.uuid, parent, type_id, false))
            }
            Some((parent, type_id)) => Err(ActuateError::ExistsOtherType {
                uuid: req.uuid.to_string(),
                existing: type_id.to_string(),
                existing_parent: parent.to_string(),
                requested: req.type_id.to_string(),
                requested_parent: req.parent.to_string(),
            }),
            None => Err(ActuateError::Exists {
                path: format!("/{}", instance_link(&req.uuid)),
                detail: ": an mdev with this UUID exists but its type cannot be read".to_owned(),
            }),
        };
    }
    let create = format!("{tdir}/create");
    write(host, &create, req.uuid.to_string().as_bytes())?;
    if !host.exists(&instance_link(&req.uuid)) {
        return Err(ActuateError::NotApplied {
            path: format!("/{}", instance_link(&req.uuid)),
            wrote: req.uuid.to_string(),
            found: "no such instance".to_owned(),
        });
    }
    Ok(instance(
        host,
        req.uuid,
        req.parent.clone(),
        req.type_id.clone(),
        true,
    ))
}

/// Creates several instances; when one fails, the ones this call created are removed again, so
/// the host is left as it was.
///
/// # Errors
/// The error of the failed creation; [`ActuateError::RollbackIncomplete`] when removing the
/// instances already created failed too.
pub fn create_mdevs(host: &dyn Host, reqs: &[MdevCreate]) -> Result<Vec<MdevInstance>> {
    let mut done: Vec<MdevInstance> = Vec::with_capacity(reqs.len());
    for req in reqs {
        match create_mdev(host, req) {
            Ok(i) => done.push(i),
            Err(e) => {
                let mut leftover = Vec::new();
                for i in done.iter().rev().filter(|i| i.changed) {
                    if let Err(r) = remove_mdev(host, &i.uuid, true) {
                        leftover.push(format!("mdev {} ({r})", i.uuid));
                    }
                }
                return Err(if leftover.is_empty() {
                    e
                } else {
                    ActuateError::RollbackIncomplete {
                        source: Box::new(e),
                        leftover: leftover.join(", "),
                    }
                });
            }
        }
    }
    Ok(done)
}

/// Removes the instance `uuid`, returning its capacity to the parent's pool.
///
/// Idempotent: no such instance is success with `changed: false`. An instance whose VFIO device
/// is open (a running VM) is refused unless `force`.
///
/// # Errors
/// [`ActuateError::InUse`]; errors of the write to `remove`; [`ActuateError::NotApplied`] when
/// the instance is still there afterwards.
pub fn remove_mdev(host: &dyn Host, uuid: &MdevUuid, force: bool) -> Result<MdevRemoved> {
    let link = instance_link(uuid);
    if !host.exists(&link) {
        return Ok(MdevRemoved {
            uuid: *uuid,
            parent: None,
            type_id: None,
            changed: false,
            warning: unreachable_instance(host, uuid),
        });
    }
    let (parent, type_id) = match locate(host, uuid) {
        Some((p, t)) => (Some(p), Some(t)),
        None => (None, None),
    };
    refuse_if_open(host, &format!("mdev {uuid}"), &link, force)?;
    write(host, &format!("{link}/remove"), b"1")?;
    if host.exists(&link) {
        return Err(ActuateError::NotApplied {
            path: format!("/{link}/remove"),
            wrote: "1".to_owned(),
            found: "the instance is still there".to_owned(),
        });
    }
    Ok(MdevRemoved {
        uuid: *uuid,
        parent,
        type_id,
        changed: true,
        warning: None,
    })
}

/// Why the entry `sys/bus/mdev/devices/<uuid>` is there but names no instance that can be read:
/// a link leading outside the root (named, with its target), a dangling link, or a parent or type
/// that cannot be read. `None` when there is no entry at all, or the instance reads fine.
pub fn unreachable_instance(host: &dyn Host, uuid: &MdevUuid) -> Option<String> {
    let link = instance_link(uuid);
    let target = host.read_link(&link).ok();
    if host.exists(&link) {
        if locate(host, uuid).is_some() {
            return None;
        }
        return Some(format!(
            "/{link} is there, but its parent or type cannot be read (a link in its path is \
             broken or leads outside the root); not reported as absent"
        ));
    }
    let target = target?.to_string_lossy().into_owned();
    Some(match host.canonicalize(&link) {
        Err(e) if crate::is_outside_root(&e) => {
            format!("/{link} -> {target} cannot be followed: {e}; not reported as absent")
        }
        // Absolute: the host's `/` under a root, but the machine's for the OS.
        _ if target.starts_with('/') => format!(
            "/{link} -> {target} cannot be followed: an absolute link leads outside the root; \
             not reported as absent"
        ),
        _ => format!("/{link} -> {target} leads nowhere that can be read; not reported as absent"),
    })
}

/// Every mdev instance on the host (`/sys/bus/mdev/devices`), with its parent, type and holder.
///
/// # Errors
/// [`ActuateError::Read`] when the directory exists but cannot be listed.
pub fn list_instances(host: &dyn Host) -> Result<Vec<MdevInstance>> {
    let dir = "sys/bus/mdev/devices";
    let Some(entries) = (match host.list(dir) {
        Ok(e) => Some(e),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => return Err(ActuateError::read(dir, e)),
    }) else {
        return Ok(Vec::new());
    };
    let mut out = Vec::new();
    for e in entries {
        let Ok(uuid) = e.parse::<MdevUuid>() else {
            continue;
        };
        let Some((parent, type_id)) = locate(host, &uuid) else {
            continue;
        };
        let mut i = instance(host, uuid, parent, type_id, false);
        i.held_by = holder_of(host, &instance_link(&uuid));
        out.push(i);
    }
    Ok(out)
}

/// Why a GPU with `vfs` has no mdev parent: VFs held by another driver than `nvidia` are named
/// with their driver and the fix (a `vfio-pci.ids=` that also matches the VFs' device ID, or a
/// `driver_override`, grabs them before the vGPU manager); else the driver or SR-IOV is missing.
fn no_parent_why(host: &dyn Host, vfs: &[gpu_core::PciAddress]) -> String {
    let elsewhere: Vec<String> = vfs
        .iter()
        .filter_map(|vf| {
            let driver = super::pci_driver(host, vf)?;
            (driver != "nvidia").then(|| format!("{vf} ({driver})"))
        })
        .collect();
    match elsewhere.as_slice() {
        [] => "neither it nor its VFs are mdev parents (is the vGPU host driver loaded and SR-IOV \
               enabled?)"
            .to_owned(),
        [first, ..] => format!(
            "its VFs are bound to another driver than nvidia ({} of {}, first {first}), so the \
             vGPU manager offers no types on them: take the VFs' device ID out of \
             `vfio-pci.ids=` (kernel command line or modprobe.d), clear each VF's \
             driver_override, unbind it and write its address to /sys/bus/pci/drivers_probe \
             (`gpuslice doctor` names each VF)",
            elsewhere.len(),
            vfs.len()
        ),
    }
}

/// The mdev parent of the physical GPU `gpu` that an instance of `profile` named `uuid` goes
/// to, and the type there: the one rule every road that creates on a GPU shares (`vgpu create`,
/// the agent's `POST /v1/vgpus`, a layout's creations). The parents are the GPU itself when it is
/// a parent (T4 and older), then its VFs in VF order (Ampere SR-IOV cards, where each VF is a
/// parent); the first that can take one more and is not in `exclude` (parents a layout keeps for
/// its later creations) is chosen. When `uuid` already exists with this type on a parent of this
/// GPU, that parent is the answer (a restart asks again for the same instance). Reads only.
///
/// # Errors
/// [`ActuateError::Unsupported`] when neither the GPU nor its VFs are mdev parents,
/// [`ActuateError::UnknownProfile`] when the first parent does not offer the profile,
/// [`ActuateError::Exhausted`] when none has room.
pub fn mdev_parent_on_gpu(
    host: &dyn Host,
    gpu: &gpu_core::PciAddress,
    profile: &str,
    uuid: Option<&MdevUuid>,
    exclude: &[ParentId],
) -> Result<(ParentId, VgpuTypeId)> {
    let vfs = super::vendor::vfs_of(host, gpu);
    let mut parents: Vec<ParentId> = vec![ParentId::Pci(*gpu)];
    parents.extend(vfs.iter().copied().map(ParentId::Pci));
    parents.retain(|p| host.exists(&parent_link(p)));
    let Some(first) = parents.first() else {
        return Err(ActuateError::Unsupported {
            device: gpu.to_string(),
            why: no_parent_why(host, &vfs),
        });
    };
    let type_id = resolve_mdev_profile(host, first, profile)?;
    if let Some((parent, existing)) = uuid.and_then(|u| locate(host, u)) {
        if parents.contains(&parent) && existing == type_id {
            return Ok((parent, existing));
        }
    }
    let free = parents.iter().filter(|p| !exclude.contains(p)).find(|p| {
        host.read_string(&format!(
            "{}/mdev_supported_types/{type_id}/available_instances",
            parent_link(p)
        ))
        .ok()
        .and_then(|s| s.parse::<u32>().ok())
        .is_some_and(|n| n > 0)
    });
    match free {
        Some(parent) => Ok((parent.clone(), type_id)),
        None => Err(ActuateError::Exhausted {
            path: format!(
                "/sys/bus/pci/devices/{gpu} (every mdev parent of the GPU, type {type_id})"
            ),
            errno: "available_instances 0".to_owned(),
        }),
    }
}

/// Creates an instance of `profile` named `uuid` on the parent of the physical GPU `gpu` that
/// [`mdev_parent_on_gpu`] chooses.
///
/// Idempotent across restarts: when `uuid` already exists with this type on a parent of this GPU,
/// it is returned with `changed: false` instead of another VF being picked.
///
/// # Errors
/// The errors of [`mdev_parent_on_gpu`] and [`create_mdev`].
pub fn create_mdev_on_gpu(
    host: &dyn Host,
    gpu: &gpu_core::PciAddress,
    profile: &str,
    uuid: MdevUuid,
) -> Result<MdevInstance> {
    let (parent, type_id) = mdev_parent_on_gpu(host, gpu, profile, Some(&uuid), &[])?;
    create_mdev(
        host,
        &MdevCreate {
            parent,
            type_id,
            uuid,
        },
    )
}
