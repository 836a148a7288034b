//! Mixed-size GPUs with counters per placement slot: a GPU in mixed-size ("heterogeneous") mode
//! whose driver's placements are known ([`super::DraOptions::mixed_placements`], read from NVML's
//! `nvmlDeviceGetVgpuTypeSupportedPlacements` by the node) gets one counter per slot of its
//! placement lattice (`placement-slot-<i>`) in its counter set, and one device per free
//! placement of each size (`vgpu-<gpu>-<MiB>mi-<placementId>`), consuming its framebuffer and
//! the slots `[placementId, placementId + placementSize)`. Two devices whose runs overlap share
//! a counter, so the scheduler can never allocate both: a mix that does not fit the lattice is
//! never promised, in every Kubernetes version with counters (1.34 and later), the same way MIG
//! placements consume their memory slices.
//!
//! The lattice is the driver's: nothing here knows a board. Slots are grouped by the largest
//! unit that divides every published size and placement ID (exact, never a guess); where the
//! counters or devices still exceed the version's limits, the smallest sizes are left out
//! (named in a warning) until they fit. A vGPU made outside Kubernetes holds the slots of its
//! placement (`placementId`, as its VF reports it); one whose placement is unknown leaves the
//! GPU's time-sliced vGPUs unpublished rather than over-promised.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use super::Ctx;
use super::gpu::OneGpu;
use gpu_core::Parent;

use super::parts::{GpuPlan, Resolved, counters};
use crate::dra::device_name::vgpu_instance_device_name;
use crate::dra::model::*;
use crate::dra::names::mib_quantity;
use crate::dra::version::*;

/// The mixed-size placements of one vGPU type on a GPU, as its driver lists them
/// (`nvmlVgpuPlacementList_v2_t`: `placementSize` slots at each of `placementIds`).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TypePlacements {
    /// Slots one vGPU of the type holds.
    pub placement_size: u32,
    /// Where a vGPU of the type may start.
    pub placement_ids: Vec<u32>,
}

/// The placements of a GPU's vGPU types in mixed-size mode, by type ID (`1155`).
pub type GpuPlacements = BTreeMap<String, TypePlacements>;

/// The prefix of a slot counter's name.
pub const SLOT_COUNTER: &str = "placement-slot-";

/// One published shape: a framebuffer size with its placement size and IDs, and its profiles.
struct Shape<'p> {
    size_mib: u64,
    placement_size: u32,
    ids: Vec<u32>,
    group: Vec<&'p Resolved<'p>>,
}

fn gcd(a: u32, b: u32) -> u32 {
    if b == 0 { a } else { gcd(b, a % b) }
}

/// The lattice of `shapes`: the unit (slots per counter) and how many counters.
fn lattice(shapes: &[Shape<'_>]) -> (u32, u32) {
    let unit = shapes
        .iter()
        .flat_map(|s| s.ids.iter().copied().chain([s.placement_size]))
        .fold(0, gcd)
        .max(1);
    let width = shapes
        .iter()
        .flat_map(|s| s.ids.iter().map(|i| i.saturating_add(s.placement_size)))
        .max()
        .unwrap_or(0);
    (unit, width.div_ceil(unit))
}

impl Ctx<'_> {
    /// The plan of a mixed-size GPU whose placements are known: its counter set (`set` and a
    /// counter per slot), the whole GPU, and a device per free placement.
    pub(super) fn slot_plan(
        &mut self,
        mut g: OneGpu<'_>,
        total: u64,
        mut set: Vec<(String, String)>,
        placements: &GpuPlacements,
        parents: &[&Parent],
        profiles: &BTreeMap<&str, Resolved<'_>>,
    ) -> GpuPlan {
        let whole = self.whole_gpu_free(g.gpu, g.foreign.count, g.foreign.prepared_here);
        let mut devices = vec![];
        if g.remaining > 0 {
            g.vgpu_attrs = self.vgpu_attributes(g.gpu, parents);
            let (by_size, _) = self.profiles_by_kind(g.gpu, profiles);
            devices = self.slot_devices(&g, placements, &by_size, &mut set, usize::from(whole));
        }
        let mut plan = GpuPlan {
            counter_set: Some(CounterSet {
                name: g.set_name.clone(),
                counters: counters(set.clone()),
            }),
            devices: vec![],
        };
        if whole {
            plan.devices
                .push(self.whole_gpu_device(&g, total, counters(set)));
        }
        plan.devices.extend(devices);
        plan
    }

    /// The slot counters and devices of a mixed-size GPU whose placements are known; `None` when
    /// the GPU has none (the framebuffer encodings apply). Pushes the slot counters to `set`.
    pub(super) fn slot_devices(
        &mut self,
        g: &OneGpu<'_>,
        placements: &GpuPlacements,
        by_size: &BTreeMap<u64, Vec<&Resolved<'_>>>,
        set: &mut Vec<(String, String)>,
        beside: usize,
    ) -> Vec<Device> {
        let who = g.who();
        // Slots held by vGPUs made outside Kubernetes (prepared ones are counted by claims).
        let mut held: Vec<(u32, u32)> = Vec::new();
        let gpu = g.gpu.address;
        let node = self.node;
        let foreign = node
            .mediated_devices
            .parents
            .iter()
            .filter(|p| p.gpu == Some(gpu))
            .flat_map(|p| p.instances.iter())
            .filter(|i| !self.prepared.instances.contains(&instance_key(i)));
        let foreign: Vec<&gpu_core::Instance> = foreign.collect();
        for inst in foreign {
            let run = placements.get(inst.profile.as_str());
            match (inst.placement_id, run) {
                (Some(id), Some(t)) => held.push((id, t.placement_size)),
                _ => {
                    self.warnings.push(format!(
                        "{who}: time-sliced vGPUs not published: the placement of vGPU {} ({}) is \
                         unknown, so the free slots are not known",
                        inst.address.map(|a| a.to_string()).unwrap_or_default(),
                        inst.profile_name
                            .as_deref()
                            .unwrap_or(inst.profile.as_str())
                    ));
                    return vec![];
                }
            }
        }
        // One shape per (framebuffer, placement size, IDs), its profiles together.
        let mut shapes: Vec<Shape<'_>> = Vec::new();
        for (size, group) in by_size {
            for r in group {
                let Some(t) = placements.get(r.profile.id.as_str()) else {
                    continue;
                };
                if t.placement_size == 0 || t.placement_ids.is_empty() {
                    continue;
                }
                match shapes.iter_mut().find(|s| {
                    s.size_mib == *size
                        && s.placement_size == t.placement_size
                        && s.ids == t.placement_ids
                }) {
                    Some(s) => s.group.push(r),
                    None => shapes.push(Shape {
                        size_mib: *size,
                        placement_size: t.placement_size,
                        ids: t.placement_ids.clone(),
                        group: vec![r],
                    }),
                }
            }
        }
        shapes.sort_by_key(|s| std::cmp::Reverse(s.size_mib));
        // Devices and counters they would consume: (devices, consumed counters).
        let demand = |shapes: &[Shape<'_>], unit: u32| -> (usize, usize) {
            let held_units = held_units(&held, unit);
            let mut out = (0, 0);
            for s in shapes.iter().filter(|s| s.size_mib <= g.remaining) {
                for id in &s.ids {
                    if units(*id, s.placement_size, unit).all(|u| !held_units.contains(&u)) {
                        out.0 += 1;
                        out.1 += 1 + units(*id, s.placement_size, unit).count();
                    }
                }
            }
            out
        };
        let mut dropped: Vec<String> = Vec::new();
        loop {
            if shapes.is_empty() {
                break;
            }
            let (unit, n) = lattice(&shapes);
            let counters_fit = n as usize + set.len() <= MAX_COUNTERS;
            let (devices, consumed) = demand(&shapes, unit);
            // 1.34 keeps a GPU's devices in one slice with its counter set.
            let devices_fit = self.opts.version.splits_counters()
                || (beside + devices <= MAX_DEVICES_WITH_COUNTERS
                    && consumed + beside * (set.len() + n as usize)
                        <= MAX_CONSUMED_COUNTERS_PER_SLICE);
            if counters_fit && devices_fit {
                break;
            }
            if let Some(s) = shapes.pop() {
                dropped.extend(s.group.iter().map(|r| r.profile.name.clone()));
            }
        }
        if !dropped.is_empty() {
            self.warnings.push(format!(
                "{who}: mixed-size profiles {} not published: their placement slots do not fit \
                 the counters or devices Kubernetes {} allows for one GPU",
                dropped.join(", "),
                self.opts.version
            ));
        }
        if shapes.is_empty() {
            return vec![];
        }
        let (unit, n) = lattice(&shapes);
        for i in 0..n {
            set.push((format!("{SLOT_COUNTER}{i}"), "1".to_owned()));
        }
        let held_units = held_units(&held, unit);
        let mut out = Vec::new();
        for s in &shapes {
            if s.size_mib > g.remaining {
                continue;
            }
            for id in &s.ids {
                if units(*id, s.placement_size, unit).any(|u| held_units.contains(&u)) {
                    continue;
                }
                let more = [
                    ("placementId", u64::from(*id)),
                    ("placementSize", u64::from(s.placement_size)),
                ];
                let mut attributes = self.size_attributes(g, s.size_mib, &more, &s.group);
                attributes.insert("mixedSize".into(), DeviceAttribute::Bool(true));
                let mut used = vec![("framebuffer".to_owned(), mib_quantity(s.size_mib))];
                used.extend(
                    units(*id, s.placement_size, unit)
                        .map(|u| (format!("{SLOT_COUNTER}{u}"), "1".to_owned())),
                );
                let name = vgpu_instance_device_name(&g.gpu.address, s.size_mib, *id);
                out.push(g.consuming(name, attributes, used));
            }
        }
        out
    }
}

/// The counters (units of `unit` slots) a run of `size` slots from `id` touches.
fn units(id: u32, size: u32, unit: u32) -> impl Iterator<Item = u32> {
    let first = id / unit;
    let end = id.saturating_add(size).div_ceil(unit);
    first..end
}

/// The counters any held run touches: a unit partly held is held whole (fewer promised, never
/// more).
fn held_units(held: &[(u32, u32)], unit: u32) -> BTreeSet<u32> {
    held.iter()
        .flat_map(|(id, size)| units(*id, *size, unit))
        .collect()
}

/// How `dra prepare`'s record names an instance: its UUID, else its VF's address.
fn instance_key(i: &gpu_core::Instance) -> String {
    i.uuid
        .map(|u| u.to_string())
        .or_else(|| i.address.map(|a| a.to_string()))
        .unwrap_or_default()
}
