//! From a node's inventory to ResourceSlices.
//!
//! Each physical GPU becomes one counter set (`framebuffer`, and `memory-slice-<i>` on MIG-capable
//! GPUs). Its devices:
//! - the whole GPU, consuming every counter of the set in full, so it excludes any vGPU on the
//!   card and any vGPU excludes it;
//! - one multi-allocatable device per time-sliced framebuffer size, with an `instances` capacity
//!   taken one at a time, consuming the whole `framebuffer` counter: the first vGPU locks the card
//!   to its size, as the NVIDIA driver does (plain counters cannot say "one size per card": two
//!   sizes that each fit twice would always co-fit);
//! - on a GPU in mixed-size mode, one multi-allocatable device whose `framebuffer` capacity is
//!   consumed per vGPU instead;
//! - one device per MIG placement (slice count, memory size, start slot) of MIG-backed profiles,
//!   consuming its memory slices and its framebuffer.
//!
//! An mdev parent that is not a function of a PCI GPU (a *virtual parent*: the kernel's sample
//! display driver `mbochs`, or any other driver whose parent sits under `/sys/devices/virtual`)
//! becomes its own counter set, `mdev-<label>` with its pool's `framebuffer` (names in
//! [`super::device_name`]), when it offers display types: `vfio-pci` types whose description
//! states their video memory (`N MB video memory`, as mbochs writes it, or NVIDIA's
//! `framebuffer=`). Only those qualify, for two reasons: a type that states no memory cannot be
//! counted against the pool, so the scheduler could hand out more than the parent holds (mdpy's
//! displays state a resolution only); and a type that is not a display is not a GPU for a VM
//! (mtty's serial ports also answer `device_api` `vfio-pci`, so that alone does not tell). The
//! parent's devices carry `virtualParent: true` and `mdevParent` (its name), so a selector can
//! keep them apart from vGPUs of real GPUs. Such a parent mixes sizes freely (no same-size rule):
//! under 1.36.2 and later it gets one multi-allocatable `vgpu-mdev-<label>-mixed` device whose
//! `framebuffer` capacity is consumed per vGPU; before, one device per vGPU of its largest type
//! (`vgpu-mdev-<label>-<MiB>mi-<n>`, each consuming its size), since those schedulers count plain
//! devices only and gpuslice's rules keep one size per counter set there.
//!
//! A profile is chosen at prepare time from the claim's opaque configuration, among the profiles
//! of the allocated device (its `profile_<NAME>` attributes).
//!
//! Capacity already taken outside Kubernetes (vGPUs or a passed-through GPU that the DRA node side
//! did not create) is left out; what `gpuslice dra prepare` created is not, because the scheduler
//! already counts it through its claims.

use std::collections::{BTreeMap, BTreeSet};

use crate::error::{IntegrationError, Result, fail};
use gpu_core::{
    Gpu, GpuState, HealthState, MigGeometry, MigOccupancy, NodeTopology, Parent, ParentId,
    PciAddress, Pool, Profile, nvidia,
};
use serde::{Deserialize, Serialize};

use super::device_name::{
    VirtualDeviceName, counter_set_name, gpu_device_name, mig_device_name, mixed_device_name,
    parent_label, vgpu_device_name, vgpu_instance_device_name, virtual_counter_set_name,
};
use super::model::*;
use super::names::{is_dns_subdomain, mib_quantity, profile_attribute};
use super::version::*;

/// What `gpuslice dra prepare` created on a node, which the export must not subtract.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Prepared {
    /// mdev UUIDs and vendor-VFIO VF addresses of prepared vGPUs.
    #[serde(default)]
    pub instances: BTreeSet<String>,
    /// Whole GPUs handed out by prepare.
    #[serde(default)]
    pub gpus: BTreeSet<PciAddress>,
}

/// Options of an export.
#[derive(Debug, Clone)]
pub struct DraOptions {
    /// The driver name (a DNS subdomain).
    pub driver: String,
    /// The Kubernetes version the objects are for.
    pub version: K8sVersion,
    /// `pool.generation`.
    pub generation: i64,
    /// What prepare created, per node name.
    pub prepared: BTreeMap<String, Prepared>,
    /// The vGPU profile the operator chose per GPU (`--size-for GPU=PROFILE`): under the
    /// one-size-per-instance encoding (before Kubernetes 1.36.2) an unlocked GPU offers that
    /// profile's size only (a MIG-backed profile: MIG placements only).
    pub size_for: BTreeMap<PciAddress, String>,
}

impl Default for DraOptions {
    fn default() -> Self {
        DraOptions {
            driver: DEFAULT_DRIVER.to_owned(),
            version: K8sVersion::default(),
            generation: 1,
            prepared: BTreeMap::new(),
            size_for: BTreeMap::new(),
        }
    }
}

/// One node's slices and what was left out, with why.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeSlices {
    /// The slices of the node's pool.
    pub slices: Vec<ResourceSlice>,
    /// Devices or profiles not published, with the reason.
    pub warnings: Vec<String>,
}

/// Where a MIG-backed vGPU of `slices` compute slices and `framebuffer_mib` can start on a GPU of
/// PCI device ID `device_id` with `total` slices, and how many memory slices it holds from there.
/// From gpu-core's per-product table ([`MigGeometry`]) where the product is in it (an H200 3g
/// instance starts at 0 or 4 and holds 4 of the 8 memory slices); otherwise starts aligned to the
/// next power of two, holding one memory slice per compute slice.
pub fn mig_spans(device_id: u16, slices: u8, framebuffer_mib: u64, total: u8) -> Vec<(u8, u8)> {
    match MigGeometry::for_device(device_id) {
        Some(g) => g
            .profile_for(slices, framebuffer_mib)
            .map(|p| {
                p.starts
                    .iter()
                    .map(|s| (*s, p.memory_slices))
                    .filter(|(s, len)| s + len <= g.memory_slices)
                    .collect()
            })
            .unwrap_or_default(),
        None => mig_placements(slices, total)
            .into_iter()
            .map(|s| (s, slices))
            .collect(),
    }
}

/// The memory slots held by a GPU's existing MIG instances when its pool knows the start of
/// every one of them ([`gpu_core::MigSlots::known_occupancy`], from NVML) and they account for all
/// `foreign_slices` compute slices of the MIG-backed vGPUs seen on it; `None` otherwise.
fn exactly_placed(pool: &Pool, foreign_slices: u32) -> Option<MigOccupancy> {
    let (held, slices) = pool.mig_slots.as_ref()?.known_occupancy()?;
    (slices == foreign_slices).then_some(held)
}

/// The memory-slice counters of a GPU of PCI device ID `device_id` with `total` MIG slices: the
/// table's memory slices where the product is in it, else one per compute slice.
pub fn mig_memory_slices(device_id: u16, total: u8) -> u8 {
    MigGeometry::for_device(device_id).map_or(total, |g| g.memory_slices)
}

/// Start slots of a MIG profile of `slices` on a GPU of `total` slices that gpu-core's table does
/// not describe: aligned to the next power of two.
pub fn mig_placements(slices: u8, total: u8) -> Vec<u8> {
    if slices == 0 || slices > total {
        return vec![];
    }
    let align = slices.next_power_of_two();
    (0..total)
        .step_by(usize::from(align))
        .filter(|s| s + slices <= total)
        .collect()
}

/// A profile with its sizes resolved from the model or, failing that, from its NVIDIA name.
#[derive(Debug, Clone)]
struct Resolved<'a> {
    profile: &'a Profile,
    framebuffer_mib: Option<u64>,
    mig_slices: Option<u8>,
}

fn resolve(p: &Profile) -> Resolved<'_> {
    let parsed = nvidia::VgpuTypeName::parse(&p.name).ok();
    Resolved {
        profile: p,
        framebuffer_mib: p
            .framebuffer_mib
            .or_else(|| parsed.as_ref().map(|n| n.framebuffer_mib())),
        mig_slices: p
            .mig_slices
            .or_else(|| parsed.as_ref().and_then(|n| n.mig_slices)),
    }
}

fn str_attr(v: &str) -> DeviceAttribute {
    let mut s = v.trim().to_owned();
    if s.len() > MAX_STRING_ATTRIBUTE {
        let mut cut = MAX_STRING_ATTRIBUTE;
        while !s.is_char_boundary(cut) {
            cut -= 1;
        }
        s.truncate(cut);
    }
    DeviceAttribute::String(s)
}

fn int_attr(v: u64) -> DeviceAttribute {
    DeviceAttribute::Int(i64::try_from(v).unwrap_or(i64::MAX))
}

fn counters(pairs: impl IntoIterator<Item = (String, String)>) -> BTreeMap<String, Counter> {
    pairs
        .into_iter()
        .map(|(k, value)| (k, Counter { value }))
        .collect()
}

/// The devices and counter set of one GPU.
#[derive(Debug, Clone, Default)]
struct GpuPlan {
    counter_set: Option<CounterSet>,
    devices: Vec<Device>,
}

impl GpuPlan {
    fn counter_count(&self) -> usize {
        self.counter_set.as_ref().map_or(0, |c| c.counters.len())
    }
    fn consumed_count(&self) -> usize {
        self.devices.iter().map(consumed_counters).sum()
    }
}

fn consumed_counters(d: &Device) -> usize {
    d.consumes_counters.iter().map(|c| c.counters.len()).sum()
}

fn limited(d: &Device) -> bool {
    !d.consumes_counters.is_empty() || !d.taints.is_empty()
}

/// Time-sliced profiles by framebuffer size.
type BySize<'p> = BTreeMap<u64, Vec<&'p Resolved<'p>>>;
/// MIG-backed profiles by slices and framebuffer size.
type MigGroups<'p> = BTreeMap<(u8, u64), Vec<&'p Resolved<'p>>>;

/// What a GPU's parents hold that `dra prepare` did not make.
#[derive(Debug, Clone, Default)]
struct Foreign {
    /// Framebuffer they take.
    mib: u64,
    /// Sizes of their time-sliced vGPUs.
    sizes: BTreeSet<u64>,
    /// Compute slices of their MIG-backed vGPUs.
    mig: u32,
    /// How many.
    count: u32,
    /// One of unknown size exists.
    unknown: bool,
    /// A vGPU `dra prepare` made is on the GPU.
    prepared_here: bool,
    /// Parents holding none of them.
    free_parents: u32,
}

/// The facts of one GPU that its devices are built from.
struct OneGpu<'a> {
    gpu: &'a Gpu,
    set_name: String,
    /// Framebuffer left for vGPUs after what is taken outside Kubernetes.
    remaining: u64,
    taints: Vec<DeviceTaint>,
    /// Attributes every vGPU device of the GPU carries.
    vgpu_attrs: BTreeMap<String, DeviceAttribute>,
    one_per_parent: bool,
    foreign: Foreign,
    mig_total: Option<u8>,
    held: MigOccupancy,
    /// The time-sliced size vGPUs made outside Kubernetes lock the GPU to.
    locked: Option<u64>,
    /// The time-sliced size any vGPU locks the GPU to, the ones `dra prepare` made included.
    locked_by_any: Option<u64>,
}

impl OneGpu<'_> {
    /// The GPU as warnings name it.
    fn who(&self) -> String {
        format!("{} ({})", self.gpu.name, self.gpu.address)
    }

    /// A consumption of the GPU's whole remaining framebuffer.
    fn whole_framebuffer(&self) -> Vec<DeviceCounterConsumption> {
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

struct Ctx<'a> {
    node: &'a NodeTopology,
    opts: &'a DraOptions,
    prepared: Prepared,
    warnings: Vec<String>,
}

impl Ctx<'_> {
    /// Attributes every device of `gpu` carries. Names without a domain are in the driver's.
    fn common_attributes(&self, gpu: &Gpu, kind: &str) -> BTreeMap<String, DeviceAttribute> {
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

    fn taints(&self, gpu: &Gpu) -> Vec<DeviceTaint> {
        self.taints_for(gpu.health.state)
    }

    fn taints_for(&self, state: HealthState) -> Vec<DeviceTaint> {
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
    fn plan_gpu(&mut self, gpu: &Gpu) -> GpuPlan {
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
        g.vgpu_attrs = self.common_attributes(gpu, "vgpu");
        g.vgpu_attrs
            .insert("gpuPciBusID".into(), str_attr(&addr.to_string()));
        if let Some(fw) = gpu.vgpu_framework.or(parents.first().map(|p| p.framework)) {
            g.vgpu_attrs
                .insert("framework".into(), str_attr(fw.as_str()));
        }

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

    /// A GPU's profiles by kind: time-sliced by framebuffer size, MIG-backed by slices and size.
    fn profiles_by_kind<'p>(
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
    fn time_sliced_devices(
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
    fn foreign_use(&self, parents: &[&Parent], profiles: &BTreeMap<&str, Resolved<'_>>) -> Foreign {
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
    fn unknown_memory_plan(
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
    fn whole_gpu_device(
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

    /// The attributes of a vGPU device of `size` (and `more`) that can become any profile of
    /// `group` (the profiles last: they are what is left out when a device has too many).
    fn size_attributes(
        &mut self,
        g: &OneGpu<'_>,
        size: u64,
        more: &[(&str, u64)],
        group: &[&Resolved<'_>],
    ) -> BTreeMap<String, DeviceAttribute> {
        let mut attributes = g.vgpu_attrs.clone();
        attributes.insert("framebufferMiB".into(), int_attr(size));
        for (k, v) in more {
            attributes.insert((*k).to_owned(), int_attr(*v));
        }
        self.add_profile_attributes(&g.who(), &mut attributes, group.iter().copied());
        attributes
    }

    /// How many vGPUs of `size` fit what is left, the profiles' instance limit and the free
    /// parents.
    fn count_of(g: &OneGpu<'_>, size: u64, group: &[&Resolved<'_>]) -> u64 {
        let mut count = g.remaining / size;
        if let Some(max) = group.iter().filter_map(|r| r.profile.max_instances).max() {
            count = count.min(u64::from(max.saturating_sub(g.foreign.count)));
        }
        if g.one_per_parent {
            count = count.min(u64::from(g.foreign.free_parents));
        }
        count
    }

    /// The size-lock encoding (1.36.2+): per size one multi-allocatable device whose `instances`
    /// capacity is taken one at a time, consuming the whole `framebuffer` counter, so the first
    /// vGPU locks the card to its size.
    fn size_lock_devices(
        &mut self,
        g: &OneGpu<'_>,
        by_size: &BTreeMap<u64, Vec<&Resolved<'_>>>,
    ) -> Vec<Device> {
        let mut out = vec![];
        for (size, group) in by_size {
            if g.locked.is_some_and(|l| l != *size) {
                continue;
            }
            let count = Self::count_of(g, *size, group);
            if count == 0 {
                continue;
            }
            let attributes = self.size_attributes(g, *size, &[], group);
            let mut capacity = BTreeMap::new();
            capacity.insert(
                "instances".to_owned(),
                DeviceCapacity {
                    value: count.to_string(),
                    request_policy: Some(CapacityRequestPolicy {
                        default: Some("1".into()),
                        valid_values: vec!["1".into()],
                        valid_range: None,
                    }),
                },
            );
            out.push(Device {
                name: vgpu_device_name(&g.gpu.address, *size),
                attributes,
                capacity,
                consumes_counters: g.whole_framebuffer(),
                allow_multiple_allocations: Some(true),
                taints: g.taints.clone(),
            });
        }
        out
    }

    /// A mixed-size GPU (size-lock encoding): one multi-allocatable device whose `framebuffer`
    /// capacity is consumed per vGPU.
    fn mixed_device(
        &mut self,
        g: &OneGpu<'_>,
        by_size: &BTreeMap<u64, Vec<&Resolved<'_>>>,
    ) -> Option<Device> {
        let capacity = mixed_framebuffer(by_size.keys().copied(), g.remaining)?;
        let mut attributes = g.vgpu_attrs.clone();
        attributes.insert("mixedSize".into(), DeviceAttribute::Bool(true));
        self.add_profile_attributes(
            &g.who(),
            &mut attributes,
            by_size.values().flatten().copied(),
        );
        Some(Device {
            name: mixed_device_name(&g.gpu.address),
            attributes,
            capacity,
            consumes_counters: g.whole_framebuffer(),
            allow_multiple_allocations: Some(true),
            taints: g.taints.clone(),
        })
    }

    /// The one time-sliced size a GPU offers under the one-size-per-instance encoding: the size
    /// it is locked to, else the operator's choice ([`DraOptions::size_for`]), else its only
    /// size. `None` (with a warning) when no size is known, or the choice is MIG-backed.
    fn chosen_size(
        &mut self,
        g: &OneGpu<'_>,
        by_size: &BTreeMap<u64, Vec<&Resolved<'_>>>,
        mig_groups: &BTreeMap<(u8, u64), Vec<&Resolved<'_>>>,
    ) -> Option<u64> {
        let addr = g.gpu.address;
        let who = format!("{} ({addr})", g.gpu.name);
        let choice = self.opts.size_for.get(&addr);
        let chosen = choice.map(|name| {
            let named = |r: &&Resolved<'_>| nvidia::names_match(&r.profile.name, name);
            match (
                by_size
                    .iter()
                    .find(|(_, group)| group.iter().any(named))
                    .map(|(s, _)| *s),
                mig_groups.values().flatten().any(named),
            ) {
                (Some(s), _) => Ok(Some(s)),
                (None, true) => Ok(None),
                (None, false) => Err(name),
            }
        });
        match (g.locked_by_any, chosen) {
            (Some(l), Some(Ok(Some(c)))) if c != l => {
                self.warnings.push(format!(
                    "{who}: --size-for asks for {} MiB vGPUs, but the GPU holds {l} MiB vGPUs: \
                     publishing {l} MiB",
                    c
                ));
                Some(l)
            }
            (Some(l), _) => Some(l),
            (None, Some(Ok(size))) => size,
            (None, Some(Err(name))) => {
                self.warnings.push(format!(
                    "{who}: time-sliced vGPUs not published, it offers no profile {name} \
                     (--size-for)"
                ));
                None
            }
            (None, None) if by_size.len() == 1 && mig_groups.is_empty() => {
                by_size.keys().next().copied()
            }
            (None, None) => {
                self.warnings.push(format!(
                    "{who}: time-sliced vGPUs not published: Kubernetes {} can give one GPU vGPUs \
                     of several sizes or kinds, so gpuslice publishes one size per GPU; choose it \
                     with --size-for {addr}=PROFILE (it offers {}{})",
                    self.opts.version,
                    by_size
                        .keys()
                        .map(|s| format!("{s} MiB"))
                        .collect::<Vec<_>>()
                        .join(", "),
                    if mig_groups.is_empty() {
                        ""
                    } else {
                        " and MIG-backed profiles"
                    }
                ));
                None
            }
        }
    }

    /// The one-size-per-instance encoding (before 1.36.2): one device per vGPU of the GPU's one
    /// size, each consuming its share of the `framebuffer` counter (not multi-allocatable, so
    /// every scheduler counts it); the whole GPU consumes all of it. `beside`: devices already in
    /// the GPU's plan (1.34 keeps a GPU's devices in one slice).
    fn per_instance_devices(
        &mut self,
        g: &OneGpu<'_>,
        size: u64,
        group: &[&Resolved<'_>],
        beside: usize,
    ) -> Vec<Device> {
        let mut count = Self::count_of(g, size, group);
        if !self.opts.version.splits_counters() {
            let room = MAX_DEVICES_WITH_COUNTERS.saturating_sub(beside) as u64;
            if count > room {
                self.warnings.push(format!(
                    "{} ({}): {count} vGPUs of {size} MiB fit, {room} published: one \
                     ResourceSlice holds {MAX_DEVICES_WITH_COUNTERS} devices under Kubernetes 1.34",
                    g.gpu.name, g.gpu.address
                ));
                count = room;
            }
        }
        let attributes = self.size_attributes(g, size, &[], group);
        (0..u32::try_from(count).unwrap_or(u32::MAX))
            .map(|n| Device {
                name: vgpu_instance_device_name(&g.gpu.address, size, n),
                attributes: attributes.clone(),
                capacity: BTreeMap::new(),
                consumes_counters: vec![DeviceCounterConsumption {
                    counter_set: g.set_name.clone(),
                    counters: counters([("framebuffer".to_owned(), mib_quantity(size))]),
                }],
                allow_multiple_allocations: None,
                taints: g.taints.clone(),
            })
            .collect()
    }

    /// One device per MIG placement (slice count, memory size, start slot), consuming its
    /// memory slices and its framebuffer.
    fn mig_devices(
        &mut self,
        g: &OneGpu<'_>,
        mig_groups: &BTreeMap<(u8, u64), Vec<&Resolved<'_>>>,
    ) -> Vec<Device> {
        let addr = g.gpu.address;
        let mut out = vec![];
        let n = match (g.mig_total, g.foreign.mib > 0 && g.foreign.mig == 0) {
            (_, true) => return out, // time-sliced vGPUs exist: MIG-backed ones cannot join them
            (None, _) => {
                self.warnings.push(format!(
                    "{} ({addr}): MIG-backed profiles not published: {}",
                    g.gpu.name,
                    if g.foreign.mig > 0 {
                        "MIG-backed vGPUs created outside Kubernetes hold slices at unknown positions"
                    } else {
                        "the GPU's MIG slice count is unknown"
                    }
                ));
                return out;
            }
            (Some(n), false) => n,
        };
        for ((slices, size), group) in mig_groups {
            if *size > g.remaining {
                continue;
            }
            for (start, span) in mig_spans(g.gpu.device_id.0, *slices, *size, n)
                .into_iter()
                .filter(|(start, span)| (*start..start + span).all(|i| !g.held.is_held(i)))
            {
                let mig = [
                    ("migSlices", u64::from(*slices)),
                    ("migStartSlice", u64::from(start)),
                ];
                let attributes = self.size_attributes(g, *size, &mig, group);
                let mut used = vec![("framebuffer".to_owned(), mib_quantity(*size))];
                for i in start..start + span {
                    used.push((format!("memory-slice-{i}"), "1".to_owned()));
                }
                out.push(Device {
                    name: mig_device_name(&addr, *slices, *size, start),
                    attributes,
                    capacity: BTreeMap::new(),
                    consumes_counters: vec![DeviceCounterConsumption {
                        counter_set: g.set_name.clone(),
                        counters: counters(used),
                    }],
                    allow_multiple_allocations: None,
                    taints: g.taints.clone(),
                });
            }
        }
        out
    }

    fn whole_gpu_free(&self, gpu: &Gpu, foreign_count: u32, prepared_here: bool) -> bool {
        if foreign_count > 0 {
            return false;
        }
        match gpu.state {
            GpuState::Free => true,
            GpuState::InUse => prepared_here || self.prepared.gpus.contains(&gpu.address),
            GpuState::Blocked => false,
        }
    }

    fn whole_gpu_attributes(&self, gpu: &Gpu, a: &mut BTreeMap<String, DeviceAttribute>) {
        a.insert(PCI_BUS_ID.to_owned(), str_attr(&gpu.address.to_string()));
        if let Some(g) = gpu.iommu_group {
            a.insert("iommuGroup".into(), int_attr(u64::from(g)));
        }
        if let Some(m) = gpu.memory_mib {
            a.insert("memoryMiB".into(), int_attr(m));
        }
    }

    /// `who`: the GPU (`name (address)`) or virtual parent, for the warnings.
    fn add_profile_attributes<'p>(
        &mut self,
        who: &str,
        a: &mut BTreeMap<String, DeviceAttribute>,
        group: impl Iterator<Item = &'p Resolved<'p>>,
    ) {
        for r in group {
            match profile_attribute(&r.profile.name) {
                Some(name) if a.len() < MAX_ATTRIBUTES - 1 => {
                    a.insert(name, DeviceAttribute::Bool(true));
                }
                Some(_) => self.warnings.push(format!(
                    "{who}: profile {} not listed, the device already has {MAX_ATTRIBUTES} attributes",
                    r.profile.name
                )),
                None => self.warnings.push(format!(
                    "{who}: profile {} not listed, its name is too long for an attribute",
                    r.profile.name
                )),
            }
        }
    }
}

/// The `framebuffer` capacity of a mixed-size device with `remaining` MiB free: taken per vGPU
/// in one of the `sizes` (ascending) that still fit: listed when ten or fewer, else as a range in
/// steps of the smallest. `None` when no size fits.
fn mixed_framebuffer(
    sizes: impl Iterator<Item = u64>,
    remaining: u64,
) -> Option<BTreeMap<String, DeviceCapacity>> {
    let sizes: Vec<u64> = sizes.filter(|s| *s <= remaining).collect();
    let &smallest = sizes.first()?;
    let policy = if sizes.len() <= 10 {
        CapacityRequestPolicy {
            default: Some(mib_quantity(smallest)),
            valid_values: sizes.iter().map(|s| mib_quantity(*s)).collect(),
            valid_range: None,
        }
    } else {
        CapacityRequestPolicy {
            default: Some(mib_quantity(smallest)),
            valid_values: vec![],
            valid_range: Some(CapacityRequestPolicyRange {
                min: mib_quantity(smallest),
                max: Some(mib_quantity(remaining - remaining % smallest)),
                step: Some(mib_quantity(smallest)),
            }),
        }
    };
    let mut capacity = BTreeMap::new();
    capacity.insert(
        "framebuffer".to_owned(),
        DeviceCapacity {
            value: mib_quantity(remaining),
            request_policy: Some(policy),
        },
    );
    Some(capacity)
}

/// The display types of a virtual parent by framebuffer size (see the module doc).
type DisplayTypes<'p> = BTreeMap<u64, Vec<Resolved<'p>>>;

impl Ctx<'_> {
    /// The counter set and devices of a virtual mdev parent (`name`), or `None` (with a warning
    /// where it offers `vfio-pci` types) when it does not qualify: see the module doc.
    fn plan_virtual(&mut self, name: &str, parent: &Parent) -> Option<GpuPlan> {
        let who = format!("mdev parent {name}");
        let mut sizes: DisplayTypes<'_> = BTreeMap::new();
        let mut unsized_types = 0;
        for p in parent
            .profiles
            .iter()
            .filter(|p| p.device_api == "vfio-pci")
        {
            let r = resolve(p);
            match (r.framebuffer_mib, r.mig_slices) {
                (Some(fb), None) if fb > 0 => sizes.entry(fb).or_default().push(r),
                _ => unsized_types += 1,
            }
        }
        if parent.framework != gpu_core::VgpuFramework::Mdev || sizes.is_empty() {
            if unsized_types > 0 {
                self.warnings.push(format!(
                    "{who} not published: its types state no video memory, so they are not \
                     counted as display vGPUs (only a virtual parent's display types that state \
                     their memory are)"
                ));
            }
            return None;
        }
        let Some(total) = self
            .node
            .pool(&parent.id)
            .map(|p| p.total_mib)
            .filter(|m| *m > 0)
        else {
            self.warnings
                .push(format!("{who} not published: its pool's size is unknown"));
            return None;
        };
        // What is taken outside Kubernetes: instances `dra prepare` did not make.
        let mut foreign_mib = 0u64;
        let mut unknown = false;
        for inst in &parent.instances {
            if inst
                .uuid
                .is_some_and(|u| self.prepared.instances.contains(&u.to_string()))
            {
                continue;
            }
            let fb = inst.framebuffer_mib.or_else(|| {
                parent
                    .profiles
                    .iter()
                    .find(|p| p.id == inst.profile)
                    .and_then(|p| resolve(p).framebuffer_mib)
            });
            match fb {
                Some(fb) => foreign_mib = foreign_mib.saturating_add(fb),
                None => unknown = true,
            }
        }
        let remaining = total.saturating_sub(foreign_mib);
        let label = parent_label(name);
        let set_name = virtual_counter_set_name(name);
        let mut plan = GpuPlan {
            counter_set: Some(CounterSet {
                name: set_name.clone(),
                counters: counters([("framebuffer".to_owned(), mib_quantity(remaining))]),
            }),
            devices: vec![],
        };
        if unknown {
            self.warnings.push(format!(
                "{who}: vGPUs not published, an instance of unknown size holds part of it"
            ));
            return Some(plan);
        }
        let mut attrs = BTreeMap::new();
        attrs.insert("type".to_owned(), str_attr("vgpu"));
        attrs.insert("framework".to_owned(), str_attr(parent.framework.as_str()));
        attrs.insert("mdevParent".to_owned(), str_attr(name));
        attrs.insert("virtualParent".to_owned(), DeviceAttribute::Bool(true));
        attrs.insert("health".to_owned(), str_attr(parent.health.state.as_str()));
        let taints = self.taints_for(parent.health.state);
        if self.opts.version.encoding() == Encoding::SizeLock {
            let Some(capacity) = mixed_framebuffer(sizes.keys().copied(), remaining) else {
                return Some(plan);
            };
            let mut attributes = attrs;
            attributes.insert("mixedSize".into(), DeviceAttribute::Bool(true));
            self.add_profile_attributes(&who, &mut attributes, sizes.values().flatten());
            plan.devices.push(Device {
                name: VirtualDeviceName::Mixed { label }.to_string(),
                attributes,
                capacity,
                consumes_counters: vec![DeviceCounterConsumption {
                    counter_set: set_name,
                    counters: counters([("framebuffer".to_owned(), mib_quantity(remaining))]),
                }],
                allow_multiple_allocations: Some(true),
                taints,
            });
            return Some(plan);
        }
        // Before 1.36.2: one device per vGPU of the largest type.
        let Some((&size, group)) = sizes.iter().next_back() else {
            return Some(plan);
        };
        let mut count = remaining / size;
        if let Some(max) = group.iter().filter_map(|r| r.profile.max_instances).max() {
            count = count.min(u64::from(max));
        }
        if !self.opts.version.splits_counters() && count > MAX_DEVICES_WITH_COUNTERS as u64 {
            self.warnings.push(format!(
                "{who}: {count} vGPUs of {size} MiB fit, {MAX_DEVICES_WITH_COUNTERS} published: one \
                 ResourceSlice holds {MAX_DEVICES_WITH_COUNTERS} devices under Kubernetes 1.34"
            ));
            count = MAX_DEVICES_WITH_COUNTERS as u64;
        }
        let mut attributes = attrs;
        attributes.insert("framebufferMiB".into(), int_attr(size));
        self.add_profile_attributes(&who, &mut attributes, group.iter());
        for n in 0..u32::try_from(count).unwrap_or(u32::MAX) {
            plan.devices.push(Device {
                name: VirtualDeviceName::Instance {
                    label: label.clone(),
                    size_mib: size,
                    n,
                }
                .to_string(),
                attributes: attributes.clone(),
                capacity: BTreeMap::new(),
                consumes_counters: vec![DeviceCounterConsumption {
                    counter_set: set_name.clone(),
                    counters: counters([("framebuffer".to_owned(), mib_quantity(size))]),
                }],
                allow_multiple_allocations: None,
                taints: taints.clone(),
            });
        }
        Some(plan)
    }
}

/// A slice being filled.
#[derive(Debug, Default)]
struct Draft {
    sets: Vec<CounterSet>,
    devices: Vec<Device>,
}

impl Draft {
    fn counters(&self) -> usize {
        self.sets.iter().map(|s| s.counters.len()).sum()
    }
    fn device_limit(&self, more: &[Device]) -> usize {
        if self.devices.iter().chain(more).any(limited) {
            MAX_DEVICES_WITH_COUNTERS
        } else {
            MAX_DEVICES
        }
    }
    fn consumed(&self) -> usize {
        self.devices.iter().map(consumed_counters).sum()
    }
    fn is_empty(&self) -> bool {
        self.sets.is_empty() && self.devices.is_empty()
    }
}

/// The slices of one node.
///
/// # Errors
/// When the node name is not a DNS subdomain, or one GPU's devices cannot fit one slice under
/// Kubernetes 1.34's rules (its devices must sit with its counter set).
pub fn node_slices(node: &NodeTopology, opts: &DraOptions) -> Result<NodeSlices> {
    if !is_dns_subdomain(&node.node) {
        fail!(
            Invalid, node.node;
            "node name {:?} is not a Kubernetes node name (a lowercase DNS subdomain)",
            node.node
        );
    }
    if !is_dns_subdomain(&opts.driver) {
        fail!(
            Invalid, opts.driver;
            "driver name {:?} is not a lowercase DNS subdomain such as gpu.example.com",
            opts.driver
        );
    }
    let mut ctx = Ctx {
        node,
        opts,
        prepared: opts.prepared.get(&node.node).cloned().unwrap_or_default(),
        warnings: vec![],
    };
    let mut gpus: Vec<&Gpu> = node.gpus.iter().collect();
    gpus.sort_by_key(|g| g.address);
    let mut plans: Vec<(String, GpuPlan)> = gpus
        .iter()
        .map(|g| (format!("{} ({})", g.name, g.address), ctx.plan_gpu(g)))
        .collect();
    let mut virtual_parents: Vec<(&str, &Parent)> = node
        .mediated_devices
        .parents
        .iter()
        .filter(|p| p.gpu.is_none())
        .filter_map(|p| match &p.id {
            ParentId::Named(n) => Some((n.as_str(), p)),
            ParentId::Pci(_) => None,
        })
        .collect();
    virtual_parents.sort_by_key(|(n, _)| *n);
    plans.extend(
        virtual_parents
            .into_iter()
            .filter_map(|(n, p)| Some((format!("mdev parent {n}"), ctx.plan_virtual(n, p)?))),
    );

    let mut drafts: Vec<Draft> = Vec::new();
    if opts.version.splits_counters() {
        let sets: Vec<CounterSet> = plans
            .iter()
            .filter_map(|(_, p)| p.counter_set.clone())
            .collect();
        for chunk in sets.chunks(MAX_COUNTER_SETS) {
            drafts.push(Draft {
                sets: chunk.to_vec(),
                devices: vec![],
            });
        }
        let mut current = Draft::default();
        for d in plans.into_iter().flat_map(|(_, p)| p.devices) {
            if current.devices.len() + 1 > current.device_limit(std::slice::from_ref(&d)) {
                drafts.push(std::mem::take(&mut current));
            }
            current.devices.push(d);
        }
        if !current.is_empty() {
            drafts.push(current);
        }
    } else {
        let mut current = Draft::default();
        for (who, plan) in plans {
            let fits = |d: &Draft| {
                d.sets.len() + usize::from(plan.counter_set.is_some()) <= MAX_COUNTER_SETS
                    && d.counters() + plan.counter_count() <= MAX_COUNTERS
                    && d.devices.len() + plan.devices.len() <= d.device_limit(&plan.devices)
                    && d.consumed() + plan.consumed_count() <= MAX_CONSUMED_COUNTERS_PER_SLICE
            };
            if !fits(&current) {
                if !fits(&Draft::default()) {
                    fail!(
                        Refused, who;
                        "{who} has {} devices and {} counters, more than one ResourceSlice holds under Kubernetes 1.34; use --k8s-version 1.35 or later",
                        plan.devices.len(),
                        plan.counter_count()
                    );
                }
                drafts.push(std::mem::take(&mut current));
            }
            current.sets.extend(plan.counter_set);
            current.devices.extend(plan.devices);
        }
        if !current.is_empty() {
            drafts.push(current);
        }
    }
    if drafts.is_empty() {
        // An empty pool still tells the scheduler the node has been seen by the driver.
        drafts.push(Draft::default());
    }
    let count = i64::try_from(drafts.len()).map_err(|_| IntegrationError::Refused {
        what: ("slices").to_string(),
        why: "too many slices".to_owned(),
    })?;
    let slices = drafts
        .into_iter()
        .enumerate()
        .map(|(i, d)| ResourceSlice {
            api_version: API_VERSION.into(),
            kind: "ResourceSlice".into(),
            metadata: ObjectMeta {
                name: format!("{}-{}-{i}", node.node, opts.driver),
                labels: BTreeMap::new(),
            },
            spec: ResourceSliceSpec {
                driver: opts.driver.clone(),
                pool: ResourcePool {
                    name: node.node.clone(),
                    generation: opts.generation,
                    resource_slice_count: count,
                },
                node_name: Some(node.node.clone()),
                shared_counters: d.sets,
                devices: d.devices,
            },
        })
        .collect::<Vec<_>>();
    for s in &slices {
        if !is_dns_subdomain(&s.metadata.name) {
            fail!(
                Invalid, s.metadata.name;
                "slice name {:?} is longer than 253 characters; use a shorter driver name",
                s.metadata.name
            );
        }
    }
    Ok(NodeSlices {
        slices,
        warnings: ctx.warnings,
    })
}

/// The DeviceClasses `gpu` (whole GPUs) and `vgpu` (vGPUs of every kind) of `driver`.
pub fn device_classes(driver: &str) -> Vec<DeviceClass> {
    ["gpu", "vgpu"]
        .into_iter()
        .map(|kind| DeviceClass {
            api_version: API_VERSION.into(),
            kind: "DeviceClass".into(),
            metadata: ObjectMeta {
                name: kind.into(),
                labels: BTreeMap::new(),
            },
            spec: DeviceClassSpec {
                selectors: vec![DeviceSelector::cel(format!(
                    "device.driver == {driver:?} && device.attributes[{driver:?}].type == {kind:?}"
                ))],
            },
        })
        .collect()
}

/// Everything an export prints: the classes, then each node's slices.
#[derive(Debug, Clone, PartialEq)]
pub struct Export {
    /// DeviceClasses and ResourceSlices, in output order.
    pub objects: Vec<Object>,
    /// What was left out, `node: reason`.
    pub warnings: Vec<String>,
    /// How time-sliced vGPUs were published for the version.
    pub encoding: Encoding,
}

/// Exports `nodes` (in the given order).
///
/// # Errors
/// As [`node_slices`].
pub fn export(nodes: &[NodeTopology], opts: &DraOptions) -> Result<Export> {
    let mut objects: Vec<Object> = device_classes(&opts.driver)
        .into_iter()
        .map(Object::Class)
        .collect();
    let mut warnings = vec![];
    for n in nodes {
        let s = node_slices(n, opts).map_err(|e| e.context(format!("node {}", n.node)))?;
        objects.extend(s.slices.into_iter().map(Object::Slice));
        warnings.extend(s.warnings.into_iter().map(|w| format!("{}: {w}", n.node)));
    }
    let slices: Vec<ResourceSlice> = objects
        .iter()
        .filter_map(|o| match o {
            Object::Slice(s) => Some(s.clone()),
            _ => None,
        })
        .collect();
    let violations = super::rules::check(&slices, opts.version);
    if !violations.is_empty() {
        return Err(IntegrationError::RulesBroken {
            what: "slices",
            version: opts.version.to_string(),
            violations,
        });
    }
    Ok(Export {
        objects,
        warnings,
        encoding: opts.version.encoding(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mig_placements_follow_the_h100_geometry() {
        assert_eq!(mig_placements(1, 7), vec![0, 1, 2, 3, 4, 5, 6]);
        assert_eq!(mig_placements(2, 7), vec![0, 2, 4]);
        assert_eq!(mig_placements(3, 7), vec![0, 4]);
        assert_eq!(mig_placements(4, 7), vec![0]);
        assert_eq!(mig_placements(7, 7), vec![0]);
        assert_eq!(mig_placements(2, 4), vec![0, 2]);
        assert!(mig_placements(8, 7).is_empty());
    }

    #[test]
    fn mig_spans_come_from_the_geometry_table_where_the_product_is_in_it() {
        // H200 SXM: 8 memory slices; a 3g instance holds 4 of them, a 7g all 8.
        assert_eq!(mig_memory_slices(0x2335, 7), 8);
        assert_eq!(mig_spans(0x2335, 3, 71 * 1024, 7), vec![(0, 4), (4, 4)]);
        assert_eq!(mig_spans(0x2335, 7, 141 * 1024, 7), vec![(0, 8)]);
        assert_eq!(mig_spans(0x2335, 1, 18 * 1024, 7).len(), 7);
        assert!(
            mig_spans(0x2335, 5, 90 * 1024, 7).is_empty(),
            "no 5g profile"
        );
        // A product the table does not describe keeps the power-of-two rule.
        assert_eq!(mig_memory_slices(0xffff, 7), 7);
        assert_eq!(mig_spans(0xffff, 3, 20 * 1024, 7), vec![(0, 3), (4, 3)]);
    }

    #[test]
    fn versions_parse_with_or_without_patch() {
        assert_eq!("1.34".parse::<K8sVersion>().unwrap(), K8sVersion::V1_34);
        assert_eq!(
            "v1.36.2".parse::<K8sVersion>().unwrap(),
            K8sVersion::V1_36_2
        );
        assert_eq!(
            "1.36".parse::<K8sVersion>().unwrap(),
            "1.36.0".parse().unwrap()
        );
        assert_eq!(
            "1.36.2".parse::<K8sVersion>().unwrap().to_string(),
            "1.36.2"
        );
        assert_eq!(K8sVersion::V1_36.to_string(), "1.36");
        for bad in ["1.33", "1.36.", "1.36.x", "1.36.2.1", "2.36", "1.38.0"] {
            assert!(bad.parse::<K8sVersion>().is_err(), "{bad}");
        }
        assert!(K8sVersion::V1_35.splits_counters() && !K8sVersion::V1_34.splits_counters());
    }
}
