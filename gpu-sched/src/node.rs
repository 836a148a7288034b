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

// Reasons are built only when a node says no; boxing them would not speed anything up.
#![allow(clippy::result_large_err)]

use gpu_core::{
    AllocatedDevice, Allocation, GpuState, HealthState, NodeTopology, ParentId, Pool, Profile,
    Vendor, VgpuFramework, pool::Misfit,
};

use crate::policy::Policy;
use crate::refusal::{Exclusion, Filter, Reason, ReasonKind};
use crate::resolve::{Catalog, ClassId, GpuRef, Kind, Req, Resolved};

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
    pub group: Option<usize>,
    /// The snapshot shows vGPUs or used framebuffer on it.
    pub hosts_base: bool,
    /// The model name in lower case, for the `model` filter.
    pub model_lc: String,
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
    pub group: usize,
    pub cap: u64,
    pub used: u64,
    pub offers: Vec<Offer>,
    pub usable: bool,
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

/// The parents of one physical GPU (or one virtual parent) and their shared pool.
#[derive(Debug, Clone)]
pub(crate) struct Group {
    pub pool: Option<Pool>,
    pub gpu: Option<usize>,
    pub parents: Vec<usize>,
    pub health: HealthState,
    /// Something exists or is charged here (instances, used framebuffer or slices).
    pub base_used: bool,
    pub charged: u32,
    /// Classes offered here, sorted.
    pub classes: Vec<ClassId>,
    /// Per class: (parent, offer) pairs, parents in address order.
    pub entries: Vec<Vec<(usize, usize)>>,
    /// Per class: a (parent, profile) whose profile stands for the class's size.
    pub sample: Vec<(usize, usize)>,
    /// Per class: instances the parents could still take, pool aside.
    pub parent_sum: Vec<u32>,
    /// Per class: instances this group can still take (0 when blocked).
    pub contrib: Vec<u32>,
}

impl Group {
    fn local(&self, class: ClassId) -> Option<usize> {
        self.classes.binary_search(&class).ok()
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
    },
}

/// Tentative state while fitting the requests of one Machine.
#[derive(Debug, Default)]
struct Overlay {
    taken: Vec<usize>,
    hosting: Vec<usize>,
    /// Units taken per parent, indexed by parent; empty until the first vGPU is picked.
    units: Vec<u64>,
    pools: Vec<(usize, Pool)>,
}

impl Overlay {
    fn units_of(&self, parent: usize) -> u64 {
        self.units.get(parent).copied().unwrap_or(0)
    }
    fn add_units(&mut self, parent: usize, parents: usize, units: u64) {
        if self.units.is_empty() {
            self.units = vec![0; parents];
        }
        if let Some(u) = self.units.get_mut(parent) {
            *u = u.saturating_add(units);
        }
    }
    fn touches(&self, group: &Group) -> bool {
        !self.units.is_empty() && group.parents.iter().any(|&p| self.units_of(p) > 0)
    }
    fn pool<'a>(&'a self, gi: usize, g: &'a Group) -> Option<&'a Pool> {
        self.pools
            .iter()
            .find(|(i, _)| *i == gi)
            .map(|(_, p)| p)
            .or(g.pool.as_ref())
    }
    fn charge_pool(&mut self, gi: usize, g: &Group, profile: &Profile) {
        if let Some((_, p)) = self.pools.iter_mut().find(|(i, _)| *i == gi) {
            p.charge(profile);
            return;
        }
        if let Some(base) = &g.pool {
            let mut p = base.clone();
            p.charge(profile);
            self.pools.push((gi, p));
        }
    }
}

/// A node in indexed form.
#[derive(Debug, Clone)]
pub(crate) struct NodeState {
    pub topo: NodeTopology,
    pub gpus: Vec<GpuSlot>,
    pub groups: Vec<Group>,
    pub parents: Vec<ParentSlot>,
    /// Free instances per class, sorted by class (classes offered but used up stay with 0).
    pub free: Vec<(ClassId, u32)>,
    /// Per group and local class: the index into `free`.
    node_ix: Vec<Vec<usize>>,
    pub whole_free: u32,
    pub whole_free_vendor: [u32; 6],
}

fn lcm_capped(values: impl Iterator<Item = u32>) -> u64 {
    let mut l: u64 = 1;
    for v in values.filter(|v| *v > 0) {
        let v = u64::from(v);
        let (mut a, mut b) = (l, v);
        while b != 0 {
            (a, b) = (b, a % b);
        }
        l = match (l / a).checked_mul(v) {
            Some(x) if x <= UNIT_CAP => x,
            _ => return UNIT_CAP,
        };
    }
    l
}

fn misfit_filter(m: &Misfit) -> Filter {
    match m {
        Misfit::SizeLocked { .. } => Filter::SizeLocked,
        Misfit::ModeConflict => Filter::ModeConflict,
        Misfit::Framebuffer { .. } | Misfit::MigSlices { .. } => Filter::PoolFull,
    }
}

fn creatable(pool: Option<&Pool>, profile: &Profile) -> u32 {
    pool.map_or(u32::MAX, |p| p.creatable(profile))
}

#[derive(Default)]
struct Excluded(Vec<Exclusion>);

impl Excluded {
    fn add(&mut self, filter: Filter) {
        match self.0.iter_mut().find(|e| e.filter == filter) {
            Some(e) => e.count += 1,
            None => self.0.push(Exclusion { filter, count: 1 }),
        }
    }
    fn into_sorted(mut self) -> Vec<Exclusion> {
        self.0.sort_by_key(|e| e.filter);
        self.0
    }
}

/// A group candidate for one vGPU request.
struct GroupCand {
    group: usize,
    local: usize,
    parent_sum: u32,
    cap: u32,
    used: bool,
    health: u8,
    cursor: usize,
}

impl NodeState {
    /// Indexes a topology, interning its profiles in `catalog`.
    pub(crate) fn new(topo: NodeTopology, catalog: &mut Catalog) -> Self {
        let mut gpus: Vec<GpuSlot> = topo
            .gpus
            .iter()
            .map(|g| GpuSlot {
                health: g.health.state,
                base_free: g.state == GpuState::Free,
                held: 0,
                vgpus: 0,
                group: None,
                hosts_base: false,
                model_lc: g.model.to_ascii_lowercase(),
            })
            .collect();
        let mut groups: Vec<Group> = Vec::new();
        let mut keys: Vec<ParentId> = Vec::new();
        let mut parents = Vec::with_capacity(topo.mediated_devices.parents.len());
        for p in &topo.mediated_devices.parents {
            let key = p.pool_key();
            let gi = match keys.iter().position(|k| *k == key) {
                Some(i) => i,
                None => {
                    keys.push(key.clone());
                    let gpu = p
                        .gpu
                        .and_then(|a| topo.gpus.iter().position(|g| g.address == a));
                    // The same-size rule is NVIDIA's: other vendors' and virtual parents'
                    // types share their pool in any mix (mbochs: 63/15/3 after one small).
                    let nvidia = gpu.is_some_and(|g| topo.gpus[g].vendor == Vendor::Nvidia);
                    let pool = topo.pool(&key).map(|pl| Pool {
                        parents: Vec::new(),
                        mixed_size: pl.mixed_size || !nvidia,
                        size_locked_mib: if nvidia { pl.size_locked_mib } else { None },
                        ..pl.clone()
                    });
                    let base_used = pool
                        .as_ref()
                        .is_some_and(|pl| pl.used_mib > 0 || pl.mig_slices_used.unwrap_or(0) > 0);
                    let health = gpu.map_or(HealthState::Healthy, |g| topo.gpus[g].health.state);
                    groups.push(Group {
                        pool,
                        gpu,
                        parents: Vec::new(),
                        health,
                        base_used,
                        charged: 0,
                        classes: Vec::new(),
                        entries: Vec::new(),
                        sample: Vec::new(),
                        parent_sum: Vec::new(),
                        contrib: Vec::new(),
                    });
                    groups.len() - 1
                }
            };
            let pi = parents.len();
            let g = &mut groups[gi];
            g.parents.push(pi);
            g.health = g.health.worst(p.health.state);
            if !p.instances.is_empty() {
                g.base_used = true;
            }
            let offerable: Vec<(usize, &Profile)> = p
                .profiles
                .iter()
                .enumerate()
                .filter(|(_, pr)| pr.device_api == "vfio-pci")
                .collect();
            let cap = lcm_capped(p.profiles.iter().map(|pr| pr.available_instances));
            let offers = offerable
                .iter()
                .map(|(i, pr)| Offer {
                    class: catalog.intern(pr),
                    profile: *i,
                    avail: pr.available_instances,
                    cost: if pr.available_instances == 0 {
                        cap
                    } else {
                        cap.div_ceil(u64::from(pr.available_instances))
                    },
                })
                .collect();
            parents.push(ParentSlot {
                group: gi,
                cap,
                used: 0,
                offers,
                usable: true,
            });
        }
        for (gi, g) in groups.iter_mut().enumerate() {
            if let Some(gpu) = g.gpu {
                gpus[gpu].group = Some(gi);
                gpus[gpu].hosts_base = g.base_used;
            }
            let mut classes: Vec<ClassId> = g
                .parents
                .iter()
                .flat_map(|&p| parents[p].offers.iter().map(|o| o.class))
                .collect();
            classes.sort_unstable();
            classes.dedup();
            let mut entries = vec![Vec::new(); classes.len()];
            let mut sample = vec![(0, 0); classes.len()];
            for &p in &g.parents {
                for (oi, o) in parents[p].offers.iter().enumerate() {
                    if let Ok(l) = classes.binary_search(&o.class) {
                        if entries[l].is_empty() {
                            sample[l] = (p, o.profile);
                        }
                        entries[l].push((p, oi));
                    }
                }
            }
            // Parents in address order, so "the first free VF" is the lowest one.
            let pid = |p: usize| &topo.mediated_devices.parents[p].id;
            for e in &mut entries {
                e.sort_by(|a, b| pid(a.0).cmp(pid(b.0)));
            }
            g.parent_sum = vec![0; classes.len()];
            g.contrib = vec![0; classes.len()];
            g.classes = classes;
            g.entries = entries;
            g.sample = sample;
        }
        let mut all: Vec<ClassId> = groups.iter().flat_map(|g| g.classes.clone()).collect();
        all.sort_unstable();
        all.dedup();
        let node_ix = groups
            .iter()
            .map(|g| {
                g.classes
                    .iter()
                    .map(|c| all.binary_search(c).unwrap_or(0))
                    .collect()
            })
            .collect();
        let mut n = NodeState {
            topo,
            gpus,
            groups,
            parents,
            free: all.into_iter().map(|c| (c, 0)).collect(),
            node_ix,
            whole_free: 0,
            whole_free_vendor: [0; 6],
        };
        for gi in 0..n.groups.len() {
            n.refresh_group(gi);
        }
        n.recount();
        n
    }

    /// The profile a class stands for in a group.
    fn sample_profile(&self, gi: usize, local: usize) -> &Profile {
        let (p, pr) = self.groups[gi].sample[local];
        &self.topo.mediated_devices.parents[p].profiles[pr]
    }

    fn group_blocked(&self, gi: usize) -> bool {
        let g = &self.groups[gi];
        g.health == HealthState::Unhealthy || g.gpu.is_some_and(|x| self.gpus[x].held > 0)
    }

    fn refresh_group(&mut self, gi: usize) {
        let blocked = self.group_blocked(gi);
        for l in 0..self.groups[gi].classes.len() {
            let g = &self.groups[gi];
            let sum: u32 = g.entries[l]
                .iter()
                .map(|&(p, o)| {
                    let ps = &self.parents[p];
                    ps.free_for(&ps.offers[o], 0)
                })
                .fold(0u32, u32::saturating_add);
            let cap = if blocked {
                0
            } else {
                sum.min(creatable(g.pool.as_ref(), self.sample_profile(gi, l)))
            };
            let g = &mut self.groups[gi];
            g.parent_sum[l] = sum;
            g.contrib[l] = cap;
        }
    }

    /// Recomputes the node-level counters from the groups' cached contributions.
    fn recount(&mut self) {
        for f in &mut self.free {
            f.1 = 0;
        }
        for (gi, g) in self.groups.iter().enumerate() {
            for (l, c) in g.contrib.iter().enumerate() {
                let ix = self.node_ix[gi][l];
                self.free[ix].1 = self.free[ix].1.saturating_add(*c);
            }
        }
        self.whole_free = 0;
        self.whole_free_vendor = [0; 6];
        for (i, g) in self.gpus.iter().enumerate() {
            if g.free_whole() {
                self.whole_free += 1;
                self.whole_free_vendor[vendor_ix(self.topo.gpus[i].vendor)] += 1;
            }
        }
    }

    /// Free instances of a class on this node.
    pub(crate) fn free_of(&self, class: ClassId) -> u32 {
        self.free
            .binary_search_by_key(&class, |f| f.0)
            .map_or(0, |i| self.free[i].1)
    }

    /// Applies charges, refreshing what they touch.
    pub(crate) fn apply(&mut self, charges: &[Charge], sign: i64) {
        let mut touched: Vec<usize> = Vec::new();
        for c in charges {
            match c {
                Charge::Whole { gpu } => {
                    let g = &mut self.gpus[*gpu];
                    g.held = if sign > 0 {
                        g.held + 1
                    } else {
                        g.held.saturating_sub(1)
                    };
                    if let Some(gi) = g.group {
                        touched.push(gi);
                    }
                }
                Charge::Vgpu {
                    parent,
                    group,
                    cost,
                    profile,
                } => {
                    let prof: &Profile = match profile {
                        ProfileRef::Topo(i) => {
                            &self.topo.mediated_devices.parents[*parent].profiles[*i]
                        }
                        ProfileRef::Own(p) => p,
                    };
                    let g = &mut self.groups[*group];
                    if let Some(pool) = &mut g.pool {
                        if sign > 0 {
                            pool.charge(prof);
                        } else {
                            pool.release(prof);
                        }
                    }
                    let ps = &mut self.parents[*parent];
                    if sign > 0 {
                        ps.used = ps.used.saturating_add(*cost);
                        g.charged += 1;
                    } else {
                        ps.used = ps.used.saturating_sub(*cost);
                        g.charged = g.charged.saturating_sub(1);
                    }
                    if let Some(gpu) = g.gpu {
                        let s = &mut self.gpus[gpu];
                        s.vgpus = if sign > 0 {
                            s.vgpus + 1
                        } else {
                            s.vgpus.saturating_sub(1)
                        };
                    }
                    touched.push(*group);
                }
            }
        }
        touched.sort_unstable();
        touched.dedup();
        for gi in touched {
            self.refresh_group(gi);
        }
        self.recount();
    }

    /// The charges of an existing allocation, and the devices it names that are not on the node.
    pub(crate) fn charges_for(&self, a: &Allocation) -> (Vec<Charge>, Vec<String>) {
        let mut charges = Vec::new();
        let mut missing = Vec::new();
        for d in &a.devices {
            match d {
                AllocatedDevice::Gpu { name, address, .. } => {
                    match self.topo.gpus.iter().position(|g| g.address == *address) {
                        Some(gpu) => charges.push(Charge::Whole { gpu }),
                        None => missing.push(format!("GPU {name} ({address})")),
                    }
                }
                AllocatedDevice::Vgpu {
                    parent,
                    profile,
                    profile_name,
                    framebuffer_mib,
                    mig_slices,
                    uuid,
                    framework,
                    ..
                } => {
                    let Some(pi) = self
                        .topo
                        .mediated_devices
                        .parents
                        .iter()
                        .position(|p| p.id == *parent)
                    else {
                        missing.push(format!("vGPU parent {parent}"));
                        continue;
                    };
                    let tp = &self.topo.mediated_devices.parents[pi];
                    let reflected = tp.instances.iter().any(|i| {
                        i.uuid == Some(*uuid)
                            || (*framework == VgpuFramework::VendorVfio && i.profile == *profile)
                    });
                    if reflected {
                        continue;
                    }
                    let ps = &self.parents[pi];
                    let topo_ix = tp.profiles.iter().position(|p| p.id == *profile);
                    let cost = topo_ix
                        .and_then(|i| ps.offers.iter().find(|o| o.profile == i))
                        .map_or(ps.cap, |o| o.cost);
                    let profile_ref = match topo_ix {
                        Some(i) => ProfileRef::Topo(i),
                        None => ProfileRef::Own(Box::new(Profile {
                            id: profile.clone(),
                            name: profile_name.clone(),
                            framebuffer_mib: *framebuffer_mib,
                            max_instances: None,
                            available_instances: 0,
                            reported_instances: None,
                            device_api: "vfio-pci".into(),
                            mig_slices: *mig_slices,
                            mig_memory_gib: None,
                            description: None,
                        })),
                    };
                    charges.push(Charge::Vgpu {
                        parent: pi,
                        group: ps.group,
                        cost,
                        profile: profile_ref,
                    });
                }
            }
        }
        (charges, missing)
    }

    /// The charges that picks make.
    pub(crate) fn charges_of(&self, picks: &[Pick]) -> Vec<Charge> {
        picks
            .iter()
            .map(|p| match *p {
                Pick::Whole { gpu, .. } => Charge::Whole { gpu },
                Pick::Vgpu {
                    parent,
                    offer,
                    group,
                    ..
                } => {
                    let o = &self.parents[parent].offers[offer];
                    Charge::Vgpu {
                        parent,
                        group,
                        cost: o.cost,
                        profile: ProfileRef::Topo(o.profile),
                    }
                }
            })
            .collect()
    }

    /// Builds the allocated devices of picks, in request order.
    pub(crate) fn devices_of(
        &self,
        machine: &str,
        m: &Resolved,
        picks: &[Pick],
    ) -> Vec<AllocatedDevice> {
        let mut out = Vec::with_capacity(picks.len());
        let mut sorted: Vec<Pick> = picks.to_vec();
        sorted.sort_by_key(|p| match *p {
            Pick::Whole { req, gpu } => (req, gpu as u64),
            Pick::Vgpu { req, index, .. } => (req, u64::from(index)),
        });
        for p in sorted {
            match p {
                Pick::Whole { req, gpu } => {
                    let g = &self.topo.gpus[gpu];
                    out.push(AllocatedDevice::Gpu {
                        request: m.reqs[req].name.clone(),
                        name: g.name.clone(),
                        address: g.address,
                        functions: g
                            .functions
                            .iter()
                            .map(|f| f.address)
                            .filter(|a| *a != g.address)
                            .collect(),
                        memory_mib: g.memory_mib,
                    });
                }
                Pick::Vgpu {
                    req,
                    index,
                    parent,
                    offer,
                    ..
                } => {
                    let tp = &self.topo.mediated_devices.parents[parent];
                    let pr = &tp.profiles[self.parents[parent].offers[offer].profile];
                    let request = &m.reqs[req].name;
                    out.push(AllocatedDevice::Vgpu {
                        request: request.clone(),
                        index,
                        parent: tp.id.clone(),
                        gpu: tp.gpu,
                        framework: tp.framework,
                        profile: pr.id.clone(),
                        profile_name: pr.name.clone(),
                        framebuffer_mib: pr.framebuffer_mib,
                        mig_slices: pr.mig_slices,
                        uuid: gpu_core::MdevUuid::for_machine(machine, request, index),
                    });
                }
            }
        }
        out
    }

    /// The worst health state of what a pick uses (cheap; no strings).
    pub(crate) fn pick_state(&self, p: &Pick) -> HealthState {
        match *p {
            Pick::Whole { gpu, .. } => self.gpus[gpu].health,
            Pick::Vgpu { group, .. } => self.groups[group].health,
        }
    }

    /// The health of the GPU a pick uses, with reasons and a display name.
    pub(crate) fn pick_health(&self, p: &Pick) -> (HealthState, Vec<String>, String) {
        match *p {
            Pick::Whole { gpu, .. } => {
                let g = &self.topo.gpus[gpu];
                (g.health.state, g.health.reasons.clone(), g.name.clone())
            }
            Pick::Vgpu { parent, group, .. } => {
                let tp = &self.topo.mediated_devices.parents[parent];
                let gpu = self.groups[group].gpu.map(|g| &self.topo.gpus[g]);
                let mut reasons = tp.health.reasons.clone();
                let mut state = tp.health.state;
                let mut name = tp.id.to_string();
                if let Some(g) = gpu {
                    state = state.worst(g.health.state);
                    for r in &g.health.reasons {
                        if !reasons.contains(r) {
                            reasons.push(r.clone());
                        }
                    }
                    name = format!("{} via {}", g.name, tp.id);
                }
                (self.groups[group].health.worst(state), reasons, name)
            }
        }
    }

    // ------------------------------------------------------------------ fitting

    /// Fits all requests of a Machine on this node, or says why not.
    pub(crate) fn fit(&self, m: &Resolved, policy: Policy) -> Result<Vec<Pick>, Vec<Reason>> {
        let vgpu_classes: Vec<ClassId> = m
            .reqs
            .iter()
            .filter_map(|r| match &r.kind {
                Kind::Vgpu { classes, .. } => Some(classes.iter().copied()),
                Kind::Whole { .. } => None,
            })
            .flatten()
            .collect();
        if m.reqs.len() == 1 {
            let mut picks = Vec::new();
            return self
                .fit_req(
                    0,
                    &m.reqs[0],
                    policy,
                    &mut Overlay::default(),
                    &vgpu_classes,
                    &mut picks,
                )
                .map(|()| picks)
                .map_err(|r| vec![r]);
        }
        let mut reasons = Vec::new();
        for (i, r) in m.reqs.iter().enumerate() {
            let mut scratch = Vec::new();
            if let Err(reason) = self.fit_req(
                i,
                r,
                policy,
                &mut Overlay::default(),
                &vgpu_classes,
                &mut scratch,
            ) {
                reasons.push(reason);
            }
        }
        if !reasons.is_empty() {
            return Err(reasons);
        }
        // Most constrained first: named GPUs, other whole GPUs, then vGPUs largest first.
        let mut order: Vec<usize> = (0..m.reqs.len()).collect();
        order.sort_by_key(|&i| {
            let r = &m.reqs[i];
            let size = match &r.kind {
                Kind::Vgpu { classes, .. } => classes
                    .first()
                    .and_then(|c| self.class_size(*c))
                    .unwrap_or(0),
                Kind::Whole { .. } => 0,
            };
            (
                r.is_vgpu(),
                std::cmp::Reverse(r.exact_count()),
                std::cmp::Reverse(size),
                i,
            )
        });
        // The first order almost always works. When it does not, other orders of the requests
        // and the other way of choosing GPUs within the node are tried: at most 24 orders (up to
        // 4 requests) times 2, and only for a node where every request fits on its own.
        let mut tries: Vec<Vec<usize>> = vec![order.clone()];
        if order.len() <= 4 {
            permutations(&order, &mut tries);
        }
        let other = match policy {
            Policy::Binpack => Policy::Spread,
            Policy::Spread => Policy::Binpack,
        };
        for (within, w) in [policy, other]
            .into_iter()
            .flat_map(|p| tries.iter().map(move |w| (p, w)))
        {
            let mut overlay = Overlay::default();
            let mut picks = Vec::new();
            let ok = w.iter().all(|&i| {
                self.fit_req(
                    i,
                    &m.reqs[i],
                    within,
                    &mut overlay,
                    &vgpu_classes,
                    &mut picks,
                )
                .is_ok()
            });
            if ok {
                return Ok(picks);
            }
        }
        let mut reason = Reason::new(
            ReasonKind::ConflictingRequests,
            &m.reqs[0].name,
            m.reqs.iter().fold(0u32, |a, r| a.saturating_add(r.wanted)),
            0,
        );
        reason.with = m.reqs[1..].iter().map(|r| r.name.clone()).collect();
        Err(vec![reason])
    }

    /// A sort key for "larger first": MIG slices outrank any framebuffer size (a 7-slice
    /// instance takes a whole GPU), then framebuffer in MiB.
    fn class_size(&self, class: ClassId) -> Option<u64> {
        self.groups.iter().enumerate().find_map(|(gi, g)| {
            g.local(class).map(|l| {
                let p = self.sample_profile(gi, l);
                p.framebuffer_mib
                    .unwrap_or(0)
                    .max(u64::from(p.mig_slices.unwrap_or(0)) << 40)
            })
        })
    }

    fn fit_req(
        &self,
        ri: usize,
        r: &Req,
        policy: Policy,
        overlay: &mut Overlay,
        vgpu_classes: &[ClassId],
        picks: &mut Vec<Pick>,
    ) -> Result<(), Reason> {
        match &r.kind {
            Kind::Vgpu { text, classes } => {
                self.fit_vgpu(ri, r, text, classes, policy, overlay, picks)
            }
            Kind::Whole {
                exact,
                families,
                listed,
            } => self.fit_whole(
                ri,
                r,
                exact,
                families,
                *listed,
                policy,
                overlay,
                vgpu_classes,
                picks,
            ),
        }
    }

    /// The first filter a GPU fails for a request, among vendor, class, model and memory.
    fn identity_filter(
        &self,
        r: &Req,
        gpu: Option<usize>,
        size_mib: Option<u64>,
    ) -> Option<Filter> {
        let g = gpu.map(|i| &self.topo.gpus[i]);
        if let Some((v, raw)) = r.vendor {
            let ok = g.is_some_and(|g| match raw {
                Some(id) => g.vendor_id.0 == id,
                None => g.vendor == v,
            });
            if !ok {
                return Some(Filter::WrongVendor);
            }
        }
        if r.accelerator && !g.is_some_and(|g| g.class.is_compute()) {
            return Some(Filter::WrongClass);
        }
        if let Some(m) = &r.model {
            if !gpu.is_some_and(|i| self.gpus[i].model_lc.contains(m.as_str())) {
                return Some(Filter::WrongModel);
            }
        }
        if let Some(min) = r.min_mib {
            if size_mib.is_none_or(|s| s < min) {
                return Some(Filter::TooSmall);
            }
        }
        None
    }

    #[allow(clippy::too_many_arguments)]
    fn fit_vgpu(
        &self,
        ri: usize,
        r: &Req,
        text: &str,
        classes: &[ClassId],
        policy: Policy,
        overlay: &mut Overlay,
        picks: &mut Vec<Pick>,
    ) -> Result<(), Reason> {
        // The node's own summary answers "not offered" without touching its parents.
        if !self.offers_any(classes) {
            let mut reason = Reason::new(ReasonKind::ProfileNotOffered, &r.name, r.wanted, 0);
            reason.profile = Some(text.to_owned());
            return Err(reason);
        }
        let mut excluded = Excluded::default();
        let mut cands: Vec<GroupCand> = Vec::new();
        let mut offered = false;
        for (gi, g) in self.groups.iter().enumerate() {
            let Some(local) = classes.iter().find_map(|c| g.local(*c)) else {
                continue;
            };
            offered = true;
            let profile = self.sample_profile(gi, local);
            if let Some(f) = self.identity_filter(r, g.gpu, profile.framebuffer_mib) {
                excluded.add(f);
                continue;
            }
            if g.health == HealthState::Unhealthy {
                excluded.add(Filter::Unhealthy);
                continue;
            }
            if g.gpu
                .is_some_and(|x| self.gpus[x].held > 0 || overlay.taken.contains(&x))
            {
                excluded.add(Filter::InUse);
                continue;
            }
            let parent_sum = if overlay.touches(g) {
                g.entries[local]
                    .iter()
                    .map(|&(p, o)| {
                        let ps = &self.parents[p];
                        ps.free_for(&ps.offers[o], overlay.units_of(p))
                    })
                    .fold(0u32, u32::saturating_add)
            } else {
                g.parent_sum[local]
            };
            if parent_sum == 0 {
                excluded.add(Filter::NoFreeParent);
                continue;
            }
            let pool = overlay.pool(gi, g);
            if let Some(Err(m)) = pool.map(|p| p.check(profile)) {
                excluded.add(misfit_filter(&m));
                continue;
            }
            let cap = parent_sum.min(creatable(pool, profile));
            if cap == 0 {
                excluded.add(Filter::PoolFull);
                continue;
            }
            let used = g.base_used
                || g.charged > 0
                || overlay.pools.iter().any(|(i, _)| *i == gi)
                || overlay.touches(g);
            cands.push(GroupCand {
                group: gi,
                local,
                parent_sum,
                cap,
                used,
                health: g.health.rank(),
                cursor: 0,
            });
        }
        if !offered {
            let mut reason = Reason::new(ReasonKind::ProfileNotOffered, &r.name, r.wanted, 0);
            reason.profile = Some(text.to_owned());
            return Err(reason);
        }
        let total: u64 = cands.iter().map(|c| u64::from(c.cap)).sum();
        if total < u64::from(r.wanted) {
            let mut reason = Reason::new(
                ReasonKind::TopologyUnsatisfiable,
                &r.name,
                r.wanted,
                u32::try_from(total).unwrap_or(u32::MAX),
            );
            reason.profile = Some(text.to_owned());
            reason.excluded = excluded.into_sorted();
            return Err(reason);
        }
        for index in 0..r.wanted {
            let best = cands
                .iter()
                .enumerate()
                .filter(|(_, c)| c.cap > 0)
                .min_by(|(_, a), (_, b)| {
                    let key = |c: &GroupCand| match policy {
                        Policy::Binpack => (c.health, !c.used, c.cap, c.group),
                        Policy::Spread => (c.health, c.used, u32::MAX - c.cap, c.group),
                    };
                    key(a).cmp(&key(b))
                })
                .map(|(i, _)| i);
            let Some(ci) = best else {
                // Unreachable in practice: the total said enough fit.
                let mut reason =
                    Reason::new(ReasonKind::TopologyUnsatisfiable, &r.name, r.wanted, index);
                reason.profile = Some(text.to_owned());
                return Err(reason);
            };
            let c = &mut cands[ci];
            let g = &self.groups[c.group];
            let entries = &g.entries[c.local];
            let mut chosen = None;
            while c.cursor < entries.len() {
                let (p, o) = entries[c.cursor];
                let ps = &self.parents[p];
                if ps.free_for(&ps.offers[o], overlay.units_of(p)) > 0 {
                    chosen = Some((p, o));
                    break;
                }
                c.cursor += 1;
            }
            let Some((p, o)) = chosen else {
                c.cap = 0;
                let mut reason =
                    Reason::new(ReasonKind::TopologyUnsatisfiable, &r.name, r.wanted, index);
                reason.profile = Some(text.to_owned());
                return Err(reason);
            };
            let profile =
                &self.topo.mediated_devices.parents[p].profiles[self.parents[p].offers[o].profile];
            overlay.add_units(p, self.parents.len(), self.parents[p].offers[o].cost);
            overlay.charge_pool(c.group, g, profile);
            if let Some(x) = g.gpu {
                overlay.hosting.push(x);
            }
            c.parent_sum -= 1;
            c.used = true;
            c.cap = c
                .parent_sum
                .min(creatable(overlay.pool(c.group, g), profile));
            picks.push(Pick::Vgpu {
                req: ri,
                index,
                parent: p,
                offer: o,
                group: c.group,
            });
        }
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    fn fit_whole(
        &self,
        ri: usize,
        r: &Req,
        exact: &[GpuRef],
        families: &[String],
        listed: bool,
        policy: Policy,
        overlay: &mut Overlay,
        vgpu_classes: &[ClassId],
        picks: &mut Vec<Pick>,
    ) -> Result<(), Reason> {
        let find = |e: &GpuRef| {
            self.topo.gpus.iter().position(|g| match e {
                GpuRef::Name(n) => g.name == *n,
                GpuRef::Address(a) => g.address == *a,
            })
        };
        let mut exact_ix = Vec::with_capacity(exact.len());
        for e in exact {
            match find(e) {
                Some(i) => exact_ix.push(i),
                None => {
                    let mut reason = Reason::new(ReasonKind::GpuNotFound, &r.name, r.wanted, 0);
                    reason.gpu = Some(e.to_string());
                    return Err(reason);
                }
            }
        }
        let mut excluded = Excluded::default();
        // (gpu, exact?) of the GPUs passing every filter, in address order.
        let mut cands: Vec<(usize, bool)> = Vec::new();
        for (i, g) in self.topo.gpus.iter().enumerate() {
            let is_exact = exact_ix.contains(&i);
            if listed && !is_exact {
                let fam = g.name.trim_end_matches(|c: char| c.is_ascii_digit());
                if !families.iter().any(|f| f == fam) {
                    continue;
                }
            }
            if let Some(f) = self.identity_filter(r, Some(i), g.memory_mib) {
                excluded.add(f);
                continue;
            }
            let s = &self.gpus[i];
            if g.state == GpuState::Blocked {
                excluded.add(Filter::Blocked);
                continue;
            }
            if s.health == HealthState::Unhealthy {
                excluded.add(Filter::Unhealthy);
                continue;
            }
            if !s.free_whole() || overlay.taken.contains(&i) || overlay.hosting.contains(&i) {
                excluded.add(Filter::InUse);
                continue;
            }
            cands.push((i, is_exact));
        }
        let fail = |free: usize, excluded: Excluded, numa: bool| {
            let mut reason = Reason::new(
                ReasonKind::InsufficientGpus,
                &r.name,
                r.wanted,
                u32::try_from(free).unwrap_or(u32::MAX),
            );
            reason.numa_aligned = numa;
            reason.excluded = excluded.into_sorted();
            reason
        };
        let exact_ok = exact_ix.iter().all(|e| cands.iter().any(|c| c.0 == *e));
        if !exact_ok {
            return Err(fail(cands.len(), excluded, r.numa));
        }
        let rank = |i: usize| {
            let hosts = self.gpus[i].group.is_some_and(|gi| {
                self.groups[gi]
                    .classes
                    .iter()
                    .any(|c| vgpu_classes.contains(c))
            });
            (self.gpus[i].health.rank(), hosts, i)
        };
        let need_more = (r.wanted as usize).saturating_sub(exact_ix.len());
        let mut chosen: Vec<usize> = exact_ix.clone();
        if r.numa {
            // Group the candidates by NUMA node; the named GPUs fix the node when given.
            let numa_of = |i: usize| self.topo.gpus[i].numa_node;
            let fixed = exact_ix.first().map(|&e| numa_of(e));
            if let Some(f) = fixed {
                if exact_ix.iter().any(|&e| numa_of(e) != f) {
                    excluded.add(Filter::WrongNuma);
                    return Err(fail(0, excluded, true));
                }
            }
            let mut nodes: Vec<Option<u32>> = cands.iter().map(|c| numa_of(c.0)).collect();
            nodes.sort_unstable();
            nodes.dedup();
            let mut best: Option<(Option<u32>, usize)> = None;
            let mut most = 0usize;
            for n in nodes {
                if fixed.is_some_and(|f| f != n) {
                    continue;
                }
                let free = cands.iter().filter(|c| !c.1 && numa_of(c.0) == n).count();
                most = most.max(free + exact_ix.len());
                if free < need_more {
                    continue;
                }
                let better = match (best, policy) {
                    (None, _) => true,
                    (Some((_, b)), Policy::Binpack) => free < b,
                    (Some((_, b)), Policy::Spread) => free > b,
                };
                if better {
                    best = Some((n, free));
                }
            }
            let Some((n, _)) = best else {
                let outside = cands.len().saturating_sub(most);
                for _ in 0..outside {
                    excluded.add(Filter::WrongNuma);
                }
                return Err(fail(most, excluded, true));
            };
            let mut pool: Vec<usize> = cands
                .iter()
                .filter(|c| !c.1 && numa_of(c.0) == n)
                .map(|c| c.0)
                .collect();
            pool.sort_by_key(|&i| rank(i));
            chosen.extend(pool.into_iter().take(need_more));
        } else {
            if cands.len() < r.wanted as usize {
                return Err(fail(cands.len(), excluded, false));
            }
            let mut pool: Vec<usize> = cands.iter().filter(|c| !c.1).map(|c| c.0).collect();
            pool.sort_by_key(|&i| rank(i));
            chosen.extend(pool.into_iter().take(need_more));
        }
        for gpu in chosen {
            overlay.taken.push(gpu);
            picks.push(Pick::Whole { req: ri, gpu });
        }
        Ok(())
    }

    /// Whether the node offers any of these classes (used up or not).
    pub(crate) fn offers_any(&self, classes: &[ClassId]) -> bool {
        classes
            .iter()
            .any(|c| self.free.binary_search_by_key(c, |f| f.0).is_ok())
    }
}

fn permutations(items: &[usize], out: &mut Vec<Vec<usize>>) {
    fn rec(prefix: &mut Vec<usize>, rest: &mut Vec<usize>, out: &mut Vec<Vec<usize>>) {
        if rest.is_empty() {
            out.push(prefix.clone());
            return;
        }
        for i in 0..rest.len() {
            let x = rest.remove(i);
            prefix.push(x);
            rec(prefix, rest, out);
            prefix.pop();
            rest.insert(i, x);
        }
    }
    let mut rest = items.to_vec();
    let mut all = Vec::new();
    rec(&mut Vec::new(), &mut rest, &mut all);
    // The given order was tried first already.
    out.extend(all.into_iter().skip(1));
}
