//! Where MIG-backed vGPUs can start on a GPU: gpu-core's per-product geometry where the product
//! is in it, else starts aligned to the next power of two.

use gpu_core::{MigGeometry, MigOccupancy, Pool};

/// Where a MIG-backed vGPU of `slices` compute slices and `framebuffer_mib` can start on a GPU of
/// PCI device ID `device_id` with `total` slices, and how many memory slices it holds from there.
/// From gpu-core's per-product table ([`MigGeometry`]) where the product is in it (an H200 3g
/// instance starts at 0 or 4 and holds 4 of the 8 memory slices); otherwise starts aligned to the
/// next power of two, holding one memory slice per compute slice.
pub fn mig_spans(device_id: u16, slices: u8, framebuffer_mib: u64, total: u8) -> Vec<(u8, u8)> {
    match MigGeometry::for_device(device_id) {
        Some(g) => g
            .profile_for(slices, framebuffer_mib)
            .map(|p| {
                p.starts
                    .iter()
                    .map(|s| (*s, p.memory_slices))
                    .filter(|(s, len)| s + len <= g.memory_slices)
                    .collect()
            })
            .unwrap_or_default(),
        None => mig_placements(slices, total)
            .into_iter()
            .map(|s| (s, slices))
            .collect(),
    }
}

/// The memory slots held by a GPU's existing MIG instances when its pool knows the start of
/// every one of them ([`gpu_core::MigSlots::known_occupancy`], from NVML) and they account for all
/// `foreign_slices` compute slices of the MIG-backed vGPUs seen on it; `None` otherwise.
pub(super) fn exactly_placed(pool: &Pool, foreign_slices: u32) -> Option<MigOccupancy> {
    let (held, slices) = pool.mig_slots.as_ref()?.known_occupancy()?;
    (slices == foreign_slices).then_some(held)
}

/// The memory-slice counters of a GPU of PCI device ID `device_id` with `total` MIG slices: the
/// table's memory slices where the product is in it, else one per compute slice.
pub fn mig_memory_slices(device_id: u16, total: u8) -> u8 {
    MigGeometry::for_device(device_id).map_or(total, |g| g.memory_slices)
}

/// Start slots of a MIG profile of `slices` on a GPU of `total` slices that gpu-core's table does
/// not describe: aligned to the next power of two.
pub fn mig_placements(slices: u8, total: u8) -> Vec<u8> {
    if slices == 0 || slices > total {
        return vec![];
    }
    let align = slices.next_power_of_two();
    (0..total)
        .step_by(usize::from(align))
        .filter(|s| s + slices <= total)
        .collect()
}
