//! The vGPU devices of one physical GPU in the version's [`Encoding`]: per-size devices under
//! the size lock, one mixed-size device, one device per instance before Kubernetes 1.36.2, and
//! one device per MIG placement.

use std::collections::BTreeMap;

use gpu_core::nvidia;

use super::Ctx;
use super::gpu::OneGpu;
use super::mig::mig_spans;
use super::parts::{Resolved, counters, int_attr};
use crate::dra::device_name::{
    mig_device_name, mixed_device_name, vgpu_device_name, vgpu_instance_device_name,
};
use crate::dra::model::*;
use crate::dra::names::{mib_quantity, profile_attribute};
use crate::dra::version::*;

impl Ctx<'_> {
    /// The attributes of a vGPU device of `size` (and `more`) that can become any profile of
    /// `group` (the profiles last: they are what is left out when a device has too many).
    pub(super) fn size_attributes(
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
    pub(super) fn count_of(g: &OneGpu<'_>, size: u64, group: &[&Resolved<'_>]) -> u64 {
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
    pub(super) fn size_lock_devices(
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
    pub(super) fn mixed_device(
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
    pub(super) fn chosen_size(
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
    pub(super) fn per_instance_devices(
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
    pub(super) fn mig_devices(
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
                out.push(g.consuming(
                    mig_device_name(&addr, *slices, *size, start),
                    attributes,
                    used,
                ));
            }
        }
        out
    }

    /// `who`: the GPU (`name (address)`) or virtual parent, for the warnings.
    pub(super) fn add_profile_attributes<'p>(
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
pub(super) fn mixed_framebuffer(
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
