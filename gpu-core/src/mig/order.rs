//! Where instances of unknown start may sit, and an order of creating new GPU instances that
//! lands each at a free start whichever of those placements the GPU is in.

use super::{MigGeometry, MigOccupancy, MigProfile};

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
