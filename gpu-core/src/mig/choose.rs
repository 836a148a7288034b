//! Where a new GPU instance should start when gpuslice chooses: the free legal start that
//! keeps the most later placements possible.
//!
//! NVIDIA lets the caller name the placement (`nvmlDeviceCreateGpuInstanceWithPlacement`,
//! `nvidia-smi mig -cgi P:S`); a careless choice strands slots (a 1g at slot 0 rules out every
//! 2g, 3g, 4g and 7g start that holds slot 0, one at slot 6 only the 3g at 4 and the 7g). The
//! measure: after the instance is placed, how many (profile, start) placements are still free;
//! the start leaving the most wins, the lowest on a tie. It works on any lattice of placements
//! (a table of gpu-core's, or what NVML lists for a board gpuslice does not know).

use super::{MigGeometry, MigOccupancy, MigProfile};

/// One legal placement: first memory slot and how many slots.
pub type Span = (u8, u8);

/// How many of `lattice`'s placements (every profile's legal spans) are free beside `occupied`.
pub fn free_spans(lattice: &[Vec<Span>], occupied: MigOccupancy) -> usize {
    lattice
        .iter()
        .map(|spans| {
            spans
                .iter()
                .filter(|(s, len)| occupied.is_span_free(*s, *len))
                .count()
        })
        .sum()
}

/// Among `choices` (one profile's legal spans), the free one that leaves the most of
/// `lattice` free, the lowest start on a tie; `None` when none is free.
pub fn best_span(lattice: &[Vec<Span>], occupied: MigOccupancy, choices: &[Span]) -> Option<Span> {
    choices
        .iter()
        .copied()
        .filter(|(s, len)| occupied.is_span_free(*s, *len))
        .map(|(s, len)| {
            let mut next = occupied;
            next.hold_span(s, len);
            ((s, len), free_spans(lattice, next))
        })
        // `max_by_key` keeps the last of equals: reverse the start so the lowest wins.
        .max_by_key(|((s, _), left)| (*left, std::cmp::Reverse(*s)))
        .map(|(span, _)| span)
}

impl MigGeometry {
    /// Every profile's legal spans.
    pub fn lattice(&self) -> Vec<Vec<Span>> {
        self.profiles.iter().map(spans_of).collect()
    }

    /// The free legal start of `profile` beside `occupied` that leaves the most placements
    /// free ([`best_span`]); `None` when no start of `profile` is free.
    pub fn best_start(&self, occupied: MigOccupancy, profile: &MigProfile) -> Option<u8> {
        best_span(&self.lattice(), occupied, &spans_of(profile)).map(|(s, _)| s)
    }
}

fn spans_of(p: &MigProfile) -> Vec<Span> {
    p.starts.iter().map(|s| (*s, p.memory_slices)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h100() -> &'static MigGeometry {
        MigGeometry::for_device(0x2330).unwrap()
    }

    #[test]
    fn a_1g_on_an_empty_gpu_goes_to_the_last_slot_not_the_first() {
        let g = h100();
        let p = g.profile_named("1g.10gb").unwrap();
        assert_eq!(g.best_start(MigOccupancy::empty(), p), Some(6));
        // At slot 6 a 4g still fits beside it; at slot 0 it would not.
        let mut occ = MigOccupancy::empty();
        occ.hold(6, p);
        assert!(g.fits(occ, g.profile_named("4g.40gb").unwrap()).is_some());
    }

    #[test]
    fn the_chosen_start_never_overlaps_what_is_held_and_none_is_given_when_full() {
        let g = h100();
        let three = g.profile_named("3g.40gb").unwrap();
        let mut occ = MigOccupancy::empty();
        occ.hold(4, three);
        assert_eq!(g.best_start(occ, three), Some(0));
        occ.hold(0, three);
        assert_eq!(g.best_start(occ, three), None);
        assert_eq!(g.best_start(occ, g.profile_named("1g.10gb").unwrap()), None);
    }

    #[test]
    fn placing_by_best_start_holds_seven_1g_instances() {
        let g = h100();
        let p = g.profile_named("1g.10gb").unwrap();
        let mut occ = MigOccupancy::empty();
        for _ in 0..7 {
            let s = g.best_start(occ, p).unwrap();
            occ.hold(s, p);
        }
        assert_eq!(g.best_start(occ, p), None);
    }
}
