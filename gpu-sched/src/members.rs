//! Sets of node places and a table of node names that a refusal can keep as they were, at the
//! cost of a few reference counts.
//!
//! A refusal names every node that refused, but a large fleet's nodes fall into a handful of
//! groups (see `classes.rs`). The groups' member sets and the names are held in chunks behind
//! `Arc`s: a refusal takes a snapshot by cloning the outer `Arc` (nothing is copied), and a later
//! placement or release that changes a set copies only the chunk it touches (at most
//! `2 * CHUNK` places) and the list of chunk pointers, never the whole set. A refusal kept for a
//! long time (a JavaScript error waiting for the garbage collector) therefore costs the fleet
//! little, and the refusal still says what the fleet said when it refused.

use std::sync::Arc;

/// Places per chunk, nominal: chunks split above twice this and merge below a quarter of it.
const CHUNK: usize = 256;

/// A sorted set of node places (slot numbers), copied on write chunk by chunk.
#[derive(Debug, Clone, Default)]
pub(crate) struct Members {
    chunks: Arc<Vec<Arc<Vec<u32>>>>,
    len: usize,
}

impl Members {
    /// How many places.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Whether the set is empty.
    pub(crate) fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The chunk that holds `x`, or would: the first whose last place is not below `x`, or the
    /// last chunk.
    fn chunk_of(&self, x: u32) -> usize {
        let i = self
            .chunks
            .partition_point(|c| c.last().is_some_and(|&l| l < x));
        i.min(self.chunks.len().saturating_sub(1))
    }

    /// Whether `x` is in the set.
    pub(crate) fn contains(&self, x: u32) -> bool {
        self.chunks
            .get(self.chunk_of(x))
            .is_some_and(|c| c.binary_search(&x).is_ok())
    }

    /// Adds `x`; false when it was there.
    pub(crate) fn insert(&mut self, x: u32) -> bool {
        if self.chunks.is_empty() {
            Arc::make_mut(&mut self.chunks).push(Arc::new(vec![x]));
            self.len = 1;
            return true;
        }
        let ci = self.chunk_of(x);
        let Err(at) = self.chunks[ci].binary_search(&x) else {
            return false;
        };
        let outer = Arc::make_mut(&mut self.chunks);
        let chunk = Arc::make_mut(&mut outer[ci]);
        chunk.insert(at, x);
        if chunk.len() > 2 * CHUNK {
            let tail = chunk.split_off(CHUNK);
            outer.insert(ci + 1, Arc::new(tail));
        }
        self.len += 1;
        true
    }

    /// Removes `x`; false when it was not there.
    pub(crate) fn remove(&mut self, x: u32) -> bool {
        if self.chunks.is_empty() {
            return false;
        }
        let ci = self.chunk_of(x);
        let Ok(at) = self.chunks[ci].binary_search(&x) else {
            return false;
        };
        let outer = Arc::make_mut(&mut self.chunks);
        let left = {
            let chunk = Arc::make_mut(&mut outer[ci]);
            chunk.remove(at);
            chunk.len()
        };
        if left == 0 {
            outer.remove(ci);
        } else if left < CHUNK / 4 {
            // Merge with a neighbour so that a drained set does not keep many tiny chunks.
            let with = if ci + 1 < outer.len() {
                Some(ci + 1)
            } else {
                ci.checked_sub(1)
            };
            if let Some(j) = with {
                let (lo, hi) = (ci.min(j), ci.max(j));
                if outer[lo].len() + outer[hi].len() <= 2 * CHUNK {
                    let moved = outer.remove(hi);
                    Arc::make_mut(&mut outer[lo]).extend_from_slice(&moved);
                }
            }
        }
        self.len -= 1;
        true
    }

    /// The places in ascending order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = u32> + '_ {
        self.chunks.iter().flat_map(|c| c.iter().copied())
    }

    /// The smallest place.
    pub(crate) fn first(&self) -> Option<u32> {
        self.chunks.first().and_then(|c| c.first().copied())
    }
}

/// One chunk of [`Names`]: the names of `CHUNK` consecutive places.
type NameChunk = Arc<Vec<Option<Arc<str>>>>;

/// Node names by place, copied on write chunk by chunk (see [`Members`]).
#[derive(Debug, Clone, Default)]
pub(crate) struct Names {
    chunks: Arc<Vec<NameChunk>>,
}

impl Names {
    /// The name of the node at `place`.
    pub(crate) fn get(&self, place: u32) -> Option<&Arc<str>> {
        let p = place as usize;
        self.chunks.get(p / CHUNK)?.get(p % CHUNK)?.as_ref()
    }

    /// Sets (or, with `None`, clears) the name at `place`.
    pub(crate) fn set(&mut self, place: usize, name: Option<Arc<str>>) {
        let (ci, k) = (place / CHUNK, place % CHUNK);
        if name.is_none() && self.chunks.get(ci).is_none_or(|c| c.get(k).is_none()) {
            return;
        }
        let outer = Arc::make_mut(&mut self.chunks);
        if outer.len() <= ci {
            outer.resize_with(ci + 1, || Arc::new(Vec::new()));
        }
        let chunk = Arc::make_mut(&mut outer[ci]);
        if chunk.len() <= k {
            chunk.resize(k + 1, None);
        }
        chunk[k] = name;
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeSet;

    proptest! {
        #[test]
        fn members_behave_as_a_sorted_set_and_snapshots_stay_as_taken(
            ops in proptest::collection::vec((any::<bool>(), 0u32..3000), 0..4000),
            snap_at in 0usize..4000
        ) {
            let mut m = Members::default();
            let mut oracle = BTreeSet::new();
            let mut snapshot: Option<(Members, Vec<u32>)> = None;
            for (k, (add, x)) in ops.iter().enumerate() {
                if k == snap_at {
                    snapshot = Some((m.clone(), oracle.iter().copied().collect()));
                }
                if *add {
                    prop_assert_eq!(m.insert(*x), oracle.insert(*x));
                } else {
                    prop_assert_eq!(m.remove(*x), oracle.remove(x));
                }
                prop_assert_eq!(m.len(), oracle.len());
                prop_assert_eq!(m.contains(*x), oracle.contains(x));
            }
            prop_assert_eq!(m.iter().collect::<Vec<_>>(), oracle.iter().copied().collect::<Vec<_>>());
            prop_assert_eq!(m.first(), oracle.first().copied());
            prop_assert!(m.chunks.iter().all(|c| !c.is_empty() && c.len() <= 2 * CHUNK));
            if let Some((s, want)) = snapshot {
                prop_assert_eq!(s.iter().collect::<Vec<_>>(), want.clone());
                prop_assert_eq!(s.len(), want.len());
            }
        }
    }

    #[test]
    fn names_keep_what_a_snapshot_saw() {
        let mut n = Names::default();
        for i in 0..1000 {
            n.set(i, Some(Arc::from(format!("node-{i}"))));
        }
        let seen = n.clone();
        n.set(3, None);
        n.set(700, Some(Arc::from("renamed")));
        n.set(5000, Some(Arc::from("far")));
        assert_eq!(seen.get(3).map(|s| &**s), Some("node-3"));
        assert_eq!(seen.get(700).map(|s| &**s), Some("node-700"));
        assert_eq!(seen.get(5000), None);
        assert_eq!(n.get(3), None);
        assert_eq!(n.get(700).map(|s| &**s), Some("renamed"));
        assert_eq!(n.get(5000).map(|s| &**s), Some("far"));
        assert_eq!(n.get(4999), None);
    }
}
