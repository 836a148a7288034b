//! Nodes grouped by what a fit can see, so that a refusal asks one node per group.
//!
//! A node's answer to "can you take this Machine, and if not why" is a pure function of its
//! indexed state, never of its name. Nodes are therefore kept in two groupings:
//!
//! - **shapes**: what never changes between snapshots (GPUs as a fit reads them, groups, parents,
//!   offers, the shared profile tables), decided at indexing time by comparing the full static
//!   signature with a member of the candidate shape (so two nodes share a shape only when equal);
//! - **classes**: a shape plus what allocations change (GPUs held, vGPUs charged, units used per
//!   parent, pool usage), as a short signature. Placement and release only mark a node dirty;
//!   the next refusal re-files the dirty nodes (a few hundred nanoseconds each).
//!
//! A refusal fits one member per class and counts the rest, and, for Machines whose every
//! request is a vGPU profile, answers whole shapes that do not offer any requested profile
//! at once (their answer does not depend on usage). Its cost grows with the number of distinct
//! node states, not with the fleet. The full scan is kept for tests ([`crate::FleetState`]'s
//! `refusal_by_full_scan` under the `testing` feature) and a property checks both agree.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::hash::{Hash, Hasher};
use std::sync::{Arc, Mutex, MutexGuard};

use crate::members::{Members, Names};
use crate::node::NodeState;

/// A signature: the words a node's fit-relevant state writes.
#[derive(Default)]
struct Rec(Vec<u64>);

impl Hasher for Rec {
    fn finish(&self) -> u64 {
        0
    }
    fn write(&mut self, bytes: &[u8]) {
        self.0.push(bytes.len() as u64);
        for c in bytes.chunks(8) {
            let mut w = [0u8; 8];
            w[..c.len()].copy_from_slice(c);
            self.0.push(u64::from_le_bytes(w));
        }
    }
    fn write_u64(&mut self, i: u64) {
        self.0.push(i);
    }
    fn write_u32(&mut self, i: u32) {
        self.0.push(u64::from(i));
    }
    fn write_usize(&mut self, i: usize) {
        self.0.push(i as u64);
    }
}

impl std::fmt::Write for Rec {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        Hasher::write(self, s.as_bytes());
        Ok(())
    }
}

fn opt<T: Into<u64> + Copy>(r: &mut Rec, v: Option<T>) {
    match v {
        Some(x) => {
            r.0.push(1);
            r.0.push(x.into());
        }
        None => r.0.push(0),
    }
}

/// Everything a fit reads that allocations do not change. Enums go in through `Debug`, shared
/// profile tables by address (they are interned fleet-wide and never freed while indexed).
fn static_sig(n: &NodeState) -> Vec<u64> {
    let mut r = Rec::default();
    r.0.push(n.topo.gpus.len() as u64);
    for (g, s) in n.topo.gpus.iter().zip(&n.gpus) {
        g.name.hash(&mut r);
        g.address.hash(&mut r);
        g.vendor_id.0.hash(&mut r);
        g.class.is_compute().hash(&mut r);
        opt(&mut r, g.memory_mib);
        opt(&mut r, g.numa_node);
        let _ = write!(r, "{:?}/{:?}/{:?}", g.vendor, g.state, s.health);
        s.base_free.hash(&mut r);
        opt(&mut r, s.group.map(|x| x as u64));
        s.hosts_base.hash(&mut r);
        s.model_lc.hash(&mut r);
    }
    r.0.push(n.groups.len() as u64);
    for g in &n.groups {
        match &g.pool {
            Some(p) => {
                r.0.push(1);
                r.0.push(p.total_mib);
                p.mixed_size.hash(&mut r);
                opt(&mut r, p.mig_slices_total);
            }
            None => r.0.push(0),
        }
        opt(&mut r, g.gpu.map(|x| x as u64));
        g.parents.hash(&mut r);
        let _ = write!(r, "{:?}", g.health);
        g.base_used.hash(&mut r);
        g.classes.hash(&mut r);
        g.order.hash(&mut r);
        g.span.hash(&mut r);
        g.list.hash(&mut r);
        g.sample.hash(&mut r);
    }
    r.0.push(n.parents.len() as u64);
    for p in &n.parents {
        r.0.push(u64::from(p.group));
        r.0.push(p.cap);
        p.usable.hash(&mut r);
        r.0.push(p.types.table.as_ptr() as usize as u64);
        r.0.push(p.offers.len() as u64);
        for o in p.offers.iter() {
            r.0.push(u64::from(o.class));
            r.0.push(o.profile as u64);
            r.0.push(u64::from(o.avail));
            r.0.push(o.cost);
        }
    }
    r.0.push(n.free.len() as u64);
    r.0.extend(n.free.iter().map(|f| u64::from(f.0)));
    r.0
}

/// The shape and what allocations changed: GPUs held and charged, pools, units per parent
/// (only parents with units in use), and the node's free counts.
fn class_sig(shape: u32, n: &NodeState) -> Vec<u64> {
    let mut r = Rec::default();
    r.0.push(u64::from(shape));
    for g in &n.gpus {
        r.0.push(u64::from(g.held));
        r.0.push(u64::from(g.vgpus));
    }
    for g in &n.groups {
        r.0.push(u64::from(g.charged));
        if let Some(p) = &g.pool {
            r.0.push(p.used_mib);
            opt(&mut r, p.size_locked_mib);
            opt(&mut r, p.mig_slices_used);
            r.0.push(crate::node::slots_word(p));
        }
    }
    r.0.extend(n.free.iter().map(|f| u64::from(f.1)));
    r.0.extend(n.free_used.iter().map(|f| u64::from(*f)));
    r.0.push(u64::from(n.whole_free));
    for (i, p) in n.parents.iter().enumerate() {
        if p.used != 0 {
            r.0.push(i as u64);
            r.0.push(p.used);
        }
    }
    r.0
}

fn digest(words: &[u64]) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    words.hash(&mut h);
    h.finish()
}

const NONE: u32 = u32::MAX;

#[derive(Debug, Clone, Default)]
pub(crate) struct Inner {
    /// Per slot: shape id, static digest, class signature, name.
    shape_of: Vec<u32>,
    digest_of: Vec<u64>,
    class_of: Vec<Option<Arc<[u64]>>>,
    /// Names by slot, kept as they were by the refusals that hold a snapshot.
    pub(crate) names: Names,
    dirty: Vec<u32>,
    is_dirty: Vec<bool>,
    /// Static digest -> (shape, a member to compare with).
    registry: HashMap<u64, Vec<(u32, u32)>>,
    next_shape: u32,
    /// Members per shape.
    pub(crate) shapes: HashMap<u32, Members>,
    /// Members per class signature (the first word is the shape).
    pub(crate) classes: HashMap<Arc<[u64]>, Members>,
}

/// The groupings, behind a lock so that a refusal (which only reads the fleet) can re-file the
/// nodes changed since the last one.
#[derive(Debug, Default)]
pub(crate) struct Classes(Mutex<Inner>);

impl Clone for Classes {
    fn clone(&self) -> Self {
        Classes(Mutex::new(self.lock().clone()))
    }
}

impl Classes {
    pub(crate) fn lock(&self) -> MutexGuard<'_, Inner> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn inner(&mut self) -> &mut Inner {
        self.0
            .get_mut()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Marks a node changed by an allocation or a release.
    pub(crate) fn touch(&mut self, slot: usize) {
        self.inner().mark(slot);
    }

    /// Files a node newly in `slot` (a new node, or a new snapshot of one).
    pub(crate) fn insert(&mut self, slot: usize, slots: &[Option<Arc<NodeState>>]) {
        let inner = self.inner();
        inner.forget_shape(slot);
        inner.grow(slot);
        let Some(n) = slots.get(slot).and_then(|s| s.as_deref()) else {
            return;
        };
        let sig = static_sig(n);
        let d = digest(&sig);
        let mut shape = None;
        if let Some(bucket) = inner.registry.get(&d) {
            for &(sid, rep) in bucket {
                let same = slots
                    .get(rep as usize)
                    .and_then(|s| s.as_deref())
                    .is_some_and(|r| static_sig(r) == sig);
                if same {
                    shape = Some(sid);
                    break;
                }
            }
        }
        let id = u32::try_from(slot).unwrap_or(NONE);
        let sid = match shape {
            Some(s) => s,
            None => {
                let s = inner.next_shape;
                inner.next_shape = inner.next_shape.wrapping_add(1);
                inner.registry.entry(d).or_default().push((s, id));
                s
            }
        };
        inner.shapes.entry(sid).or_default().insert(id);
        inner.shape_of[slot] = sid;
        inner.digest_of[slot] = d;
        inner.names.set(slot, Some(Arc::from(n.name())));
        inner.mark(slot);
    }

    /// Forgets a removed node.
    pub(crate) fn remove(&mut self, slot: usize) {
        let inner = self.inner();
        inner.forget_shape(slot);
        inner.mark(slot);
    }
}

impl Inner {
    fn grow(&mut self, slot: usize) {
        if self.shape_of.len() <= slot {
            let n = slot + 1;
            self.shape_of.resize(n, NONE);
            self.digest_of.resize(n, 0);
            self.class_of.resize(n, None);
            self.is_dirty.resize(n, false);
        }
    }

    fn mark(&mut self, slot: usize) {
        self.grow(slot);
        if !self.is_dirty[slot] {
            self.is_dirty[slot] = true;
            self.dirty.push(u32::try_from(slot).unwrap_or(NONE));
        }
    }

    fn forget_shape(&mut self, slot: usize) {
        let Some(&sid) = self.shape_of.get(slot) else {
            return;
        };
        if sid == NONE {
            return;
        }
        let id = u32::try_from(slot).unwrap_or(NONE);
        let mut next = None;
        if let Some(m) = self.shapes.get_mut(&sid) {
            m.remove(id);
            next = m.first();
            if m.is_empty() {
                self.shapes.remove(&sid);
            }
        }
        let d = self.digest_of[slot];
        if let Some(bucket) = self.registry.get_mut(&d) {
            for e in bucket.iter_mut().filter(|e| e.1 == id) {
                e.1 = next.unwrap_or(NONE);
            }
            bucket.retain(|e| e.1 != NONE);
            if bucket.is_empty() {
                self.registry.remove(&d);
            }
        }
        self.shape_of[slot] = NONE;
        self.names.set(slot, None);
    }

    /// Re-files the nodes changed since the last call.
    pub(crate) fn refresh(&mut self, slots: &[Option<Arc<NodeState>>]) {
        for id in std::mem::take(&mut self.dirty) {
            let i = id as usize;
            self.is_dirty[i] = false;
            if let Some(old) = self.class_of[i].take() {
                if let Some(m) = self.classes.get_mut(&old) {
                    m.remove(id);
                    if m.is_empty() {
                        self.classes.remove(&old);
                    }
                }
            }
            let Some(n) = slots.get(i).and_then(|s| s.as_deref()) else {
                continue;
            };
            if self.shape_of[i] == NONE {
                continue;
            }
            let sig = class_sig(self.shape_of[i], n);
            let key: Arc<[u64]> = match self.classes.get_key_value(&sig[..]) {
                Some((k, _)) => Arc::clone(k),
                None => Arc::from(sig),
            };
            self.classes.entry(Arc::clone(&key)).or_default().insert(id);
            self.class_of[i] = Some(key);
        }
    }

    /// Nodes filed, each in its one shape.
    pub(crate) fn filed(&self) -> usize {
        self.shapes.values().map(Members::len).sum()
    }

    /// Whether the node in `slot` is filed.
    pub(crate) fn is_filed(&self, slot: u32) -> bool {
        self.shape_of.get(slot as usize).is_some_and(|&s| s != NONE)
    }
}
