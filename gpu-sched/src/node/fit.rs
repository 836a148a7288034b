//! Fitting a Machine's requests on one node: candidates, filters, policy order, and the reasons
//! a node gives when it says no.

// Reasons are built only when a node says no; boxing them would not speed anything up.
#![allow(clippy::result_large_err)]

use gpu_core::{GpuState, HealthState, Pool, Profile, SlotMisfit, pool::Misfit};

use super::fabric::PartitionFit;
use super::{Group, NodeState, Pick, creatable};
use crate::policy::Policy;
use crate::refusal::{Exclusion, Filter, Reason, ReasonKind};
use crate::resolve::{ClassId, GpuRef, Kind, Req, Resolved};
use crate::slots::SlotPolicy;

/// Tentative state while fitting the requests of one Machine.
#[derive(Debug, Default)]
struct Overlay {
    hosting: Vec<usize>,
    /// Units taken per parent, indexed by parent; empty until the first vGPU is picked.
    units: Vec<u64>,
    pools: Vec<(usize, Pool)>,
}

/// The GPUs the picks so far take whole.
fn taken(picks: &[Pick]) -> impl Iterator<Item = usize> + '_ {
    picks.iter().filter_map(|p| match *p {
        Pick::Whole { gpu, .. } => Some(gpu),
        Pick::Vgpu { .. } => None,
    })
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
        !self.units.is_empty() && group.parents.iter().any(|&p| self.units_of(p as usize) > 0)
    }
    fn pool<'a>(&'a self, gi: usize, g: &'a Group) -> Option<&'a Pool> {
        self.pools
            .iter()
            .find(|(i, _)| *i == gi)
            .map(|(_, p)| p)
            .or(g.pool.as_ref())
    }
    fn charge_pool(&mut self, gi: usize, g: &Group, profile: &Profile, start: Option<u8>) {
        if let Some((_, p)) = self.pools.iter_mut().find(|(i, _)| *i == gi) {
            p.charge_at(profile, start);
            return;
        }
        if let Some(base) = &g.pool {
            let mut p = base.clone();
            p.charge_at(profile, start);
            self.pools.push((gi, p));
        }
    }
}

/// One attempt at fitting a Machine on a node: how to choose, what the Machine's vGPU requests
/// ask for (whole-GPU picks avoid GPUs offering those), and what has been taken so far.
pub(crate) struct FitCtx<'a> {
    policy: Policy,
    slots: SlotPolicy,
    vgpu_classes: &'a [ClassId],
    overlay: Overlay,
    picks: Vec<Pick>,
    /// On a node whose fabric activates partitions, the Machine's whole GPUs in all its
    /// requests together (one partition of that size); 0 when each request stands alone.
    set_size: usize,
    /// The members of the Machine's partition its whole-GPU requests have not taken yet.
    set_rest: Option<Vec<usize>>,
}

impl<'a> FitCtx<'a> {
    fn new(
        (policy, slots): (Policy, SlotPolicy),
        vgpu_classes: &'a [ClassId],
        set_size: usize,
    ) -> Self {
        FitCtx {
            policy,
            slots,
            vgpu_classes,
            overlay: Overlay::default(),
            picks: Vec::new(),
            set_size,
            set_rest: None,
        }
    }
}

fn misfit_filter(m: &Misfit) -> Filter {
    match m {
        Misfit::SizeLocked { .. } => Filter::SizeLocked,
        Misfit::ModeConflict => Filter::ModeConflict,
        // No free GPU-instance start counts as a full pool: the slots are used up where the
        // existing instances may sit.
        Misfit::Framebuffer { .. } | Misfit::MigSlices { .. } | Misfit::MigSlots(_) => {
            Filter::PoolFull
        }
    }
}

/// How many candidates each filter took away, counted on the stack: a fit that succeeds
/// builds no list.
#[derive(Default)]
struct Excluded([u32; Filter::ALL.len()]);

impl Excluded {
    fn add(&mut self, filter: Filter) {
        if let Some(c) = self.0.get_mut(filter.slot()) {
            *c += 1;
        }
    }
    /// The filters that took any, in filter order.
    fn into_sorted(self) -> Vec<Exclusion> {
        Filter::ALL
            .iter()
            .zip(self.0)
            .filter(|(_, count)| *count > 0)
            .map(|(&filter, count)| Exclusion { filter, count })
            .collect()
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
    // ------------------------------------------------------------------ fitting

    /// Fits all requests of a Machine on this node, or says why not.
    pub(crate) fn fit(
        &self,
        m: &Resolved,
        policy: Policy,
        slots: SlotPolicy,
    ) -> Result<Vec<Pick>, Vec<Reason>> {
        let mixed = m.reqs.iter().any(|r| !r.is_vgpu()); // only whole GPUs read the classes
        let vgpu_classes: Vec<ClassId> = m
            .reqs
            .iter()
            .filter(|_| mixed)
            .filter_map(|r| match &r.kind {
                Kind::Vgpu { classes, .. } => Some(classes.iter().copied()),
                Kind::Whole { .. } => None,
            })
            .flatten()
            .collect();
        let set_size = self.machine_set_size(m);
        if m.reqs.len() == 1 {
            let mut cx = FitCtx::new((policy, slots), &vgpu_classes, 0);
            return self
                .fit_req(0, &m.reqs[0], &mut cx)
                .map(|()| cx.picks)
                .map_err(|r| vec![r]);
        }
        let mut reasons = Vec::new();
        for (i, r) in m.reqs.iter().enumerate() {
            // Alone, each request is checked against a partition of its own size; together
            // they must share one (below).
            if let Err(reason) =
                self.fit_req(i, r, &mut FitCtx::new((policy, slots), &vgpu_classes, 0))
            {
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
            Policy::Binpack | Policy::FirstFit => Policy::Spread,
            Policy::Spread => Policy::Binpack,
        };
        for (within, w) in [policy, other]
            .into_iter()
            .flat_map(|p| tries.iter().map(move |w| (p, w)))
        {
            let mut cx = FitCtx::new((within, slots), &vgpu_classes, set_size);
            let ok = w
                .iter()
                .all(|&i| self.fit_req(i, &m.reqs[i], &mut cx).is_ok());
            if ok {
                return Ok(cx.picks);
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

    /// How many instances of these classes GPU `gpu`'s parents could still take (pool aside):
    /// what taking the GPU whole would cost the Machine's vGPU requests.
    fn vgpu_room(&self, gpu: usize, classes: &[ClassId]) -> u32 {
        if classes.is_empty() {
            return 0;
        }
        self.gpus[gpu].group.map_or(0, |gi| {
            let g = &self.groups[gi as usize];
            classes
                .iter()
                .filter_map(|c| g.local(*c))
                .fold(0u32, |a, l| a.saturating_add(g.parent_sum[l]))
        })
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

    fn fit_req(&self, ri: usize, r: &Req, cx: &mut FitCtx<'_>) -> Result<(), Reason> {
        match &r.kind {
            Kind::Vgpu { text, classes } => self.fit_vgpu(ri, r, text, classes, cx),
            Kind::Whole {
                exact,
                families,
                listed,
            } => self.fit_whole(ri, r, exact, families, *listed, cx),
        }
    }

    /// The first filter a GPU fails for a request, among vendor, class, model and memory.
    pub(super) fn identity_filter(
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

    fn fit_vgpu(
        &self,
        ri: usize,
        r: &Req,
        text: &str,
        classes: &[ClassId],
        cx: &mut FitCtx<'_>,
    ) -> Result<(), Reason> {
        let (policy, overlay, picks) = (cx.policy, &mut cx.overlay, &mut cx.picks);
        // The node's own summary answers "not offered" without touching its parents.
        if !self.offers_any(classes) {
            let mut reason = Reason::new(ReasonKind::ProfileNotOffered, &r.name, r.wanted, 0);
            reason.profile = Some(text.to_owned());
            return Err(reason);
        }
        let mut excluded = Excluded::default();
        let mut cands: Vec<GroupCand> = Vec::new();
        let mut offered = false;
        // Groups left out for no free GPU-instance start, named only when the request fails.
        let mut no_start: Vec<usize> = Vec::new();
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
                .is_some_and(|x| self.gpus[x].held > 0 || taken(picks).any(|t| t == x))
            {
                excluded.add(Filter::InUse);
                continue;
            }
            let parent_sum = if overlay.touches(g) {
                g.entries(local)
                    .map(|(p, o)| {
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
            let room = match overlay.pool(gi, g).map(|p| p.room(profile)) {
                Some(Err(m)) => {
                    if matches!(m, Misfit::MigSlots(SlotMisfit::NoStart { .. })) {
                        no_start.push(gi);
                    }
                    excluded.add(misfit_filter(&m));
                    continue;
                }
                Some(Ok(n)) => n,
                None => u32::MAX,
            };
            let cap = parent_sum.min(room);
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
        if r.numa {
            if let Err(most) = self.keep_one_numa_node(&mut cands, r.wanted, policy, &mut excluded)
            {
                let mut reason =
                    Reason::new(ReasonKind::TopologyUnsatisfiable, &r.name, r.wanted, most);
                reason.profile = Some(text.to_owned());
                reason.numa_aligned = true;
                reason.excluded = excluded.into_sorted();
                reason.slots = self.no_start_words(&no_start, classes, &overlay.pools);
                return Err(reason);
            }
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
            reason.slots = self.no_start_words(&no_start, classes, &overlay.pools);
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
                        Policy::FirstFit => (c.health, false, 0, c.group),
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
            let count = g.entry_count(c.local);
            let mut chosen = None;
            while c.cursor < count {
                let (p, o) = g.entry(c.local, c.cursor);
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
            let profile = &self.parents[p].types.table[self.parents[p].offers[o].profile];
            let start = cx.slots.choice().and_then(|how| {
                overlay
                    .pool(c.group, g)
                    .and_then(|pool| pool.choose_start(profile, how))
            });
            overlay.add_units(p, self.parents.len(), self.parents[p].offers[o].cost);
            overlay.charge_pool(c.group, g, profile, start);
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
                start,
            });
        }
        Ok(())
    }

    /// Keeps the vGPU candidates of one NUMA node: among those that can take `wanted` instances,
    /// the fullest (binpack) or emptiest (spread), ties by NUMA node. When none can, returns the
    /// most instances one NUMA node could take, with the GPUs outside that node excluded.
    fn keep_one_numa_node(
        &self,
        cands: &mut Vec<GroupCand>,
        wanted: u32,
        policy: Policy,
        excluded: &mut Excluded,
    ) -> Result<(), u32> {
        let numa_of = |c: &GroupCand| {
            self.groups[c.group]
                .gpu
                .and_then(|x| self.topo.gpus[x].numa_node)
        };
        let mut totals: Vec<(Option<u32>, u64)> = Vec::new();
        for c in cands.iter() {
            let n = numa_of(c);
            match totals.iter_mut().find(|t| t.0 == n) {
                Some(t) => t.1 += u64::from(c.cap),
                None => totals.push((n, u64::from(c.cap))),
            }
        }
        totals.sort_unstable();
        let fits = totals.iter().filter(|t| t.1 >= u64::from(wanted));
        let best = match policy {
            Policy::Spread => fits.min_by_key(|t| std::cmp::Reverse(t.1)),
            Policy::Binpack => fits.min_by_key(|t| t.1),
            Policy::FirstFit => fits.min_by_key(|_| 0),
        };
        let keep = match best {
            Some(t) => Ok(t.0),
            None => {
                let most = totals
                    .iter()
                    .min_by_key(|t| std::cmp::Reverse(t.1))
                    .copied();
                Err(most)
            }
        };
        let node = match keep {
            Ok(n) | Err(Some((n, _))) => n,
            Err(None) => return Err(0),
        };
        let before = cands.len();
        cands.retain(|c| numa_of(c) == node);
        for _ in cands.len()..before {
            excluded.add(Filter::WrongNuma);
        }
        match keep {
            Ok(_) => Ok(()),
            Err(most) => Err(most.map_or(0, |t| u32::try_from(t.1).unwrap_or(u32::MAX))),
        }
    }

    fn fit_whole(
        &self,
        ri: usize,
        r: &Req,
        exact: &[GpuRef],
        families: &[&str],
        listed: bool,
        cx: &mut FitCtx<'_>,
    ) -> Result<(), Reason> {
        let (policy, vgpu_classes, set_size) = (cx.policy, cx.vgpu_classes, cx.set_size);
        let (overlay, picks, set_rest) = (&mut cx.overlay, &mut cx.picks, &mut cx.set_rest);
        let find = |e: &GpuRef| {
            self.topo.gpus.iter().position(|g| match e {
                GpuRef::Name(n) => g.name == *n,
                GpuRef::Address(a) => g.address == *a,
                GpuRef::Family(_) => false,
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
        let mut cands: Vec<(usize, bool)> = Vec::with_capacity(self.topo.gpus.len());
        for (i, g) in self.topo.gpus.iter().enumerate() {
            let is_exact = exact_ix.contains(&i);
            if listed && !is_exact {
                let fam = g.name.trim_end_matches(|c: char| c.is_ascii_digit());
                if !families.contains(&fam) {
                    excluded.add(Filter::OtherFamily);
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
            if !s.free_whole()
                || taken(picks).any(|t| t == i)
                || overlay.hosting.contains(&i)
                || set_rest.as_ref().is_some_and(|rest| !rest.contains(&i))
            {
                // Outside the partition an earlier request of the Machine took counts as in
                // use: the Machine's whole GPUs are one set.
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
            reason.gpus = exact
                .iter()
                .map(ToString::to_string)
                .chain(families.iter().map(|f| (*f).to_owned()))
                .collect();
            reason
        };
        let exact_ok = exact_ix.iter().all(|e| cands.iter().any(|c| c.0 == *e));
        if !exact_ok {
            return Err(fail(cands.len(), excluded, r.numa));
        }
        let rank = |i: usize| {
            // Binpack and spread keep GPUs that offer the Machine's vGPU types for those: the
            // GPU taken whole is the one that could host the fewest of them, so a card with
            // one free parent goes before a card with three when the Machine wants two.
            let hosts = if policy == Policy::FirstFit {
                0
            } else {
                self.vgpu_room(i, vgpu_classes)
            };
            (self.gpus[i].health.rank(), hosts, i)
        };
        let need_more = (r.wanted as usize).saturating_sub(exact_ix.len());
        let mut chosen: Vec<usize> = exact_ix.clone();
        // With too few GPUs free the reason is that, partitions or not.
        let fabric = if set_rest.is_some() {
            // The Machine's partition is chosen; this request takes from what is left of it.
            PartitionFit::Free
        } else if cands.len() >= r.wanted as usize {
            let size = set_size.max(r.wanted as usize);
            self.fit_partition(r, size, &cands, &exact_ix, taken(picks), policy)
        } else {
            PartitionFit::Free
        };
        let partition = match fabric {
            PartitionFit::Free => None,
            PartitionFit::Refused(mut reason) => {
                reason.free = u32::try_from(cands.len()).unwrap_or(u32::MAX);
                reason.excluded = excluded.into_sorted();
                return Err(reason);
            }
            PartitionFit::Chosen(members) => Some(members),
        };
        if let Some(members) = partition {
            let members = members.iter().map(|&g| usize::from(g));
            if members.len() > r.wanted as usize {
                // The Machine's set: this request takes its named GPUs and then the members
                // that pass its filters, in member order; the rest wait for its other requests.
                let mut mine = exact_ix.clone();
                for g in members.clone() {
                    if mine.len() < r.wanted as usize
                        && !mine.contains(&g)
                        && cands.iter().any(|c| c.0 == g)
                    {
                        mine.push(g);
                    }
                }
                *set_rest = Some(members.filter(|g| !mine.contains(g)).collect());
                chosen = mine;
            } else {
                // The partition is the request's: its members, taken as they are.
                picks.extend(members.map(|gpu| Pick::Whole { req: ri, gpu }));
                return Ok(());
            }
        } else if r.numa {
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
                    (Some(_), Policy::FirstFit) => false,
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
        picks.extend(chosen.into_iter().map(|gpu| Pick::Whole { req: ri, gpu }));
        Ok(())
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

#[cfg(test)]
mod tests {
    use super::Excluded;
    use crate::refusal::Filter;

    #[test]
    fn exclusions_come_counted_in_filter_order() {
        let mut e = Excluded::default();
        for f in [
            Filter::OtherFamily,
            Filter::InUse,
            Filter::WrongVendor,
            Filter::InUse,
        ] {
            e.add(f);
        }
        let got: Vec<(Filter, u32)> = e
            .into_sorted()
            .into_iter()
            .map(|x| (x.filter, x.count))
            .collect();
        assert_eq!(
            got,
            [
                (Filter::WrongVendor, 1),
                (Filter::InUse, 2),
                (Filter::OtherFamily, 1)
            ]
        );
    }
}
