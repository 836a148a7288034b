//! Where a new GPU instance goes when the scheduler chooses: a start free wherever the
//! instances of unknown start may sit, chosen on the one slot model ([`crate::slots::choose`]),
//! held at that start so the next placement sees it taken, and freed at that start.

use std::sync::OnceLock;

use super::{GEOMETRIES, MigGeometry, MigOccupancy, MigPlaced, MigProfile, MigSlots, SlotMisfit};
use crate::slots::{self, SlotChoice, SlotMask, SlotShape};

/// The occupancies as one mask of the slots any of them holds: a start free in it is free
/// wherever the instances of unknown start sit.
fn union(occupancies: &[MigOccupancy], slots: u8) -> SlotMask {
    let mut mask = SlotMask::empty();
    for o in occupancies {
        for i in 0..slots {
            if o.is_held(i) {
                mask.hold(i, 1);
            }
        }
    }
    mask
}

/// Every known geometry's profiles as slot shapes, in [`GEOMETRIES`] and profile order: built
/// once, so a choice allocates nothing for them.
fn shapes_of(g: &MigGeometry) -> &'static [SlotShape] {
    static SHAPES: OnceLock<Vec<Vec<SlotShape>>> = OnceLock::new();
    let all = SHAPES.get_or_init(|| {
        GEOMETRIES
            .iter()
            .map(|g| g.profiles.iter().map(SlotShape::of_mig).collect())
            .collect()
    });
    GEOMETRIES
        .iter()
        .position(|x| x == g)
        .and_then(|i| all.get(i))
        .map_or(&[], Vec::as_slice)
}

impl MigSlots {
    /// The start a new instance of `profile` takes when chosen `how`: among its legal starts
    /// free in every occupancy the GPU can be in ([`MigSlots::occupancies`]). `Ok(None)` when
    /// one fits in every occupancy but at no one start common to all of them (instances of
    /// unknown start leave the choice to the driver).
    ///
    /// # Errors
    /// [`SlotMisfit::Unknown`] when the slots name what the geometry does not have,
    /// [`SlotMisfit::NoStart`] when no start is free, naming the profile's starts and the
    /// memory slots held.
    pub fn choose_start(
        &self,
        profile: &MigProfile,
        how: SlotChoice,
    ) -> Result<Option<u8>, SlotMisfit> {
        let r = self.resolve()?;
        let g = r.geometry;
        // Every instance at a known start (what the solver's own choices leave): one
        // occupancy, nothing to search.
        let mask = if r.existing.is_empty() && r.pending.is_empty() {
            union(&[r.placed], g.memory_slices)
        } else {
            r.check(profile)?;
            union(&self.occupancies()?.1, g.memory_slices)
        };
        let shapes = shapes_of(g);
        let shape = g
            .profiles
            .iter()
            .position(|p| p.name == profile.name)
            .and_then(|i| shapes.get(i));
        let owned;
        let shape = match shape {
            Some(s) => s,
            None => {
                owned = SlotShape::of_mig(profile);
                &owned
            }
        };
        let later = match how {
            SlotChoice::KeepMost => shapes,
            SlotChoice::FirstFit => &[],
        };
        match slots::choose(mask, g.memory_slices, shape, later, how) {
            Ok(s) => Ok(Some(s)),
            Err(_) => r.check(profile).map(|()| None),
        }
    }

    /// Holds one instance of `profile` at `start` (after [`MigSlots::choose_start`] gave it).
    pub fn hold_at(&mut self, profile: &MigProfile, start: u8) {
        self.placed.push(MigPlaced {
            profile: profile.name.to_owned(),
            start,
        });
    }

    /// Frees the instance of `profile` at `start`, or one of `profile` as
    /// [`MigSlots::release`] does when none is placed there. False when the slots hold no
    /// instance of `profile`.
    pub fn release_at(&mut self, profile: &MigProfile, start: u8) -> bool {
        let at = self
            .placed
            .iter()
            .position(|p| p.start == start && p.profile.eq_ignore_ascii_case(profile.name));
        match at {
            Some(i) => {
                self.placed.remove(i);
                true
            }
            None => self.release(profile),
        }
    }

    /// The memory slots free wherever the instances of unknown start sit, for a refusal's
    /// words.
    pub fn free_slots(&self) -> Vec<u8> {
        self.occupancies()
            .map(|(g, occ)| {
                let mask = union(&occ, g.memory_slices);
                (0..g.memory_slices)
                    .filter(|i| mask.is_free(*i, 1))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// The legal starts of `profile` still free wherever the instances of unknown start sit,
    /// for a refusal's words.
    pub fn free_starts(&self, profile: &MigProfile) -> Vec<u8> {
        self.occupancies()
            .map(|(g, occ)| union(&occ, g.memory_slices).free_starts(&SlotShape::of_mig(profile)))
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mig::MigGeometry;

    fn h200() -> (&'static MigGeometry, MigSlots) {
        let g = MigGeometry::for_vgpu_board("H200X").expect("H200 geometry");
        (g, MigSlots::new(g))
    }

    #[test]
    fn two_3g_instances_take_both_of_their_starts_and_a_third_is_refused() {
        let (g, mut s) = h200();
        let three = g.profile_named("3g.71gb").unwrap();
        let a = s
            .choose_start(three, SlotChoice::KeepMost)
            .unwrap()
            .unwrap();
        s.hold_at(three, a);
        let b = s
            .choose_start(three, SlotChoice::KeepMost)
            .unwrap()
            .unwrap();
        s.hold_at(three, b);
        let mut got = [a, b];
        got.sort_unstable();
        assert_eq!(got, [0, 4]);
        assert!(matches!(
            s.choose_start(three, SlotChoice::KeepMost),
            Err(SlotMisfit::NoStart { .. })
        ));
    }

    #[test]
    fn keep_most_leaves_the_4g_room_first_fit_takes() {
        let (g, empty) = h200();
        let one = g.profile_named("1g.18gb").unwrap();
        let four = g.profile_named("4g.71gb").unwrap();
        for (how, four_fits) in [(SlotChoice::KeepMost, true), (SlotChoice::FirstFit, false)] {
            let mut s = empty.clone();
            let at = s.choose_start(one, how).unwrap().unwrap();
            s.hold_at(one, at);
            assert_eq!(
                s.check(four).is_ok(),
                four_fits,
                "{how:?} put the 1g at {at}"
            );
        }
    }

    #[test]
    fn a_start_is_chosen_clear_of_every_place_an_instance_of_unknown_start_may_sit() {
        let (g, mut s) = h200();
        // A 3g of unknown start sits at 0 or 4: no 1g start is free in both, so the choice
        // goes to the driver; with the 3g known at 4, the 1g goes below it.
        s.unplaced.push("3g.71gb".into());
        let one = g.profile_named("1g.18gb").unwrap();
        assert_eq!(s.choose_start(one, SlotChoice::KeepMost), Ok(None));
        s.unplaced.clear();
        s.hold_at(g.profile_named("3g.71gb").unwrap(), 4);
        let at = s.choose_start(one, SlotChoice::KeepMost).unwrap().unwrap();
        assert!(at < 4, "{at}");
    }

    #[test]
    fn release_frees_the_start_it_names() {
        let (g, mut s) = h200();
        let one = g.profile_named("1g.18gb").unwrap();
        s.hold_at(one, 6);
        s.hold_at(one, 5);
        assert!(s.release_at(one, 6));
        assert_eq!(
            s.placed,
            vec![MigPlaced {
                profile: "1g.18gb".into(),
                start: 5
            }]
        );
        assert_eq!(s.free_starts(one), vec![0, 1, 2, 3, 4, 6]);
    }
}
