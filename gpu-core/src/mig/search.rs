//! Whether instances fit: placing a set of profiles, and asking whether one more fits beside
//! instances at known starts and ones whose start is not known (an exhaustive search over their
//! placements, answered from a per-thread memo where it can be).

use super::table::GEOMETRIES;
use super::{MigGeometry, MigOccupancy, MigProfile, memo};

/// One question to [`MigGeometry::fits_every_given`].
#[derive(Clone, Copy)]
pub(super) struct Ask<'q> {
    pub(super) placed: MigOccupancy,
    pub(super) existing: &'q [&'q MigProfile],
    pub(super) still_fit: &'q [&'q MigProfile],
    pub(super) pending: &'q [&'q MigProfile],
    pub(super) profile: &'q MigProfile,
}

impl MigGeometry {
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
    pub(super) fn search_every(&self, ask: &Ask<'_>) -> Result<(), MigOccupancy> {
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
