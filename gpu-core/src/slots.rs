//! One slot model for every partition of a GPU: a MIG GPU instance and a mixed-size
//! ("heterogeneous") vGPU are the same kind of thing, a run of `size` consecutive slots that may
//! begin only at a few legal starts, on a lattice of a GPU's slots, two runs never sharing one.
//!
//! - A MIG GPU-instance profile is a run of its memory slices at the starts NVIDIA's MIG user
//!   guide allows ([`SlotShape::of_mig`]; NVML's `nvmlGpuInstancePlacement_t` is `start`/`size`).
//! - A vGPU type in mixed-size mode is a run of `placementSize` slots at the `placementIds` NVML
//!   lists for it (`nvmlVgpuPlacementList_v2_t`; [`SlotShape::of_placements`]). Nothing here
//!   knows a board: the shapes come from the geometry table or from the driver.
//!
//! Which start a new run takes decides what still fits later. [`SlotChoice::FirstFit`] takes
//! the lowest free legal start (what a driver does when asked for none); [`SlotChoice::KeepMost`]
//! takes the start that leaves the most room for the shapes that may come next (each later
//! shape's free legal starts, weighted by its size), lowest start on a tie. On an empty H200
//! asked for a 1g, first-fit takes slot 0 and no 4g or 7g fits any more; keep-most takes slot 6
//! and the 4g at 0 still fits.
//!
//! Pure: no host access.

use crate::mig::MigProfile;

/// The most slots a lattice holds (one bit each).
pub const MAX_SLOTS: u8 = 64;

/// A run of `size` slots with the starts it may take.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlotShape {
    /// Slots one run holds.
    pub size: u8,
    /// The slots it may start at, ascending, each with the run inside the lattice.
    pub starts: Vec<u8>,
}

/// Why a shape cannot be made from what a table or a driver gave.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ShapeError {
    /// A size of 0, or one past the lattice.
    #[error("a run of {size} slots does not fit a lattice of {slots}")]
    Size {
        /// The size given.
        size: u32,
        /// The lattice's slots.
        slots: u8,
    },
    /// A start whose run ends past the lattice.
    #[error("start {start} with {size} slots ends past the lattice's {slots} slots")]
    Start {
        /// The start given.
        start: u32,
        /// The run's size.
        size: u8,
        /// The lattice's slots.
        slots: u8,
    },
}

impl SlotShape {
    /// The shape of a MIG GPU-instance profile: its memory slices at its allowed starts.
    pub fn of_mig(profile: &MigProfile) -> Self {
        SlotShape {
            size: profile.memory_slices,
            starts: profile.starts.to_vec(),
        }
    }

    /// The shape of a vGPU type from NVML's placement list (`placementSize`, `placementIds`) on
    /// a lattice of `slots` slots.
    ///
    /// # Errors
    /// [`ShapeError`] for a size of 0 or past the lattice, or an ID whose run ends past it: a
    /// driver's answer gpuslice cannot place on, refused rather than clipped.
    pub fn of_placements(size: u32, ids: &[u32], slots: u8) -> Result<Self, ShapeError> {
        let slots = slots.min(MAX_SLOTS);
        let sz = u8::try_from(size)
            .ok()
            .filter(|s| *s > 0 && *s <= slots)
            .ok_or(ShapeError::Size { size, slots })?;
        let mut starts = Vec::with_capacity(ids.len());
        for &id in ids {
            let start = u8::try_from(id)
                .ok()
                .filter(|s| u32::from(*s) + u32::from(sz) <= u32::from(slots))
                .ok_or(ShapeError::Start {
                    start: id,
                    size: sz,
                    slots,
                })?;
            starts.push(start);
        }
        starts.sort_unstable();
        starts.dedup();
        Ok(SlotShape { size: sz, starts })
    }
}

/// Which slots of a lattice are held (bit `i` = slot `i`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
pub struct SlotMask(u64);

impl SlotMask {
    /// No slot held.
    pub fn empty() -> Self {
        SlotMask(0)
    }

    fn span(start: u8, size: u8) -> Option<u64> {
        let end = u32::from(start) + u32::from(size);
        if size == 0 || end > u32::from(MAX_SLOTS) {
            return None;
        }
        let run = if size == 64 {
            u64::MAX
        } else {
            (1u64 << size) - 1
        };
        Some(run << start)
    }

    /// Whether a run of `size` from `start` holds no held slot.
    pub fn is_free(self, start: u8, size: u8) -> bool {
        Self::span(start, size).is_some_and(|m| self.0 & m == 0)
    }

    /// Holds a run of `size` from `start`.
    pub fn hold(&mut self, start: u8, size: u8) {
        if let Some(m) = Self::span(start, size) {
            self.0 |= m;
        }
    }

    /// Frees a run of `size` from `start`.
    pub fn free(&mut self, start: u8, size: u8) {
        if let Some(m) = Self::span(start, size) {
            self.0 &= !m;
        }
    }

    /// How many slots are held.
    pub fn held(self) -> u32 {
        self.0.count_ones()
    }

    /// The legal starts of `shape` still free.
    pub fn free_starts(self, shape: &SlotShape) -> Vec<u8> {
        shape
            .starts
            .iter()
            .copied()
            .filter(|s| self.is_free(*s, shape.size))
            .collect()
    }

    /// The room `later` shapes still have: each one's free legal starts times its size.
    pub fn room(self, later: &[SlotShape]) -> u64 {
        later
            .iter()
            .map(|sh| {
                let n = shape_free_count(self, sh);
                n * u64::from(sh.size)
            })
            .sum()
    }
}

fn shape_free_count(mask: SlotMask, shape: &SlotShape) -> u64 {
    shape
        .starts
        .iter()
        .filter(|s| mask.is_free(**s, shape.size))
        .count() as u64
}

/// How a start is chosen among a shape's free legal starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SlotChoice {
    /// The lowest free legal start.
    FirstFit,
    /// The start that leaves the most room for the shapes that may come later
    /// ([`SlotMask::room`]), the lowest on a tie.
    KeepMost,
}

/// No legal start of a shape is free: the shape and what is left, for the refusal's words.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("no free start for a run of {size} slots (legal starts {starts:?}); slots free: {free:?}")]
pub struct NoStart {
    /// The shape's size.
    pub size: u8,
    /// Its legal starts.
    pub starts: Vec<u8>,
    /// The free slots of the lattice (of its first `slots`).
    pub free: Vec<u8>,
}

/// Chooses where `shape` starts on a lattice of `slots` slots holding `mask`, by `how`;
/// `later` are the shapes that may be asked for next (for [`SlotChoice::KeepMost`]).
///
/// # Errors
/// [`NoStart`] naming the shape's legal starts and the free slots when none of them is free.
pub fn choose(
    mask: SlotMask,
    slots: u8,
    shape: &SlotShape,
    later: &[SlotShape],
    how: SlotChoice,
) -> Result<u8, NoStart> {
    let mut best: Option<(u64, u8)> = None;
    for s in mask.free_starts(shape) {
        match how {
            SlotChoice::FirstFit => return Ok(s),
            SlotChoice::KeepMost => {
                let mut after = mask;
                after.hold(s, shape.size);
                let room = after.room(later);
                if best.is_none_or(|(r, _)| room > r) {
                    best = Some((room, s));
                }
            }
        }
    }
    best.map(|(_, s)| s).ok_or_else(|| NoStart {
        size: shape.size,
        starts: shape.starts.clone(),
        free: (0..slots.min(MAX_SLOTS))
            .filter(|i| mask.is_free(*i, 1))
            .collect(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mig::MigGeometry;

    fn h200() -> &'static MigGeometry {
        MigGeometry::for_vgpu_board("H200X").expect("H200 geometry")
    }

    fn shape(name: &str) -> SlotShape {
        SlotShape::of_mig(h200().profile_named(name).expect(name))
    }

    fn all_shapes() -> Vec<SlotShape> {
        h200().profiles.iter().map(SlotShape::of_mig).collect()
    }

    #[test]
    fn keep_most_puts_a_small_run_where_it_keeps_a_larger_one_possible() {
        let mask = SlotMask::empty();
        let one = shape("1g.18gb");
        let four = shape("4g.71gb");
        let later = all_shapes();
        let ff = choose(mask, 8, &one, &later, SlotChoice::FirstFit).unwrap();
        let km = choose(mask, 8, &one, &later, SlotChoice::KeepMost).unwrap();
        assert_eq!(ff, 0, "first-fit takes the lowest free start");
        let (mut a, mut b) = (mask, mask);
        a.hold(ff, one.size);
        b.hold(km, one.size);
        assert!(a.free_starts(&four).is_empty(), "first-fit leaves no 4g");
        assert_eq!(
            b.free_starts(&four),
            vec![0],
            "keep-most at {km} keeps the 4g"
        );
        assert!(b.room(&later) > a.room(&later));
    }

    #[test]
    fn a_shape_with_no_free_start_is_refused_naming_its_starts_and_the_free_slots() {
        let mut mask = SlotMask::empty();
        mask.hold(0, 4);
        mask.hold(5, 1);
        let four = shape("4g.71gb");
        let e = choose(mask, 8, &four, &[], SlotChoice::KeepMost).unwrap_err();
        assert_eq!(e.starts, vec![0]);
        assert_eq!(e.free, vec![4, 6, 7]);
        assert!(e.to_string().contains("legal starts [0]"), "{e}");
    }

    #[test]
    fn placements_from_a_driver_are_checked_against_the_lattice() {
        let s = SlotShape::of_placements(2, &[6, 0, 2, 2], 8).unwrap();
        assert_eq!(s.starts, vec![0, 2, 6]);
        assert_eq!(
            SlotShape::of_placements(2, &[7], 8),
            Err(ShapeError::Start {
                start: 7,
                size: 2,
                slots: 8
            })
        );
        assert!(SlotShape::of_placements(0, &[0], 8).is_err());
        assert!(SlotShape::of_placements(9, &[0], 8).is_err());
        assert!(SlotShape::of_placements(1, &[u32::MAX], 8).is_err());
    }

    #[test]
    fn mig_starts_and_mixed_size_placements_are_one_kind_of_thing() {
        // A 3g.71gb (4 memory slots at 0 or 4) and a vGPU type of placement size 4 at IDs 0
        // and 4 are the same shape: they block each other alike.
        let mig = shape("3g.71gb");
        let vgpu = SlotShape::of_placements(4, &[0, 4], 8).unwrap();
        assert_eq!(mig, vgpu);
        let mut mask = SlotMask::empty();
        mask.hold(choose(mask, 8, &mig, &[], SlotChoice::FirstFit).unwrap(), 4);
        let second = choose(mask, 8, &vgpu, &[], SlotChoice::FirstFit).unwrap();
        assert_eq!(second, 4);
        mask.hold(second, 4);
        assert!(choose(mask, 8, &vgpu, &[], SlotChoice::KeepMost).is_err());
    }

    #[test]
    fn a_full_lattice_of_sixty_four_slots_holds_and_frees() {
        let mut m = SlotMask::empty();
        m.hold(0, 64);
        assert_eq!(m.held(), 64);
        m.free(0, 64);
        assert_eq!(m, SlotMask::empty());
        assert!(!m.is_free(60, 5), "a run past the lattice is never free");
    }
}
