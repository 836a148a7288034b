//! NVML's names for the MIG profiles of [`gpu_core::mig`]'s geometry tables: the profile index
//! (`NVML_GPU_INSTANCE_PROFILE_*`, nvml.h) and the profile ID the GPU-instance calls take.
//!
//! The geometry itself (slices, memory, legal starts) is gpu-core's; only the two numbers NVML
//! adds live here.

use gpu_core::mig::{MigGeometry, MigProfile};

use crate::types::{GpuInstanceProfile, Placement};

/// NVML's profile index and ID of `profile` on a GPU of `geometry`, `None` for a profile shape
/// this table does not know.
///
/// Seven-slice products (A100, H100, H200, H20, B200): indices from nvml.h
/// (`NVML_GPU_INSTANCE_PROFILE_1_SLICE` = 0, `_2_SLICE` = 1, `_3_SLICE` = 2, `_4_SLICE` = 3,
/// `_7_SLICE` = 4, `_1_SLICE_REV2` = 9 for the 1g profile with two memory slices); IDs as
/// `nvidia-smi mig -lgip` lists them on an H100 80GB (19, 15, 14, 9, 5, 0). A30 (four slices):
/// IDs 14, 5, 0 as `nvidia-smi` lists them on an A30 (not confirmed against NVIDIA's
/// documentation; see docs/partitions.md).
pub fn nvml_profile(geometry: &MigGeometry, profile: &MigProfile) -> Option<(u32, u32)> {
    let seven = geometry.compute_slices == 7;
    Some(
        match (profile.compute_slices, profile.memory_slices, seven) {
            (1, 1, true) => (0, 19),
            (1, 2, true) => (9, 15),
            (2, 2, true) => (1, 14),
            (3, 4, true) => (2, 9),
            (4, 4, true) => (3, 5),
            (7, 8, true) => (4, 0),
            (1, 1, false) => (0, 14),
            (2, 2, false) => (1, 5),
            (4, 4, false) => (3, 0),
            _ => return None,
        },
    )
}

/// The profile of `geometry` with NVML profile ID `id`.
pub fn profile_by_id(geometry: &'static MigGeometry, id: u32) -> Option<&'static MigProfile> {
    geometry
        .profiles
        .iter()
        .find(|p| nvml_profile(geometry, p).is_some_and(|(_, pid)| pid == id))
}

/// `profile` as `nvmlDeviceGetGpuInstanceProfileInfo` describes it.
pub fn profile_info(geometry: &MigGeometry, profile: &MigProfile) -> Option<GpuInstanceProfile> {
    let (index, id) = nvml_profile(geometry, profile)?;
    Some(GpuInstanceProfile {
        index,
        id,
        slice_count: u32::from(profile.compute_slices),
        instance_count: u32::try_from(profile.starts.len()).unwrap_or(u32::MAX),
        memory_mib: u64::from(profile.memory_gb) * 1024,
    })
}

/// Every placement of `profile` (`nvmlDeviceGetGpuInstancePossiblePlacements_v2`): its legal
/// starts, each holding its memory slices.
pub fn placements(profile: &MigProfile) -> Vec<Placement> {
    profile
        .starts
        .iter()
        .map(|s| Placement {
            start: u32::from(*s),
            size: u32::from(profile.memory_slices),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_profile_of_every_known_geometry_has_an_nvml_id_unique_on_its_gpu() {
        for g in gpu_core::mig::GEOMETRIES {
            let mut ids = Vec::new();
            for p in g.profiles {
                let (_, id) =
                    nvml_profile(g, p).unwrap_or_else(|| panic!("{} {}", g.product, p.name));
                assert!(!ids.contains(&id), "{} {}", g.product, p.name);
                ids.push(id);
                assert_eq!(profile_by_id(g, id).map(|q| q.name), Some(p.name));
            }
        }
    }
}
