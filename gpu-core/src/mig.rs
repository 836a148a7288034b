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

use serde::{Deserialize, Serialize};

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
/// 0/2/4/6, 2g at 0/2/4, 3g at 0/4, 4g and 7g at 0. `names` are NVIDIA's profile names in
/// that order, `gb` their memory.
const fn seven(names: [&'static str; 6], gb: [u32; 6]) -> [MigProfile; 6] {
    [
        p(names[0], 1, 1, gb[0], S1),
        p(names[1], 1, 2, gb[1], S1X2),
        p(names[2], 2, 2, gb[2], S2),
        p(names[3], 3, 4, gb[3], S3),
        p(names[4], 4, 4, gb[4], S0),
        p(names[5], 7, 8, gb[5], S0),
    ]
}

// Profile names and memory: NVIDIA's MIG user guide, "Supported MIG Profiles" (A30 24 GB,
// A100 40/80 GB, H100, H200, H20, B200 180 GB). The `+me` variants hold the same slots as their
// base profile and are not listed separately.
const A100_40: [MigProfile; 6] = seven(
    [
        "1g.5gb", "1g.10gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb",
    ],
    [5, 10, 10, 20, 20, 40],
);
const A100_80: [MigProfile; 6] = seven(
    [
        "1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb",
    ],
    [10, 20, 20, 40, 40, 80],
);
const H100_64: [MigProfile; 6] = seven(
    [
        "1g.8gb", "1g.16gb", "2g.16gb", "3g.32gb", "4g.32gb", "7g.64gb",
    ],
    [8, 16, 16, 32, 32, 64],
);
const H100_94: [MigProfile; 6] = seven(
    [
        "1g.12gb", "1g.24gb", "2g.24gb", "3g.47gb", "4g.47gb", "7g.94gb",
    ],
    [12, 24, 24, 47, 47, 94],
);
const H200_141: [MigProfile; 6] = seven(
    [
        "1g.18gb", "1g.35gb", "2g.35gb", "3g.71gb", "4g.71gb", "7g.141gb",
    ],
    [18, 35, 35, 71, 71, 141],
);
const H20_96: [MigProfile; 6] = seven(
    [
        "1g.12gb", "1g.24gb", "2g.24gb", "3g.48gb", "4g.48gb", "7g.96gb",
    ],
    [12, 24, 24, 48, 48, 96],
);
const B200_180: [MigProfile; 6] = seven(
    [
        "1g.23gb", "1g.45gb", "2g.45gb", "3g.90gb", "4g.90gb", "7g.180gb",
    ],
    [23, 45, 45, 90, 90, 180],
);
const A30_24: [MigProfile; 3] = [
    p("1g.6gb", 1, 1, 6, &[0, 1, 2, 3]),
    p("2g.12gb", 2, 2, 12, &[0, 2]),
    p("4g.24gb", 4, 4, 24, S0),
];

const fn g7(
    product: &'static str,
    vgpu_board: &'static str,
    device_ids: &'static [u16],
    profiles: &'static [MigProfile],
) -> MigGeometry {
    MigGeometry {
        product,
        vgpu_board,
        device_ids,
        compute_slices: 7,
        memory_slices: 8,
        profiles,
    }
}

/// The products whose MIG geometry is known, one per vGPU board.
///
/// Boards (the part of a MIG-backed vGPU type name before the slice count, `H200X` in
/// `H200X-3-71C`) and the profile each type maps to: NVIDIA's vGPU for Compute type tables
/// ("Ampere Architecture vGPU Types", "Hopper Architecture vGPU Types" in the NVIDIA AI
/// Enterprise documentation). PCI device IDs are listed only where one is established (0x20b0
/// is the A100 HGX 40GB, whose driver table names `GRID A100X-1-5C`); a product without one is
/// found by its board name. B200's board name could not be established from public sources:
/// NVIDIA's "Blackwell Architecture vGPU Types" page lists the HGX B200, but the copies read for
/// gpuslice show only its RTX PRO rows, whose types carry the shared board `DC` (`DC-1-16C`) rather
/// than a product name. `B200` is therefore an assumption, and a B200 is matched only by a type
/// name with that board (no PCI device ID is on record for it); one whose types name another
/// board gets no MIG slots, and its MIG-backed types are then checked by slice counts only.
pub const GEOMETRIES: &[MigGeometry] = &[
    g7("A100 PCIe 40GB", "A100", &[0x20f1], &A100_40),
    g7("A100 HGX 40GB", "A100X", &[0x20b0], &A100_40),
    g7("A100 PCIe 80GB", "A100D", &[0x20b5], &A100_80),
    g7("A100 HGX 80GB", "A100DX", &[0x20b2], &A100_80),
    MigGeometry {
        product: "A30 24GB",
        vgpu_board: "A30",
        device_ids: &[0x20b7],
        compute_slices: 4,
        memory_slices: 4,
        profiles: &A30_24,
    },
    g7("H100 PCIe 80GB", "H100", &[], &A100_80),
    g7("H100 SXM5 80GB", "H100XM", &[0x2330], &A100_80),
    g7("H100 SXM5 64GB", "H100XS", &[], &H100_64),
    g7("H100 NVL 94GB", "H100L", &[], &H100_94),
    g7("H100 SXM5 94GB", "H100XL", &[], &H100_94),
    g7("H800 PCIe 80GB", "H800", &[], &A100_80),
    g7("H800 SXM5 80GB", "H800XM", &[], &A100_80),
    g7("H800 NVL 94GB", "H800L", &[], &H100_94),
    g7("H200 SXM5 141GB", "H200X", &[0x2335], &H200_141),
    g7("H200 NVL 141GB", "H200", &[], &H200_141),
    g7("H20 SXM5 96GB", "H20", &[], &H20_96),
    g7("H20 SXM5 141GB", "H20X", &[], &H200_141),
    g7("B200 180GB", "B200", &[], &B200_180),
];

/// One question to [`MigGeometry::fits_every_given`].
#[derive(Clone, Copy)]
struct Ask<'q> {
    placed: MigOccupancy,
    existing: &'q [&'q MigProfile],
    still_fit: &'q [&'q MigProfile],
    pending: &'q [&'q MigProfile],
    profile: &'q MigProfile,
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

    /// Places `profiles` beside what `occupied` holds: largest first, each at the lowest start
    /// that still lets the rest fit (an exhaustive search: a set fits whenever some placement
    /// exists). `Err` names the first profile, largest first, that finds no placement with the
    /// ones before it, with the slots those hold.
    ///
    /// # Errors
    /// The profile that found no free start, and the occupancy it met.
    pub fn place_all<'a>(
        &self,
        occupied: MigOccupancy,
        profiles: &[&'a MigProfile],
    ) -> Result<MigOccupancy, (&'a MigProfile, MigOccupancy)> {
        let mut order: Vec<&'a MigProfile> = profiles.to_vec();
        order.sort_by_key(|p| std::cmp::Reverse((p.memory_slices, p.compute_slices)));
        // The longest prefix that can be placed, and the slots its first placement holds.
        let mut best: (usize, MigOccupancy) = (0, occupied);
        fn search(
            order: &[&MigProfile],
            i: usize,
            occ: MigOccupancy,
            best: &mut (usize, MigOccupancy),
        ) -> Option<MigOccupancy> {
            if i > best.0 {
                *best = (i, occ);
            }
            let Some(p) = order.get(i) else {
                return Some(occ);
            };
            for &s in p.starts {
                if occ.is_free(s, p) {
                    let mut next = occ;
                    next.hold(s, p);
                    if let Some(done) = search(order, i + 1, next, best) {
                        return Some(done);
                    }
                }
            }
            None
        }
        match search(&order, 0, occupied, &mut best) {
            Some(done) => Ok(done),
            None => match order.get(best.0) {
                Some(p) => Err((*p, best.1)),
                None => Ok(best.1),
            },
        }
    }

    /// Whether one more `profile` fits beside GPU instances at known starts (`placed`) and
    /// instances whose start is not known (`unplaced`), wherever the driver put those: it fits
    /// only when it fits in every placement of `unplaced` the geometry allows. This never
    /// over-promises; it may refuse a set that a careful placement would hold (a 3g and two 2g
    /// on a seven-slice GPU fit only with the 3g at slot 4).
    ///
    /// # Errors
    /// A placement of `unplaced` that leaves no start for `profile` (its occupancy), or, where
    /// `unplaced` has no placement at all beside `placed`, the occupancy of `placed`.
    pub fn fits_every(
        &self,
        placed: MigOccupancy,
        unplaced: &[&MigProfile],
        profile: &MigProfile,
    ) -> Result<(), MigOccupancy> {
        self.fits_every_given(placed, unplaced, &[], &[], profile)
    }

    /// [`MigGeometry::fits_every`] with what the driver said: the `existing` instances of
    /// unknown start sit only where every profile of `still_fit` (the types the driver listed
    /// as creatable beside them) still has a start; `pending` instances (placed, not created
    /// yet) may then go anywhere.
    ///
    /// # Errors
    /// As [`MigGeometry::fits_every`].
    pub fn fits_every_given(
        &self,
        placed: MigOccupancy,
        existing: &[&MigProfile],
        still_fit: &[&MigProfile],
        pending: &[&MigProfile],
        profile: &MigProfile,
    ) -> Result<(), MigOccupancy> {
        let ask = Ask {
            placed,
            existing,
            still_fit,
            pending,
            profile,
        };
        let Some(key) = self.memo_key(&ask) else {
            return self.search_every(&ask);
        };
        if let Some(answer) = memo::get(key) {
            return answer;
        }
        let answer = self.search_every(&ask);
        memo::put(key, answer);
        answer
    }

    /// The key of one question to [`MigGeometry::fits_every_given`] in its memo: which product,
    /// the known occupancy, how many of each profile exist and are pending, which profiles the
    /// driver still listed, and the one asked about. The answer depends on nothing else (the
    /// search sorts what it is given, and `still_fit` is only asked whether any is blocked).
    /// `None` (asked without the memo) for a geometry or profile not in [`GEOMETRIES`], more
    /// than eight profiles, or more than 15 instances of one.
    fn memo_key(&self, ask: &Ask<'_>) -> Option<u128> {
        let product = GEOMETRIES.iter().position(|g| std::ptr::eq(g, self))?;
        if self.profiles.len() > 8 {
            return None;
        }
        let index = |p: &MigProfile| self.profiles.iter().position(|q| std::ptr::eq(q, p));
        let counts = |list: &[&MigProfile]| -> Option<u128> {
            let mut c = [0u8; 8];
            for p in list {
                let n = c.get_mut(index(p)?)?;
                *n += 1;
                if *n > 15 {
                    return None;
                }
            }
            Some(
                c.iter()
                    .enumerate()
                    .fold(0u128, |k, (i, n)| k | (u128::from(*n) << (4 * i))),
            )
        };
        let mut fit = 0u128;
        for p in ask.still_fit {
            fit |= 1 << index(p)?;
        }
        let key = 1u128 << 127
            | u128::from(ask.placed.0)
            | (product as u128) << 16
            | (index(ask.profile)? as u128) << 24
            | fit << 28
            | counts(ask.existing)? << 36
            | counts(ask.pending)? << 68;
        Some(key)
    }

    /// The exhaustive search behind [`MigGeometry::fits_every_given`].
    fn search_every(&self, ask: &Ask<'_>) -> Result<(), MigOccupancy> {
        let Ask {
            placed,
            existing,
            still_fit,
            pending,
            profile,
        } = *ask;
        let key = |p: &&MigProfile| std::cmp::Reverse((p.memory_slices, p.compute_slices, p.name));
        // A GPU holds at most seven instances: the order is kept on the stack (this runs for
        // every GPU a placement considers), on the heap only past 16.
        let split = existing.len();
        let total = split + pending.len();
        let mut inline: [&MigProfile; 16] = [profile; 16];
        let mut heap: Vec<&MigProfile> = Vec::new();
        let order: &mut [&MigProfile] = match inline.get_mut(..total) {
            Some(order) => {
                for (slot, p) in order.iter_mut().zip(existing.iter().chain(pending)) {
                    *slot = p;
                }
                order
            }
            None => {
                heap.extend(existing.iter().chain(pending).copied());
                &mut heap
            }
        };
        let (known, rest) = order.split_at_mut(split);
        known.sort_unstable_by_key(key);
        rest.sort_unstable_by_key(key);
        let order: &[&MigProfile] = order;
        struct Search<'s> {
            geometry: &'s MigGeometry,
            order: &'s [&'s MigProfile],
            split: usize,
            still_fit: &'s [&'s MigProfile],
            q: &'s MigProfile,
            any: bool,
        }
        impl Search<'_> {
            /// Some(occupancy) of a placement that blocks `q`; `any` records that some
            /// placement exists at all.
            fn blocking(
                &mut self,
                i: usize,
                min_start: u8,
                occ: MigOccupancy,
            ) -> Option<MigOccupancy> {
                if i == self.split
                    && self
                        .still_fit
                        .iter()
                        .any(|p| self.geometry.fits(occ, p).is_none())
                {
                    // Not where the driver's lists say the existing instances are.
                    return None;
                }
                let Some(p) = self.order.get(i).copied() else {
                    self.any = true;
                    return self.geometry.fits(occ, self.q).is_none().then_some(occ);
                };
                // Equal profiles of one group take increasing starts: each set is tried once.
                let same_as_next = i + 1 != self.split
                    && self
                        .order
                        .get(i + 1)
                        .is_some_and(|n| std::ptr::eq(*n, p) || **n == *p);
                for &s in p.starts {
                    if s < min_start || !occ.is_free(s, p) {
                        continue;
                    }
                    let mut next = occ;
                    next.hold(s, p);
                    let floor = if same_as_next { s.saturating_add(1) } else { 0 };
                    if let Some(b) = self.blocking(i + 1, floor, next) {
                        return Some(b);
                    }
                }
                None
            }
        }
        let mut search = Search {
            geometry: self,
            order,
            split,
            still_fit,
            q: profile,
            any: false,
        };
        match search.blocking(0, 0, placed) {
            Some(b) => Err(b),
            None if !search.any => Err(placed),
            None => Ok(()),
        }
    }
}

/// A small direct-mapped memo of [`MigGeometry::fits_every_given`], one per thread. A placement
/// asks it of every MIG GPU it considers, and across a fleet the GPUs are in few states, so
/// the same questions come again and again; the exhaustive search behind each costs far more
/// than a look-up. A pure function's answers only: a slot holds one key and its answer, and a
/// new key takes the slot of an old one.
mod memo {
    use super::MigOccupancy;
    use std::cell::RefCell;

    const SLOTS: usize = 1024;

    type Answer = Result<(), MigOccupancy>;

    thread_local! {
        static TABLE: RefCell<Vec<(u128, Answer)>> = const { RefCell::new(Vec::new()) };
    }

    fn slot(key: u128) -> usize {
        let folded = (key as u64) ^ ((key >> 64) as u64);
        (folded.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 54) as usize % SLOTS
    }

    pub(super) fn get(key: u128) -> Option<Answer> {
        TABLE.with(|t| {
            t.borrow()
                .get(slot(key))
                .and_then(|(k, a)| (*k == key).then_some(*a))
        })
    }

    pub(super) fn put(key: u128, answer: Answer) {
        TABLE.with(|t| {
            let mut t = t.borrow_mut();
            if t.is_empty() {
                t.resize(SLOTS, (0, Ok(())));
            }
            if let Some(s) = t.get_mut(slot(key)) {
                *s = (key, answer);
            }
        });
    }
}

impl MigGeometry {
    /// Every occupancy the `existing` instances of unknown start can leave beside `placed`,
    /// narrowed by what the driver still listed beside them (`still_fit`: each of these has a
    /// start in the occupancy). Empty when they have no placement at all.
    pub fn placements_of(
        &self,
        placed: MigOccupancy,
        existing: &[&MigProfile],
        still_fit: &[&MigProfile],
    ) -> Vec<MigOccupancy> {
        fn walk(
            g: &MigGeometry,
            rest: &[&MigProfile],
            min_start: u8,
            occ: MigOccupancy,
            still_fit: &[&MigProfile],
            out: &mut Vec<MigOccupancy>,
        ) {
            let Some((p, tail)) = rest.split_first() else {
                if still_fit.iter().all(|q| g.fits(occ, q).is_some()) && !out.contains(&occ) {
                    out.push(occ);
                }
                return;
            };
            // Equal profiles take increasing starts: each set is tried once.
            let same_next = tail.first().is_some_and(|n| **n == **p);
            for &s in p.starts {
                if s < min_start || !occ.is_free(s, p) {
                    continue;
                }
                let mut next = occ;
                next.hold(s, p);
                let floor = if same_next { s.saturating_add(1) } else { 0 };
                walk(g, tail, floor, next, still_fit, out);
            }
        }
        let mut order: Vec<&MigProfile> = existing.to_vec();
        order.sort_by_key(|p| std::cmp::Reverse((p.memory_slices, p.compute_slices, p.name)));
        let mut out = Vec::new();
        walk(self, &order, 0, placed, still_fit, &mut out);
        out
    }

    /// An order in which to create the GPU instances `new` (indices into it) so that each
    /// lands at a free start whatever occupancy of `occupancies` the GPU is in, assuming the
    /// driver puts a new GPU instance at the lowest free allowed start of its profile (NVIDIA's
    /// first-fit placement when none is asked for: the documented assumption). Orders are tried
    /// largest first, then every other distinct order; `None` when no order fits in every
    /// occupancy (or there is none).
    pub fn creation_order(
        &self,
        occupancies: &[MigOccupancy],
        new: &[&MigProfile],
    ) -> Option<Vec<usize>> {
        if occupancies.is_empty() {
            return None;
        }
        let fits_all = |order: &[usize]| {
            occupancies.iter().all(|occ| {
                let mut occ = *occ;
                order
                    .iter()
                    .all(|&i| match new.get(i).and_then(|p| self.fits(occ, p)) {
                        Some(s) => {
                            if let Some(p) = new.get(i) {
                                occ.hold(s, p);
                            }
                            true
                        }
                        None => false,
                    })
            })
        };
        let mut first: Vec<usize> = (0..new.len()).collect();
        first.sort_by_key(|&i| {
            new.get(i)
                .map(|p| std::cmp::Reverse((p.memory_slices, p.compute_slices, p.name)))
        });
        if fits_all(&first) {
            return Some(first);
        }
        // Every distinct order (a GPU holds at most seven instances, so at most 5040).
        fn permute(
            prefix: &mut Vec<usize>,
            left: &mut Vec<usize>,
            new: &[&MigProfile],
            found: &mut dyn FnMut(&[usize]) -> bool,
        ) -> bool {
            if left.is_empty() {
                return found(prefix);
            }
            let mut tried: Vec<&str> = Vec::new();
            for k in 0..left.len() {
                let i = left[k];
                let name = new.get(i).map_or("", |p| p.name);
                if tried.contains(&name) {
                    continue;
                }
                tried.push(name);
                left.remove(k);
                prefix.push(i);
                if permute(prefix, left, new, found) {
                    return true;
                }
                prefix.pop();
                left.insert(k, i);
            }
            false
        }
        if new.len() > 8 {
            return None;
        }
        let mut result: Option<Vec<usize>> = None;
        let mut left = first.clone();
        permute(&mut Vec::new(), &mut left, new, &mut |order| {
            if fits_all(order) {
                result = Some(order.to_vec());
                true
            } else {
                false
            }
        });
        result
    }
}

impl MigSlots {
    /// The occupancies this GPU can be in (known starts, and every placement of the instances of
    /// unknown start the driver's lists allow; pending ones count as of unknown start too), for
    /// [`MigGeometry::creation_order`].
    ///
    /// # Errors
    /// [`SlotMisfit::Unknown`] when the slots name what the geometry does not have.
    pub fn occupancies(&self) -> Result<(&'static MigGeometry, Vec<MigOccupancy>), SlotMisfit> {
        let r = self.resolve()?;
        let mut out: Vec<MigOccupancy> = Vec::new();
        for occ in r
            .geometry
            .placements_of(r.placed, &r.existing, &r.still_fit)
        {
            for o in r.geometry.placements_of(occ, &r.pending, &[]) {
                if !out.contains(&o) {
                    out.push(o);
                }
            }
        }
        Ok((r.geometry, out))
    }
}

/// One GPU instance at a known start slot.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct MigPlaced {
    /// Its GPU-instance profile (`1g.18gb`).
    pub profile: String,
    /// Its start slot.
    pub start: u8,
}

/// The GPU-instance slots of one MIG-capable GPU whose geometry gpuslice knows: instances at
/// known starts (from NVML's placements), existing instances whose start is not known (a
/// MIG-backed vGPU seen without NVML), narrowed by what the driver still listed beside them,
/// and pending ones (placed but not created yet: the driver picks the start at creation). A new
/// instance fits only where it fits beside every placement the unknown ones could have
/// ([`MigGeometry::fits_every_given`]). Why not one worst-case occupancy: none exists (a 1g at
/// slot 0 leaves a 3g, a 2g and a 1g room; one at slot 6 leaves a 4g room), so every placement
/// is tried; a GPU holds at most seven instances, which keeps that small.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct MigSlots {
    /// The vGPU board of the product (`H200X`): the key of its [`MigGeometry`].
    pub board: String,
    /// GPU instances at known start slots.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub placed: Vec<MigPlaced>,
    /// GPU-instance profiles of existing instances whose start slot is not known.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unplaced: Vec<String>,
    /// Profiles the driver listed as creatable beside the existing instances when the slots
    /// were read: those instances sit where each of these still has a start.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub creatable: Vec<String>,
    /// Instances placed by the scheduler and not created yet: the driver picks their start.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pending: Vec<String>,
}

/// Why a MIG-backed instance does not fit a GPU's slots.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SlotMisfit {
    /// gpuslice has no geometry for this board, or the GPU's slots name a profile the board
    /// does not have: it cannot tell where instances go.
    Unknown {
        /// What is not known.
        why: String,
    },
    /// The board has no GPU-instance profile for this vGPU type.
    NoProfile {
        /// The product.
        product: &'static str,
        /// The type's compute slices.
        slices: u8,
    },
    /// No start slot is free for it in some placement of what the GPU holds.
    NoStart {
        /// The product.
        product: &'static str,
        /// The profile that does not fit.
        profile: &'static str,
        /// Its allowed starts.
        starts: &'static [u8],
        /// Memory slots held in the placement that blocks it.
        held: u32,
        /// Memory slots of the GPU.
        total: u8,
    },
}

impl std::fmt::Display for SlotMisfit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SlotMisfit::Unknown { why } => write!(f, "MIG slots cannot be established: {why}"),
            SlotMisfit::NoProfile { product, slices } => {
                write!(
                    f,
                    "the {product} has no {slices}-slice GPU-instance profile"
                )
            }
            SlotMisfit::NoStart {
                product,
                profile,
                starts,
                held,
                total,
            } => write!(
                f,
                "no free start slot for a {profile} GPU instance (starts {starts:?}) on the \
                 {product}: {held} of {total} memory slices are held where the existing \
                 instances may sit"
            ),
        }
    }
}

/// [`MigSlots`] with its names looked up.
struct Resolved {
    geometry: &'static MigGeometry,
    placed: MigOccupancy,
    existing: Vec<&'static MigProfile>,
    still_fit: Vec<&'static MigProfile>,
    pending: Vec<&'static MigProfile>,
}

impl Resolved {
    /// Whether one more `profile` fits, as a [`SlotMisfit`] when not.
    fn check(&self, profile: &MigProfile) -> Result<(), SlotMisfit> {
        let g = self.geometry;
        self.fits(profile).map_err(|blocked| SlotMisfit::NoStart {
            product: g.product,
            profile: profile.name,
            starts: profile.starts,
            held: blocked.held(),
            total: g.memory_slices,
        })
    }

    fn fits(&self, profile: &MigProfile) -> Result<(), MigOccupancy> {
        self.geometry.fits_every_given(
            self.placed,
            &self.existing,
            &self.still_fit,
            &self.pending,
            profile,
        )
    }
}

impl MigSlots {
    /// Empty slots of a product.
    pub fn new(geometry: &MigGeometry) -> Self {
        MigSlots {
            board: geometry.vgpu_board.to_owned(),
            placed: Vec::new(),
            unplaced: Vec::new(),
            creatable: Vec::new(),
            pending: Vec::new(),
        }
    }

    /// The geometry these slots follow.
    ///
    /// # Errors
    /// [`SlotMisfit::Unknown`] for a board gpuslice has no geometry for.
    pub fn geometry(&self) -> Result<&'static MigGeometry, SlotMisfit> {
        MigGeometry::for_vgpu_board(&self.board).ok_or_else(|| SlotMisfit::Unknown {
            why: format!("no MIG geometry is known for board {:?}", self.board),
        })
    }

    fn resolve(&self) -> Result<Resolved, SlotMisfit> {
        let g = self.geometry()?;
        let unknown = |name: &str| SlotMisfit::Unknown {
            why: format!("the {} has no GPU-instance profile {name:?}", g.product),
        };
        let mut occ = MigOccupancy::empty();
        for pl in &self.placed {
            let p = g
                .profile_named(&pl.profile)
                .ok_or_else(|| unknown(&pl.profile))?;
            if !p.starts.contains(&pl.start) || !occ.is_free(pl.start, p) {
                return Err(SlotMisfit::Unknown {
                    why: format!(
                        "a {} at slot {} overlaps another instance or is not an allowed start",
                        p.name, pl.start
                    ),
                });
            }
            occ.hold(pl.start, p);
        }
        let names = |list: &[String]| {
            list.iter()
                .map(|n| g.profile_named(n).ok_or_else(|| unknown(n)))
                .collect::<Result<Vec<_>, _>>()
        };
        Ok(Resolved {
            geometry: g,
            placed: occ,
            existing: names(&self.unplaced)?,
            still_fit: names(&self.creatable)?,
            pending: names(&self.pending)?,
        })
    }

    /// The memory slots held and the compute slices they add up to, when every instance on the
    /// GPU sits at a known start (none of unknown start, none pending) and the starts are
    /// consistent with the geometry; `None` when any of that is not known.
    pub fn known_occupancy(&self) -> Option<(MigOccupancy, u32)> {
        if !self.unplaced.is_empty() || !self.pending.is_empty() {
            return None;
        }
        let r = self.resolve().ok()?;
        let slices = self
            .placed
            .iter()
            .filter_map(|p| r.geometry.profile_named(&p.profile))
            .map(|p| u32::from(p.compute_slices))
            .sum();
        Some((r.placed, slices))
    }

    /// The GPU-instance profile of a MIG-backed vGPU type of `slices` compute slices and
    /// `framebuffer_mib` on this product.
    ///
    /// # Errors
    /// [`SlotMisfit::Unknown`] or [`SlotMisfit::NoProfile`].
    pub fn profile_for(
        &self,
        slices: u8,
        framebuffer_mib: u64,
    ) -> Result<&'static MigProfile, SlotMisfit> {
        let g = self.geometry()?;
        g.profile_for(slices, framebuffer_mib)
            .ok_or(SlotMisfit::NoProfile {
                product: g.product,
                slices,
            })
    }

    /// Whether one more instance of `profile` fits wherever the instances of unknown start sit.
    ///
    /// # Errors
    /// The [`SlotMisfit`] saying why not.
    pub fn check(&self, profile: &MigProfile) -> Result<(), SlotMisfit> {
        self.resolve()?.check(profile)
    }

    /// How many more instances of `profile` fit, one after another (each charged with an
    /// unknown start, as the driver picks it).
    pub fn creatable(&self, profile: &'static MigProfile) -> u32 {
        self.room(profile, u32::MAX).unwrap_or(0)
    }

    /// [`MigSlots::check`] and [`MigSlots::creatable`] in one pass, the names looked up once:
    /// how many more instances of `profile` fit one after another, counting no further than
    /// `limit` (one is counted when one fits, whatever `limit`; a GPU holds at most 16).
    ///
    /// # Errors
    /// The [`SlotMisfit`] saying why not even one fits.
    pub fn room(&self, profile: &'static MigProfile, limit: u32) -> Result<u32, SlotMisfit> {
        let mut r = self.resolve()?;
        r.check(profile)?;
        let mut n = 1;
        while n < limit.min(16) {
            r.pending.push(profile);
            if r.fits(profile).is_err() {
                break;
            }
            n += 1;
        }
        Ok(n)
    }

    /// Holds one instance of `profile`, start unknown (the driver picks it at creation).
    pub fn charge(&mut self, profile: &MigProfile) {
        self.pending.push(profile.name.to_owned());
    }

    /// Frees one instance of `profile`: a pending one first, then one of unknown start, then
    /// one at a known start. False when the slots hold no instance of `profile`.
    ///
    /// Which of several placed instances of the profile a removed vGPU held is not known (the
    /// slots say where GPU instances are, not which vGPU uses which), so the others of that
    /// profile lose their known starts: they are held wherever they may sit from then on. Only
    /// the last placed instance of a profile frees its own start.
    pub fn release(&mut self, profile: &MigProfile) -> bool {
        let is = |n: &str| n.eq_ignore_ascii_case(profile.name);
        for list in [&mut self.pending, &mut self.unplaced] {
            if let Some(i) = list.iter().position(|n| is(n)) {
                list.remove(i);
                return true;
            }
        }
        let Some(i) = self.placed.iter().position(|p| is(&p.profile)) else {
            return false;
        };
        self.placed.remove(i);
        let (others, rest): (Vec<MigPlaced>, Vec<MigPlaced>) = std::mem::take(&mut self.placed)
            .into_iter()
            .partition(|p| is(&p.profile));
        self.placed = rest;
        self.unplaced.extend(others.into_iter().map(|p| p.profile));
        true
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
    fn the_occupancy_is_known_only_when_every_instance_has_a_known_start() {
        let mut s = MigSlots::new(h200());
        s.placed.push(MigPlaced {
            profile: "1g.18gb".into(),
            start: 0,
        });
        s.placed.push(MigPlaced {
            profile: "2g.35gb".into(),
            start: 2,
        });
        let (held, slices) = s.known_occupancy().unwrap();
        assert_eq!(slices, 3);
        assert!(held.is_held(0) && held.is_held(2) && held.is_held(3));
        assert!(!held.is_held(1) && !held.is_held(4));
        let mut unknown = s.clone();
        unknown.unplaced.push("1g.18gb".into());
        assert_eq!(unknown.known_occupancy(), None);
        let mut pending = s.clone();
        pending.pending.push("1g.18gb".into());
        assert_eq!(pending.known_occupancy(), None);
        let mut overlapping = s;
        overlapping.placed.push(MigPlaced {
            profile: "1g.18gb".into(),
            start: 3,
        });
        assert_eq!(overlapping.known_occupancy(), None);
    }

    #[test]
    fn releasing_one_of_several_placed_instances_of_a_profile_forgets_where_the_others_are() {
        let g = h200();
        let one = g.profile_named("1g.18gb").unwrap();
        let four = g.profile_named("4g.71gb").unwrap();
        let at = |profile: &str, start| MigPlaced {
            profile: profile.into(),
            start,
        };
        let mut s = MigSlots::new(g);
        s.placed = vec![at("1g.18gb", 0), at("1g.18gb", 4), at("2g.35gb", 2)];
        // One of the two 1g goes; the one left is at 0 or 4, so a 4g (slots 0-3) may not fit.
        assert!(s.release(one));
        assert_eq!(s.placed, [at("2g.35gb", 2)]);
        assert_eq!(s.unplaced, ["1g.18gb"]);
        assert!(s.check(four).is_err());
        // The last one of a profile frees its own start: with the 2g gone, slots 2-3 are free.
        let mut s = MigSlots::new(g);
        s.placed = vec![at("1g.18gb", 6), at("2g.35gb", 2)];
        let two = g.profile_named("2g.35gb").unwrap();
        assert!(s.check(four).is_err());
        assert!(s.release(two));
        assert_eq!(s.placed, [at("1g.18gb", 6)]);
        assert!(s.unplaced.is_empty());
        assert!(s.check(four).is_ok());
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

    #[test]
    fn place_all_finds_a_placement_that_largest_first_lowest_start_misses() {
        let g = h200();
        let two = g.profile_named("2g.35gb").unwrap();
        let three = g.profile_named("3g.71gb").unwrap();
        // Greedy would put the 3g at 0 and find one 2g start; the 3g at 4 holds both.
        let o = g
            .place_all(MigOccupancy::empty(), &[two, three, two])
            .unwrap();
        assert_eq!(o.held(), 8);
    }

    #[test]
    fn an_instance_of_unknown_start_blocks_what_any_of_its_starts_would() {
        let g = h200();
        let one = g.profile_named("1g.18gb").unwrap();
        let two = g.profile_named("2g.35gb").unwrap();
        let three = g.profile_named("3g.71gb").unwrap();
        let four = g.profile_named("4g.71gb").unwrap();
        let empty = MigOccupancy::empty();
        // One 1g anywhere leaves a 3g a half; two may sit at 0 and 4.
        assert!(g.fits_every(empty, &[one], three).is_ok());
        assert!(g.fits_every(empty, &[one, one], three).is_err());
        // A 3g may sit at 0: a 4g is never safe beside it, a 2g always is.
        assert!(g.fits_every(empty, &[three], four).is_err());
        assert!(g.fits_every(empty, &[three], two).is_ok());
        // A set with no placement at all is full.
        assert!(g.fits_every(empty, &[three, three, three], one).is_err());
    }

    /// The memo gives back what the search answers, for every small H200 question, asked
    /// twice (the second time from the memo, or from a slot another key took since).
    #[test]
    fn the_memo_answers_what_the_search_does() {
        let g = h200();
        let all: Vec<&MigProfile> = g.profiles.iter().collect();
        let mut lists: Vec<Vec<&MigProfile>> = vec![vec![]];
        for a in &all {
            lists.push(vec![a]);
            for b in &all {
                lists.push(vec![a, b]);
            }
        }
        let one = g.profile_named("1g.18gb").unwrap();
        let mut at6 = MigOccupancy::empty();
        at6.hold(6, one);
        let mut asked = 0;
        for round in 0..2 {
            for placed in [MigOccupancy::empty(), at6] {
                for existing in &lists {
                    for pending in lists.iter().take(8) {
                        for still_fit in [&[][..], &[one][..]] {
                            for q in &all {
                                let searched = g.search_every(&Ask {
                                    placed,
                                    existing,
                                    still_fit,
                                    pending,
                                    profile: q,
                                });
                                let given =
                                    g.fits_every_given(placed, existing, still_fit, pending, q);
                                assert_eq!(
                                    given, searched,
                                    "round {round}: {existing:?} {pending:?} {}",
                                    q.name
                                );
                                asked += 1;
                            }
                        }
                    }
                }
            }
        }
        assert!(asked > 10_000, "{asked}");
        // A profile the table does not hold is answered by the search alone.
        let odd = MigProfile {
            name: "odd",
            ..*one
        };
        assert_eq!(
            g.fits_every_given(at6, &[&odd], &[], &[], one),
            g.search_every(&Ask {
                placed: at6,
                existing: &[&odd],
                still_fit: &[],
                pending: &[],
                profile: one,
            })
        );
    }

    /// `room` (one look-up, counting on from the first fit) answers what checking and
    /// charging one instance at a time does, for every H200 state of at most one instance of
    /// unknown start, one at a known start and three pending, and every profile and limit.
    #[test]
    fn room_counts_what_charging_one_at_a_time_does() {
        let g = h200();
        let names: Vec<&str> = g.profiles.iter().map(|p| p.name).collect();
        let mut states: Vec<MigSlots> = Vec::new();
        let mut pendings: Vec<Vec<String>> = vec![vec![]];
        for _ in 0..3 {
            let longer: Vec<Vec<String>> = pendings
                .iter()
                .filter(|v| v.len() == pendings.last().map_or(0, Vec::len))
                .flat_map(|v| {
                    names.iter().map(move |n| {
                        let mut v = v.clone();
                        v.push((*n).to_owned());
                        v
                    })
                })
                .collect();
            pendings.extend(longer);
        }
        let unplaced: Vec<Vec<String>> = std::iter::once(vec![])
            .chain(names.iter().map(|n| vec![(*n).to_owned()]))
            .collect();
        let placed = [
            vec![],
            vec![MigPlaced {
                profile: "1g.18gb".into(),
                start: 6,
            }],
        ];
        for pe in &pendings {
            for un in &unplaced {
                for pl in &placed {
                    let mut s = MigSlots::new(g);
                    s.pending.clone_from(pe);
                    s.unplaced.clone_from(un);
                    s.placed.clone_from(pl);
                    states.push(s);
                }
            }
        }
        assert!(states.len() > 1000, "{}", states.len());
        for s in &states {
            for p in g.profiles {
                let mut one_by_one = s.clone();
                let mut n = 0;
                while n < 16 && one_by_one.check(p).is_ok() {
                    one_by_one.charge(p);
                    n += 1;
                }
                assert_eq!(s.creatable(p), n, "{s:?} {}", p.name);
                for limit in [1, 2, 7, u32::MAX] {
                    match s.room(p, limit) {
                        Ok(k) => assert_eq!(k, n.min(limit.max(1)), "{s:?} {} {limit}", p.name),
                        Err(e) => {
                            assert_eq!(n, 0, "{s:?} {}", p.name);
                            assert_eq!(Err(e), s.check(p));
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn slots_name_profiles_and_refuse_what_they_cannot_place() {
        let g = h200();
        let mut slots = MigSlots::new(g);
        let three = slots.profile_for(3, 71 * 1024).unwrap();
        assert_eq!(three.name, "3g.71gb");
        assert_eq!(slots.creatable(three), 2);
        slots.charge(three);
        assert_eq!(slots.creatable(three), 1);
        assert!(slots.release(three));
        assert_eq!(slots.creatable(three), 2);
        slots.unplaced.push("5g.99gb".into());
        let e = slots.check(three).unwrap_err();
        assert!(e.to_string().contains("5g.99gb"), "{e}");
        assert_eq!(slots.creatable(three), 0);
        let json = serde_json::to_string(&MigSlots {
            board: "H200X".into(),
            placed: vec![MigPlaced {
                profile: "1g.18gb".into(),
                start: 4,
            }],
            unplaced: vec![],
            creatable: vec![],
            pending: vec![],
        })
        .unwrap();
        assert_eq!(
            json,
            r#"{"board":"H200X","placed":[{"profile":"1g.18gb","start":4}]}"#
        );
    }

    #[test]
    fn boards_map_mig_backed_types_to_nvidias_gpu_instance_profiles() {
        // (board, slices, GB as in the type name, profile): rows of NVIDIA's vGPU type tables.
        for (board, slices, gb, profile) in [
            ("A100", 1, 5, "1g.5gb"),
            ("A100X", 3, 20, "3g.20gb"),
            ("A100D", 1, 20, "1g.20gb"),
            ("A100DX", 7, 80, "7g.80gb"),
            ("H100", 2, 20, "2g.20gb"),
            ("H100XM", 1, 10, "1g.10gb"),
            ("H100XS", 1, 8, "1g.8gb"),
            ("H100L", 3, 47, "3g.47gb"),
            ("H100XL", 1, 24, "1g.24gb"),
            ("H200", 1, 35, "1g.35gb"),
            ("H200X", 4, 71, "4g.71gb"),
            ("H20", 1, 12, "1g.12gb"),
            ("H20X", 3, 71, "3g.71gb"),
            ("H800L", 7, 94, "7g.94gb"),
        ] {
            let g = MigGeometry::for_vgpu_board(board).unwrap();
            let p = g.profile_for(slices, gb * 1024).unwrap();
            assert_eq!(p.name, profile, "{board}-{slices}-{gb}C");
        }
        assert_eq!(MigGeometry::for_device(0x20b0).unwrap().vgpu_board, "A100X");
    }

    #[test]
    fn what_the_driver_still_lists_narrows_where_existing_instances_sit() {
        let g = h200();
        let one = g.profile_named("1g.18gb").unwrap();
        let three = g.profile_named("3g.71gb").unwrap();
        let four = g.profile_named("4g.71gb").unwrap();
        let empty = MigOccupancy::empty();
        // Two 1g anywhere may block both 3g starts; with a 4g still creatable beside them they
        // sit in slots 4-6, and a 3g fits at 0.
        assert!(g.fits_every(empty, &[one, one], three).is_err());
        assert!(
            g.fits_every_given(empty, &[one, one], &[four], &[], three)
                .is_ok()
        );
        // A pending 3g (the driver picks its start when created) takes that room.
        assert!(
            g.fits_every_given(empty, &[one, one], &[four], &[three], three)
                .is_err()
        );
        // A list no placement explains (a 7g still creatable beside a 1g) leaves nothing safe.
        let seven = g.profile_named("7g.141gb").unwrap();
        assert!(
            g.fits_every_given(empty, &[one], &[seven], &[], one)
                .is_err()
        );
    }
}
