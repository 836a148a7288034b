//! A time-sliced vGPU inside a MIG GPU instance on the node (Blackwell RTX PRO; docs/partitions.md,
//! "vGPUs inside MIG instances"): an existing instance with room takes it
//! ([`crate::mig_vgpu::choose_instance`], the count being what the driver lists per instance);
//! where every instance of the type's profile is full, a new one is made on request through the
//! MIG writer ([`crate::mig::Mig::create`], called, not copied), else the create is refused
//! naming each instance and what it can still take.

use gpu_core::PciAddress;
use gpu_nvml::NvmlDevices;

use crate::NodeError;
use crate::mig::{InstanceView, Mig, MigError};
use crate::mig_vgpu::{InstanceChoice, choose_instance};
use crate::mixed::MixedError;

fn refused(e: MixedError) -> MigError {
    MigError::from(NodeError::Mixed(Box::new(e)))
}

/// The GPU instance (and placement in it) for a vGPU of `type_id` on `gpu`, whose instances are
/// of the MIG profile `profile` (`1g.24gb`). With `make`, a full GPU gets a new instance of
/// `profile` (the one returned, recorded as gpuslice's); it is destroyed again when the driver
/// still lists no placement in it.
///
/// # Errors
/// [`MixedError::NoInstanceRoom`] (inside [`MigError::Node`]) naming each instance and its
/// free placements, when none has room and `make` is off or the new instance takes no vGPU;
/// what [`Mig::create`] answers (MIG mode off, no room for another instance, ...). `held`: the
/// caller holds the host-wide lock already (the agent), the instance is made under it.
pub fn instance_for(
    mig: &Mig<'_, '_>,
    nvml: &dyn NvmlDevices,
    gpu: &PciAddress,
    type_id: u32,
    profile: &str,
    make: bool,
    held: bool,
) -> Result<(InstanceChoice, Option<InstanceView>), MigError> {
    match choose_instance(nvml, gpu, type_id) {
        Ok(c) => Ok((c, None)),
        Err(MixedError::NoInstanceRoom { .. }) if make => {
            let made_for = format!("a vGPU of type {type_id}");
            let made = if held {
                mig.create_held(gpu, profile, &made_for)?
            } else {
                mig.create(gpu, profile, &made_for)?
            };
            match choose_instance(nvml, gpu, type_id) {
                Ok(c) => Ok((c, Some(made))),
                Err(e) => {
                    // Undo what this call made; the refusal is the answer.
                    let _ = mig.destroy(gpu, made.id, false);
                    Err(refused(e))
                }
            }
        }
        Err(e) => Err(refused(e)),
    }
}

/// Whether the driver time-slices vGPUs of `type_id` inside `gpu`'s GPU instances, as it lists
/// them (`nvmlGpuInstanceGetVgpuTypeCreatablePlacements`): some instance still takes two or
/// more, or takes one more while NVML already runs at least one vGPU of the type per instance
/// of its profile. A driver without the call, or one that lists one per instance (H100, H200),
/// answers no: those keep one instance per vGPU ([`crate::mig::Mig::before_vgpu`]).
pub fn time_sliced_in_instances(nvml: &dyn NvmlDevices, gpu: &PciAddress, type_id: u32) -> bool {
    let Ok(instances) = nvml.gpu_instances(gpu) else {
        return false;
    };
    let free: Vec<usize> = instances
        .iter()
        .filter_map(|gi| {
            nvml.gpu_instance_vgpu_creatable_placements(gpu, gi.id, type_id)
                .ok()
        })
        .map(|p| p.placement_ids.len())
        .collect();
    if free.is_empty() {
        return false;
    }
    if free.iter().any(|n| *n >= 2) {
        return true;
    }
    let running = nvml
        .active_vgpus(gpu)
        .map(|a| a.iter().filter(|v| v.type_id == type_id).count())
        .unwrap_or(0);
    running >= free.len() && free.iter().any(|n| *n >= 1)
}

/// A create of the MIG-backed `profile` (a type name) on `gpu` where the driver time-slices it
/// inside GPU instances ([`time_sliced_in_instances`]): the instance it goes to, filled before
/// another is made ([`instance_for`], making one where all are full). `None` where the type is
/// not time-sliced inside instances here (the one-instance-per-vGPU path applies). `held`: as
/// for [`instance_for`].
///
/// # Errors
/// As [`instance_for`].
pub fn before_vgpu_in_instance(
    host: &dyn gpu_sysfs::Host,
    mig: &Mig<'_, '_>,
    nvml: &dyn NvmlDevices,
    gpu: &PciAddress,
    profile: &str,
    held: bool,
) -> Result<Option<(InstanceChoice, Option<InstanceView>)>, MigError> {
    let Ok(types) = nvml.vgpu_supported_types(gpu) else {
        return Ok(None);
    };
    let Some(t) = types
        .iter()
        .find(|t| gpu_core::nvidia::names_match(&t.name, profile))
    else {
        return Ok(None);
    };
    if !time_sliced_in_instances(nvml, gpu, t.id) {
        return Ok(None);
    }
    let board = crate::mig::board::read(host, nvml, gpu, gpu_nvml::MigMode::Enabled)?;
    let Some(p) = crate::mig::board::profile_of_type(&board, &t.name) else {
        return Ok(None);
    };
    instance_for(mig, nvml, gpu, t.id, &p.name, true, held).map(Some)
}

impl crate::Node<'_> {
    /// For a writer that holds the lock (the agent's `POST /v1/vgpus`): where the driver
    /// time-slices `profile` inside `parent`'s GPU instances ([`time_sliced_in_instances`]),
    /// the instance with room chosen, or one made (the GPU and its ID returned, for
    /// [`crate::Node::undo_instance_held`] when the vGPU is not made). `None` where the type is
    /// not time-sliced inside instances here: [`crate::Node::instance_for_request_held`] applies.
    ///
    /// # Errors
    /// As [`instance_for`].
    pub fn vgpu_in_instance_held(
        &self,
        nvml: &dyn NvmlDevices,
        parent: &gpu_core::ParentId,
        profile: &str,
    ) -> Result<Option<Option<(PciAddress, u32)>>, MigError> {
        let gpu_core::ParentId::Pci(a) = parent else {
            return Ok(None);
        };
        let gpu = crate::mixed_create::gpu_of(self.host, a);
        match nvml.mig_mode(&gpu) {
            Ok(m) if m.current == gpu_nvml::MigMode::Enabled && !m.is_pending() => {}
            _ => return Ok(None),
        }
        let mig = self.mig(nvml);
        Ok(
            before_vgpu_in_instance(self.host, &mig, nvml, &gpu, profile, true)?
                .map(|(_, made)| made.map(|gi| (gpu, gi.id))),
        )
    }
}

/// What a layout's MIG-backed counts become where the driver time-slices a type inside GPU
/// instances ([`time_sliced_in_instances`]): GPU instances, not vGPUs. Each instance of the
/// type's profile holds at least as many as the most the driver lists creatable in one of the
/// GPU's instances now (exact for an empty one), so `n` vGPUs need `ceil(n / that)` instances,
/// never fewer than it takes. Where the driver lists one per instance, or no instance of the
/// profile exists yet to ask, the counts stay one instance per vGPU (as NVIDIA's
/// vgpu-device-manager derives them).
pub fn instance_counts(
    nvml: &dyn NvmlDevices,
    wants: &std::collections::BTreeMap<PciAddress, Vec<(String, u32)>>,
) -> std::collections::BTreeMap<PciAddress, Vec<(String, u32)>> {
    let mut out = wants.clone();
    for (gpu, types) in &mut out {
        let (Ok(listed), Ok(instances)) = (nvml.vgpu_supported_types(gpu), nvml.gpu_instances(gpu))
        else {
            continue;
        };
        for (name, n) in types.iter_mut() {
            let Some(t) = listed
                .iter()
                .find(|t| gpu_core::nvidia::names_match(&t.name, name))
            else {
                continue;
            };
            if !time_sliced_in_instances(nvml, gpu, t.id) {
                continue;
            }
            let per = instances
                .iter()
                .filter_map(|gi| {
                    nvml.gpu_instance_vgpu_creatable_placements(gpu, gi.id, t.id)
                        .ok()
                })
                .map(|p| u32::try_from(p.placement_ids.len()).unwrap_or(u32::MAX))
                .max()
                .unwrap_or(1)
                .max(1);
            *n = n.div_ceil(per);
        }
    }
    out
}
