//! Choosing where a vGPU goes: the one function every road that creates one asks.
//!
//! A request names a parent or a GPU and a profile. The answer is a concrete place: the mdev
//! parent (a VF of an SR-IOV card when a GPU was named; the rule is
//! [`gpu_sysfs::actuate::mdev_parent_on_gpu`], which a layout's creations follow too) and the
//! type directory there, or the vendor-VFIO VF and the type number. `gpuslice vgpu create`, the
//! agent's `POST /v1/vgpus` and a layout asking for the same profile on the same GPU land on the
//! same parent.

use gpu_core::{MdevUuid, ParentId, PciAddress, VgpuTypeId};
use gpu_sysfs::Host;
use gpu_sysfs::actuate::{self, ActuateError, CreateTarget};
use serde::Serialize;

use crate::NodeError;

/// Where a vGPU goes, and its type there.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(
    tag = "kind",
    rename_all = "camelCase",
    rename_all_fields = "camelCase"
)]
pub enum Target {
    /// An mdev instance.
    Mdev {
        /// The parent it goes on.
        parent: ParentId,
        /// The parent's type directory for the profile.
        type_id: VgpuTypeId,
        /// The GPU the request named, when the parent was chosen among its VFs.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        on_gpu: Option<PciAddress>,
    },
    /// A vendor-VFIO vGPU: the VF takes the type.
    VendorVfio {
        /// The VF.
        vf: PciAddress,
        /// The vendor-VFIO type number.
        type_num: u32,
    },
}

impl Target {
    /// Whether the vGPU is an mdev instance (which needs a UUID).
    pub fn is_mdev(&self) -> bool {
        matches!(self, Target::Mdev { .. })
    }

    /// The parent the vGPU goes on: the mdev parent, or the VF.
    pub fn parent(&self) -> ParentId {
        match self {
            Target::Mdev { parent, .. } => parent.clone(),
            Target::VendorVfio { vf, .. } => ParentId::Pci(*vf),
        }
    }
}

impl Target {
    /// The same target for an mdev named `uuid`: when the parent was chosen among a GPU's VFs
    /// and `uuid` already exists with this type on one of them, that one (a restart asks again
    /// for the same instance). Reads only.
    ///
    /// # Errors
    /// [`NodeError::Choose`], as [`choose_target`].
    pub fn for_uuid(self, host: &dyn Host, uuid: Option<&MdevUuid>) -> Result<Target, NodeError> {
        match (self, uuid) {
            (
                Target::Mdev {
                    type_id,
                    on_gpu: Some(gpu),
                    ..
                },
                Some(u),
            ) => {
                let (parent, type_id) =
                    actuate::mdev_parent_on_gpu(host, &gpu, type_id.as_str(), Some(u), &[])
                        .map_err(|e| NodeError::Choose(Box::new(e)))?;
                Ok(Target::Mdev {
                    parent,
                    type_id,
                    on_gpu: Some(gpu),
                })
            }
            (t, _) => Ok(t),
        }
    }
}

/// Chooses where a vGPU of `profile` asked on `parent` goes: `parent` is an mdev parent (used
/// as is), a GPU (by address, or a name `gpu_named` resolves) whose VFs are mdev parents (the
/// first with room, or the one already holding `uuid` with this type), a vendor-VFIO VF (used as
/// is), or the GPU of vendor-VFIO VFs (its first free VF that lists the type). Reads only.
///
/// # Errors
/// What `gpu_named` answers; [`NodeError::Choose`] with [`ActuateError::UnknownProfile`],
/// [`ActuateError::NotAParent`], [`ActuateError::NoFreeVf`] or [`ActuateError::Exhausted`].
pub fn choose_target<E: From<NodeError>>(
    host: &dyn Host,
    parent: &ParentId,
    profile: &str,
    uuid: Option<&MdevUuid>,
    gpu_named: impl FnOnce(&str) -> Result<PciAddress, E>,
) -> Result<Target, E> {
    choose(host, parent, profile, uuid, &[], gpu_named).map_err(|e| match e {
        Pass::Named(e) => e,
        Pass::Actuate(e) => E::from(crate::full::explained(
            host,
            parent,
            profile,
            NodeError::Choose(Box::new(e)),
        )),
    })
}

/// Where a layout's creation of `profile` on `gpu` goes, chosen right before its write by the
/// rule of [`choose_target`] (the same answer `vgpu create --parent GPU` gets), leaving out
/// `kept`, the parents the plan's later creations on the GPU (and the VFs the layout names) hold.
/// The chooser `gpu-sysfs`'s layout executor is given ([`gpu_sysfs::apply::ApplyOptions`]).
///
/// # Errors
/// [`ActuateError::UnknownProfile`], [`ActuateError::NotAParent`], [`ActuateError::NoFreeVf`]
/// or [`ActuateError::Exhausted`].
pub fn choose_on_gpu(
    host: &dyn Host,
    gpu: &PciAddress,
    profile: &str,
    uuid: Option<&MdevUuid>,
    kept: &[ParentId],
) -> Result<ParentId, ActuateError> {
    let named = |_: &str| Ok::<_, std::convert::Infallible>(*gpu);
    match choose(host, &ParentId::Pci(*gpu), profile, uuid, kept, named) {
        Ok(target) => Ok(target.parent()),
        Err(Pass::Actuate(e)) => Err(e),
        Err(Pass::Named(never)) => match never {},
    }
}

/// The one rule of [`choose_target`] and [`choose_on_gpu`]: where `profile` asked on `parent`
/// goes, leaving out the parents in `kept`.
fn choose<E>(
    host: &dyn Host,
    parent: &ParentId,
    profile: &str,
    uuid: Option<&MdevUuid>,
    kept: &[ParentId],
    gpu_named: impl FnOnce(&str) -> Result<PciAddress, E>,
) -> Result<Target, Pass<E>> {
    let found =
        actuate::create_target(host, parent, profile, |n| gpu_named(n).map_err(Pass::Named))?;
    Ok(match found {
        CreateTarget::Mdev { parent, type_id } => Target::Mdev {
            parent,
            type_id,
            on_gpu: None,
        },
        CreateTarget::MdevOnGpu { gpu, .. } => {
            let (parent, type_id) = actuate::mdev_parent_on_gpu(host, &gpu, profile, uuid, kept)?;
            Target::Mdev {
                parent,
                type_id,
                on_gpu: Some(gpu),
            }
        }
        // A VF a later creation keeps: the next free one by the same rule.
        CreateTarget::VendorVfio { vf, .. } if kept.contains(&ParentId::Pci(vf)) => {
            let gpu = parent.pci().unwrap_or(vf);
            let num = actuate::resolve_gpu_profile(host, &gpu, profile)?;
            let kept: Vec<PciAddress> = kept.iter().filter_map(ParentId::pci).collect();
            let vf = actuate::free_vf_avoiding(host, &gpu, num, &kept).ok_or_else(|| {
                ActuateError::NoFreeVf {
                    gpu: gpu.to_string(),
                    profile: profile.to_owned(),
                }
            })?;
            let type_num = actuate::resolve_vf_profile(host, &vf, profile)?;
            Target::VendorVfio { vf, type_num }
        }
        CreateTarget::VendorVfio { vf, type_num } => Target::VendorVfio { vf, type_num },
    })
}

/// [`actuate::create_target`]'s error: the caller's lookup failed (carried through untouched),
/// or actuation did.
enum Pass<E> {
    Named(E),
    Actuate(ActuateError),
}

impl<E> From<ActuateError> for Pass<E> {
    fn from(e: ActuateError) -> Self {
        Pass::Actuate(e)
    }
}
