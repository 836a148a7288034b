//! A fake NVML that answers as the driver does (feature `testing`): MIG mode with its pending
//! state, GPU instances placed on gpu-core's MIG geometry, mixed-size vGPU mode and placements,
//! module IDs, health signals. Each rule names the NVML call and the documentation it follows;
//! docs/partitions.md lists them with their sources, and marks the few that are assumptions.
//!
//! Tests play the kernel's side with [`FakeNvml::start_vgpu`], [`FakeNvml::stop_vgpu`],
//! [`FakeNvml::start_process`] and [`FakeNvml::reset`], and inject failures with
//! [`FakeNvml::failing`].

mod gpu;
pub mod persist;
pub mod profiles;

use std::collections::BTreeMap;
use std::sync::Mutex;

use gpu_core::PciAddress;

pub use gpu::{FakeGpu, FakeVgpuType};

use crate::devices::NvmlDevices;
use crate::error::{NvmlError, NvmlErrorKind};
use crate::types::{
    ActiveVgpu, GpuInstance, GpuInstanceProfile, HealthReads, MigActivation, MigMode, MigModes,
    Placement, VgpuMode, VgpuPlacements, VgpuScheduler, VgpuTypeInfo,
};

/// The device lookup every question starts with.
const LOOKUP: &str = "nvmlDeviceGetHandleByPciBusId_v2";

#[derive(Debug, Default)]
struct State {
    gpus: BTreeMap<PciAddress, FakeGpu>,
    failing: BTreeMap<&'static str, NvmlErrorKind>,
    writes: Vec<String>,
}

/// The fake NVML; see the module documentation.
#[derive(Debug, Default)]
pub struct FakeNvml {
    state: Mutex<State>,
    driver_version: Option<String>,
    /// The file the MIG state is kept in between processes ([`FakeNvml::saved_in`]).
    saved_at: Option<std::path::PathBuf>,
}

impl FakeNvml {
    /// A fake NVML of driver `570.124.03` with no GPUs.
    pub fn new() -> Self {
        FakeNvml {
            state: Mutex::default(),
            driver_version: Some("570.124.03".to_owned()),
            saved_at: None,
        }
    }

    /// Adds the GPU at `address`.
    pub fn with_gpu(self, address: PciAddress, gpu: FakeGpu) -> Self {
        self.lock().gpus.insert(address, gpu);
        self
    }

    /// Every later `call` (an NVML function name, `nvmlDeviceSetMigMode`) answers `kind`, on
    /// every GPU.
    pub fn failing(self, call: &'static str, kind: NvmlErrorKind) -> Self {
        self.lock().failing.insert(call, kind);
        self
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The writes NVML accepted, in order (`nvmlDeviceSetMigMode 0000:18:00.0 enabled`): for
    /// tests that check what changed and in which order.
    pub fn writes(&self) -> Vec<String> {
        self.lock().writes.clone()
    }

    /// Runs `f` on the GPU at `gpu` for `call` ([`answer`]). A fake kept in a file
    /// ([`FakeNvml::saved_in`]) reads it first and writes it back when the MIG state changed.
    fn on<T>(
        &self,
        call: &'static str,
        gpu: &PciAddress,
        f: impl FnOnce(&mut FakeGpu) -> Result<T, NvmlErrorKind>,
    ) -> Result<T, NvmlError> {
        let mut state = self.lock();
        let before = persist::load_into(self.saved_at.as_deref(), &mut state)?;
        let out = answer(&mut state, call, gpu, f);
        persist::save_if_changed(self.saved_at.as_deref(), &state, before.as_ref())?;
        out
    }
}

/// One NVML answer on `state`: an injected failure, an unknown address (`NOT_FOUND`) and a
/// lost GPU (`GPU_IS_LOST`) before `f`.
fn answer<T>(
    state: &mut State,
    call: &'static str,
    gpu: &PciAddress,
    f: impl FnOnce(&mut FakeGpu) -> Result<T, NvmlErrorKind>,
) -> Result<T, NvmlError> {
    if let Some(kind) = state.failing.get(call) {
        return Err(NvmlError::new(call, kind.clone()));
    }
    let Some(g) = state.gpus.get_mut(gpu) else {
        return Err(NvmlError::new(LOOKUP, NvmlErrorKind::NotFound));
    };
    if g.lost {
        return Err(NvmlError::new(LOOKUP, NvmlErrorKind::GpuLost));
    }
    f(g).map_err(|kind| NvmlError::new(call, kind))
}

impl FakeNvml {
    fn wrote(&self, what: String) {
        self.lock().writes.push(what);
    }

    /// The kernel starts a vGPU of `type_id` on `gpu` (a type written to a VF): at
    /// `placement_id` in mixed-size mode, inside GPU instance `gpu_instance` for a MIG-backed
    /// type. Returns its NVML instance ID.
    ///
    /// # Errors
    /// `INVALID_ARGUMENT` for a type the GPU does not support; `INSUFFICIENT_RESOURCES` for a
    /// placement not creatable now (NVML's creatable placements are the ones a vGPU may take);
    /// `NOT_FOUND` for a MIG-backed type without a GPU instance of its profile, and
    /// `INSUFFICIENT_RESOURCES` when that instance already holds a vGPU; `NOT_SUPPORTED` for a
    /// time-sliced type on a GPU in MIG mode.
    pub fn start_vgpu(
        &self,
        gpu: &PciAddress,
        type_id: u32,
        placement_id: Option<u32>,
        gpu_instance: Option<u32>,
    ) -> Result<u32, NvmlError> {
        self.on("vgpu-create", gpu, |g| {
            let t = g
                .vgpu_type(type_id)
                .cloned()
                .ok_or(NvmlErrorKind::InvalidArgument)?;
            if let Some(profile) = t.gpu_instance_profile {
                let fits = g.mig.as_ref().is_some_and(|m| {
                    m.modes.current == MigMode::Enabled
                        && m.instances
                            .iter()
                            .any(|i| Some(i.id) == gpu_instance && i.profile_id == profile)
                });
                if !fits {
                    return Err(NvmlErrorKind::NotFound);
                }
                // As many vGPUs per GPU instance as the type's time-slicing inside it allows
                // (one where the GPU has none): each at a creatable placement of the instance.
                let free = g.creatable_in_instance(&t, gpu_instance.unwrap_or(0));
                let at = match placement_id {
                    Some(p) if free.placement_ids.contains(&p) => p,
                    Some(_) => return Err(NvmlErrorKind::InsufficientResources),
                    None => *free
                        .placement_ids
                        .first()
                        .ok_or(NvmlErrorKind::InsufficientResources)?,
                };
                let instance = g.next_vgpu;
                g.next_vgpu = g.next_vgpu.saturating_add(1);
                g.active.push((
                    ActiveVgpu {
                        instance,
                        type_id,
                        placement_id: (t.per_instance > 1).then_some(at),
                    },
                    gpu_instance,
                ));
                return Ok(instance);
            }
            if g.mig_enabled() {
                // A time-sliced type does not run on a GPU in MIG mode.
                return Err(NvmlErrorKind::NotSupported);
            }
            let mode = g.vgpu_mode.unwrap_or(VgpuMode::Homogeneous);
            if let Some(p) = placement_id {
                if !g.creatable(&t, mode).placement_ids.contains(&p) {
                    return Err(NvmlErrorKind::InsufficientResources);
                }
            } else if mode == VgpuMode::Homogeneous
                && g.active.iter().any(|(v, _)| v.type_id != type_id)
            {
                // One vGPU size per GPU in homogeneous mode.
                return Err(NvmlErrorKind::InsufficientResources);
            }
            let instance = g.next_vgpu;
            g.next_vgpu = g.next_vgpu.saturating_add(1);
            g.active.push((
                ActiveVgpu {
                    instance,
                    type_id,
                    placement_id,
                },
                gpu_instance,
            ));
            Ok(instance)
        })
    }

    /// The kernel stops vGPU `instance` on `gpu`.
    ///
    /// # Errors
    /// `NOT_FOUND` when no such vGPU runs.
    pub fn stop_vgpu(&self, gpu: &PciAddress, instance: u32) -> Result<(), NvmlError> {
        self.on("vgpu-remove", gpu, |g| {
            let before = g.active.len();
            g.active.retain(|(v, _)| v.instance != instance);
            if g.active.len() == before {
                return Err(NvmlErrorKind::NotFound);
            }
            Ok(())
        })
    }

    /// A compute process starts on `gpu` (`nvidia-smi` or a CUDA program holds it).
    ///
    /// # Errors
    /// As every question about an unknown or lost GPU.
    pub fn start_process(&self, gpu: &PciAddress) -> Result<(), NvmlError> {
        self.on("process-start", gpu, |g| {
            g.processes = g.processes.saturating_add(1);
            Ok(())
        })
    }

    /// Every process on `gpu` ends.
    ///
    /// # Errors
    /// As every question about an unknown or lost GPU.
    pub fn end_processes(&self, gpu: &PciAddress) -> Result<(), NvmlError> {
        self.on("process-end", gpu, |g| {
            g.processes = 0;
            Ok(())
        })
    }

    /// The GPU is reset (`nvidia-smi -r`): a pending MIG mode comes into force; turning MIG off
    /// drops the GPU instances.
    ///
    /// # Errors
    /// `IN_USE` while a vGPU or process runs (a reset needs an idle GPU).
    pub fn reset(&self, gpu: &PciAddress) -> Result<(), NvmlError> {
        self.on("gpu-reset", gpu, FakeGpu::reset)
    }
}

fn mig_of(g: &FakeGpu) -> Result<&gpu::MigState, NvmlErrorKind> {
    g.mig.as_ref().ok_or(NvmlErrorKind::NotSupported)
}

/// The GPU-instance calls other than the placement list need MIG mode in force
/// (`nvmlDeviceGetGpuInstanceProfileInfo`: "NVML_ERROR_NOT_SUPPORTED if device doesn't have MIG
/// mode enabled").
fn mig_enabled(g: &FakeGpu) -> Result<&gpu::MigState, NvmlErrorKind> {
    let m = mig_of(g)?;
    if m.modes.current != MigMode::Enabled {
        return Err(NvmlErrorKind::NotSupported);
    }
    Ok(m)
}

impl NvmlDevices for FakeNvml {
    fn driver_version(&self) -> Option<String> {
        self.driver_version.clone()
    }

    fn health_reads(&self, gpu: &PciAddress) -> Result<HealthReads, NvmlError> {
        self.on(LOOKUP, gpu, |g| Ok(g.health.clone()))
    }

    fn vgpu_supported_types(&self, gpu: &PciAddress) -> Result<Vec<VgpuTypeInfo>, NvmlError> {
        self.on("nvmlDeviceGetSupportedVgpus", gpu, |g| {
            if g.types.is_empty() {
                return Err(NvmlErrorKind::NotSupported);
            }
            Ok(g.types.iter().map(|t| t.info.clone()).collect())
        })
    }

    /// `nvmlDeviceGetModuleId`: only GPUs on an NVSwitch baseboard have one here.
    fn module_id(&self, gpu: &PciAddress) -> Result<u32, NvmlError> {
        self.on("nvmlDeviceGetModuleId", gpu, |g| {
            g.module_id.ok_or(NvmlErrorKind::NotSupported)
        })
    }

    /// `nvmlDeviceGetMigMode`: current and pending ("the target mode following the next
    /// activation trigger"); `NOT_SUPPORTED` on a GPU without MIG.
    fn mig_mode(&self, gpu: &PciAddress) -> Result<MigModes, NvmlError> {
        self.on("nvmlDeviceGetMigMode", gpu, |g| Ok(mig_of(g)?.modes))
    }

    /// `nvmlDeviceSetMigMode` (NVML API reference): the mode becomes pending; it is activated
    /// at once unless the GPU is not idle (`activationStatus` `NVML_ERROR_IN_USE`: "if device
    /// unbind fails because the device isn't idle") or the platform needs a reset or VM reboot
    /// (`NVML_ERROR_RESET_REQUIRED`). Turning MIG off while GPU instances exist is refused with
    /// `IN_USE` (an assumption, docs/partitions.md).
    fn set_mig_mode(&self, gpu: &PciAddress, mode: MigMode) -> Result<MigActivation, NvmlError> {
        let r = self.on("nvmlDeviceSetMigMode", gpu, |g| {
            let busy = g.busy();
            let m = g.mig.as_mut().ok_or(NvmlErrorKind::NotSupported)?;
            if m.modes == MigModes::settled(mode) {
                return Ok(MigActivation::Active);
            }
            if mode == MigMode::Disabled && !m.instances.is_empty() {
                return Err(NvmlErrorKind::InUse);
            }
            m.modes.pending = mode;
            if busy {
                return Ok(MigActivation::Pending(NvmlErrorKind::InUse));
            }
            if m.needs_reset {
                return Ok(MigActivation::Pending(NvmlErrorKind::ResetRequired));
            }
            m.modes.current = mode;
            Ok(MigActivation::Active)
        })?;
        self.wrote(format!("nvmlDeviceSetMigMode {gpu} {mode:?}"));
        Ok(r)
    }

    fn gpu_instance_profiles(
        &self,
        gpu: &PciAddress,
    ) -> Result<Vec<GpuInstanceProfile>, NvmlError> {
        self.on("nvmlDeviceGetGpuInstanceProfileInfo", gpu, |g| {
            let m = mig_enabled(g)?;
            Ok(m.geometry
                .profiles
                .iter()
                .filter_map(|p| profiles::profile_info(m.geometry, p))
                .collect())
        })
    }

    /// `nvmlDeviceGetGpuInstancePossiblePlacements_v2`: "all the possible placements for the
    /// given profile regardless of whether MIG is enabled or not"; a profile the GPU lacks is
    /// `INVALID_ARGUMENT`.
    fn gpu_instance_possible_placements(
        &self,
        gpu: &PciAddress,
        profile_id: u32,
    ) -> Result<Vec<Placement>, NvmlError> {
        self.on("nvmlDeviceGetGpuInstancePossiblePlacements_v2", gpu, |g| {
            let m = mig_of(g)?;
            let p = profiles::profile_by_id(m.geometry, profile_id)
                .ok_or(NvmlErrorKind::InvalidArgument)?;
            Ok(profiles::placements(p))
        })
    }

    fn gpu_instances(&self, gpu: &PciAddress) -> Result<Vec<GpuInstance>, NvmlError> {
        self.on("nvmlDeviceGetGpuInstanceProfileInfo", gpu, |g| {
            let mut out = mig_enabled(g)?.instances.clone();
            out.sort_by_key(|i| (i.placement.start, i.id));
            Ok(out)
        })
    }

    /// `nvmlDeviceCreateGpuInstanceWithPlacement`: the placement must be one the profile may
    /// take (`nvmlDeviceGetGpuInstancePossiblePlacements_v2`), else `INVALID_ARGUMENT`; "creation
    /// of new GPU instance will fail if there is overlap with the already occupied memory
    /// slices": `INSUFFICIENT_RESOURCES`, as also when the profile's `instanceCount` is reached.
    fn create_gpu_instance(
        &self,
        gpu: &PciAddress,
        profile_id: u32,
        placement: Placement,
    ) -> Result<GpuInstance, NvmlError> {
        let gi = self.on("nvmlDeviceCreateGpuInstanceWithPlacement", gpu, |g| {
            mig_enabled(g)?;
            let m = g.mig.as_mut().ok_or(NvmlErrorKind::NotSupported)?;
            let p = profiles::profile_by_id(m.geometry, profile_id)
                .ok_or(NvmlErrorKind::InvalidArgument)?;
            if !profiles::placements(p).contains(&placement) {
                return Err(NvmlErrorKind::InvalidArgument);
            }
            if m.instances.iter().any(|i| i.placement.overlaps(placement)) {
                return Err(NvmlErrorKind::InsufficientResources);
            }
            let of_profile = m
                .instances
                .iter()
                .filter(|i| i.profile_id == profile_id)
                .count();
            if of_profile >= p.starts.len() {
                return Err(NvmlErrorKind::InsufficientResources);
            }
            let gi = GpuInstance {
                id: m.next_id,
                profile_id,
                slice_count: u32::from(p.compute_slices),
                placement,
            };
            m.next_id = m.next_id.saturating_add(1);
            m.instances.push(gi);
            Ok(gi)
        })?;
        self.wrote(format!(
            "nvmlDeviceCreateGpuInstanceWithPlacement {gpu} profile {profile_id} at {}",
            placement.start
        ));
        Ok(gi)
    }

    /// `nvmlDeviceGetGpuInstanceById` (`NOT_FOUND` for an ID the GPU lacks), then
    /// `nvmlGpuInstanceDestroy`: `IN_USE` while a vGPU runs inside the instance.
    fn destroy_gpu_instance(&self, gpu: &PciAddress, id: u32) -> Result<(), NvmlError> {
        let exists = self.on("nvmlDeviceGetGpuInstanceById", gpu, |g| {
            Ok(mig_enabled(g)?.instances.iter().any(|i| i.id == id))
        })?;
        if !exists {
            return Err(NvmlError::new(
                "nvmlDeviceGetGpuInstanceById",
                NvmlErrorKind::NotFound,
            ));
        }
        self.on("nvmlGpuInstanceDestroy", gpu, |g| {
            if g.active.iter().any(|(_, inside)| *inside == Some(id)) {
                return Err(NvmlErrorKind::InUse);
            }
            let m = g.mig.as_mut().ok_or(NvmlErrorKind::NotSupported)?;
            m.instances.retain(|i| i.id != id);
            Ok(())
        })?;
        self.wrote(format!("nvmlGpuInstanceDestroy {gpu} {id}"));
        Ok(())
    }

    /// `nvmlDeviceGetVgpuHeterogeneousMode`: `NOT_SUPPORTED` without mixed-size support and "when
    /// in MIG mode" (NVML change log, v570 to v575).
    fn vgpu_heterogeneous_mode(&self, gpu: &PciAddress) -> Result<VgpuMode, NvmlError> {
        self.on("nvmlDeviceGetVgpuHeterogeneousMode", gpu, |g| {
            if g.mig_enabled() {
                return Err(NvmlErrorKind::NotSupported);
            }
            g.vgpu_mode.ok_or(NvmlErrorKind::NotSupported)
        })
    }

    /// `nvmlDeviceSetVgpuHeterogeneousMode`: `NOT_SUPPORTED` as the get, and `IN_USE` while any
    /// vGPU exists on the GPU (NVIDIA's vGPU guide sets the mode before any vGPU type is written;
    /// the code is an assumption, docs/partitions.md).
    fn set_vgpu_heterogeneous_mode(
        &self,
        gpu: &PciAddress,
        mode: VgpuMode,
    ) -> Result<(), NvmlError> {
        self.on("nvmlDeviceSetVgpuHeterogeneousMode", gpu, |g| {
            if g.mig_enabled() || g.vgpu_mode.is_none() {
                return Err(NvmlErrorKind::NotSupported);
            }
            if !g.active.is_empty() {
                return Err(NvmlErrorKind::InUse);
            }
            g.vgpu_mode = Some(mode);
            Ok(())
        })?;
        self.wrote(format!("nvmlDeviceSetVgpuHeterogeneousMode {gpu} {mode:?}"));
        Ok(())
    }

    /// `nvmlDeviceGetVgpuTypeSupportedPlacements`: the type's `placementSize` and every ID it may
    /// take in the mode asked (`nvmlVgpuPlacementList_v2_t.mode`).
    fn vgpu_type_supported_placements(
        &self,
        gpu: &PciAddress,
        type_id: u32,
        mode: VgpuMode,
    ) -> Result<VgpuPlacements, NvmlError> {
        self.on("nvmlDeviceGetVgpuTypeSupportedPlacements", gpu, |g| {
            if g.vgpu_mode.is_none() {
                return Err(NvmlErrorKind::NotSupported);
            }
            let t = g.vgpu_type(type_id).ok_or(NvmlErrorKind::InvalidArgument)?;
            Ok(match mode {
                VgpuMode::Heterogeneous => t.heterogeneous.clone(),
                VgpuMode::Homogeneous => t.homogeneous.clone(),
            })
        })
    }

    /// `nvmlDeviceGetVgpuTypeCreatablePlacements`: the supported IDs no running vGPU's slots
    /// overlap; `NOT_SUPPORTED` "when in MIG mode" (NVML change log, v570 to v575).
    fn vgpu_type_creatable_placements(
        &self,
        gpu: &PciAddress,
        type_id: u32,
        mode: VgpuMode,
    ) -> Result<VgpuPlacements, NvmlError> {
        self.on("nvmlDeviceGetVgpuTypeCreatablePlacements", gpu, |g| {
            if g.mig_enabled() || g.vgpu_mode.is_none() {
                return Err(NvmlErrorKind::NotSupported);
            }
            let t = g.vgpu_type(type_id).ok_or(NvmlErrorKind::InvalidArgument)?;
            Ok(g.creatable(t, mode))
        })
    }

    fn active_vgpus(&self, gpu: &PciAddress) -> Result<Vec<ActiveVgpu>, NvmlError> {
        self.on("nvmlDeviceGetActiveVgpus", gpu, |g| {
            Ok(g.active.iter().map(|(v, _)| *v).collect())
        })
    }

    fn gpu_instance_vgpu_creatable_placements(
        &self,
        gpu: &PciAddress,
        gpu_instance: u32,
        type_id: u32,
    ) -> Result<VgpuPlacements, NvmlError> {
        self.on("nvmlGpuInstanceGetVgpuTypeCreatablePlacements", gpu, |g| {
            let m = g.mig.as_ref().ok_or(NvmlErrorKind::NotSupported)?;
            let gi = m
                .instances
                .iter()
                .find(|i| i.id == gpu_instance)
                .ok_or(NvmlErrorKind::NotFound)?;
            let t = g.vgpu_type(type_id).ok_or(NvmlErrorKind::InvalidArgument)?;
            if t.gpu_instance_profile != Some(gi.profile_id) {
                return Err(NvmlErrorKind::InvalidArgument);
            }
            Ok(g.creatable_in_instance(t, gpu_instance))
        })
    }

    fn vgpu_scheduler(&self, gpu: &PciAddress) -> Result<VgpuScheduler, NvmlError> {
        self.on("nvmlDeviceGetVgpuSchedulerState", gpu, |g| {
            if g.types.is_empty() {
                return Err(NvmlErrorKind::NotSupported);
            }
            Ok(g.scheduler)
        })
    }
}

#[cfg(test)]
mod tests;
