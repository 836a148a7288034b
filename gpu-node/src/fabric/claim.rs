//! A DRA claim's vGPUs in Fabric Manager's vGPU mode: when its vGPUs sit on several GPUs
//! (peers over NVLink), they must be NVIDIA's kind for NVLink (time-sliced, the whole
//! framebuffer: [`super::vgpu::check_nvlink_type`]) on exactly one partition's GPUs, checked
//! before any write; after the claim's VFs are typed the partition is activated with them
//! (`fmActivateFabricPartitionWithVFs`), in the order of its GPUs.

use gpu_core::{NodeTopology, ParentId, PciAddress};
use gpu_health::fabric::FabricSource;
use gpu_integrations::dra::prepare::PrepareAction;

use super::{FabricError, FabricMode, record};

/// The VFs a planned claim types (vendor-specific VFIO) or makes an mdev on, each with its
/// GPU and the profile.
fn claim_vfs(t: &NodeTopology, actions: &[PrepareAction]) -> Vec<(PciAddress, PciAddress, String)> {
    let gpu_of = |vf: &PciAddress| {
        t.mediated_devices
            .parents
            .iter()
            .find(|p| p.id == ParentId::Pci(*vf))
            .and_then(|p| p.gpu)
    };
    actions
        .iter()
        .filter_map(|a| match a {
            PrepareAction::SetVfType { vf, profile, .. } => Some((*vf, profile.clone())),
            PrepareAction::CreateMdev {
                parent: ParentId::Pci(vf),
                profile,
                ..
            } => Some((*vf, profile.clone())),
            _ => None,
        })
        .filter_map(|(vf, profile)| gpu_of(&vf).map(|g| (vf, g, profile)))
        .collect()
}

/// The partition to activate with the claim's VFs, and the VFs in its GPUs' order: `Ok(None)`
/// unless Fabric Manager runs in vGPU mode and the claim's vGPUs sit on several GPUs.
///
/// # Errors
/// Before any write: [`FabricError::NvlinkVgpu`] for a vGPU NVIDIA does not let use NVLink (or
/// two on one GPU), [`FabricError::NotAPartition`] / [`FabricError::Degraded`] for GPUs that are
/// no healthy partition.
pub fn vgpu_claim_partition(
    t: &NodeTopology,
    actions: &[PrepareAction],
) -> Result<Option<(u32, Vec<PciAddress>)>, FabricError> {
    let Some(f) = t.fabric.as_ref() else {
        return Ok(None);
    };
    if !f.fabric_manager.is_reachable() || f.fabric_manager.mode != Some(FabricMode::Vgpu) {
        return Ok(None);
    }
    let vfs = claim_vfs(t, actions);
    let mut gpus: Vec<PciAddress> = vfs.iter().map(|(_, g, _)| *g).collect();
    gpus.sort();
    gpus.dedup();
    if gpus.len() < 2 {
        return Ok(None);
    }
    for (_, g, profile) in &vfs {
        super::vgpu::check_nvlink_type(t, g, profile)?;
    }
    if gpus.len() != vfs.len() {
        let (_, g, profile) = &vfs[0];
        return Err(FabricError::NvlinkVgpu {
            profile: profile.clone(),
            gpu: super::name_in(t, g),
            why: "the claim has two vGPUs on one GPU, and a vGPU using NVLink takes all of its \
                  GPU's framebuffer"
                .to_owned(),
        });
    }
    let Some(p) = super::claim_partition(t, &gpus)? else {
        return Ok(None);
    };
    let ordered = p
        .addresses
        .iter()
        .filter_map(|g| vfs.iter().find(|(_, x, _)| x == g).map(|(vf, _, _)| *vf))
        .collect();
    Ok(Some((p.id, ordered)))
}

/// The GPUs whose VFs a claim's vGPUs use (for the deactivation at unprepare).
pub fn claim_vf_gpus(t: &NodeTopology, actions: &[PrepareAction]) -> Vec<PciAddress> {
    let mut gpus: Vec<PciAddress> = claim_vfs(t, actions).iter().map(|(_, g, _)| *g).collect();
    gpus.sort();
    gpus.dedup();
    gpus
}

/// Activates partition `id` with `vfs` for a prepared claim.
///
/// # Errors
/// [`FabricError::Unreachable`], [`FabricError::Fm`].
pub fn activate_vfs_for_claim(
    source: &FabricSource,
    host: &dyn gpu_sysfs::Host,
    topology: &NodeTopology,
    id: u32,
    vfs: &[PciAddress],
) -> Result<(), FabricError> {
    let fm = gpu_health::fabric::open_fabric_at(source, host, topology).map_err(|e| {
        FabricError::Unreachable {
            reason: e.to_string(),
        }
    })?;
    fm.activate_with_vfs(id, vfs)
        .map_err(|source| FabricError::Fm {
            action: "activate",
            id,
            source,
        })?;
    record::note(host, id, true);
    Ok(())
}
