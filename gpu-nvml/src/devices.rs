//! The trait every NVML answer comes through: [`crate::NvmlLibrary`] on a host, the fake
//! (`fake::FakeNvml`, feature `testing`) in tests and the sandbox.

use gpu_core::PciAddress;

use crate::error::NvmlError;
use crate::types::{
    ActiveVgpu, GpuInstance, GpuInstanceProfile, HealthReads, MigActivation, MigMode, MigModes,
    Placement, VgpuMode, VgpuPlacements, VgpuScheduler, VgpuTypeInfo,
};

/// NVML's devices, addressed by the GPU's PCI address (the physical function). Every method is
/// one NVML question or change; none retries or decides anything. A GPU NVML does not know
/// answers `NotFound` from `nvmlDeviceGetHandleByPciBusId_v2`; an NVML that did not open answers
/// [`crate::NvmlErrorKind::Unavailable`].
///
/// Writes need root on a real host (`NoPermission` otherwise).
pub trait NvmlDevices: Send + Sync + std::fmt::Debug {
    /// The driver version NVML reports (`nvmlSystemGetDriverVersion`), when it does.
    fn driver_version(&self) -> Option<String>;

    /// The health signals of `gpu`, each call's own answer.
    ///
    /// # Errors
    /// Finding the device: `NotFound`, `GpuLost`, ... (each signal's own failure is in its field).
    fn health_reads(&self, gpu: &PciAddress) -> Result<HealthReads, NvmlError>;

    /// The vGPU types `gpu` supports (`nvmlDeviceGetSupportedVgpus`); a type whose name cannot
    /// be read is left out.
    ///
    /// # Errors
    /// Finding the device; `NotSupported` on a GPU or driver without vGPU.
    fn vgpu_supported_types(&self, gpu: &PciAddress) -> Result<Vec<VgpuTypeInfo>, NvmlError>;

    /// The module (physical) ID of `gpu` on an HGX baseboard (`nvmlDeviceGetModuleId`), which
    /// Fabric Manager's partitions name GPUs by.
    ///
    /// # Errors
    /// `NotSupported` off an NVSwitch host.
    fn module_id(&self, gpu: &PciAddress) -> Result<u32, NvmlError>;

    /// The MIG mode in force and pending (`nvmlDeviceGetMigMode`).
    ///
    /// # Errors
    /// `NotSupported` on a GPU without MIG.
    fn mig_mode(&self, gpu: &PciAddress) -> Result<MigModes, NvmlError>;

    /// Sets the MIG mode (`nvmlDeviceSetMigMode`); the answer says whether it is in force or
    /// pending a reset.
    ///
    /// # Errors
    /// `NotSupported`, `NoPermission`, `InUse` (vGPUs or processes on the GPU).
    fn set_mig_mode(&self, gpu: &PciAddress, mode: MigMode) -> Result<MigActivation, NvmlError>;

    /// The GPU-instance profiles of `gpu`, asked by every profile index NVML defines
    /// (`nvmlDeviceGetGpuInstanceProfileInfo`); an index the GPU lacks is left out.
    ///
    /// # Errors
    /// `NotSupported` when the GPU has none (no MIG, or MIG mode off).
    fn gpu_instance_profiles(&self, gpu: &PciAddress)
    -> Result<Vec<GpuInstanceProfile>, NvmlError>;

    /// Every placement profile `profile_id` may take, free or not
    /// (`nvmlDeviceGetGpuInstancePossiblePlacements_v2`).
    ///
    /// # Errors
    /// `InvalidArgument` for a profile the GPU lacks; `NotSupported`.
    fn gpu_instance_possible_placements(
        &self,
        gpu: &PciAddress,
        profile_id: u32,
    ) -> Result<Vec<Placement>, NvmlError>;

    /// Every GPU instance of `gpu` with its profile and placement, by start
    /// (`nvmlDeviceGetGpuInstances` per profile, `nvmlGpuInstanceGetInfo`).
    ///
    /// # Errors
    /// `NotSupported` when MIG mode is off; `NoPermission` for a user who is not root.
    fn gpu_instances(&self, gpu: &PciAddress) -> Result<Vec<GpuInstance>, NvmlError>;

    /// Creates a GPU instance of `profile_id` at `placement`
    /// (`nvmlDeviceCreateGpuInstanceWithPlacement`).
    ///
    /// # Errors
    /// `InsufficientResources` when the placement overlaps an instance, `InvalidArgument` for a
    /// placement the profile may not take, `NotSupported` when MIG mode is off.
    fn create_gpu_instance(
        &self,
        gpu: &PciAddress,
        profile_id: u32,
        placement: Placement,
    ) -> Result<GpuInstance, NvmlError>;

    /// Destroys the GPU instance `id` (`nvmlDeviceGetGpuInstanceById`, `nvmlGpuInstanceDestroy`).
    ///
    /// # Errors
    /// `NotFound`, `InUse` (a vGPU or compute instance uses it).
    fn destroy_gpu_instance(&self, gpu: &PciAddress, id: u32) -> Result<(), NvmlError>;

    /// The vGPU size mode of `gpu` (`nvmlDeviceGetVgpuHeterogeneousMode`).
    ///
    /// # Errors
    /// `NotSupported` on a GPU without mixed-size vGPUs, and in MIG mode.
    fn vgpu_heterogeneous_mode(&self, gpu: &PciAddress) -> Result<VgpuMode, NvmlError>;

    /// Sets the vGPU size mode (`nvmlDeviceSetVgpuHeterogeneousMode`).
    ///
    /// # Errors
    /// `NotSupported` (and in MIG mode), `InUse` while vGPUs exist on the GPU.
    fn set_vgpu_heterogeneous_mode(
        &self,
        gpu: &PciAddress,
        mode: VgpuMode,
    ) -> Result<(), NvmlError>;

    /// Every placement vGPU type `type_id` may take in `mode`
    /// (`nvmlDeviceGetVgpuTypeSupportedPlacements`).
    ///
    /// # Errors
    /// `NotSupported`, `InvalidArgument` for a type the GPU does not support.
    fn vgpu_type_supported_placements(
        &self,
        gpu: &PciAddress,
        type_id: u32,
        mode: VgpuMode,
    ) -> Result<VgpuPlacements, NvmlError>;

    /// The placements vGPU type `type_id` can take now, beside the running vGPUs
    /// (`nvmlDeviceGetVgpuTypeCreatablePlacements`).
    ///
    /// # Errors
    /// As [`NvmlDevices::vgpu_type_supported_placements`]; `NotSupported` in MIG mode.
    fn vgpu_type_creatable_placements(
        &self,
        gpu: &PciAddress,
        type_id: u32,
        mode: VgpuMode,
    ) -> Result<VgpuPlacements, NvmlError>;

    /// The running vGPUs of `gpu` with their types and placements.
    ///
    /// # Errors
    /// Finding the device; `NotSupported` without vGPU.
    fn active_vgpus(&self, gpu: &PciAddress) -> Result<Vec<ActiveVgpu>, NvmlError>;

    /// The time-sliced vGPU scheduler `gpu` runs (`nvmlDeviceGetVgpuSchedulerState`).
    ///
    /// # Errors
    /// Finding the device; `NotSupported` without vGPU; `FunctionNotFound` on an older driver.
    fn vgpu_scheduler(&self, gpu: &PciAddress) -> Result<VgpuScheduler, NvmlError>;

    /// The placements vGPU type `type_id` can still take inside GPU instance `gpu_instance`
    /// (`nvmlGpuInstanceGetVgpuTypeCreatablePlacements`): on GPUs with time-sliced vGPUs inside
    /// MIG instances (Blackwell RTX PRO), how many more vGPUs of the type the instance holds.
    ///
    /// # Errors
    /// `NotFound` for an instance the GPU lacks; `NotSupported` where the GPU has no time-sliced
    /// vGPUs inside instances; `FunctionNotFound` on an older driver.
    fn gpu_instance_vgpu_creatable_placements(
        &self,
        gpu: &PciAddress,
        gpu_instance: u32,
        type_id: u32,
    ) -> Result<VgpuPlacements, NvmlError>;
}
