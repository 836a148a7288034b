//! The sorted `(free count, node)` indexes per profile class and per vendor, kept in step with
//! the nodes as they are added, removed and charged.

use std::sync::Arc;

use super::{FleetState, Tree};
use crate::node::{Charge, NO_PARTITION};

fn slot_id(i: usize) -> u32 {
    u32::try_from(i).unwrap_or(u32::MAX)
}

impl FleetState {
    /// Adds (or removes, with `insert == false`) a node's entries in the indexes.
    pub(super) fn index(&mut self, i: usize, insert: bool) {
        let Some(n) = self.slots[i].as_ref() else {
            return;
        };
        let id = slot_id(i);
        for (&(c, f), &u) in n.free.iter().zip(&n.free_used) {
            for (map, f) in [(&mut self.by_class, f), (&mut self.by_class_used, u)] {
                if f == 0 {
                    continue;
                }
                let t = map.entry(c).or_default();
                if insert {
                    t.insert((f, id));
                } else {
                    t.remove(&(f, id));
                }
            }
        }
        for &(size, cost) in n.part_cost.iter() {
            if cost == NO_PARTITION {
                continue;
            }
            let t = self.by_partition.entry((size, cost)).or_default();
            if insert {
                t.insert((n.whole_free, id));
            } else {
                t.remove(&(n.whole_free, id));
            }
        }
        let mut whole = vec![(&mut self.whole_all, n.whole_free)];
        for (t, f) in self.whole_vendor.iter_mut().zip(n.whole_free_vendor) {
            whole.push((t, f));
        }
        for (t, f) in whole {
            if f == 0 {
                continue;
            }
            if insert {
                t.insert((f, id));
            } else {
                t.remove(&(f, id));
            }
        }
    }

    /// Applies charges on a node and moves it in the indexes where its counts changed.
    pub(crate) fn charge(&mut self, i: usize, charges: &[Charge], sign: i64) {
        let Some(n) = self.slots[i].as_mut().map(Arc::make_mut) else {
            return;
        };
        let old_free = n.free.clone();
        let old_used = n.free_used.clone();
        let old_whole = n.whole_free;
        let old_vendor = n.whole_free_vendor;
        let old_parts = n.part_cost.clone();
        n.apply(charges, sign);
        self.classes.touch(i);
        let id = slot_id(i);
        let update = |t: &mut Tree, old: u32, new: u32| {
            if old == new {
                return;
            }
            if old > 0 {
                t.remove(&(old, id));
            }
            if new > 0 {
                t.insert((new, id));
            }
        };
        for (o, nw) in old_free.iter().zip(n.free.iter()) {
            if o.1 != nw.1 {
                let t = self.by_class.entry(o.0).or_default();
                update(t, o.1, nw.1);
            }
        }
        for ((o, nw), (c, _)) in old_used.iter().zip(&n.free_used).zip(&n.free) {
            if o != nw {
                let t = self.by_class_used.entry(*c).or_default();
                update(t, *o, *nw);
            }
        }
        if old_whole != n.whole_free || old_parts != n.part_cost {
            for (&(size, old), &(_, new)) in old_parts.iter().zip(n.part_cost.iter()) {
                if old != NO_PARTITION {
                    if let Some(t) = self.by_partition.get_mut(&(size, old)) {
                        t.remove(&(old_whole, id));
                    }
                }
                if new != NO_PARTITION {
                    self.by_partition
                        .entry((size, new))
                        .or_default()
                        .insert((n.whole_free, id));
                }
            }
        }
        update(&mut self.whole_all, old_whole, n.whole_free);
        for ((t, old), new) in self
            .whole_vendor
            .iter_mut()
            .zip(old_vendor)
            .zip(n.whole_free_vendor)
        {
            update(t, old, new);
        }
    }
}
