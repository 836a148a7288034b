//! The devices and counter set of one physical GPU: what is taken outside Kubernetes, the
//! counter set, the whole GPU, and its vGPUs by kind (built in [`super::vgpu`]).

use std::collections::{BTreeMap, BTreeSet};

use gpu_core::{Gpu, GpuState, HealthState, MigOccupancy, Parent, ParentId, nvidia};

use super::Ctx;
use super::mig::{exactly_placed, mig_memory_slices};
use super::parts::{BySize, GpuPlan, MigGroups, Resolved, counters, int_attr, resolve, str_attr};
use crate::dra::device_name::{counter_set_name, gpu_device_name};
use crate::dra::model::*;
use crate::dra::names::mib_quantity;
use crate::dra::version::*;

/// What a GPU's parents hold that `dra prepare` did not make.
#[derive(Debug, Clone, Default)]
pub(super) struct Foreign {
    /// Framebuffer they take.
    pub(super) mib: u64,
    /// Sizes of their time-sliced vGPUs.
    pub(super) sizes: BTreeSet<u64>,
    /// Compute slices of their MIG-backed vGPUs.
    pub(super) mig: u32,
    /// How many.
    pub(super) count: u32,
    /// One of unknown size exists.
    pub(super) unknown: bool,
    /// A vGPU `dra prepare` made is on the GPU.
    pub(super) prepared_here: bool,
    /// Parents holding none of them.
    pub(super) free_parents: u32,
}

/// The facts of one GPU that its devices are built from.
pub(super) struct OneGpu<'a> {
    pub(super) gpu: &'a Gpu,
    pub(super) set_name: String,
    /// Framebuffer left for vGPUs after what is taken outside Kubernetes.
    pub(super) remaining: u64,
    pub(super) taints: Vec<DeviceTaint>,
    /// Attributes every vGPU device of the GPU carries.
    pub(super) vgpu_attrs: BTreeMap<String, DeviceAttribute>,
    pub(super) one_per_parent: bool,
    pub(super) foreign: Foreign,
    pub(super) mig_total: Option<u8>,
    pub(super) held: MigOccupancy,
    /// The time-sliced size vGPUs made outside Kubernetes lock the GPU to.
    pub(super) locked: Option<u64>,
    /// The time-sliced size any vGPU locks the GPU to, the ones `dra prepare` made included.
    pub(super) locked_by_any: Option<u64>,
}

impl OneGpu<'_> {
    /// The GPU as warnings name it.
    pub(super) fn who(&self) -> String {
        format!("{} ({})", self.gpu.name, self.gpu.address)
    }

    /// A device of the GPU consuming `used` (counter name, amount) of its counter set.
    pub(super) fn consuming(
        &self,
        name: String,
        attributes: BTreeMap<String, DeviceAttribute>,
        used: Vec<(String, String)>,
    ) -> Device {
        Device {
            name,
            attributes,
            capacity: BTreeMap::new(),
            consumes_counters: vec![DeviceCounterConsumption {
                counter_set: self.set_name.clone(),
                counters: counters(used),
            }],
            allow_multiple_allocations: None,
            taints: self.taints.clone(),
        }
    }

    /// A consumption of the GPU's whole remaining framebuffer.
    pub(super) fn whole_framebuffer(&self) -> Vec<DeviceCounterConsumption> {
        vec![DeviceCounterConsumption {
            counter_set: self.set_name.clone(),
            counters: counters([("framebuffer".to_owned(), mib_quantity(self.remaining))]),
        }]
    }
}

/// The framebuffer left for vGPUs. A pool total inferred from the types a GPU lists is only a
/// lower bound, and a GPU holding MIG-backed vGPUs lists only what it can still create: its total
/// may not include them, and subtracting them again would hide types the driver says it can
/// create now. So there, what the driver lists as creatable now is free now.
fn remaining_framebuffer(parents: &[&Parent], foreign: &Foreign, total: u64) -> u64 {
    let creatable_mig_mib = if foreign.mig > 0 {
        parents
            .iter()
            .flat_map(|p| p.profiles.iter())
            .filter(|p| p.device_api == "vfio-pci" && p.available_instances > 0)
            .map(resolve)
            .filter(|r| r.mig_slices.is_some())
            .filter_map(|r| r.framebuffer_mib)
            .max()
            .unwrap_or(0)
            .min(total)
    } else {
        0
    };
    total.saturating_sub(foreign.mib).max(creatable_mig_mib)
}

impl Ctx<'_> {
    /// Attributes every device of `gpu` carries. Names without a domain are in the driver's.
    pub(super) fn common_attributes(
        &self,
        gpu: &Gpu,
        kind: &str,
    ) -> BTreeMap<String, DeviceAttribute> {
        let mut a = BTreeMap::new();
        a.insert("type".into(), str_attr(kind));
        a.insert("vendor".into(), str_attr(gpu.vendor.family()));
        if !gpu.model.trim().is_empty() {
            a.insert("model".into(), str_attr(&gpu.model));
        }
        a.insert(
            "pciDeviceID".into(),
            str_attr(&format!("{}:{}", gpu.vendor_id, gpu.device_id)),
        );
        a.insert("gpuName".into(), str_attr(&gpu.name));
        a.insert("health".into(), str_attr(gpu.health.state.as_str()));
        if let Some(n) = gpu.numa_node {
            a.insert(NUMA_NODE.to_owned(), int_attr(u64::from(n)));
        }
        a
    }

    pub(super) fn taints(&self, gpu: &Gpu) -> Vec<DeviceTaint> {
        self.taints_for(gpu.health.state)
    }

    pub(super) fn taints_for(&self, state: HealthState) -> Vec<DeviceTaint> {
        match state {
            HealthState::Unhealthy => vec![DeviceTaint {
                key: format!("{}/unhealthy", self.opts.driver),
                value: None,
                effect: "NoSchedule".into(),
            }],
            HealthState::Degraded if self.opts.version.has_none_effect() => vec![DeviceTaint {
                key: format!("{}/degraded", self.opts.driver),
                value: None,
                effect: "None".into(),
            }],
            _ => vec![],
        }
    }

    /// The devices and counter set of one GPU, in steps: what is taken outside Kubernetes
    /// ([`Ctx::foreign_use`]), the counter set, the whole GPU, then the vGPUs by kind:
    /// time-sliced ones in the version's [`Encoding`] ([`Ctx::size_lock_devices`],
    /// [`Ctx::mixed_device`], [`Ctx::per_instance_devices`]) and MIG placements
    /// ([`Ctx::mig_devices`]).
    pub(super) fn plan_gpu(&mut self, gpu: &Gpu) -> GpuPlan {
        let addr = gpu.address;
        if gpu.state == GpuState::Blocked {
            self.warnings.push(format!(
                "{} ({addr}) not published: blocked ({})",
                gpu.name,
                gpu.state_reason.as_deref().unwrap_or("cannot go to a VM")
            ));
            return GpuPlan::default();
        }
        let parents: Vec<&Parent> = self
            .node
            .mediated_devices
            .parents
            .iter()
            .filter(|p| p.gpu == Some(addr))
            .collect();
        let pool = self.node.pool(&ParentId::Pci(addr));
        // The vGPU pool's size is what vGPUs can use (a T4 reports 15360 MiB but holds 16 1 GB
        // vGPUs); without a pool, the GPU's own memory.
        let total = pool
            .map(|p| p.total_mib)
            .filter(|m| *m > 0)
            .or(gpu.memory_mib)
            .filter(|m| *m > 0);

        // Profiles offered anywhere on the card, by type ID.
        let mut profiles: BTreeMap<&str, Resolved<'_>> = BTreeMap::new();
        for p in parents.iter().flat_map(|p| p.profiles.iter()) {
            if p.device_api == "vfio-pci" {
                profiles.entry(p.id.as_str()).or_insert_with(|| resolve(p));
            }
        }
        let foreign = self.foreign_use(&parents, &profiles);
        if gpu.state == GpuState::InUse
            && gpu.vgpu_framework.is_none()
            && foreign.count == 0
            && !foreign.prepared_here
            && !self.prepared.gpus.contains(&addr)
        {
            self.warnings.push(format!(
                "{} ({addr}) not published: in use outside Kubernetes ({})",
                gpu.name,
                gpu.state_reason
                    .as_deref()
                    .unwrap_or("bound to vfio-pci or held by a VM")
            ));
            return GpuPlan::default();
        }
        let Some(total) = total else {
            return self.unknown_memory_plan(gpu, &profiles, &foreign);
        };
        // MIG-backed vGPUs made outside Kubernetes hold slots: where the pool knows each one's
        // start (NVML's placements), the placements beside them are published; otherwise none.
        let held = match foreign.mig {
            0 => Some(MigOccupancy::empty()),
            n if !foreign.prepared_here => pool.and_then(|p| exactly_placed(p, n)),
            _ => None,
        };
        let mig_total = pool
            .and_then(|p| p.mig_slices_total)
            .filter(|_| held.is_some());
        let remaining = remaining_framebuffer(&parents, &foreign, total);
        let mut g = OneGpu {
            gpu,
            set_name: counter_set_name(&addr),
            remaining,
            taints: self.taints(gpu),
            vgpu_attrs: BTreeMap::new(),
            // SR-IOV frameworks hold one vGPU per parent (VF); a PF mdev parent holds many.
            one_per_parent: !parents.is_empty()
                && parents.iter().all(|p| p.id != ParentId::Pci(addr)),
            foreign,
            mig_total,
            held: held.unwrap_or_default(),
            locked: None,
            locked_by_any: None,
        };
        let mut plan = GpuPlan::default();
        let mut set_counters = vec![("framebuffer".to_owned(), mib_quantity(remaining))];
        if let Some(n) = mig_total {
            for i in 0..mig_memory_slices(gpu.device_id.0, n) {
                set_counters.push((format!("memory-slice-{i}"), "1".to_owned()));
            }
        }
        // A mixed-size GPU whose driver's placements are known: counters per placement slot.
        let opts = self.opts;
        if let Some(placements) = opts
            .mixed_placements
            .get(&addr)
            .filter(|p| !p.is_empty() && g.foreign.mig == 0)
        {
            return self.slot_plan(g, total, set_counters, placements, &parents, &profiles);
        }
        plan.counter_set = Some(CounterSet {
            name: g.set_name.clone(),
            counters: counters(set_counters.clone()),
        });
        if self.whole_gpu_free(gpu, g.foreign.count, g.foreign.prepared_here) {
            plan.devices
                .push(self.whole_gpu_device(&g, total, counters(set_counters)));
        }
        if remaining == 0 {
            return plan;
        }
        g.vgpu_attrs = self.vgpu_attributes(gpu, &parents);

        let (by_size, mig_groups) = self.profiles_by_kind(gpu, &profiles);
        let mixed = pool.is_some_and(|p| p.mixed_size);
        g.locked = if mixed {
            None
        } else {
            g.foreign.sizes.iter().next().copied()
        };
        g.locked_by_any = pool.and_then(|p| p.size_locked_mib).or(g.locked);
        let (time_sliced, publish_mig) =
            self.time_sliced_devices(&g, mixed, &by_size, &mig_groups, plan.devices.len());
        plan.devices.extend(time_sliced);
        if publish_mig && !mig_groups.is_empty() {
            plan.devices.extend(self.mig_devices(&g, &mig_groups));
        }
        plan
    }

    /// The attributes every vGPU device of `gpu` carries.
    pub(super) fn vgpu_attributes(
        &self,
        gpu: &Gpu,
        parents: &[&Parent],
    ) -> BTreeMap<String, DeviceAttribute> {
        let mut a = self.common_attributes(gpu, "vgpu");
        a.insert("gpuPciBusID".into(), str_attr(&gpu.address.to_string()));
        if let Some(fw) = gpu.vgpu_framework.or(parents.first().map(|p| p.framework)) {
            a.insert("framework".into(), str_attr(fw.as_str()));
        }
        // In Fabric Manager's vGPU mode a partition is activated with its GPUs' VFs.
        if self
            .node
            .fabric
            .as_ref()
            .is_some_and(|f| f.fabric_manager.mode == Some(gpu_core::FabricMode::Vgpu))
        {
            a.extend(crate::dra::partition::fabric_attributes(self.node, gpu));
        }
        a
    }

    /// A GPU's profiles by kind: time-sliced by framebuffer size, MIG-backed by slices and size.
    pub(super) fn profiles_by_kind<'p>(
        &mut self,
        gpu: &Gpu,
        profiles: &'p BTreeMap<&str, Resolved<'p>>,
    ) -> (BySize<'p>, MigGroups<'p>) {
        let mut by_size: BTreeMap<u64, Vec<&Resolved<'_>>> = BTreeMap::new();
        let mut mig_groups: BTreeMap<(u8, u64), Vec<&Resolved<'_>>> = BTreeMap::new();
        for r in profiles.values() {
            match (r.mig_slices, r.framebuffer_mib) {
                (None, Some(fb)) if fb > 0 => by_size.entry(fb).or_default().push(r),
                (Some(s), Some(fb)) if s > 0 => mig_groups.entry((s, fb)).or_default().push(r),
                _ => self.warnings.push(format!(
                    "{} ({}): profile {} not published, its framebuffer size is unknown",
                    gpu.name, gpu.address, r.profile.name
                )),
            }
        }
        (by_size, mig_groups)
    }

    /// The time-sliced devices of a GPU in the version's [`Encoding`], and whether its MIG
    /// placements may be published beside them. `beside`: devices already in the GPU's plan.
    pub(super) fn time_sliced_devices(
        &mut self,
        g: &OneGpu<'_>,
        mixed: bool,
        by_size: &BTreeMap<u64, Vec<&Resolved<'_>>>,
        mig_groups: &BTreeMap<(u8, u64), Vec<&Resolved<'_>>>,
        beside: usize,
    ) -> (Vec<Device>, bool) {
        let size_lock = self.opts.version.encoding() == Encoding::SizeLock;
        if g.foreign.mig > 0 || by_size.is_empty() {
            // MIG-backed vGPUs exist: time-sliced ones cannot join them (the GPU is in MIG mode).
            (vec![], true)
        } else if size_lock && mixed {
            (self.mixed_device(g, by_size).into_iter().collect(), true)
        } else if g.foreign.unknown {
            self.warnings.push(format!(
                "{} ({}): time-sliced vGPUs not published, a vGPU of unknown size holds the card",
                g.gpu.name, g.gpu.address
            ));
            (vec![], true)
        } else if size_lock {
            (self.size_lock_devices(g, by_size), true)
        } else {
            // Plain counters cannot keep time-sliced and MIG-backed vGPUs apart when several of
            // each fit: publish one kind.
            match self.chosen_size(g, by_size, mig_groups) {
                Some(size) => {
                    let group = by_size.get(&size).cloned().unwrap_or_default();
                    (self.per_instance_devices(g, size, &group, beside), false)
                }
                None => (vec![], true),
            }
        }
    }

    /// What is taken on a GPU's parents outside Kubernetes (vGPUs `dra prepare` did not make).
    pub(super) fn foreign_use(
        &self,
        parents: &[&Parent],
        profiles: &BTreeMap<&str, Resolved<'_>>,
    ) -> Foreign {
        let mut f = Foreign::default();
        for parent in parents {
            let mut parent_foreign = false;
            for inst in &parent.instances {
                let key = inst
                    .uuid
                    .map(|u| u.to_string())
                    .or_else(|| inst.address.map(|a| a.to_string()))
                    .unwrap_or_default();
                if self.prepared.instances.contains(&key) {
                    f.prepared_here = true;
                    continue;
                }
                parent_foreign = true;
                f.count += 1;
                // A vendor-VFIO VF lists only what is still creatable, so the instance's own type
                // may be missing from the profiles: fall back to its name.
                let r = profiles.get(inst.profile.as_str());
                let named = inst
                    .profile_name
                    .as_deref()
                    .and_then(|n| nvidia::VgpuTypeName::parse(n).ok());
                let mig = r
                    .and_then(|r| r.mig_slices)
                    .or_else(|| named.as_ref().and_then(|n| n.mig_slices));
                if let Some(s) = mig {
                    f.mig += u32::from(s);
                }
                let fb = inst
                    .framebuffer_mib
                    .or_else(|| r.and_then(|r| r.framebuffer_mib))
                    .or_else(|| named.as_ref().map(|n| n.framebuffer_mib()))
                    .unwrap_or(0);
                f.mib = f.mib.saturating_add(fb);
                if mig.is_none() && fb > 0 {
                    f.sizes.insert(fb);
                }
                f.unknown |= mig.is_none() && fb == 0;
            }
            if !parent_foreign {
                f.free_parents += 1;
            }
        }
        f
    }

    /// A GPU whose memory is unknown: no counters, so only a whole GPU with nothing to share it.
    pub(super) fn unknown_memory_plan(
        &mut self,
        gpu: &Gpu,
        profiles: &BTreeMap<&str, Resolved<'_>>,
        foreign: &Foreign,
    ) -> GpuPlan {
        let mut plan = GpuPlan::default();
        if profiles.is_empty() && self.whole_gpu_free(gpu, foreign.count, foreign.prepared_here) {
            let mut attributes = self.common_attributes(gpu, "gpu");
            self.whole_gpu_attributes(gpu, &mut attributes);
            plan.devices.push(Device {
                name: gpu_device_name(&gpu.address),
                attributes,
                taints: self.taints(gpu),
                ..Device::default()
            });
        } else if !profiles.is_empty() {
            self.warnings.push(format!(
                "{} ({}): vGPUs not published, the GPU's memory is unknown",
                gpu.name, gpu.address
            ));
        }
        plan
    }

    /// The whole GPU: it consumes every counter of its set, so it excludes every vGPU.
    pub(super) fn whole_gpu_device(
        &self,
        g: &OneGpu<'_>,
        total: u64,
        all: BTreeMap<String, Counter>,
    ) -> Device {
        let mut attributes = self.common_attributes(g.gpu, "gpu");
        self.whole_gpu_attributes(g.gpu, &mut attributes);
        let mut capacity = BTreeMap::new();
        capacity.insert(
            "framebuffer".to_owned(),
            DeviceCapacity {
                value: mib_quantity(g.gpu.memory_mib.unwrap_or(total)),
                request_policy: None,
            },
        );
        Device {
            name: gpu_device_name(&g.gpu.address),
            attributes,
            capacity,
            consumes_counters: vec![DeviceCounterConsumption {
                counter_set: g.set_name.clone(),
                counters: all,
            }],
            allow_multiple_allocations: None,
            taints: g.taints.clone(),
        }
    }

    pub(super) fn whole_gpu_free(
        &self,
        gpu: &Gpu,
        foreign_count: u32,
        prepared_here: bool,
    ) -> bool {
        if foreign_count > 0 {
            return false;
        }
        match gpu.state {
            GpuState::Free => true,
            GpuState::InUse => prepared_here || self.prepared.gpus.contains(&gpu.address),
            GpuState::Blocked => false,
        }
    }

    pub(super) fn whole_gpu_attributes(
        &self,
        gpu: &Gpu,
        a: &mut BTreeMap<String, DeviceAttribute>,
    ) {
        a.insert(PCI_BUS_ID.to_owned(), str_attr(&gpu.address.to_string()));
        if let Some(g) = gpu.iommu_group {
            a.insert("iommuGroup".into(), int_attr(u64::from(g)));
        }
        if let Some(m) = gpu.memory_mib {
            a.insert("memoryMiB".into(), int_attr(m));
        }
        a.extend(crate::dra::partition::fabric_attributes(self.node, gpu));
    }
}
