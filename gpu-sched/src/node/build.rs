//! Indexing a topology: GPUs, parents grouped by pool, offers with their unit costs, and the
//! cached per-group and per-node free counts.

use gpu_core::{GpuState, HealthState, NodeTopology, ParentId, Pool, Profile, Vendor};

use super::{
    GpuSlot, Group, NodeState, Offer, ParentSlot, ProfileTables, UNIT_CAP, creatable, vendor_ix,
};
use crate::resolve::{Catalog, ClassId};

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
    /// The parents' type lists move into `tables` (shared), leaving the kept topology without
    /// them; [`NodeState::topology`] puts them back.
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
            let (table, counts) = tables.intern(&p.profiles);
            let offers = tables.offers(&table, &counts, || {
                offerable
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
                    .collect()
            });
            parents.push(ParentSlot {
                group: gi,
                cap,
                used: 0,
                offers,
                usable: true,
                table,
                counts,
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
                        entries[l].push(super::Entry::new(p, oi));
                    }
                }
            }
            // Parents in address order, so "the first free VF" is the lowest one.
            let pid = |p: usize| &topo.mediated_devices.parents[p].id;
            for e in &mut entries {
                e.sort_by(|a, b| pid(a.get().0).cmp(pid(b.get().0)));
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
        for p in &mut topo.mediated_devices.parents {
            p.profiles = Vec::new();
        }
        let mut n = NodeState {
            topo,
            gpus,
            groups,
            parents,
            free_used: vec![0; all.len()],
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

    fn group_blocked(&self, gi: usize) -> bool {
        let g = &self.groups[gi];
        g.health == HealthState::Unhealthy || g.gpu.is_some_and(|x| self.gpus[x].held > 0)
    }

    pub(super) fn refresh_group(&mut self, gi: usize) {
        let blocked = self.group_blocked(gi);
        for l in 0..self.groups[gi].classes.len() {
            let g = &self.groups[gi];
            let sum: u32 = g.entries[l]
                .iter()
                .map(|e| {
                    let (p, o) = e.get();
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
        for (gi, g) in self.groups.iter().enumerate() {
            let used = g.base_used || g.charged > 0;
            for (l, c) in g.contrib.iter().enumerate() {
                let ix = self.node_ix[gi][l];
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
    }
}
