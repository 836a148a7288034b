//! NVIDIA vendor-specific VFIO (vGPU 17+ on Ada, Hopper, Blackwell): a VF takes one vGPU type by
//! a write of the type's decimal ID to `nvidia/current_vgpu_type`, and gives it back with `0`.
//!
//! `nvidia/creatable_vgpu_types` lists what can still be created on the whole GPU; it changes as
//! other VFs take types, so it is read again right before each write. The VM gets the VF itself,
//! and the same VF is reused by the next VM, so clearing or re-typing a VF that a process holds
//! open is refused unless forced.

use serde::{Deserialize, Serialize};

use gpu_core::{PciAddress, VgpuTypeId, nvidia};

use super::handoff::Handoff;
use super::inuse::refuse_if_open;
use super::{ActuateError, Result, pci_dir, read_opt, read_req, require_pci, write};
use crate::host::Host;
use crate::resolver::TypeNameResolver;

/// A VF's type after [`set_vf_type`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct VfTypeSet {
    /// The VF.
    pub vf: PciAddress,
    /// The type's decimal ID.
    pub type_id: VgpuTypeId,
    /// The type's name as the driver lists it, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub type_name: Option<String>,
    /// The type the VF had before (`None` for none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub previous: Option<VgpuTypeId>,
    /// True when this call changed the VF.
    pub changed: bool,
    /// How to hand the VF to a VM.
    pub handoff: Handoff,
    /// The placement the VF reports after the write on a GPU in mixed-size mode
    /// ([`placement_id`]), read back; none where it reports none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub placement_id: Option<u32>,
}

/// The outcome of [`clear_vf`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct VfCleared {
    /// The VF.
    pub vf: PciAddress,
    /// The type it had (`None` when it had none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub previous: Option<VgpuTypeId>,
    /// True when this call cleared a type.
    pub changed: bool,
}

fn current_path(vf: &PciAddress) -> String {
    format!("{}/nvidia/current_vgpu_type", pci_dir(vf))
}

fn creatable_path(vf: &PciAddress) -> String {
    format!("{}/nvidia/creatable_vgpu_types", pci_dir(vf))
}

/// True when `addr` is a VF with NVIDIA's vendor-VFIO files.
pub fn is_vendor_vfio_vf(host: &dyn Host, addr: &PciAddress) -> bool {
    host.exists(&current_path(addr))
}

fn require_vf(host: &dyn Host, vf: &PciAddress) -> Result<()> {
    require_pci(host, vf)?;
    if is_vendor_vfio_vf(host, vf) {
        Ok(())
    } else {
        Err(ActuateError::Unsupported {
            device: vf.to_string(),
            why: "not an NVIDIA vendor-VFIO virtual function (no nvidia/current_vgpu_type); enable SR-IOV with `gpuslice sriov enable <PF>` and use a VF".to_owned(),
        })
    }
}

/// Parses `creatable_vgpu_types`: a header `ID    : vGPU Name`, then `1155  : NVIDIA L40S-24Q`.
pub fn parse_creatable(text: &str) -> Vec<(u32, String)> {
    text.lines()
        .filter_map(|l| {
            let (id, name) = l.split_once(':')?;
            Some((id.trim().parse().ok()?, name.trim().to_owned()))
        })
        .collect()
}

/// What the VF lists as creatable now.
///
/// # Errors
/// [`ActuateError::Read`] when the file cannot be read.
pub fn creatable_types(host: &dyn Host, vf: &PciAddress) -> Result<Vec<(u32, String)>> {
    let path = creatable_path(vf);
    let bytes = host.read(&path).map_err(|e| ActuateError::read(&path, e))?;
    Ok(parse_creatable(&String::from_utf8_lossy(&bytes)))
}

/// The VF's current type ID (`0` = none).
///
/// # Errors
/// [`ActuateError::Read`] when the file cannot be read or does not hold a number.
pub fn current_type(host: &dyn Host, vf: &PciAddress) -> Result<u32> {
    let path = current_path(vf);
    let s = read_req(host, &path)?;
    s.parse().map_err(|_| ActuateError::Read {
        path: path.clone(),
        source: std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("expected a type number, found {s:?}"),
        ),
    })
}

/// Resolves a profile given as a type ID (`1155`) or name (`L40S-24Q`, `NVIDIA L40S-24Q`) against
/// what the VF lists as creatable, then, when it does not list it (a VF that has a type lists
/// nothing), against its sibling VFs on the same GPU.
///
/// # Errors
/// [`ActuateError::UnknownProfile`] listing what is creatable; read errors.
pub fn resolve_vf_profile(host: &dyn Host, vf: &PciAddress, profile: &str) -> Result<u32> {
    require_vf(host, vf)?;
    let types = creatable_types(host, vf)?;
    let p = profile.trim();
    if let Ok(n) = p.parse::<u32>() {
        return Ok(n);
    }
    if let Some((id, _)) = types.iter().find(|(_, name)| nvidia::names_match(name, p)) {
        return Ok(*id);
    }
    let pf: Option<PciAddress> =
        super::link_name(host, &format!("{}/physfn", pci_dir(vf))).and_then(|p| p.parse().ok());
    match pf {
        Some(pf) => resolve_gpu_profile(host, &pf, profile),
        None => Err(ActuateError::UnknownProfile {
            parent: vf.to_string(),
            profile: profile.to_owned(),
            offered: list(&types),
        }),
    }
}

fn list(types: &[(u32, String)]) -> String {
    if types.is_empty() {
        return "none".to_owned();
    }
    types
        .iter()
        .map(|(id, n)| format!("{id} ({n})"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Gives `vf` the vGPU type `type_num`.
///
/// Idempotent when the VF already has this type. A VF with another type is re-typed (cleared,
/// then set; restored when the new type does not take), which is refused while a process holds
/// the VF open unless `force`.
///
/// # Errors
/// - [`ActuateError::Unsupported`]: not a vendor-VFIO VF; [`ActuateError::NotFound`]: no such device;
/// - [`ActuateError::InUse`]: re-typing a VF a process holds open;
/// - [`ActuateError::NotCreatable`]: the type is not creatable on this GPU right now;
/// - errors of the write (`EPERM`, `EIO`, `EINVAL`), [`ActuateError::NotApplied`] when the type did
///   not read back; [`ActuateError::RollbackIncomplete`] when re-typing failed and the old type
///   could not be restored.
pub fn set_vf_type(
    host: &dyn Host,
    vf: &PciAddress,
    type_num: u32,
    force: bool,
) -> Result<VfTypeSet> {
    require_vf(host, vf)?;
    if type_num == 0 {
        return Err(ActuateError::Unsupported {
            device: vf.to_string(),
            why: "type 0 means no type; use remove to clear a VF".to_owned(),
        });
    }
    let path = current_path(vf);
    let current = current_type(host, vf)?;
    let previous = (current != 0).then(|| VgpuTypeId::vendor_vfio(current));
    if current == type_num {
        return Ok(VfTypeSet {
            vf: *vf,
            type_id: VgpuTypeId::vendor_vfio(type_num),
            type_name: name_of_current(host, vf),
            previous,
            changed: false,
            handoff: Handoff::pci_on(host, vf),
            placement_id: placement_id(host, vf),
        });
    }
    if current != 0 {
        refuse_if_open(host, &format!("VF {vf}"), &pci_dir(vf), force)?;
        write(host, &path, b"0")?;
    }
    let restore = |e: ActuateError| -> ActuateError {
        if current == 0 {
            return e;
        }
        match write(host, &path, current.to_string().as_bytes()) {
            Ok(()) => e,
            Err(r) => ActuateError::RollbackIncomplete {
                source: Box::new(e),
                leftover: format!("VF {vf} lost its type {current} ({r})"),
            },
        }
    };
    // The list is GPU-wide and moves as other VFs take types: read it right before writing.
    let creatable = match creatable_types(host, vf) {
        Ok(c) => c,
        Err(e) => return Err(restore(e)),
    };
    let Some((_, name)) = creatable.iter().find(|(id, _)| *id == type_num) else {
        return Err(restore(ActuateError::NotCreatable {
            vf: vf.to_string(),
            type_id: type_num.to_string(),
            creatable: list(&creatable),
        }));
    };
    let name = name.clone();
    if let Err(e) = write(host, &path, type_num.to_string().as_bytes()) {
        return Err(restore(e));
    }
    let now = read_opt(host, &path)?.unwrap_or_default();
    if now != type_num.to_string() {
        return Err(ActuateError::NotApplied {
            path: format!("/{path}"),
            wrote: type_num.to_string(),
            found: now,
        });
    }
    Ok(VfTypeSet {
        vf: *vf,
        type_id: VgpuTypeId::vendor_vfio(type_num),
        type_name: Some(name),
        previous,
        changed: true,
        handoff: Handoff::pci_on(host, vf),
        placement_id: placement_id(host, vf),
    })
}

fn name_of_current(host: &dyn Host, vf: &PciAddress) -> Option<String> {
    // A VF with a type may no longer list it as creatable; its siblings on the GPU might.
    let cur = current_type(host, vf).ok()?;
    creatable_types(host, vf)
        .ok()?
        .into_iter()
        .find(|(id, _)| *id == cur)
        .map(|(_, n)| n)
}

/// Takes the vGPU type off `vf` (writes `0`), returning its share of the GPU.
///
/// Idempotent when the VF has no type. Refused while a process holds the VF open unless `force`.
///
/// # Errors
/// [`ActuateError::Unsupported`], [`ActuateError::NotFound`], [`ActuateError::InUse`], errors of
/// the write, [`ActuateError::NotApplied`] when the type is still set afterwards.
pub fn clear_vf(host: &dyn Host, vf: &PciAddress, force: bool) -> Result<VfCleared> {
    require_vf(host, vf)?;
    let current = current_type(host, vf)?;
    if current == 0 {
        return Ok(VfCleared {
            vf: *vf,
            previous: None,
            changed: false,
        });
    }
    refuse_if_open(host, &format!("VF {vf}"), &pci_dir(vf), force)?;
    let path = current_path(vf);
    write(host, &path, b"0")?;
    let now = current_type(host, vf)?;
    if now != 0 {
        return Err(ActuateError::NotApplied {
            path: format!("/{path}"),
            wrote: "0".to_owned(),
            found: now.to_string(),
        });
    }
    Ok(VfCleared {
        vf: *vf,
        previous: Some(VgpuTypeId::vendor_vfio(current)),
        changed: true,
    })
}

/// The VFs of `pf` (from its `virtfnN` links, in VF order).
pub fn vfs_of(host: &dyn Host, pf: &PciAddress) -> Vec<PciAddress> {
    let dir = pci_dir(pf);
    let mut v: Vec<(u32, PciAddress)> = host
        .list(&dir)
        .unwrap_or_default()
        .into_iter()
        .filter_map(|e| {
            let n: u32 = e.strip_prefix("virtfn")?.parse().ok()?;
            let a: PciAddress = super::link_name(host, &format!("{dir}/{e}"))?
                .parse()
                .ok()?;
            Some((n, a))
        })
        .collect();
    v.sort();
    v.into_iter().map(|(_, a)| a).collect()
}

/// The first VF of `pf` without a type on which `type_num` is creatable and that no process
/// holds open.
pub fn free_vf_for(host: &dyn Host, pf: &PciAddress, type_num: u32) -> Option<PciAddress> {
    free_vf_avoiding(host, pf, type_num, &[])
}

/// [`free_vf_for`], leaving out the VFs in `kept` (those a layout's later steps take).
pub fn free_vf_avoiding(
    host: &dyn Host,
    pf: &PciAddress,
    type_num: u32,
    kept: &[PciAddress],
) -> Option<PciAddress> {
    vfs_of(host, pf).into_iter().find(|vf| {
        !kept.contains(vf)
            && is_vendor_vfio_vf(host, vf)
            && current_type(host, vf).ok() == Some(0)
            && creatable_types(host, vf).is_ok_and(|c| c.iter().any(|(id, _)| *id == type_num))
            && super::holder_of(host, &pci_dir(vf)).is_none()
    })
}

/// A vendor-VFIO VF that has a vGPU type.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct VfInstance {
    /// The VF.
    pub vf: PciAddress,
    /// Its physical function, when the `physfn` link is there.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pf: Option<PciAddress>,
    /// The type's decimal ID.
    pub type_id: VgpuTypeId,
    /// The type's name, when a VF of the GPU still lists it or gpuslice remembers it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub type_name: Option<String>,
    /// The process holding the VF open, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub held_by: Option<super::Holder>,
    /// How to hand the VF to a VM.
    pub handoff: Handoff,
    /// Its placement ID on a GPU in mixed-size mode, as the VF reports it ([`placement_id`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub placement_id: Option<u32>,
}

/// The placement ID a VF reports (`nvidia/placement_id`: a decimal number once a type is set on
/// a GPU in mixed-size mode); `None` where the file is absent, empty or says something else
/// (`Not Applicable`): never guessed.
pub fn placement_id(host: &dyn Host, vf: &PciAddress) -> Option<u32> {
    let bytes = host
        .read(&format!("{}/nvidia/placement_id", pci_dir(vf)))
        .ok()?;
    String::from_utf8_lossy(&bytes).trim().parse().ok()
}

/// Every vendor-VFIO VF on the host that has a type, in address order.
///
/// # Errors
/// [`ActuateError::Read`] when `sys/bus/pci/devices` cannot be listed.
pub fn list_vf_instances(host: &dyn Host) -> Result<Vec<VfInstance>> {
    let dir = "sys/bus/pci/devices";
    let mut addrs: Vec<PciAddress> = host
        .list(dir)
        .map_err(|e| ActuateError::read(dir, e))?
        .iter()
        .filter_map(|e| e.parse().ok())
        .collect();
    addrs.sort();
    let memory = crate::remembered::RememberedNames::read(host, None);
    let mut out = Vec::new();
    for vf in addrs {
        if !is_vendor_vfio_vf(host, &vf) {
            continue;
        }
        let Ok(t) = current_type(host, &vf) else {
            continue;
        };
        if t == 0 {
            continue;
        }
        let pf: Option<PciAddress> = super::link_name(host, &format!("{}/physfn", pci_dir(&vf)))
            .and_then(|p| p.parse().ok());
        // The VF itself no longer lists its type; a sibling with room might; on a full GPU
        // the name gpuslice remembered when it listed or set it (as discovery names it).
        let type_name = name_of_current(host, &vf)
            .or_else(|| {
                let pf = pf?;
                vfs_of(host, &pf).iter().find_map(|s| {
                    creatable_types(host, s)
                        .ok()?
                        .into_iter()
                        .find(|(id, _)| *id == t)
                        .map(|(_, n)| n)
                })
            })
            .or_else(|| memory.resolve(&vf, t).map(|i| i.name));
        out.push(VfInstance {
            held_by: super::holder_of(host, &pci_dir(&vf)),
            handoff: Handoff::pci_on(host, &vf),
            placement_id: placement_id(host, &vf),
            vf,
            pf,
            type_id: VgpuTypeId::vendor_vfio(t),
            type_name,
        });
    }
    Ok(out)
}

/// Resolves a profile (type ID or name) against what any VF of the physical GPU `pf` lists as
/// creatable (a VF that has a type lists nothing).
///
/// # Errors
/// [`ActuateError::UnknownProfile`] listing what the GPU's VFs offer together.
pub fn resolve_gpu_profile(host: &dyn Host, pf: &PciAddress, profile: &str) -> Result<u32> {
    let p = profile.trim();
    if let Ok(n) = p.parse::<u32>() {
        return Ok(n);
    }
    let mut all: Vec<(u32, String)> = Vec::new();
    for vf in vfs_of(host, pf) {
        if !is_vendor_vfio_vf(host, &vf) {
            continue;
        }
        for t in creatable_types(host, &vf).unwrap_or_default() {
            if !all.contains(&t) {
                all.push(t);
            }
        }
    }
    all.sort();
    all.iter()
        .find(|(_, name)| nvidia::names_match(name, p))
        .map(|(id, _)| *id)
        .ok_or_else(|| ActuateError::UnknownProfile {
            parent: pf.to_string(),
            profile: profile.to_owned(),
            offered: list(&all),
        })
}
