//! What allocations hold on a node: charging and releasing them, turning picks into charges and
//! allocated devices, and the health of what a pick uses.

use gpu_core::{AllocatedDevice, Allocation, HealthState, Profile, VgpuFramework};

use super::{Charge, NodeState, Pick, ProfileRef};
use crate::resolve::Resolved;

impl NodeState {
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
                        touched.push(gi as usize);
                    }
                }
                Charge::Vgpu {
                    parent,
                    group,
                    cost,
                    profile,
                    start,
                } => {
                    let prof: &Profile = match profile {
                        ProfileRef::Topo(i) => &self.parents[*parent].types.table[*i],
                        ProfileRef::Own(p) => p,
                    };
                    let g = &mut self.groups[*group];
                    if let Some(pool) = &mut g.pool {
                        if sign > 0 {
                            pool.charge_at(prof, *start);
                        } else {
                            pool.release_at(prof, *start);
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
                    gpu_instance_start,
                    ..
                } => {
                    let Some(pi) = self.topo.parents.iter().position(|p| p.id == *parent) else {
                        missing.push(format!("vGPU parent {parent}"));
                        continue;
                    };
                    let tp = &self.topo.parents[pi];
                    let reflected = tp.instances.iter().any(|i| {
                        i.uuid == Some(*uuid)
                            || (*framework == VgpuFramework::VendorVfio && i.profile == *profile)
                    });
                    if reflected {
                        continue;
                    }
                    let ps = &self.parents[pi];
                    let topo_ix = self.profiles_of(pi).iter().position(|p| p.id == *profile);
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
                        group: ps.group as usize,
                        cost,
                        profile: profile_ref,
                        start: *gpu_instance_start,
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
                    start,
                    ..
                } => {
                    let o = &self.parents[parent].offers[offer];
                    Charge::Vgpu {
                        parent,
                        group,
                        cost: o.cost,
                        profile: ProfileRef::Topo(o.profile),
                        start,
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
        let key = |p: &Pick| match *p {
            Pick::Whole { req, gpu } => (req, gpu as u64),
            Pick::Vgpu { req, index, .. } => (req, u64::from(index)),
        };
        // Picks mostly come in request order already; only others are copied to be sorted.
        let sorted: std::borrow::Cow<'_, [Pick]> = if picks.is_sorted_by_key(key) {
            picks.into()
        } else {
            let mut v = picks.to_vec();
            v.sort_by_key(key);
            v.into()
        };
        for &p in sorted.iter() {
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
                    start,
                    ..
                } => {
                    let tp = &self.topo.parents[parent];
                    let pr = &self.profiles_of(parent)[self.parents[parent].offers[offer].profile];
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
                        gpu_instance_start: start,
                        placement_id: None,
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
                let tp = &self.topo.parents[parent];
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
}
