//! The trait every Fabric Manager answers through.

use gpu_core::PciAddress;
use gpu_core::fabric::FabricMode;

use crate::error::FmError;
use crate::types::{FmPartition, NvlinkFailures};

/// NVIDIA Fabric Manager as gpuslice uses it: the partitions on offer, activated and
/// deactivated (with the VFs of their GPUs in vGPU mode), the list of active partitions given
/// back after an FM restart, and the devices whose NVLinks failed.
///
/// [`crate::FmLibrary`] is the real one (`libnvfm` loaded at run time);
/// [`crate::fake::FakeFabric`] answers as FM does, for tests and the sandbox.
pub trait FabricManager: Send + Sync {
    /// The mode FM runs in (`FABRIC_MODE` of its configuration: FM's API does not report it).
    fn mode(&self) -> FabricMode;

    /// FM's version, when known (a guest's NVIDIA driver must match it).
    fn version(&self) -> Option<String> {
        None
    }

    /// `fmGetSupportedFabricPartitions`: the partitions on offer, active or not.
    ///
    /// # Errors
    /// FM's answer ([`crate::FmErrorKind`]); `NotSupported` in bare-metal mode.
    fn partitions(&self) -> Result<Vec<FmPartition>, FmError>;

    /// `fmActivateFabricPartition` (shared NVSwitch mode).
    ///
    /// # Errors
    /// `BadParam` for an ID FM does not offer, `InUse` for an active partition, `NotSupported`
    /// outside shared NVSwitch mode, `NvlinkError` when training failed.
    fn activate(&self, id: u32) -> Result<(), FmError>;

    /// `fmActivateFabricPartitionWithVFs` (vGPU mode): `vfs` in the order of the partition's
    /// GPUs, one VF of each.
    ///
    /// # Errors
    /// As [`FabricManager::activate`]; `NotSupported` outside vGPU mode.
    fn activate_with_vfs(&self, id: u32, vfs: &[PciAddress]) -> Result<(), FmError>;

    /// `fmDeactivateFabricPartition`.
    ///
    /// # Errors
    /// `BadParam` for an ID FM does not offer, `Uninitialized` for a partition not active.
    fn deactivate(&self, id: u32) -> Result<(), FmError>;

    /// `fmSetActivatedFabricPartitions`: after FM restarted, the partitions that are active
    /// (an empty list when none is).
    ///
    /// # Errors
    /// `BadParam` for an ID FM does not offer.
    fn set_activated(&self, ids: &[u32]) -> Result<(), FmError>;

    /// `fmGetNvlinkFailedDevices`.
    ///
    /// # Errors
    /// FM's answer.
    fn nvlink_failed_devices(&self) -> Result<NvlinkFailures, FmError>;
}
