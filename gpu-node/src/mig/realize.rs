//! The MIG step of [`crate::Node::realize`]: a MIG-backed vGPU of an allocation whose GPU
//! instance does not exist gets it made, through the same door as `vgpu create`
//! ([`Mig::before_vgpu_at_held`]), under the realize's lock, right before its type is written,
//! recorded as gpuslice's (so `vgpu remove` destroys it with the vGPU) and destroyed again when
//! the realize is undone. Everything is checked before the first write ([`check`]).
//!
//! Where the allocation carries the instance's start (`gpuInstanceStart`, chosen by the solver
//! on the slot model), the instance is made there ([`InstanceStarts::of`]); a start that is not
//! legal for the profile or is taken is refused naming it.

use std::collections::BTreeMap;

use gpu_core::nvidia::VgpuTypeName;
use gpu_core::{AllocatedDevice, Allocation, PciAddress};

use super::ask::VgpuAsk;
use super::{InstanceView, MigError};
use crate::Node;

/// The GPU-instance start of each device of an allocation that names one, by the device's
/// position in `allocation.devices`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct InstanceStarts(BTreeMap<usize, u8>);

impl InstanceStarts {
    /// The starts `allocation` carries: each vGPU's `gpuInstanceStart` (the first memory slice
    /// of its GPU instance, as the scheduler chose it on the slot model). A vGPU without one
    /// gets the start that keeps the most later placements.
    pub fn of(allocation: &Allocation) -> Self {
        let starts = allocation
            .devices
            .iter()
            .enumerate()
            .filter_map(|(i, d)| match d {
                AllocatedDevice::Vgpu {
                    gpu_instance_start: Some(s),
                    ..
                } => Some((i, *s)),
                _ => None,
            });
        InstanceStarts(starts.collect())
    }

    /// These starts with device number `position` at `start`.
    #[must_use]
    pub fn with(mut self, position: usize, start: u8) -> Self {
        self.0.insert(position, start);
        self
    }

    /// The start of device number `position`, when given.
    pub fn at(&self, position: usize) -> Option<u8> {
        self.0.get(&position).copied()
    }
}

/// Whether `d` is a vGPU of a MIG-backed NVIDIA type (by its name).
pub fn is_mig_backed(d: &AllocatedDevice) -> bool {
    match d {
        AllocatedDevice::Vgpu { profile_name, .. } => {
            VgpuTypeName::parse(profile_name).is_ok_and(|t| t.mig_slices.is_some())
        }
        AllocatedDevice::Gpu { .. } => false,
    }
}

/// The physical GPU of vGPU device `d`: the allocation's, else its parent's `physfn`, else the
/// parent itself.
pub fn gpu_of_device(node: &Node<'_>, d: &AllocatedDevice) -> Option<PciAddress> {
    let AllocatedDevice::Vgpu { gpu, parent, .. } = d else {
        return None;
    };
    if let Some(g) = gpu {
        return Some(*g);
    }
    parent.pci().map(|a| super::vgpu::pf_of(node, &a))
}

/// Checks, before the first write, what MIG needs for the devices at `positions` of
/// `allocation` (the MIG-backed vGPUs it makes): per GPU, in order, through
/// [`super::Mig::plan_asks`]. Reads only. `Ok(false)`: the node has no NVML to ask.
///
/// # Errors
/// What [`super::Mig::plan_asks`] refuses, for the first GPU that cannot take its devices.
pub fn check(
    node: &Node<'_>,
    allocation: &Allocation,
    positions: &[usize],
    starts: &InstanceStarts,
) -> Result<bool, MigError> {
    let Some(nvml) = node.nvml_handle() else {
        return Ok(false);
    };
    let mut per_gpu: BTreeMap<PciAddress, Vec<VgpuAsk<'_>>> = BTreeMap::new();
    for &i in positions {
        let Some(d @ AllocatedDevice::Vgpu { profile_name, .. }) = allocation.devices.get(i) else {
            continue;
        };
        let Some(gpu) = gpu_of_device(node, d) else {
            continue;
        };
        per_gpu.entry(gpu).or_default().push(VgpuAsk {
            type_name: profile_name,
            start: starts.at(i),
        });
    }
    let mig = node.mig(nvml);
    for (gpu, asks) in &per_gpu {
        mig.plan_asks(gpu, asks)?;
    }
    Ok(true)
}

/// Right before device number `position` of `allocation` is written, the lock held: its GPU
/// instance made where it needs one ([`super::Mig::before_vgpu_at_held`]). The GPU and the
/// instance made, if one was.
///
/// # Errors
/// What [`super::Mig::before_vgpu_at_held`] answers.
pub fn before_device(
    node: &Node<'_>,
    allocation: &Allocation,
    position: usize,
    starts: &InstanceStarts,
) -> Result<Option<(PciAddress, InstanceView)>, MigError> {
    let Some(nvml) = node.nvml_handle() else {
        return Ok(None);
    };
    let Some(d @ AllocatedDevice::Vgpu { profile_name, .. }) = allocation.devices.get(position)
    else {
        return Ok(None);
    };
    if !is_mig_backed(d) {
        return Ok(None);
    }
    let Some(gpu) = gpu_of_device(node, d) else {
        return Ok(None);
    };
    let made = node
        .mig(nvml)
        .before_vgpu_at_held(&gpu, profile_name, starts.at(position))?;
    Ok(made.map(|gi| (gpu, gi)))
}

/// Why [`check_todo`] refused, for the realize to say.
#[derive(Debug)]
pub enum TodoRefusal {
    /// MIG cannot make what a device needs.
    Mig(MigError),
    /// A device's parent does not list its type and there is no NVML to make its instance.
    Unlisted {
        /// The device request.
        request: String,
        /// The parent.
        parent: gpu_core::ParentId,
        /// The type asked for.
        profile: String,
    },
}

/// [`check`] for the devices `todo` names (position, and whether its parent does not list its
/// type yet) that are MIG-backed; without NVML, a type no parent lists is refused as unknown,
/// as before.
///
/// # Errors
/// [`TodoRefusal::Mig`] for what [`check`] refuses; [`TodoRefusal::Unlisted`].
pub fn check_todo(
    node: &Node<'_>,
    allocation: &Allocation,
    todo: &[(usize, bool)],
    starts: &InstanceStarts,
) -> Result<(), TodoRefusal> {
    let device = |i: usize| allocation.devices.get(i);
    let positions: Vec<usize> = todo
        .iter()
        .map(|(i, _)| *i)
        .filter(|i| device(*i).is_some_and(is_mig_backed))
        .collect();
    let asked = check(node, allocation, &positions, starts).map_err(TodoRefusal::Mig)?;
    let unlisted = todo.iter().find(|(_, u)| *u).and_then(|(i, _)| device(*i));
    match unlisted {
        Some(AllocatedDevice::Vgpu {
            request,
            parent,
            profile,
            ..
        }) if !asked => Err(TodoRefusal::Unlisted {
            request: request.clone(),
            parent: parent.clone(),
            profile: profile.to_string(),
        }),
        _ => Ok(()),
    }
}
