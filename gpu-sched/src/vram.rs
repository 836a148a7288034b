//! GPU memory of a node and what of it is allocated: one count for `topology`, metrics and the
//! bindings, with the same rules as the solver's charges.
//!
//! A GPU held whole counts its whole memory: in use on the host (passed through, bound to
//! vfio-pci) or allocated whole to a Machine, pending or created. A GPU sharing its memory as
//! vGPUs counts every instance the snapshot shows (time-sliced and MIG-backed alike: MIG-backed
//! instances leave the pool's `usedMiB` at 0, so their framebuffers are added up), plus every
//! allocated vGPU, pending or created, that the snapshot does not show yet (same mdev UUID, or a
//! vendor-VFIO VF holding that type, is the same instance). No GPU counts more than its memory.

use gpu_core::{
    AllocatedDevice, Allocation, GpuState, NodeTopology, Parent, ParentId, VgpuFramework,
};

/// Memory of one node's GPUs and what of it is allocated, in MiB.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct VramUsage {
    /// Memory of every GPU whose size is known (the vGPU pool size when the GPU does not say).
    pub total_mib: u64,
    /// Whole GPUs in use or allocated, and every vGPU that exists or is allocated.
    pub allocated_mib: u64,
}

fn instance_mib(p: &Parent, profile: &gpu_core::VgpuTypeId, own: Option<u64>) -> u64 {
    own.or_else(|| {
        p.profiles
            .iter()
            .find(|t| t.id == *profile)
            .and_then(|t| t.framebuffer_mib)
    })
    .unwrap_or(0)
}

/// Computes [`VramUsage`] of `node`, counting the allocations among `allocations` that are on it
/// (any status).
pub fn vram_usage(node: &NodeTopology, allocations: &[Allocation]) -> VramUsage {
    let on_node: Vec<&Allocation> = allocations.iter().filter(|a| a.node == node.node).collect();
    let mut usage = VramUsage::default();
    for gpu in &node.gpus {
        let pool = node.pool(&ParentId::Pci(gpu.address));
        let memory = gpu.memory_mib.or(pool.map(|p| p.total_mib)).unwrap_or(0);
        usage.total_mib = usage.total_mib.saturating_add(memory);
        let held = on_node.iter().any(|a| {
            a.devices.iter().any(
                |d| matches!(d, AllocatedDevice::Gpu { address, .. } if *address == gpu.address),
            )
        });
        let parents: Vec<&Parent> = node
            .mediated_devices
            .parents
            .iter()
            .filter(|p| p.gpu == Some(gpu.address))
            .collect();
        let passed_through = gpu.state == GpuState::InUse && gpu.vgpu_framework.is_none();
        if held || (passed_through && parents.is_empty()) {
            usage.allocated_mib = usage.allocated_mib.saturating_add(memory);
            continue;
        }
        let mut shown: u64 = 0;
        for p in &parents {
            for i in &p.instances {
                shown = shown.saturating_add(instance_mib(p, &i.profile, i.framebuffer_mib));
            }
        }
        let mut used = shown.max(pool.map_or(0, |p| p.used_mib));
        for a in &on_node {
            for d in &a.devices {
                let AllocatedDevice::Vgpu {
                    parent,
                    profile,
                    framebuffer_mib,
                    uuid,
                    framework,
                    ..
                } = d
                else {
                    continue;
                };
                let Some(p) = parents.iter().find(|p| p.id == *parent) else {
                    continue;
                };
                let reflected = p.instances.iter().any(|i| {
                    i.uuid == Some(*uuid)
                        || (*framework == VgpuFramework::VendorVfio && i.profile == *profile)
                });
                if !reflected {
                    used = used.saturating_add(instance_mib(p, profile, *framebuffer_mib));
                }
            }
        }
        let used = if memory > 0 { used.min(memory) } else { used };
        usage.allocated_mib = usage.allocated_mib.saturating_add(used);
    }
    usage
}
