//! GPU instances on request for MIG-backed vGPUs: before a MIG-backed type is written to a VF,
//! a free GPU instance of its profile must exist (NVIDIA: MIG mode on and GPU instances made
//! before the vGPUs, docs/partitions.md); gpuslice makes one where none is free (turning MIG
//! mode on first where nothing uses the GPU) and destroys it again when the vGPU goes (only one
//! it made). A time-sliced type on a GPU in MIG mode turns MIG mode off where nothing uses the
//! GPU, and is refused otherwise, before anything is cleared or written ([`super::ask`]).

use std::collections::BTreeMap;

use gpu_core::{MdevUuid, ParentId, PciAddress};
use gpu_nvml::MigMode;
use gpu_sysfs::actuate::Created;

use super::ask::VgpuAsk;
use super::board::Board;
use super::{InstanceView, Mig, MigError, board, owned};
use crate::node::{Removed, VgpuId};
use crate::{Node, NodeError, Target};

pub use super::board::profile_of_type;

impl Mig<'_, '_> {
    /// How many MIG-backed vGPUs of each profile the VFs of `gpu` hold (from discovery: each
    /// VF's type, by name).
    pub(super) fn held(
        &self,
        gpu: &PciAddress,
        board: &Board,
    ) -> Result<BTreeMap<String, usize>, MigError> {
        let topo = gpu_sysfs::discover::discover(self.host(), self.node.discover)
            .map_err(MigError::Discover)?;
        let mut held: BTreeMap<String, usize> = BTreeMap::new();
        for p in &topo.mediated_devices.parents {
            if p.gpu != Some(*gpu) {
                continue;
            }
            for i in &p.instances {
                let name = i.profile_name.as_deref().unwrap_or_default();
                if let Some(bp) = profile_of_type(board, name) {
                    *held.entry(bp.name.clone()).or_default() += 1;
                }
            }
        }
        Ok(held)
    }

    /// Before a vGPU of `type_name` is made on `gpu`, what MIG needs ([`super::ask`]): for a
    /// MIG-backed type a free GPU instance of its profile (one made here when none is, at the
    /// start that keeps the most later placements, returned), MIG mode turned on first where
    /// nothing uses the GPU; for a time-sliced type on a GPU in MIG mode, MIG mode turned off
    /// where nothing uses it. `Ok(None)`: no instance made (a GPU without MIG, a free instance,
    /// a name that is not NVIDIA's).
    ///
    /// # Errors
    /// What [`Mig::plan_asks`] refuses ([`MigError::InUse`] naming what uses the GPU,
    /// [`MigError::PendingReset`], ...), what the writes answer.
    pub fn before_vgpu(
        &self,
        gpu: &PciAddress,
        type_name: &str,
    ) -> Result<Option<InstanceView>, MigError> {
        let ask = VgpuAsk {
            type_name,
            start: None,
        };
        self.before_one(gpu, ask, false)
    }

    /// [`Mig::before_vgpu`] for a caller that holds the host-wide lock already (the agent's
    /// `POST /v1/vgpus`, a DRA prepare).
    ///
    /// # Errors
    /// As [`Mig::before_vgpu`].
    pub fn before_vgpu_held(
        &self,
        gpu: &PciAddress,
        type_name: &str,
    ) -> Result<Option<InstanceView>, MigError> {
        self.before_vgpu_at_held(gpu, type_name, None)
    }

    /// [`Mig::before_vgpu_held`] with the GPU instance's start decided by the caller (an
    /// allocation's `gpuInstanceStart`): the instance is made there, refused naming the start
    /// when it is not a legal start of the profile ([`MigError::BadStart`]) or is taken
    /// ([`MigError::StartTaken`]).
    ///
    /// # Errors
    /// As [`Mig::before_vgpu`].
    pub fn before_vgpu_at_held(
        &self,
        gpu: &PciAddress,
        type_name: &str,
        start: Option<u8>,
    ) -> Result<Option<InstanceView>, MigError> {
        self.before_one(gpu, VgpuAsk { type_name, start }, true)
    }

    /// After a vGPU of `type_name` left `gpu`: destroys one GPU instance of its profile that
    /// gpuslice made and no vGPU needs any more (none it did not make). The ID destroyed.
    ///
    /// # Errors
    /// What [`Mig::destroy`] answers.
    pub fn after_vgpu(&self, gpu: &PciAddress, type_name: &str) -> Result<Option<u32>, MigError> {
        let Ok(modes) = self.nvml.mig_mode(gpu) else {
            return Ok(None);
        };
        if modes.current != MigMode::Enabled {
            return Ok(None);
        }
        let board = board::read(self.host(), self.nvml, gpu, MigMode::Enabled)?;
        let Some(p) = profile_of_type(&board, type_name) else {
            return Ok(None);
        };
        let all = board::instances(self.nvml, gpu)?;
        let of_profile: Vec<_> = all
            .iter()
            .filter(|gi| Some(gi.profile_id) == p.id)
            .collect();
        let used = self.held(gpu, &board)?.get(&p.name).copied().unwrap_or(0);
        if of_profile.len() <= used {
            return Ok(None);
        }
        let mine = owned::read(self.host());
        let Some(gi) = of_profile
            .iter()
            .rev()
            .find(|gi| owned::made_for_vgpus(&mine, gpu, gi))
        else {
            return Ok(None);
        };
        self.destroy(gpu, gi.id, false).map(|()| Some(gi.id))
    }
}

/// The physical GPU of `parent`: a PF itself, a VF's `physfn`, else the GPU `gpu_named` names.
fn gpu_of<E>(
    node: &Node<'_>,
    parent: &ParentId,
    gpu_named: &impl Fn(&str) -> Result<PciAddress, E>,
) -> Result<PciAddress, E> {
    if let ParentId::Pci(a) = parent {
        return Ok(pf_of(node, a));
    }
    gpu_named(&parent.to_string())
}

/// The physical function of `a`: its `physfn`, else `a` itself.
pub(crate) fn pf_of(node: &Node<'_>, a: &PciAddress) -> PciAddress {
    node.host
        .read_link(&format!("sys/bus/pci/devices/{a}/physfn"))
        .ok()
        .and_then(|t| t.file_name()?.to_str()?.parse().ok())
        .unwrap_or(*a)
}

impl Node<'_> {
    /// [`Node::create_vgpu`] with MIG on request through `mig`: a MIG-backed type gets a GPU
    /// instance first where none is free (destroyed again when the vGPU cannot be made); a
    /// time-sliced type on a GPU in MIG mode is refused before anything is written.
    ///
    /// # Errors
    /// What [`Mig::before_vgpu`] and [`Node::create_vgpu`] answer.
    pub fn create_vgpu_with_mig<E: From<NodeError> + From<MigError>>(
        &self,
        mig: &Mig<'_, '_>,
        parent: &ParentId,
        profile: &str,
        force: bool,
        gpu_named: impl Fn(&str) -> Result<PciAddress, E>,
        name: impl Fn(&Target) -> Result<Option<MdevUuid>, E>,
    ) -> Result<(Created, Option<InstanceView>), E> {
        let gpu = gpu_of(self, parent, &gpu_named)?;
        let made = mig.before_vgpu(&gpu, profile)?;
        match self.create_vgpu(parent, profile, force, gpu_named, name) {
            Ok(c) => Ok((c, made)),
            Err(e) => {
                if let Some(gi) = &made {
                    // Undo what this call made; the vGPU's own error is the answer.
                    let _ = mig.destroy(&gpu, gi.id, false);
                }
                Err(e)
            }
        }
    }

    /// [`Node::remove_vgpu`], then, for a VF that held a MIG-backed type, the GPU instance
    /// gpuslice made for it destroyed ([`Mig::after_vgpu`]).
    ///
    /// # Errors
    /// What [`Node::remove_vgpu`] and [`Mig::after_vgpu`] answer.
    pub fn remove_vgpu_with_mig(
        &self,
        mig: &Mig<'_, '_>,
        id: &VgpuId,
        force: bool,
    ) -> Result<(Removed, Option<u32>), MigError> {
        let before = match id {
            VgpuId::Vf(vf) => self.vf_type_name(vf),
            VgpuId::Mdev(_) => None,
        };
        let removed = self.remove_vgpu(id, force)?;
        let destroyed = match before {
            Some((gpu, name)) if removed.changed() => mig.after_vgpu(&gpu, &name)?,
            _ => None,
        };
        Ok((removed, destroyed))
    }

    /// The PF and type name of the vGPU VF `vf` holds, from discovery.
    fn vf_type_name(&self, vf: &PciAddress) -> Option<(PciAddress, String)> {
        let topo = gpu_sysfs::discover::discover(self.host, self.discover).ok()?;
        topo.mediated_devices.parents.iter().find_map(|p| {
            if p.id != ParentId::Pci(*vf) {
                return None;
            }
            let i = p.instances.first()?;
            Some((p.gpu?, i.profile_name.clone()?))
        })
    }
}

/// [`Node::remove_vgpu_with_mig`] where the root has an NVML, else [`Node::remove_vgpu`].
///
/// # Errors
/// As those two.
pub fn remove_on_request(
    node: &Node<'_>,
    root: &gpu_sysfs::OpenedRoot,
    id: &VgpuId,
    force: bool,
) -> Result<(Removed, Option<u32>), MigError> {
    match super::open::open_nvml(root, &gpu_health::NvmlSource::LocalOnly) {
        Ok(nvml) => node.remove_vgpu_with_mig(&node.mig(nvml.as_ref()), id, force),
        Err(_) => Ok((node.remove_vgpu(id, force)?, None)),
    }
}

impl Node<'_> {
    /// MIG on request for a door that holds the host-wide lock already (the agent's `POST
    /// /v1/vgpus`): [`Mig::before_vgpu_held`] on the GPU of `parent`, through `nvml`. The GPU
    /// instance made, if one was (to undo with [`Node::undo_instance_held`] when the vGPU is
    /// not made).
    ///
    /// # Errors
    /// What [`Mig::before_vgpu_held`] answers; `gpu_named`'s error for a name it does not know.
    pub fn instance_for_request_held<E: From<MigError>>(
        &self,
        nvml: &dyn gpu_nvml::NvmlDevices,
        parent: &ParentId,
        profile: &str,
        gpu_named: impl Fn(&str) -> Result<PciAddress, E>,
    ) -> Result<Option<(PciAddress, u32)>, E> {
        let gpu = gpu_of(self, parent, &gpu_named)?;
        Ok(self
            .mig(nvml)
            .before_vgpu_held(&gpu, profile)?
            .map(|gi| (gpu, gi.id)))
    }

    /// Destroys GPU instance `id` of `gpu` made by [`Node::instance_for_request_held`] for a
    /// vGPU that was not made (the lock still held). Best effort: one a vGPU took stays.
    pub fn undo_instance_held(&self, nvml: &dyn gpu_nvml::NvmlDevices, gpu: &PciAddress, id: u32) {
        let _ = self.mig(nvml).unmake(gpu, id);
    }
}
