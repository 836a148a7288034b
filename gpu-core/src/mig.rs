//! MIG geometry: per product, each GPU-instance profile's compute slices, memory slices and the
//! start slots it may take (NVIDIA's MIG user guide, "Supported MIG Profiles"). Placement is
//! over memory slices, as NVML's GPU-instance placements are (`nvmlGpuInstancePlacement_t`:
//! `start` is the index of the first memory slice held, `size` how many, per NVML's API
//! reference): a profile started at `s` holds memory slots `s .. s + memory_slices`, and two
//! instances never share a slot. Counting slices
//! over-promises: on an H200, 1g at slots 0 and 4 leave 5 free slices and no room for a 3g, and
//! two 3g plus one 1g need 9 of 8 memory slices.
//!
//! Pure: no host access. The layout planner, the scheduler and the DRA export share this table.
pub mod choose;
mod memo;
mod order;
pub mod parted;
mod search;
mod slots;
mod start;
mod table;
#[cfg(test)]
mod tests;

pub use slots::{MigPlaced, MigSlots, SlotMisfit};
pub use table::GEOMETRIES;

/// One GPU-instance profile of a product.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MigProfile {
    /// NVIDIA's profile name on this product (`1g.18gb`).
    pub name: &'static str,
    /// Compute slices (the `1g` of `1g.18gb`).
    pub compute_slices: u8,
    /// Memory slices it holds.
    pub memory_slices: u8,
    /// Its memory in GB as NVIDIA names it.
    pub memory_gb: u32,
    /// The memory slots it may start at.
    pub starts: &'static [u8],
}

/// The MIG geometry of one product.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MigGeometry {
    /// The product (`H200 SXM 141GB`).
    pub product: &'static str,
    /// The board part of its vGPU type names (`H200X` as in `H200X-1-18C`).
    pub vgpu_board: &'static str,
    /// PCI device IDs of the product (empty where gpuslice has none on record: the product is
    /// then found by its vGPU board name).
    pub device_ids: &'static [u16],
    /// Compute slices of the whole GPU.
    pub compute_slices: u8,
    /// Memory slices of the whole GPU.
    pub memory_slices: u8,
    /// Its GPU-instance profiles, smallest first.
    pub profiles: &'static [MigProfile],
}

/// Which memory slots of one GPU are held (bit `i` = slot `i`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MigOccupancy(u16);

impl MigOccupancy {
    /// No slot held.
    pub fn empty() -> Self {
        Self(0)
    }
    /// Whether slot `i` is held.
    pub fn is_held(self, slot: u8) -> bool {
        slot < 16 && self.0 & (1 << slot) != 0
    }
    /// How many slots are held.
    pub fn held(self) -> u32 {
        self.0.count_ones()
    }
    fn span(start: u8, len: u8) -> Option<u16> {
        let end = u32::from(start) + u32::from(len);
        if len == 0 || end > 16 {
            return None;
        }
        Some((((1u32 << len) - 1) << start) as u16)
    }
    /// Whether `profile` started at `start` is free of held slots.
    pub fn is_free(self, start: u8, profile: &MigProfile) -> bool {
        Self::span(start, profile.memory_slices).is_some_and(|m| self.0 & m == 0)
    }
    /// Holds the slots of `profile` started at `start`.
    pub fn hold(&mut self, start: u8, profile: &MigProfile) {
        if let Some(m) = Self::span(start, profile.memory_slices) {
            self.0 |= m;
        }
    }
    /// Whether the `len` slots from `start` are free (false past slot 15 or for no slot).
    pub fn is_span_free(self, start: u8, len: u8) -> bool {
        Self::span(start, len).is_some_and(|m| self.0 & m == 0)
    }
    /// Holds the `len` slots from `start`.
    pub fn hold_span(&mut self, start: u8, len: u8) {
        if let Some(m) = Self::span(start, len) {
            self.0 |= m;
        }
    }
    /// Frees the slots of `profile` started at `start`.
    pub fn free(&mut self, start: u8, profile: &MigProfile) {
        if let Some(m) = Self::span(start, profile.memory_slices) {
            self.0 &= !m;
        }
    }
}

impl MigGeometry {
    /// The geometry of the product with PCI device ID `device_id`.
    pub fn for_device(device_id: u16) -> Option<&'static MigGeometry> {
        GEOMETRIES
            .iter()
            .find(|g| g.device_ids.contains(&device_id))
    }

    /// The geometry of the product whose vGPU type names start with `board` (`H200X`).
    pub fn for_vgpu_board(board: &str) -> Option<&'static MigGeometry> {
        GEOMETRIES
            .iter()
            .find(|g| g.vgpu_board.eq_ignore_ascii_case(board))
    }

    /// The GPU-instance profile of a MIG-backed vGPU type of `compute_slices` slices and
    /// `framebuffer_mib`: the one of that slice count whose memory is nearest.
    pub fn profile_for(&self, compute_slices: u8, framebuffer_mib: u64) -> Option<&MigProfile> {
        let gb = framebuffer_mib / 1024;
        self.profiles
            .iter()
            .filter(|p| p.compute_slices == compute_slices)
            .min_by_key(|p| u64::from(p.memory_gb).abs_diff(gb))
    }

    /// The lowest allowed start slot where `profile` fits beside what `occupied` holds, if any.
    pub fn fits(&self, occupied: MigOccupancy, profile: &MigProfile) -> Option<u8> {
        profile
            .starts
            .iter()
            .copied()
            .find(|s| occupied.is_free(*s, profile))
    }

    /// The profile named `name` (`3g.71gb`; case-insensitive, `MIG ` prefix allowed).
    pub fn profile_named(&self, name: &str) -> Option<&'static MigProfile> {
        // Names gpuslice wrote itself are the table's own: the exact match first.
        if let Some(p) = self.profiles.iter().find(|p| p.name == name) {
            return Some(p);
        }
        let name = name.trim();
        let name = name
            .strip_prefix("MIG ")
            .or_else(|| name.strip_prefix("mig "))
            .unwrap_or(name);
        self.profiles
            .iter()
            .find(|p| p.name.eq_ignore_ascii_case(name))
    }
}
