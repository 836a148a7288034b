//! The counter set and devices of a virtual mdev parent (see the module doc of [`super`]).

use std::collections::BTreeMap;

use gpu_core::Parent;

use super::Ctx;
use super::parts::{GpuPlan, Resolved, counters, int_attr, resolve, str_attr};
use super::vgpu::mixed_framebuffer;
use crate::dra::device_name::{VirtualDeviceName, parent_label, virtual_counter_set_name};
use crate::dra::model::*;
use crate::dra::names::mib_quantity;
use crate::dra::version::*;

/// The display types of a virtual parent by framebuffer size (see the module doc).
type DisplayTypes<'p> = BTreeMap<u64, Vec<Resolved<'p>>>;

impl Ctx<'_> {
    /// The counter set and devices of a virtual mdev parent (`name`), or `None` (with a warning
    /// where it offers `vfio-pci` types) when it does not qualify: see the module doc.
    pub(super) fn plan_virtual(&mut self, name: &str, parent: &Parent) -> Option<GpuPlan> {
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
