//! GPU memory of a node and what of it is allocated: the one computation behind `topology`'s
//! "GPU memory" line, the `gpuslice_gpu_vram_mib` metric and the bindings.
//!
//! Allocated is, per GPU: the framebuffer of every existing vGPU (time-sliced and MIG-backed
//! alike; the pool's own count when it is larger), or the whole GPU when it is in use outside
//! vGPUs or a created allocation holds it whole; plus what pending allocations reserve.

use crate::allocation::{AllocatedDevice, Allocation, AllocationStatus};
use crate::ids::ParentId;
use crate::nvidia::VgpuTypeName;
use crate::topology::{GpuState, NodeTopology};

/// Memory of one node's GPUs and what of it is allocated, in MiB.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct VramUsage {
    /// Memory of every GPU whose size is known (the vGPU pool size when the GPU does not say).
    pub total_mib: u64,
    /// In-use and allocated whole GPUs, existing vGPU framebuffers and pending allocations.
    pub allocated_mib: u64,
}

/// Computes [`VramUsage`] of `node`, counting the allocations among `allocations` that are on it.
pub fn vram_usage(node: &NodeTopology, allocations: &[Allocation]) -> VramUsage {
    let mut usage = VramUsage::default();
    for gpu in &node.gpus {
        let pool = node.pool(&ParentId::Pci(gpu.address));
        let memory = gpu.memory_mib.or(pool.map(|p| p.total_mib)).unwrap_or(0);
        usage.total_mib = usage.total_mib.saturating_add(memory);
        let instances: u64 = node
            .mediated_devices
            .parents
            .iter()
            .filter(|p| p.gpu == Some(gpu.address))
            .flat_map(|p| p.instances.iter())
            .map(|i| {
                i.framebuffer_mib
                    .or_else(|| {
                        let name = i.profile_name.as_deref()?;
                        VgpuTypeName::parse(name).ok().map(|n| n.framebuffer_mib())
                    })
                    .unwrap_or(0)
            })
            .sum();
        let vgpu_used = pool.map_or(0, |p| p.used_mib).max(instances);
        let held_whole = allocations.iter().any(|a| {
            a.node == node.node
                && a.status == AllocationStatus::Created
                && a.devices.iter().any(
                    |d| matches!(d, AllocatedDevice::Gpu { address, .. } if *address == gpu.address),
                )
        });
        if vgpu_used > 0 {
            usage.allocated_mib = usage.allocated_mib.saturating_add(vgpu_used);
        } else if held_whole || (gpu.state == GpuState::InUse && gpu.vgpu_framework.is_none()) {
            usage.allocated_mib = usage.allocated_mib.saturating_add(memory);
        }
    }
    usage.allocated_mib = usage
        .allocated_mib
        .saturating_add(pending_mib(node, allocations));
    usage
}

/// GPU memory in MiB that the pending allocations among `allocations` reserve on `node`.
pub fn pending_mib(node: &NodeTopology, allocations: &[Allocation]) -> u64 {
    let mut total = 0u64;
    for a in allocations
        .iter()
        .filter(|a| a.node == node.node && a.status == AllocationStatus::Pending)
    {
        for d in &a.devices {
            let mib = match d {
                AllocatedDevice::Gpu {
                    address,
                    memory_mib,
                    ..
                } => memory_mib
                    .or_else(|| node.gpu_by_address(address).and_then(|g| g.memory_mib))
                    .unwrap_or(0),
                AllocatedDevice::Vgpu {
                    framebuffer_mib, ..
                } => framebuffer_mib.unwrap_or(0),
            };
            total = total.saturating_add(mib);
        }
    }
    total
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::topology::{Gpu, Instance, Parent, VgpuFramework};
    use crate::{MdevUuid, PciAddress, VgpuTypeId};

    fn h200(mig_instance: bool) -> NodeTopology {
        let pf: PciAddress = "0000:1a:00.0".parse().unwrap();
        let vf: PciAddress = "0000:1a:00.4".parse().unwrap();
        let mut t = NodeTopology::new("n");
        let mut g = Gpu::new("nvidia0", pf, 0x10de, 0x2335, 0x030200);
        g.memory_mib = Some(141 * 1024);
        g.vgpu_framework = Some(VgpuFramework::VendorVfio);
        t.gpus.push(g);
        t.mediated_devices.parents.push(Parent {
            id: ParentId::Pci(vf),
            gpu: Some(pf),
            framework: VgpuFramework::VendorVfio,
            health: Default::default(),
            profiles: vec![],
            instances: if mig_instance {
                vec![Instance {
                    uuid: None,
                    address: Some(vf),
                    profile: VgpuTypeId::from_str_unchecked("1414"),
                    profile_name: Some("NVIDIA H200X-1-18C".into()),
                    framebuffer_mib: None,
                    in_use: None,
                }]
            } else {
                vec![]
            },
            warnings: vec![],
        });
        t
    }

    #[test]
    fn an_existing_mig_backed_vgpu_counts_as_allocated() {
        let u = vram_usage(&h200(true), &[]);
        assert_eq!(u.total_mib, 141 * 1024);
        assert_eq!(u.allocated_mib, 18 * 1024);
    }

    #[test]
    fn a_created_whole_gpu_allocation_counts_its_memory() {
        let t = h200(false);
        assert_eq!(vram_usage(&t, &[]).allocated_mib, 0);
        let a = Allocation {
            machine: "vm".into(),
            node: "n".into(),
            status: AllocationStatus::Created,
            devices: vec![AllocatedDevice::Gpu {
                request: "gpu".into(),
                name: "nvidia0".into(),
                address: t.gpus[0].address,
                functions: vec![],
                memory_mib: None,
            }],
        };
        assert_eq!(vram_usage(&t, &[a]).allocated_mib, 141 * 1024);
        let _ = MdevUuid::for_machine("m", "r", 0);
    }
}
