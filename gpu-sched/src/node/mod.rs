//! One node in indexed form: GPUs, vGPU parents grouped by framebuffer pool, what the fleet's
//! allocations charge on them, and the free counts the fleet index is built from.
//!
//! Accounting. Discovery already counts instances that exist on the host: the driver's
//! `availableInstances` and the pool's `usedMiB`/`sizeLockedMiB`/`migSlicesUsed` include them.
//! An allocated device whose instance discovery reported (same mdev UUID, or a vendor-VFIO VF
//! holding that type) is therefore charged nothing more; every other allocated device, pending or
//! created, is charged on top of the snapshot until a new snapshot of the node shows it.
//!
//! Parents offer several types from one capacity (mbochs: 64/16/4 of small/medium/large; a VF:
//! one instance of any type). Without knowing that capacity, each parent gets `L` units, the
//! least common multiple of its types' reported counts, and one instance of a type reported `a`
//! times costs `L / a` units: exact for shared capacity, never more generous than the driver.
mod build;
mod charge;
mod fabric;
mod fit;
mod same;
mod slots;
mod topo;
mod view;

use std::collections::{HashMap, HashSet};
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use gpu_core::{HealthState, NodeTopology, Pool, Profile, Vendor};

use crate::resolve::ClassId;
pub(crate) use fabric::NO_PARTITION;
pub(crate) use slots::slots_word;
pub(crate) use topo::{Topo, TopoTables};

const UNIT_CAP: u64 = 1 << 32;

pub(crate) fn vendor_ix(v: Vendor) -> usize {
    match v {
        Vendor::Nvidia => 0,
        Vendor::Amd => 1,
        Vendor::Intel => 2,
        Vendor::Matrox => 3,
        Vendor::Aspeed => 4,
        Vendor::Other => 5,
    }
}

/// A whole GPU's accounting.
#[derive(Debug, Clone)]
pub(crate) struct GpuSlot {
    pub health: HealthState,
    /// Discovery says it can be passed through (`free`).
    pub base_free: bool,
    /// Whole-GPU allocations holding it.
    pub held: u32,
    /// vGPU instances charged on it by allocations (not yet in the snapshot).
    pub vgpus: u32,
    pub group: Option<u32>,
    /// The snapshot shows vGPUs or used framebuffer on it.
    pub hosts_base: bool,
    /// The model name in lower case, for the `model` filter (shared fleet-wide).
    pub model_lc: Arc<str>,
}

impl GpuSlot {
    fn free_whole(&self) -> bool {
        self.base_free
            && !self.hosts_base
            && self.health != HealthState::Unhealthy
            && self.held == 0
            && self.vgpus == 0
    }
}

/// A type a parent offers.
#[derive(Debug, Clone)]
pub(crate) struct Offer {
    pub class: ClassId,
    pub profile: usize,
    pub avail: u32,
    pub cost: u64,
}

/// A vGPU parent's accounting.
#[derive(Debug, Clone)]
pub(crate) struct ParentSlot {
    pub group: u32,
    pub cap: u64,
    pub used: u64,
    /// Shared by every parent whose types and counts are the same (every free VF of a GPU).
    pub offers: Arc<[Offer]>,
    pub usable: bool,
    /// The parent's types and counts, shared by every parent listing the same.
    pub types: Arc<ParentTypes>,
}

/// A parent's types (shared by every parent listing the same ones) and its own instance counts,
/// where they differ from the table's.
#[derive(Debug)]
pub(crate) struct ParentTypes {
    pub table: Arc<[Profile]>,
    pub counts: Counts,
}

/// A parent's `availableInstances` and `reportedInstances` per type.
#[derive(Debug, Clone)]
pub(crate) enum Counts {
    /// As in the shared table.
    Table,
    /// Its own, type by type (shared by every parent with the same counts).
    Own(OwnCounts),
}

/// A parent's `(availableInstances, reportedInstances)` per type, shared.
pub(crate) type OwnCounts = Arc<[(u32, Option<u32>)]>;

/// Offers and types of the parents of one table with the same counts.
type SharedOffers = (Arc<[Offer]>, Arc<ParentTypes>);

/// Profile lists and offers shared across the fleet: every VF of a GPU model and driver lists
/// the same types, so one copy serves them all. Parents keep only their counts where they
/// differ (a VF holding an instance reports 0).
#[derive(Debug, Clone, Default)]
pub(crate) struct ProfileTables {
    tables: HashMap<u64, Vec<Arc<[Profile]>>>,
    /// Offers and types by table address and counts (`None`: the table's own).
    offers: HashMap<(usize, Option<usize>), SharedOffers>,
    /// Parents' own counts, shared: a driver reports few distinct patterns across VFs.
    counts: HashSet<OwnCounts>,
    /// The GPUs, parents and pools of the nodes' topologies.
    pub topo: TopoTables,
}

/// Equal apart from the instance counts.
fn same_type(a: &Profile, b: &Profile) -> bool {
    a.id == b.id
        && a.name == b.name
        && a.framebuffer_mib == b.framebuffer_mib
        && a.max_instances == b.max_instances
        && a.device_api == b.device_api
        && a.mig_slices == b.mig_slices
        && a.mig_memory_gib == b.mig_memory_gib
        && a.description == b.description
}

impl ProfileTables {
    /// The shared table listing these types, and the parent's counts against it.
    pub(crate) fn intern(&mut self, profiles: &[Profile]) -> (Arc<[Profile]>, Counts) {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        for p in profiles {
            p.id.as_str().hash(&mut h);
            p.name.hash(&mut h);
            p.framebuffer_mib.hash(&mut h);
        }
        let bucket = self.tables.entry(h.finish()).or_default();
        let table = match bucket.iter().find(|t| {
            t.len() == profiles.len() && t.iter().zip(profiles).all(|(a, b)| same_type(a, b))
        }) {
            Some(t) => Arc::clone(t),
            None => {
                let t: Arc<[Profile]> = Arc::from(profiles);
                bucket.push(Arc::clone(&t));
                t
            }
        };
        let same = table.iter().zip(profiles).all(|(a, b)| {
            a.available_instances == b.available_instances
                && a.reported_instances == b.reported_instances
        });
        let counts = if same {
            Counts::Table
        } else {
            let own: Vec<(u32, Option<u32>)> = profiles
                .iter()
                .map(|p| (p.available_instances, p.reported_instances))
                .collect();
            let shared = match self.counts.get(own.as_slice()) {
                Some(c) => Arc::clone(c),
                None => {
                    let c: OwnCounts = Arc::from(own);
                    self.counts.insert(Arc::clone(&c));
                    c
                }
            };
            Counts::Own(shared)
        };
        (table, counts)
    }

    /// Offers and types shared by the parents of one table with the same counts (the offers
    /// follow from the types and their counts alone).
    pub(crate) fn offers(
        &mut self,
        table: Arc<[Profile]>,
        counts: Counts,
        make: impl FnOnce() -> Vec<Offer>,
    ) -> (Arc<[Offer]>, Arc<ParentTypes>) {
        let own = match &counts {
            Counts::Own(c) => Some(c.as_ptr() as usize),
            Counts::Table => None,
        };
        let (o, t) = self
            .offers
            .entry((table.as_ptr() as usize, own))
            .or_insert_with(|| (Arc::from(make()), Arc::new(ParentTypes { table, counts })));
        (Arc::clone(o), Arc::clone(t))
    }
}

impl ParentSlot {
    fn free_for(&self, offer: &Offer, extra: u64) -> u32 {
        if !self.usable || offer.avail == 0 {
            return 0;
        }
        let left = self.cap.saturating_sub(self.used.saturating_add(extra));
        u32::try_from(left / offer.cost.max(1))
            .unwrap_or(u32::MAX)
            .min(offer.avail)
    }
}

/// A `(parent, offer)` pair of a group's class, stored small (a node has one per VF and type).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct Entry(u32, u32);

impl Entry {
    pub(crate) fn new(parent: usize, offer: usize) -> Self {
        Entry(
            u32::try_from(parent).unwrap_or(u32::MAX),
            u32::try_from(offer).unwrap_or(u32::MAX),
        )
    }
    /// The parent and offer indexes.
    pub(crate) fn get(self) -> (usize, usize) {
        (self.0 as usize, self.1 as usize)
    }
}

/// The parents of one physical GPU (or one virtual parent) and their shared pool.
#[derive(Debug, Clone)]
pub(crate) struct Group {
    pub pool: Option<Pool>,
    pub gpu: Option<usize>,
    /// The group's parents, in topology order.
    pub parents: Box<[u32]>,
    pub health: HealthState,
    /// Something exists or is charged here (instances, used framebuffer or slices).
    pub base_used: bool,
    pub charged: u32,
    /// Classes offered here, sorted.
    pub classes: Box<[ClassId]>,
    /// The parents in address order, so "the first free VF" is the lowest one.
    pub order: Box<[u32]>,
    /// Per class, its (parent, offer) pairs: `(UNIFORM, o)` when every parent of `order` offers
    /// it once, as offer `o` (every VF of a GPU lists the same types), else `(start, len)` in
    /// `list`.
    pub span: Box<[(u32, u32)]>,
    pub list: Box<[Entry]>,
    /// Per class: a (parent, profile) whose profile stands for the class's size.
    pub sample: Box<[(u32, u32)]>,
    /// Per class: instances the parents could still take, pool aside.
    pub parent_sum: Box<[u32]>,
    /// Per class: instances this group can still take (0 when blocked).
    pub contrib: Box<[u32]>,
    /// Per class: the index into the node's `free`.
    pub node_ix: Box<[u32]>,
}

/// See [`Group::span`].
pub(crate) const UNIFORM: u32 = u32::MAX;

impl Group {
    fn local(&self, class: ClassId) -> Option<usize> {
        self.classes.binary_search(&class).ok()
    }

    /// How many (parent, offer) pairs local class `l` has.
    pub(crate) fn entry_count(&self, l: usize) -> usize {
        match self.span[l] {
            (UNIFORM, _) => self.order.len(),
            (_, len) => len as usize,
        }
    }

    /// The `i`-th (parent, offer) pair of local class `l`, parents in address order.
    pub(crate) fn entry(&self, l: usize, i: usize) -> (usize, usize) {
        match self.span[l] {
            (UNIFORM, o) => (self.order[i] as usize, o as usize),
            (start, _) => self.list[start as usize + i].get(),
        }
    }

    /// The (parent, offer) pairs of local class `l`, parents in address order.
    pub(crate) fn entries(&self, l: usize) -> impl Iterator<Item = (usize, usize)> + '_ {
        (0..self.entry_count(l)).map(move |i| self.entry(l, i))
    }
}

/// What an allocated device holds on the node.
#[derive(Debug, Clone)]
pub(crate) enum Charge {
    /// A whole GPU.
    Whole { gpu: usize },
    /// A vGPU instance not yet in the snapshot.
    Vgpu {
        parent: usize,
        group: usize,
        cost: u64,
        profile: ProfileRef,
        /// The start of the GPU instance it holds, where the scheduler chose one.
        start: Option<u8>,
    },
}

/// The profile a vGPU charge draws with.
#[derive(Debug, Clone)]
pub(crate) enum ProfileRef {
    /// A profile of the charged parent in the topology.
    Topo(usize),
    /// A profile only the allocation knows (the snapshot no longer lists it).
    Own(Box<Profile>),
}

/// One chosen device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Pick {
    Whole {
        req: usize,
        gpu: usize,
    },
    Vgpu {
        req: usize,
        index: u32,
        parent: usize,
        offer: usize,
        group: usize,
        /// The start of the GPU instance a MIG-backed vGPU takes, where one was chosen.
        start: Option<u8>,
    },
}

/// A node in indexed form.
#[derive(Debug, Clone)]
pub(crate) struct NodeState {
    pub topo: Topo,
    pub gpus: Box<[GpuSlot]>,
    pub groups: Box<[Group]>,
    pub parents: Box<[ParentSlot]>,
    /// Free instances per class, sorted by class (classes offered but used up stay with 0).
    pub free: Box<[(ClassId, u32)]>,
    /// Per class (as in `free`): the free instances on GPUs already hosting vGPUs, which take
    /// more without opening a fresh card (and, on NVIDIA, match its locked size).
    pub free_used: Box<[u32]>,
    pub whole_free: u32,
    pub whole_free_vendor: [u32; 6],
    /// On a node whose fabric activates partitions: per partition size (ascending), what the
    /// cheapest free partition of that size would break ([`NodeState::partition_costs`]);
    /// empty elsewhere. The fleet indexes nodes by it, so binpack's node order is
    /// partition-aware.
    pub part_cost: Box<[(u32, u32)]>,
}

fn creatable(pool: Option<&Pool>, profile: &Profile) -> u32 {
    pool.map_or(u32::MAX, |p| p.creatable(profile))
}

impl NodeState {
    /// The types parent `p` lists (counts aside: see [`NodeState::topology`]).
    pub(crate) fn profiles_of(&self, p: usize) -> &[Profile] {
        &self.parents[p].types.table
    }

    /// The topology as it was given: the shared types with each parent's own counts.
    pub(crate) fn topology(&self) -> NodeTopology {
        self.topo.to_topology(|i| {
            let ps = &self.parents[i];
            let mut profiles = ps.types.table.to_vec();
            if let Counts::Own(c) = &ps.types.counts {
                for (p, (avail, reported)) in profiles.iter_mut().zip(c.iter()) {
                    p.available_instances = *avail;
                    p.reported_instances = *reported;
                }
            }
            profiles
        })
    }

    /// A copy of this node under another name (nodes of one host shape differ only by name).
    pub(crate) fn renamed(&self, name: &str) -> NodeState {
        let mut n = self.clone();
        n.topo.node = name.into();
        n
    }

    /// The node's name.
    pub(crate) fn name(&self) -> &str {
        &self.topo.node
    }

    /// The profile a class stands for in a group.
    fn sample_profile(&self, gi: usize, local: usize) -> &Profile {
        let (p, pr) = self.groups[gi].sample[local];
        &self.parents[p as usize].types.table[pr as usize]
    }

    /// Free instances of a class on this node.
    pub(crate) fn free_of(&self, class: ClassId) -> u32 {
        self.free
            .binary_search_by_key(&class, |f| f.0)
            .map_or(0, |i| self.free[i].1)
    }

    /// False when the node's free counts alone rule the Machine out (a cheap necessary test).
    pub(crate) fn may_fit(&self, m: &crate::resolve::Resolved) -> bool {
        m.reqs.iter().all(|r| match &r.kind {
            crate::resolve::Kind::Vgpu { classes, .. } => {
                classes
                    .iter()
                    .fold(0u32, |a, c| a.saturating_add(self.free_of(*c)))
                    >= r.wanted
            }
            crate::resolve::Kind::Whole { .. } => self.whole_free >= r.wanted,
        })
    }

    /// Whether the node offers any of these classes (used up or not).
    pub(crate) fn offers_any(&self, classes: &[ClassId]) -> bool {
        classes
            .iter()
            .any(|c| self.free.binary_search_by_key(c, |f| f.0).is_ok())
    }
}
