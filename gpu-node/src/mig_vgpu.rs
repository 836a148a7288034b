//! Time-sliced vGPUs inside MIG GPU instances (Blackwell RTX PRO: one instance holds one to
//! three vGPUs, per NVIDIA's "MIG-Backed vGPU" page; docs/partitions.md). Placement counts both
//! levels: the GPU instance (a run of slots on the GPU, `gpu_core::slots`) and the vGPUs
//! inside it, whose count is what the driver lists for the instance
//! (`nvmlGpuInstanceGetVgpuTypeCreatablePlacements`), never a table.
//!
//! [`choose_instance`] picks, among the GPU's existing instances, the one that takes a vGPU of
//! the type with the fewest placements left (an instance is filled before another is opened, so
//! empty instances stay whole for other types). A GPU with no instance that has room is refused
//! naming each instance and what it can still take; making a new instance is the MIG writer's
//! step (issue 47, points 1 and 2), not this one.

use gpu_core::PciAddress;
use gpu_nvml::NvmlDevices;

use crate::mixed::{MixedError, ask};

/// Where a time-sliced vGPU goes inside a GPU instance.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct InstanceChoice {
    /// The GPU instance's ID.
    pub gpu_instance: u32,
    /// The placement inside it the driver lists as creatable.
    pub placement_id: u32,
    /// Placements of the type the instance still has, this one included.
    pub free: usize,
}

/// Chooses the GPU instance (and the placement inside it) for a vGPU of `type_id` on `gpu`.
///
/// # Errors
/// [`MixedError::NoInstanceRoom`] naming every instance and its free placements;
/// [`MixedError::Nvml`] when the instances cannot be listed.
pub fn choose_instance(
    nvml: &dyn NvmlDevices,
    gpu: &PciAddress,
    type_id: u32,
) -> Result<InstanceChoice, MixedError> {
    let instances = ask(gpu, "listing GPU instances", nvml.gpu_instances(gpu))?;
    let mut seen = Vec::new();
    let mut best: Option<InstanceChoice> = None;
    for gi in &instances {
        // An instance of another profile answers INVALID_ARGUMENT: not one for this type.
        let Ok(p) = nvml.gpu_instance_vgpu_creatable_placements(gpu, gi.id, type_id) else {
            continue;
        };
        seen.push(format!(
            "instance {}: {} free",
            gi.id,
            p.placement_ids.len()
        ));
        let Some(first) = p.placement_ids.first().copied() else {
            continue;
        };
        let c = InstanceChoice {
            gpu_instance: gi.id,
            placement_id: first,
            free: p.placement_ids.len(),
        };
        if best.is_none_or(|b| c.free < b.free) {
            best = Some(c);
        }
    }
    best.ok_or_else(|| MixedError::NoInstanceRoom {
        gpu: *gpu,
        type_id,
        seen: if seen.is_empty() {
            "no GPU instance".to_owned()
        } else {
            seen.join(", ")
        },
    })
}
