//! MIG geometry: per product, each GPU-instance profile's compute slices, memory slices and the
//! start slots it may take (NVIDIA's MIG user guide, "Supported MIG Profiles"). Placement is
//! over memory slices, as NVML's GPU-instance placements are: a profile started at `s` holds
//! memory slots `s .. s + memory_slices`, and two instances never share a slot. Counting slices
//! over-promises: on an H200, 1g at slots 0 and 4 leave 5 free slices and no room for a 3g, and
//! two 3g plus one 1g need 9 of 8 memory slices.
//!
//! Pure: no host access. The layout planner, the scheduler and the DRA export share this table.

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
    /// Frees the slots of `profile` started at `start`.
    pub fn free(&mut self, start: u8, profile: &MigProfile) {
        if let Some(m) = Self::span(start, profile.memory_slices) {
            self.0 &= !m;
        }
    }
}

const fn p(
    name: &'static str,
    compute_slices: u8,
    memory_slices: u8,
    memory_gb: u32,
    starts: &'static [u8],
) -> MigProfile {
    MigProfile {
        name,
        compute_slices,
        memory_slices,
        memory_gb,
        starts,
    }
}

const S1: &[u8] = &[0, 1, 2, 3, 4, 5, 6];
const S1X2: &[u8] = &[0, 2, 4, 6];
const S2: &[u8] = &[0, 2, 4];
const S3: &[u8] = &[0, 4];
const S0: &[u8] = &[0];

/// The seven-slice products (eight memory slices): 1g at 0–6, 1g with two memory slices at
/// 0/2/4/6, 2g at 0/2/4, 3g at 0/4, 4g and 7g at 0.
const fn seven(gb: [u32; 6]) -> [MigProfile; 6] {
    [
        p("1g", 1, 1, gb[0], S1),
        p("1g", 1, 2, gb[1], S1X2),
        p("2g", 2, 2, gb[2], S2),
        p("3g", 3, 4, gb[3], S3),
        p("4g", 4, 4, gb[4], S0),
        p("7g", 7, 8, gb[5], S0),
    ]
}

const A100_40: [MigProfile; 6] = seven([5, 10, 10, 20, 20, 40]);
const A100_80: [MigProfile; 6] = seven([10, 20, 20, 40, 40, 80]);
const H100_80: [MigProfile; 6] = seven([10, 20, 20, 40, 40, 80]);
const H200_141: [MigProfile; 6] = seven([18, 35, 35, 71, 71, 141]);
const H20_96: [MigProfile; 6] = seven([12, 24, 24, 48, 48, 96]);
const B200_180: [MigProfile; 6] = seven([23, 45, 45, 90, 90, 180]);
const A30_24: [MigProfile; 3] = [
    p("1g", 1, 1, 6, &[0, 1, 2, 3]),
    p("2g", 2, 2, 12, &[0, 2]),
    p("4g", 4, 4, 24, S0),
];

/// The products whose MIG geometry is known.
pub const GEOMETRIES: &[MigGeometry] = &[
    MigGeometry {
        product: "A100 40GB",
        vgpu_board: "A100",
        device_ids: &[0x20f1, 0x20b0],
        compute_slices: 7,
        memory_slices: 8,
        profiles: &A100_40,
    },
    MigGeometry {
        product: "A100 80GB",
        vgpu_board: "A100D",
        device_ids: &[0x20b5, 0x20b2],
        compute_slices: 7,
        memory_slices: 8,
        profiles: &A100_80,
    },
    MigGeometry {
        product: "A30 24GB",
        vgpu_board: "A30",
        device_ids: &[0x20b7],
        compute_slices: 4,
        memory_slices: 4,
        profiles: &A30_24,
    },
    MigGeometry {
        product: "H100 80GB",
        vgpu_board: "H100XM",
        device_ids: &[0x2330],
        compute_slices: 7,
        memory_slices: 8,
        profiles: &H100_80,
    },
    MigGeometry {
        product: "H200 SXM 141GB",
        vgpu_board: "H200X",
        device_ids: &[0x2335],
        compute_slices: 7,
        memory_slices: 8,
        profiles: &H200_141,
    },
    MigGeometry {
        product: "H20 96GB",
        vgpu_board: "H20",
        device_ids: &[],
        compute_slices: 7,
        memory_slices: 8,
        profiles: &H20_96,
    },
    MigGeometry {
        product: "B200 180GB",
        vgpu_board: "B200",
        device_ids: &[],
        compute_slices: 7,
        memory_slices: 8,
        profiles: &B200_180,
    },
];

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

    /// Places `profiles` in turn, largest first, each at its lowest free start; `Err` names the
    /// first that does not fit, with the slots held at that point.
    ///
    /// # Errors
    /// The profile that found no free start, and the occupancy it met.
    pub fn place_all<'a>(
        &self,
        mut occupied: MigOccupancy,
        profiles: &[&'a MigProfile],
    ) -> Result<MigOccupancy, (&'a MigProfile, MigOccupancy)> {
        let mut order: Vec<&MigProfile> = profiles.to_vec();
        order.sort_by_key(|p| std::cmp::Reverse((p.memory_slices, p.compute_slices)));
        for p in order {
            match self.fits(occupied, p) {
                Some(s) => occupied.hold(s, p),
                None => return Err((p, occupied)),
            }
        }
        Ok(occupied)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn h200() -> &'static MigGeometry {
        MigGeometry::for_device(0x2335).unwrap()
    }

    #[test]
    fn h200_profiles_start_where_the_mig_guide_says() {
        let g = h200();
        let starts = |slices, mib| g.profile_for(slices, mib).unwrap().starts.to_vec();
        assert_eq!(starts(1, 18 * 1024), [0, 1, 2, 3, 4, 5, 6]);
        assert_eq!(starts(1, 35 * 1024), [0, 2, 4, 6]);
        assert_eq!(starts(2, 35 * 1024), [0, 2, 4]);
        assert_eq!(starts(3, 71 * 1024), [0, 4]);
        assert_eq!(starts(4, 71 * 1024), [0]);
        assert_eq!(starts(7, 141 * 1024), [0]);
        assert_eq!(MigGeometry::for_vgpu_board("h200x"), Some(g));
    }

    #[test]
    fn one_g_at_slots_0_and_4_leaves_no_room_for_a_3g() {
        let g = h200();
        let one = g.profile_for(1, 18 * 1024).unwrap();
        let three = g.profile_for(3, 71 * 1024).unwrap();
        let mut o = MigOccupancy::empty();
        o.hold(0, one);
        o.hold(4, one);
        assert_eq!(o.held(), 2);
        assert_eq!(g.fits(o, three), None);
        o.free(4, one);
        assert_eq!(g.fits(o, three), Some(4));
    }

    #[test]
    fn two_3g_and_a_1g_need_nine_of_eight_memory_slices() {
        let g = h200();
        let one = g.profile_for(1, 18 * 1024).unwrap();
        let three = g.profile_for(3, 71 * 1024).unwrap();
        let e = g
            .place_all(MigOccupancy::empty(), &[three, three, one])
            .unwrap_err();
        assert_eq!(e.0, one);
        assert_eq!(e.1.held(), 8);
        let ok = g.place_all(MigOccupancy::empty(), &[three, one, one, one]);
        assert!(ok.is_ok());
    }

    #[test]
    fn seven_1g_fill_an_h100_and_an_a30_takes_four() {
        let g = MigGeometry::for_device(0x2330).unwrap();
        let one = g.profile_for(1, 10 * 1024).unwrap();
        let o = g.place_all(MigOccupancy::empty(), &[one; 7]).unwrap();
        assert_eq!(g.fits(o, one), None);
        let a30 = MigGeometry::for_vgpu_board("A30").unwrap();
        let one = a30.profile_for(1, 6 * 1024).unwrap();
        assert!(a30.place_all(MigOccupancy::empty(), &[one; 4]).is_ok());
        assert!(a30.place_all(MigOccupancy::empty(), &[one; 5]).is_err());
    }
}
