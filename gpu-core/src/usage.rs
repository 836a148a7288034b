//! GPU memory of a node and what of it is allocated: the one computation behind `topology`'s
//! "GPU memory" line, the `gpuslice_gpu_vram_mib` metric and the bindings; and which Machine's
//! allocation holds each GPU and each instance ([`allocated_gpu`], [`allocated_instance`]), the
//! one answer behind `gpu list --inventory`, `topology --inventory` and the memory figures.
//!
//! The solver (`gpu_sched::vram_usage` re-exports this) and every renderer count with the same
//! rules, so the figures a user sees are the ones placement works with.

use crate::address::PciAddress;
use crate::allocation::{AllocatedDevice, Allocation, AllocationStatus};
use crate::ids::{ParentId, VgpuTypeId};
use crate::nvidia::VgpuTypeName;
use crate::topology::{GpuState, Instance, NodeTopology, Parent, VgpuFramework};

/// Whether allocated device `d` is instance `i` of parent `p`: the same mdev UUID, or, on a
/// vendor-VFIO VF (whose one instance is the VF itself), a vGPU of that type on that VF.
pub fn is_instance(d: &AllocatedDevice, p: &Parent, i: &Instance) -> bool {
    let AllocatedDevice::Vgpu {
        parent,
        profile,
        uuid,
        framework,
        ..
    } = d
    else {
        return false;
    };
    *parent == p.id
        && (i.uuid == Some(*uuid)
            || (*framework == VgpuFramework::VendorVfio && i.profile == *profile))
}

/// The allocations among `allocations` (those on `node`) that hold GPU `gpu`, each with whether
/// it holds the GPU whole: a whole-GPU device at its address, or a vGPU on it.
pub fn allocated_gpu<'a>(
    node: &NodeTopology,
    allocations: &'a [Allocation],
    gpu: &PciAddress,
) -> Vec<(&'a Allocation, bool)> {
    allocated_gpu_named(&node.node, allocations, gpu)
}

/// [`allocated_gpu`] of the node named `node` (a fleet's shaped node, whose topology is not
/// expanded).
pub fn allocated_gpu_named<'a>(
    node: &str,
    allocations: &'a [Allocation],
    gpu: &PciAddress,
) -> Vec<(&'a Allocation, bool)> {
    allocations
        .iter()
        .filter(|a| a.node == node)
        .filter_map(|a| {
            let whole = a
                .devices
                .iter()
                .any(|d| matches!(d, AllocatedDevice::Gpu { address, .. } if *address == *gpu));
            let vgpu = a
                .devices
                .iter()
                .any(|d| matches!(d, AllocatedDevice::Vgpu { gpu: Some(g), .. } if *g == *gpu));
            (whole || vgpu).then_some((a, whole))
        })
        .collect()
}

/// `gpu` of the node named `node` as the fleet's allocations leave it, and the Machines holding
/// it: a GPU an allocation holds (whole, or a vGPU on it) is in use, whatever the node's snapshot
/// said.
pub fn allocated_view(
    node: &str,
    allocations: &[Allocation],
    gpu: &crate::Gpu,
) -> (crate::Gpu, Vec<String>) {
    let holders = allocated_gpu_named(node, allocations, &gpu.address);
    let mut g = gpu.clone();
    let machines: Vec<String> = holders.iter().map(|(a, _)| a.machine.clone()).collect();
    if let Some((a, whole)) = holders.first() {
        if g.state == crate::GpuState::Free {
            g.state = crate::GpuState::InUse;
            g.state_reason = Some(format!(
                "{} Machine {} ({})",
                if *whole {
                    "allocated whole to"
                } else {
                    "hosts a vGPU of"
                },
                a.machine,
                a.status.as_str()
            ));
        }
    }
    (g, machines)
}

/// The allocation among `allocations` (those on `node`) that holds instance `i` of parent `p`
/// ([`is_instance`]), if any.
pub fn allocated_instance<'a>(
    node: &NodeTopology,
    allocations: &'a [Allocation],
    p: &Parent,
    i: &Instance,
) -> Option<&'a Allocation> {
    allocations
        .iter()
        .filter(|a| a.node == node.node)
        .find(|a| a.devices.iter().any(|d| is_instance(d, p, i)))
}

/// The allocated vGPUs among `allocations` (those on `node`) that the node's snapshot does not
/// show yet (no instance of their parent is the same one, [`is_instance`]): pending ones, and
/// created ones a newer snapshot will show. Each with the allocation (its Machine) it belongs
/// to, in allocation and device order: the instances the fleet views list beside the made ones.
pub fn unmade_vgpus<'a>(
    node: &NodeTopology,
    allocations: &'a [Allocation],
) -> Vec<(&'a Allocation, &'a AllocatedDevice)> {
    allocations
        .iter()
        .filter(|a| a.node == node.node)
        .flat_map(|a| a.devices.iter().map(move |d| (a, d)))
        .filter(|(_, d)| match d {
            AllocatedDevice::Vgpu { parent, .. } => !node
                .mediated_devices
                .parents
                .iter()
                .filter(|p| p.id == *parent)
                .any(|p| p.instances.iter().any(|i| is_instance(d, p, i))),
            AllocatedDevice::Gpu { .. } => false,
        })
        .collect()
}

/// Memory of one node's GPUs and what of it is allocated, in MiB.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct VramUsage {
    /// Memory of every GPU whose size is known (the vGPU pool size when the GPU does not say).
    pub total_mib: u64,
    /// In-use and allocated whole GPUs, existing vGPU framebuffers and pending allocations.
    pub allocated_mib: u64,
    /// `total_mib` is only a lower bound: some GPU's size was inferred from the types it still
    /// lists ([`crate::Gpu::memory_is_lower_bound`]).
    pub total_is_lower_bound: bool,
    /// GPUs whose size is not known at all (not in `total_mib`).
    pub unknown_gpus: usize,
}

impl VramUsage {
    /// `49152 MiB allocated of 144384 MiB total`, with `at least` before a total that is a
    /// lower bound and the GPUs of unknown size counted: the words every front-end shows.
    pub fn summary(&self) -> String {
        let mut s = format!(
            "{} MiB allocated of {}{} MiB total",
            self.allocated_mib,
            if self.total_is_lower_bound {
                "at least "
            } else {
                ""
            },
            self.total_mib
        );
        if self.unknown_gpus > 0 {
            s.push_str(&format!(
                " ({} GPU{} of unknown size)",
                self.unknown_gpus,
                if self.unknown_gpus == 1 { "" } else { "s" }
            ));
        }
        s
    }
}

/// Whether `pool`'s total is only a lower bound: its GPU's memory is the pool's total, inferred
/// from the types still creatable ([`crate::Gpu::memory_is_lower_bound`]).
pub fn pool_total_is_lower_bound(node: &NodeTopology, pool: &crate::Pool) -> bool {
    pool.gpu
        .pci()
        .and_then(|a| node.gpu_by_address(&a))
        .is_some_and(|g| g.memory_is_lower_bound && g.memory_mib == Some(pool.total_mib))
}

/// A GPU's memory as people read it: `144384 MiB`, `at least 72704 MiB` when only a lower bound
/// is known, `-` when nothing is.
pub fn memory_text(gpu: &crate::Gpu) -> String {
    match (gpu.memory_mib, gpu.memory_is_lower_bound) {
        (Some(m), true) => format!("at least {m} MiB"),
        (Some(m), false) => format!("{m} MiB"),
        (None, _) => "-".to_owned(),
    }
}

/// The framebuffer of one instance of `profile` on `p`: its own size, else the profile's, else
/// what an NVIDIA type name says (MIG-backed instances often carry only their name).
fn instance_mib(p: &Parent, profile: &VgpuTypeId, own: Option<u64>, name: Option<&str>) -> u64 {
    own.or_else(|| {
        p.profiles
            .iter()
            .find(|t| t.id == *profile)
            .and_then(|t| t.framebuffer_mib)
    })
    .or_else(|| VgpuTypeName::parse(name?).ok().map(|n| n.framebuffer_mib()))
    .unwrap_or(0)
}

/// Computes [`VramUsage`] of `node`, counting the allocations among `allocations` that are on it
/// (any status).
///
/// A GPU held whole counts its whole memory: in use on the host (passed through, bound to
/// vfio-pci) or allocated whole to a Machine, pending or created. A GPU sharing its memory as
/// vGPUs counts every instance the snapshot shows (time-sliced and MIG-backed alike: MIG-backed
/// instances leave the pool's `usedMiB` at 0, so their framebuffers are added up), plus every
/// allocated vGPU, pending or created, that the snapshot does not show yet (same mdev UUID, or a
/// vendor-VFIO VF holding that type, is the same instance). No GPU counts more than its memory.
pub fn vram_usage(node: &NodeTopology, allocations: &[Allocation]) -> VramUsage {
    let on_node: Vec<&Allocation> = allocations.iter().filter(|a| a.node == node.node).collect();
    let mut usage = VramUsage::default();
    for gpu in &node.gpus {
        let pool = node.pool(&ParentId::Pci(gpu.address));
        let memory = gpu.memory_mib.or(pool.map(|p| p.total_mib)).unwrap_or(0);
        usage.total_mib = usage.total_mib.saturating_add(memory);
        if gpu.memory_mib.is_some() {
            usage.total_is_lower_bound |= gpu.memory_is_lower_bound;
        } else if memory == 0 {
            usage.unknown_gpus += 1;
        }
        let held = allocated_gpu(node, allocations, &gpu.address)
            .iter()
            .any(|(_, whole)| *whole);
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
                shown = shown.saturating_add(instance_mib(
                    p,
                    &i.profile,
                    i.framebuffer_mib,
                    i.profile_name.as_deref(),
                ));
            }
        }
        let mut used = shown.max(pool.map_or(0, |p| p.used_mib));
        for a in &on_node {
            for d in &a.devices {
                let AllocatedDevice::Vgpu {
                    parent,
                    profile,
                    profile_name,
                    framebuffer_mib,
                    ..
                } = d
                else {
                    continue;
                };
                let Some(p) = parents.iter().find(|p| p.id == *parent) else {
                    continue;
                };
                let reflected = p.instances.iter().any(|i| is_instance(d, p, i));
                if !reflected {
                    used = used.saturating_add(instance_mib(
                        p,
                        profile,
                        *framebuffer_mib,
                        Some(profile_name.as_str()),
                    ));
                }
            }
        }
        let used = if memory > 0 { used.min(memory) } else { used };
        usage.allocated_mib = usage.allocated_mib.saturating_add(used);
    }
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
                    placement_id: None,
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
