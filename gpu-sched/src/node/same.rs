//! Whether an allocation already on a node answers a Machine's requests: placing a Machine that
//! is placed, unchanged, gives the existing placement back (an orchestrator retrying after a
//! timeout must not be refused, nor get a second set of devices).

use gpu_core::AllocatedDevice;

use super::NodeState;
use crate::resolve::{Catalog, GpuRef, Kind, Req};

impl NodeState {
    /// Whether `devices` (those of one allocation on this node that fulfil request `r`) are an
    /// answer to `r` as the solver would check it: the count, the profile of each vGPU, each
    /// whole GPU named or of a family listed, the vendor, class, model and memory filters, and
    /// NUMA alignment. Health and free room are not asked: the devices are held already.
    pub(crate) fn fulfils(&self, r: &Req, devices: &[&AllocatedDevice], catalog: &Catalog) -> bool {
        if u32::try_from(devices.len()).ok() != Some(r.wanted) {
            return false;
        }
        let index_of =
            |a: &gpu_core::PciAddress| self.topo.gpus.iter().position(|g| g.address == *a);
        let mut gpus: Vec<Option<usize>> = Vec::with_capacity(devices.len());
        match &r.kind {
            Kind::Vgpu { classes, .. } => {
                for d in devices {
                    let AllocatedDevice::Vgpu {
                        gpu,
                        profile,
                        profile_name,
                        framebuffer_mib,
                        ..
                    } = d
                    else {
                        return false;
                    };
                    let same_class = catalog
                        .class_of(profile.as_str(), profile_name)
                        .is_some_and(|c| classes.contains(&c));
                    let i = gpu.as_ref().and_then(index_of);
                    if !same_class || self.identity_filter(r, i, *framebuffer_mib).is_some() {
                        return false;
                    }
                    gpus.push(i);
                }
            }
            Kind::Whole {
                exact,
                families,
                listed,
            } => {
                let mut held: Vec<usize> = Vec::with_capacity(devices.len());
                for d in devices {
                    let AllocatedDevice::Gpu { address, .. } = d else {
                        return false;
                    };
                    let Some(i) = index_of(address) else {
                        return false;
                    };
                    held.push(i);
                }
                let is_exact = |i: usize| {
                    let g = &self.topo.gpus[i];
                    exact.iter().any(|e| match e {
                        GpuRef::Name(n) => g.name == *n,
                        GpuRef::Address(a) => g.address == *a,
                        GpuRef::Family(_) => false,
                    })
                };
                let named_held = exact.iter().all(|e| {
                    held.iter().any(|i| {
                        let g = &self.topo.gpus[*i];
                        match e {
                            GpuRef::Name(n) => g.name == *n,
                            GpuRef::Address(a) => g.address == *a,
                            GpuRef::Family(_) => false,
                        }
                    })
                });
                if !named_held {
                    return false;
                }
                for &i in &held {
                    let g = &self.topo.gpus[i];
                    if *listed && !is_exact(i) {
                        let fam = g.name.trim_end_matches(|c: char| c.is_ascii_digit());
                        if !families.contains(&fam) {
                            return false;
                        }
                    }
                    if self.identity_filter(r, Some(i), g.memory_mib).is_some() {
                        return false;
                    }
                    gpus.push(Some(i));
                }
            }
        }
        if r.numa {
            let mut nodes = gpus
                .iter()
                .map(|i| i.and_then(|i| self.topo.gpus[i].numa_node));
            let first = nodes.next().flatten();
            if first.is_none() || nodes.any(|n| n != first) {
                return false;
            }
        }
        true
    }
}
