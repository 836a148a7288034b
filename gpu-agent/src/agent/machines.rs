//! The Machines the agent's promises record, as allocations (what an evacuation plans on).

use gpu_core::{AllocatedDevice, Allocation, AllocationStatus, NodeTopology, ParentId};

use crate::state::{Device, Promise};

/// The Machines the agent's promises record, as allocations on `topology` (what
/// `gpuslice plan evacuate` plans on). Promises without a Machine are left out.
pub fn allocations_of(topology: &NodeTopology, promises: &[Promise]) -> Vec<Allocation> {
    let mut by_machine: std::collections::BTreeMap<String, Vec<AllocatedDevice>> =
        Default::default();
    for p in promises {
        let Some(machine) = &p.owner.machine else {
            continue;
        };
        let request = p.owner.request.clone().unwrap_or_else(|| "gpu".to_owned());
        let index = p.owner.index.unwrap_or(0);
        let (parent, uuid, type_num) = match &p.device {
            Device::Mdev { uuid, parent, .. } => (parent.clone(), *uuid, None),
            Device::VendorVfio { vf, type_num } => (
                ParentId::Pci(*vf),
                gpu_core::MdevUuid::for_machine(machine, &request, index),
                Some(*type_num),
            ),
        };
        let Some(par) = topology.parent(&parent) else {
            continue;
        };
        let profile = par.profiles.iter().find(|pr| match (&p.device, type_num) {
            (Device::Mdev { type_id, .. }, _) => pr.id == *type_id,
            (_, Some(n)) => pr.id.number() == Some(n),
            _ => false,
        });
        let Some(profile) = profile else { continue };
        by_machine
            .entry(machine.clone())
            .or_default()
            .push(AllocatedDevice::Vgpu {
                request,
                index,
                parent,
                gpu: par.gpu,
                framework: par.framework,
                profile: profile.id.clone(),
                profile_name: profile.name.clone(),
                framebuffer_mib: profile.framebuffer_mib,
                mig_slices: profile.mig_slices,
                uuid,
                gpu_instance_start: None,
                placement_id: None,
            });
    }
    by_machine
        .into_iter()
        .map(|(machine, devices)| Allocation {
            machine,
            node: topology.node.clone(),
            status: AllocationStatus::Created,
            devices,
        })
        .collect()
}
