//! The one decision behind "create a vGPU on this parent": `gpuslice vgpu create` and the agent's
//! `POST /v1/vgpus` both ask [`create_target`] what the parent they were given is (an mdev parent,
//! a GPU whose VFs are mdev parents, an NVIDIA vendor-VFIO VF or the GPU of such VFs) and which
//! type the profile names there, then make it with [`create_vgpu`].

use gpu_core::{CoreError, MdevUuid, ParentId, PciAddress, VgpuTypeId};
use serde::Serialize;

use super::mdev::{
    MdevCreate, MdevInstance, create_mdev, create_mdev_on_gpu, resolve_mdev_profile,
};
use super::vendor::{
    VfTypeSet, free_vf_for, is_vendor_vfio_vf, resolve_gpu_profile, resolve_vf_profile,
    set_vf_type, vfs_of,
};
use super::{ActuateError, Result};
use crate::host::Host;

/// Where a create puts the vGPU, and its type, as the host shows them now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CreateTarget {
    /// An mdev instance on a parent named directly (`0000:08:00.4`, `mbochs`).
    Mdev {
        /// The parent.
        parent: ParentId,
        /// The parent's type directory for the profile.
        type_id: VgpuTypeId,
    },
    /// An mdev instance on whichever VF of this GPU has room (SR-IOV cards in the mdev
    /// framework, where each VF is a parent); the type is as the first parent lists it.
    MdevOnGpu {
        /// The physical GPU.
        gpu: PciAddress,
        /// The type directory for the profile.
        type_id: VgpuTypeId,
    },
    /// A vendor-VFIO vGPU: the VF given, or a free VF of the GPU given, takes this type.
    VendorVfio {
        /// The VF.
        vf: PciAddress,
        /// The vendor-VFIO type number.
        type_num: u32,
    },
}

impl CreateTarget {
    /// Whether the vGPU is an mdev instance (which needs a UUID).
    pub fn is_mdev(&self) -> bool {
        !matches!(self, CreateTarget::VendorVfio { .. })
    }
}

/// What a create made (`kind` tells which, in the JSON).
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "kind", rename_all = "camelCase")]
pub enum Created {
    /// An mdev instance.
    Mdev(MdevInstance),
    /// A type on a vendor-VFIO VF.
    VendorVfio(VfTypeSet),
}

/// The mdev UUID of the device `index` of request `request` of Machine `machine`, after checking
/// both names; the error names the field that is wrong (`machine` or `request`).
///
/// # Errors
/// The field and why, when a name is not a valid gpuslice name.
pub fn machine_uuid(
    machine: &str,
    request: &str,
    index: u32,
) -> std::result::Result<MdevUuid, (&'static str, CoreError)> {
    gpu_core::validate_name(machine).map_err(|e| ("machine", e))?;
    gpu_core::validate_name(request).map_err(|e| ("request", e))?;
    Ok(MdevUuid::for_machine(machine, request, index))
}

fn is_mdev_parent(host: &dyn Host, parent: &ParentId) -> bool {
    host.exists(&format!("sys/class/mdev_bus/{parent}"))
}

/// Decides what a create of `profile` on `parent` makes: `parent` is an mdev parent, else a GPU
/// (by address, or a name `gpu_named` resolves) whose VFs are mdev parents, a vendor-VFIO VF, or
/// the GPU of vendor-VFIO VFs (a free VF that can take the type is picked). Reads only.
///
/// # Errors
/// What `gpu_named` answers; [`ActuateError::UnknownProfile`] when the parent has no such type;
/// [`ActuateError::NotAParent`] when it is none of the above; [`ActuateError::NoFreeVf`] when
/// no VF of the GPU can take the type now.
pub fn create_target<E: From<ActuateError>>(
    host: &dyn Host,
    parent: &ParentId,
    profile: &str,
    gpu_named: impl FnOnce(&str) -> std::result::Result<PciAddress, E>,
) -> std::result::Result<CreateTarget, E> {
    if is_mdev_parent(host, parent) {
        let type_id = resolve_mdev_profile(host, parent, profile)?;
        return Ok(CreateTarget::Mdev {
            parent: parent.clone(),
            type_id,
        });
    }
    let gpu = match parent {
        ParentId::Pci(p) => *p,
        ParentId::Named(n) => gpu_named(n)?,
    };
    let vfs = vfs_of(host, &gpu);
    if let Some(first) = vfs
        .iter()
        .map(|v| ParentId::Pci(*v))
        .find(|v| is_mdev_parent(host, v))
    {
        let type_id = resolve_mdev_profile(host, &first, profile)?;
        return Ok(CreateTarget::MdevOnGpu { gpu, type_id });
    }
    let vf = if is_vendor_vfio_vf(host, &gpu) {
        gpu
    } else {
        if !vfs.iter().any(|v| is_vendor_vfio_vf(host, v)) {
            return Err(ActuateError::NotAParent {
                parent: parent.to_string(),
                gpu: gpu.to_string(),
            }
            .into());
        }
        let num = resolve_gpu_profile(host, &gpu, profile)?;
        free_vf_for(host, &gpu, num).ok_or_else(|| ActuateError::NoFreeVf {
            gpu: gpu.to_string(),
            profile: profile.to_owned(),
        })?
    };
    let type_num = resolve_vf_profile(host, &vf, profile)?;
    Ok(CreateTarget::VendorVfio { vf, type_num })
}

/// Makes what [`create_target`] decided: the mdev instance `uuid`, or the VF's type (`force`:
/// even while a process holds the VF open). Idempotent as the operations it runs.
///
/// # Errors
/// [`ActuateError::Invalid`] for an mdev without a UUID; the errors of [`create_mdev`],
/// [`create_mdev_on_gpu`] and [`set_vf_type`].
pub fn create_vgpu(
    host: &dyn Host,
    target: &CreateTarget,
    uuid: Option<MdevUuid>,
    profile: &str,
    force: bool,
) -> Result<Created> {
    let named = || {
        uuid.ok_or_else(|| {
            ActuateError::Invalid(CoreError::InvalidUuid {
                input: String::new(),
            })
        })
    };
    Ok(match target {
        CreateTarget::Mdev { parent, type_id } => Created::Mdev(create_mdev(
            host,
            &MdevCreate {
                parent: parent.clone(),
                type_id: type_id.clone(),
                uuid: named()?,
            },
        )?),
        CreateTarget::MdevOnGpu { gpu, .. } => {
            Created::Mdev(create_mdev_on_gpu(host, gpu, profile, named()?)?)
        }
        CreateTarget::VendorVfio { vf, type_num } => {
            let set = set_vf_type(host, vf, *type_num, force)?;
            remember_name(host, *type_num, set.type_name.as_deref());
            Created::VendorVfio(set)
        }
    })
}

/// Remembers the name of a type just set ([`crate::remembered`]), as `vgpu apply` does: once the
/// GPU is full no VF lists it, and without NVML its number would go unnamed. Only a memory: a
/// root where it cannot be kept still creates.
fn remember_name(host: &dyn Host, id: u32, name: Option<&str>) {
    let (Some(name), Some(_)) = (name, host.root_dir()) else {
        return;
    };
    let mut memory = crate::remembered::RememberedNames::read(host, None);
    if memory.remember(id, name) {
        let _ = memory.save(host);
    }
}
