//! Indexing a topology: GPUs, parents grouped by pool, offers with their unit costs, and the
//! cached per-group and per-node free counts.

use gpu_core::{GpuState, HealthState, NodeTopology, ParentId, Pool, Profile, Vendor};

use super::{
    GpuSlot, Group, NodeState, Offer, ParentSlot, ProfileTables, UNIFORM, UNIT_CAP, creatable,
    vendor_ix,
};
use crate::resolve::{Catalog, ClassId};

/// An index stored small (a node has far fewer than 2^32 of anything).
fn ix(i: usize) -> u32 {
    u32::try_from(i).unwrap_or(u32::MAX)
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

impl NodeState {
    /// Indexes a topology, interning its profiles in `catalog`.
    /// The parents' type lists move into `tables` (shared), and so do its GPUs, parents and
    /// pools; [`NodeState::topology`] puts them together again.
    pub(crate) fn new(
        mut topo: NodeTopology,
        catalog: &mut Catalog,
        tables: &mut ProfileTables,
    ) -> Self {
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
                model_lc: tables.topo.model_lc(&g.model),
            })
            .collect();
        /// A group while it is built.
        struct Building {
            group: Group,
            parents: Vec<u32>,
        }
        let mut groups: Vec<Building> = Vec::new();
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
                    groups.push(Building {
                        group: Group {
                            pool,
                            gpu,
                            parents: Box::default(),
                            health,
                            base_used,
                            charged: 0,
                            classes: Box::default(),
                            order: Box::default(),
                            span: Box::default(),
                            list: Box::default(),
                            sample: Box::default(),
                            parent_sum: Box::default(),
                            contrib: Box::default(),
                            node_ix: Box::default(),
                        },
                        parents: Vec::new(),
                    });
                    groups.len() - 1
                }
            };
            let pi = parents.len();
            let b = &mut groups[gi];
            b.parents.push(ix(pi));
            b.group.health = b.group.health.worst(p.health.state);
            if !p.instances.is_empty() {
                b.group.base_used = true;
            }
            let offerable: Vec<(usize, &Profile)> = p
                .profiles
                .iter()
                .enumerate()
                .filter(|(_, pr)| pr.device_api == "vfio-pci")
                .collect();
            // A parent that is its pool's only one, with every type sized, is bounded by the
            // pool (mbochs: 256 MiB after its descriptions): the units would over-charge where
            // the counts do not divide evenly (63/15/3 after one small).
            let pooled = topo.pool(&key).is_some_and(|pl| pl.parents.len() == 1)
                && offerable
                    .iter()
                    .all(|(_, pr)| pr.framebuffer_mib.is_some() && pr.mig_slices.is_none());
            // Within the pool, one parent holds no more instances than its largest count: the
            // kernel counts each type from what is left, so the smallest type's count bounds the
            // total (a VF that takes one vGPU reads 1 for every type; 16 GiB left of its pool
            // would otherwise let a second vGPU onto it).
            let cap = if pooled {
                offerable
                    .iter()
                    .map(|(_, pr)| u64::from(pr.available_instances))
                    .max()
                    .unwrap_or(0)
            } else {
                lcm_capped(p.profiles.iter().map(|pr| pr.available_instances))
            };
            let (table, counts) = tables.intern(&p.profiles);
            let (offers, types) = tables.offers(table, counts, || {
                offerable
                    .iter()
                    .map(|(i, pr)| Offer {
                        class: catalog.intern(pr),
                        profile: *i,
                        avail: pr.available_instances,
                        cost: if pr.available_instances == 0 {
                            cap
                        } else if pooled {
                            1
                        } else {
                            cap.div_ceil(u64::from(pr.available_instances))
                        },
                    })
                    .collect()
            });
            parents.push(ParentSlot {
                group: ix(gi),
                cap,
                used: 0,
                offers,
                usable: true,
                types,
            });
        }
        let mut built: Vec<Group> = Vec::with_capacity(groups.len());
        for (gi, b) in groups.into_iter().enumerate() {
            let Building {
                mut group,
                parents: members,
            } = b;
            if let Some(gpu) = group.gpu {
                gpus[gpu].group = Some(ix(gi));
                gpus[gpu].hosts_base = group.base_used;
            }
            let mut classes: Vec<ClassId> = members
                .iter()
                .flat_map(|&p| parents[p as usize].offers.iter().map(|o| o.class))
                .collect();
            classes.sort_unstable();
            classes.dedup();
            let mut sample: Vec<(u32, u32)> = vec![(0, 0); classes.len()];
            let mut seen = vec![false; classes.len()];
            for &p in &members {
                for o in parents[p as usize].offers.iter() {
                    if let Ok(l) = classes.binary_search(&o.class) {
                        if !seen[l] {
                            seen[l] = true;
                            sample[l] = (p, ix(o.profile));
                        }
                    }
                }
            }
            // Parents in address order, so "the first free VF" is the lowest one.
            let pid = |p: u32| &topo.mediated_devices.parents[p as usize].id;
            let mut order = members.clone();
            order.sort_by(|a, b| pid(*a).cmp(pid(*b)));
            let mut span = Vec::with_capacity(classes.len());
            let mut list: Vec<super::Entry> = Vec::new();
            for c in &classes {
                // The offer of class `c`, when each parent has exactly one and all the same.
                let once = |p: u32| {
                    let mut it = parents[p as usize]
                        .offers
                        .iter()
                        .enumerate()
                        .filter(|(_, o)| o.class == *c)
                        .map(|(i, _)| i);
                    match (it.next(), it.next()) {
                        (Some(i), None) => Some(i),
                        _ => None,
                    }
                };
                let first = order.first().and_then(|&p| once(p));
                let uniform = first.filter(|&o| order.iter().all(|&p| once(p) == Some(o)));
                match uniform {
                    Some(o) if ix(o) != UNIFORM => span.push((UNIFORM, ix(o))),
                    _ => {
                        let start = list.len();
                        for &p in &order {
                            for (oi, o) in parents[p as usize].offers.iter().enumerate() {
                                if o.class == *c {
                                    list.push(super::Entry::new(p as usize, oi));
                                }
                            }
                        }
                        span.push((ix(start), ix(list.len() - start)));
                    }
                }
            }
            group.parent_sum = vec![0; classes.len()].into_boxed_slice();
            group.contrib = vec![0; classes.len()].into_boxed_slice();
            group.classes = classes.into_boxed_slice();
            group.parents = members.into_boxed_slice();
            group.order = order.into_boxed_slice();
            group.span = span.into_boxed_slice();
            group.list = list.into_boxed_slice();
            group.sample = sample.into_boxed_slice();
            built.push(group);
        }
        let mut all: Vec<ClassId> = built.iter().flat_map(|g| g.classes.to_vec()).collect();
        all.sort_unstable();
        all.dedup();
        for g in &mut built {
            g.node_ix = g
                .classes
                .iter()
                .map(|c| ix(all.binary_search(c).unwrap_or(0)))
                .collect();
        }
        for p in &mut topo.mediated_devices.parents {
            p.profiles = Vec::new();
        }
        let mut n = NodeState {
            topo: tables.topo.intern(topo),
            gpus: gpus.into_boxed_slice(),
            groups: built.into_boxed_slice(),
            parents: parents.into_boxed_slice(),
            free_used: vec![0; all.len()].into_boxed_slice(),
            free: all.into_iter().map(|c| (c, 0)).collect(),
            whole_free: 0,
            whole_free_vendor: [0; 6],
            part_cost: Box::default(),
        };
        n.part_cost = n.partition_sizes();
        for gi in 0..n.groups.len() {
            n.refresh_group(gi);
        }
        n.recount();
        n
    }

    fn group_blocked(&self, gi: usize) -> bool {
        let g = &self.groups[gi];
        g.health == HealthState::Unhealthy || g.gpu.is_some_and(|x| self.gpus[x].held > 0)
    }

    pub(super) fn refresh_group(&mut self, gi: usize) {
        let blocked = self.group_blocked(gi);
        for l in 0..self.groups[gi].classes.len() {
            let g = &self.groups[gi];
            let sum: u32 = g
                .entries(l)
                .map(|(p, o)| {
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
    pub(super) fn recount(&mut self) {
        for f in &mut self.free {
            f.1 = 0;
        }
        for f in &mut self.free_used {
            *f = 0;
        }
        for g in self.groups.iter() {
            let used = g.base_used || g.charged > 0;
            for (c, &ix) in g.contrib.iter().zip(g.node_ix.iter()) {
                let ix = ix as usize;
                self.free[ix].1 = self.free[ix].1.saturating_add(*c);
                if used {
                    self.free_used[ix] = self.free_used[ix].saturating_add(*c);
                }
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
        self.partition_costs();
    }
}
