//! What NVML answers, as plain values: MIG modes, GPU-instance profiles and placements, vGPU
//! placements, and the health signals gpu-health grades.

use serde::Serialize;

use crate::error::NvmlError;

/// One MIG mode (`NVML_DEVICE_MIG_DISABLE` / `NVML_DEVICE_MIG_ENABLE`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum MigMode {
    /// `NVML_DEVICE_MIG_DISABLE` (0).
    Disabled,
    /// `NVML_DEVICE_MIG_ENABLE` (1).
    Enabled,
}

impl MigMode {
    /// NVML's value for this mode.
    pub fn raw(self) -> u32 {
        match self {
            MigMode::Disabled => 0,
            MigMode::Enabled => 1,
        }
    }

    /// The mode NVML reports as `raw` (any value but 1 is disabled, as `nvidia-smi` reads it).
    pub fn from_raw(raw: u32) -> Self {
        if raw == 1 {
            MigMode::Enabled
        } else {
            MigMode::Disabled
        }
    }
}

/// A GPU's MIG modes as `nvmlDeviceGetMigMode` reports them: the mode in force and the mode
/// pending the next activation (a GPU reset, or a VM reboot where the reset is not exposed).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct MigModes {
    /// The mode in force.
    pub current: MigMode,
    /// The mode after the next activation.
    pub pending: MigMode,
}

impl MigModes {
    /// Both modes `mode`: nothing pending.
    pub fn settled(mode: MigMode) -> Self {
        MigModes {
            current: mode,
            pending: mode,
        }
    }

    /// True when a change waits for a GPU reset.
    pub fn is_pending(self) -> bool {
        self.current != self.pending
    }

    /// `enabled`, `disabled`, or `pending reset` (what `gpuslice mig list` shows).
    pub fn describe(self) -> &'static str {
        match (self.current, self.pending) {
            (MigMode::Enabled, MigMode::Enabled) => "enabled",
            (MigMode::Disabled, MigMode::Disabled) => "disabled",
            _ => "pending reset",
        }
    }
}

/// What `nvmlDeviceSetMigMode` said about activating the mode it accepted (its
/// `activationStatus`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MigActivation {
    /// The mode is in force now.
    Active,
    /// The mode is set but pending: activation answered this (`NVML_ERROR_RESET_REQUIRED` where
    /// the GPU must be reset or the VM rebooted, `NVML_ERROR_IN_USE` where the GPU was not idle).
    Pending(crate::error::NvmlErrorKind),
}

/// A placement of a GPU instance (`nvmlGpuInstancePlacement_t`): the first memory slice it holds
/// and how many.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct Placement {
    /// Index of the first memory slice held.
    pub start: u32,
    /// Memory slices held.
    pub size: u32,
}

impl Placement {
    /// True when the two placements share a memory slice.
    pub fn overlaps(self, other: Placement) -> bool {
        self.start < other.start.saturating_add(other.size)
            && other.start < self.start.saturating_add(self.size)
    }
}

/// A GPU-instance profile of one GPU (`nvmlGpuInstanceProfileInfo_t`), found by its profile
/// index (`NVML_GPU_INSTANCE_PROFILE_*`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct GpuInstanceProfile {
    /// The profile index asked (`NVML_GPU_INSTANCE_PROFILE_1_SLICE` = 0, ...).
    pub index: u32,
    /// The profile ID the other GPU-instance calls take (`19` for `1g.10gb` on an A100).
    pub id: u32,
    /// Compute slices (`sliceCount`).
    pub slice_count: u32,
    /// The most instances of it the GPU can hold (`instanceCount`).
    pub instance_count: u32,
    /// Its memory in MiB (`memorySizeMB`).
    pub memory_mib: u64,
}

impl GpuInstanceProfile {
    /// The profile among `profiles` (as [`crate::NvmlDevices::gpu_instance_profiles`] lists
    /// them) that is gpu-core's `profile`: the same compute slices and the memory nearest its
    /// GB, the lowest profile index on a tie (so `1g.10gb` rather than `1g.10gb+me`, index 7).
    /// NVML reports memory in MiB as the driver carves it (9984 for a 10 GB slice), which is
    /// why the nearest is taken rather than an equal one.
    pub fn for_mig_profile<'a>(
        profiles: &'a [GpuInstanceProfile],
        profile: &gpu_core::mig::MigProfile,
    ) -> Option<&'a GpuInstanceProfile> {
        let want_mib = u64::from(profile.memory_gb) * 1024;
        profiles
            .iter()
            .filter(|p| p.slice_count == u32::from(profile.compute_slices))
            .min_by_key(|p| (p.memory_mib.abs_diff(want_mib), p.index))
    }
}

/// One GPU instance with its profile and placement (`nvmlGpuInstanceInfo_t`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct GpuInstance {
    /// NVML's ID of the instance on its GPU.
    pub id: u32,
    /// Its profile ID.
    pub profile_id: u32,
    /// Compute slices of its profile.
    pub slice_count: u32,
    /// Its placement.
    pub placement: Placement,
}

/// A GPU's vGPU mode for sizes (`NVML_VGPU_PGPU_HETEROGENEOUS_MODE` /
/// `NVML_VGPU_PGPU_HOMOGENEOUS_MODE`): in homogeneous mode every vGPU on the GPU has one size; in
/// heterogeneous ("mixed-size") mode each takes a placement of its type's size.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum VgpuMode {
    /// `NVML_VGPU_PGPU_HETEROGENEOUS_MODE` (0).
    Heterogeneous,
    /// `NVML_VGPU_PGPU_HOMOGENEOUS_MODE` (1).
    Homogeneous,
}

impl VgpuMode {
    /// NVML's value for this mode.
    pub fn raw(self) -> u32 {
        match self {
            VgpuMode::Heterogeneous => 0,
            VgpuMode::Homogeneous => 1,
        }
    }

    /// The mode of NVML's value `raw`, `None` for a value NVML does not define.
    pub fn from_raw(raw: u32) -> Option<Self> {
        match raw {
            0 => Some(VgpuMode::Heterogeneous),
            1 => Some(VgpuMode::Homogeneous),
            _ => None,
        }
    }
}

/// The time-sliced vGPU scheduler a GPU runs (`nvmlVgpuSchedulerGetState_t.schedulerPolicy`,
/// `NVML_VGPU_SCHEDULER_POLICY_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum VgpuScheduler {
    /// `NVML_VGPU_SCHEDULER_POLICY_BEST_EFFORT` (1), the default.
    BestEffort,
    /// `NVML_VGPU_SCHEDULER_POLICY_EQUAL_SHARE` (2).
    EqualShare,
    /// `NVML_VGPU_SCHEDULER_POLICY_FIXED_SHARE` (3).
    FixedShare,
    /// `NVML_VGPU_SCHEDULER_POLICY_UNKNOWN` (0), or a value a newer driver adds.
    Unknown(u32),
}

impl VgpuScheduler {
    /// The scheduler of NVML's value `raw`.
    pub fn from_raw(raw: u32) -> Self {
        match raw {
            1 => VgpuScheduler::BestEffort,
            2 => VgpuScheduler::EqualShare,
            3 => VgpuScheduler::FixedShare,
            other => VgpuScheduler::Unknown(other),
        }
    }

    /// Whether NVIDIA supports mixed-size ("heterogeneous") vGPUs under it: Best Effort and
    /// Equal Share only (NVIDIA AI Enterprise, "Heterogeneous vGPU"; docs/partitions.md).
    pub fn allows_mixed_size(self) -> bool {
        matches!(self, VgpuScheduler::BestEffort | VgpuScheduler::EqualShare)
    }
}

impl std::fmt::Display for VgpuScheduler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            VgpuScheduler::BestEffort => f.write_str("best effort"),
            VgpuScheduler::EqualShare => f.write_str("equal share"),
            VgpuScheduler::FixedShare => f.write_str("fixed share"),
            VgpuScheduler::Unknown(v) => write!(f, "unknown ({v})"),
        }
    }
}

/// A vGPU type's placements on a GPU (`nvmlVgpuPlacementList_v2_t`): how many slots one vGPU of
/// the type occupies and the placement IDs (first slots) it may take.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct VgpuPlacements {
    /// Slots one vGPU of the type occupies (`placementSize`).
    pub placement_size: u32,
    /// The placement IDs (`placementIds`).
    pub placement_ids: Vec<u32>,
}

/// One vGPU type a GPU supports (`nvmlDeviceGetSupportedVgpus` and the type's queries).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct VgpuTypeInfo {
    /// The type ID.
    pub id: u32,
    /// Its name as the driver prints it (`NVIDIA L40S-24Q`).
    pub name: String,
    /// Framebuffer per vGPU in MiB, when read.
    pub framebuffer_mib: Option<u64>,
    /// The most vGPUs of the type on one GPU, when read.
    pub max_instances: Option<u32>,
}

/// One running vGPU on a GPU (`nvmlDeviceGetActiveVgpus`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ActiveVgpu {
    /// NVML's vGPU instance ID.
    pub instance: u32,
    /// Its type ID.
    pub type_id: u32,
    /// Its placement ID, in heterogeneous mode (`nvmlVgpuInstanceGetPlacementId`).
    pub placement_id: Option<u32>,
}

/// Row-remapping counts as `nvmlDeviceGetRemappedRows` gives them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RemappedRows {
    /// Rows remapped for correctable errors.
    pub corrected: u32,
    /// Rows remapped for uncorrectable errors.
    pub uncorrected: u32,
    /// A remapping waits for the next reset.
    pub pending: bool,
    /// A remapping failed.
    pub failure: bool,
}

/// The health signals of one GPU, each call's own answer (one failing call leaves the others
/// intact). gpu-health grades them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HealthReads {
    /// `nvmlDeviceGetTotalEccErrors(UNCORRECTED, VOLATILE_ECC)`.
    pub ecc_uncorrected_volatile: Result<u64, NvmlError>,
    /// `nvmlDeviceGetTotalEccErrors(UNCORRECTED, AGGREGATE_ECC)`.
    pub ecc_uncorrected_aggregate: Result<u64, NvmlError>,
    /// `nvmlDeviceGetTotalEccErrors(CORRECTED, VOLATILE_ECC)`.
    pub ecc_corrected_volatile: Result<u64, NvmlError>,
    /// `nvmlDeviceGetTotalEccErrors(CORRECTED, AGGREGATE_ECC)`.
    pub ecc_corrected_aggregate: Result<u64, NvmlError>,
    /// Pages retired for multiple single-bit errors (`nvmlDeviceGetRetiredPages`).
    pub retired_pages_sbe: Result<u64, NvmlError>,
    /// Pages retired for a double-bit error.
    pub retired_pages_dbe: Result<u64, NvmlError>,
    /// `nvmlDeviceGetRetiredPagesPendingStatus`.
    pub pages_pending_retirement: Result<bool, NvmlError>,
    /// `nvmlDeviceGetRemappedRows`.
    pub remapped_rows: Result<RemappedRows, NvmlError>,
    /// `nvmlDeviceGetTemperature(GPU)`, °C.
    pub temperature_c: Result<u32, NvmlError>,
    /// The slowdown threshold, °C.
    pub slowdown_c: Result<u32, NvmlError>,
    /// The shutdown threshold, °C.
    pub shutdown_c: Result<u32, NvmlError>,
    /// `nvmlDeviceGetPcieReplayCounter`.
    pub pcie_replay_counter: Result<u64, NvmlError>,
    /// Total framebuffer in bytes (`nvmlDeviceGetMemoryInfo`).
    pub memory_total_bytes: Result<u64, NvmlError>,
}

impl HealthReads {
    /// A healthy GPU with `memory_mib` of framebuffer: no errors, 40 °C against 90/95 °C.
    pub fn nominal(memory_mib: u64) -> Self {
        HealthReads {
            ecc_uncorrected_volatile: Ok(0),
            ecc_uncorrected_aggregate: Ok(0),
            ecc_corrected_volatile: Ok(0),
            ecc_corrected_aggregate: Ok(0),
            retired_pages_sbe: Ok(0),
            retired_pages_dbe: Ok(0),
            pages_pending_retirement: Ok(false),
            remapped_rows: Ok(RemappedRows::default()),
            temperature_c: Ok(40),
            slowdown_c: Ok(90),
            shutdown_c: Ok(95),
            pcie_replay_counter: Ok(0),
            memory_total_bytes: Ok(memory_mib.saturating_mul(1024 * 1024)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placements_overlap_only_when_they_share_a_memory_slice() {
        let p = |start, size| Placement { start, size };
        assert!(p(0, 4).overlaps(p(2, 2)));
        assert!(p(2, 2).overlaps(p(0, 4)));
        assert!(!p(0, 4).overlaps(p(4, 4)));
        assert!(!p(4, 1).overlaps(p(0, 4)));
    }

    #[test]
    fn gpu_cores_profile_is_found_among_nvmls_by_slices_and_nearest_memory() {
        // As `nvidia-smi mig -lgip` lists them on an H100 80GB.
        let nvml = |index, id, slice_count, memory_mib| GpuInstanceProfile {
            index,
            id,
            slice_count,
            instance_count: 1,
            memory_mib,
        };
        let listed = [
            nvml(0, 19, 1, 9984),
            nvml(7, 20, 1, 9984),
            nvml(9, 15, 1, 20096),
            nvml(1, 14, 2, 20096),
            nvml(2, 9, 3, 40448),
            nvml(3, 5, 4, 40448),
            nvml(4, 0, 7, 81152),
        ];
        let g = gpu_core::mig::MigGeometry::for_device(0x2330).unwrap();
        let id = |name: &str| {
            let p = g.profile_named(name).unwrap();
            GpuInstanceProfile::for_mig_profile(&listed, p).map(|p| p.id)
        };
        assert_eq!(id("1g.10gb"), Some(19));
        assert_eq!(id("1g.20gb"), Some(15));
        assert_eq!(id("3g.40gb"), Some(9));
        assert_eq!(id("7g.80gb"), Some(0));
        assert_eq!(
            GpuInstanceProfile::for_mig_profile(&listed[..1], g.profile_named("2g.20gb").unwrap()),
            None
        );
    }

    #[test]
    fn a_mode_change_waiting_for_a_reset_reads_as_pending_reset() {
        let m = MigModes {
            current: MigMode::Disabled,
            pending: MigMode::Enabled,
        };
        assert!(m.is_pending());
        assert_eq!(m.describe(), "pending reset");
        assert_eq!(MigModes::settled(MigMode::Enabled).describe(), "enabled");
    }
}
