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
/// what [`Mig::create`] answers (MIG mode off, no room for another instance, ...).
pub fn instance_for(
    mig: &Mig<'_, '_>,
    nvml: &dyn NvmlDevices,
    gpu: &PciAddress,
    type_id: u32,
    profile: &str,
    make: bool,
) -> Result<(InstanceChoice, Option<InstanceView>), MigError> {
    match choose_instance(nvml, gpu, type_id) {
        Ok(c) => Ok((c, None)),
        Err(MixedError::NoInstanceRoom { .. }) if make => {
            let made = mig.create(gpu, profile, &format!("a vGPU of type {type_id}"))?;
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
