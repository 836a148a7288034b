//! Framebuffer pools per physical GPU, and the capping of every profile's count by its pool.
//!
//! The driver's per-parent counts overstate capacity on SR-IOV GPUs: on the A2 capture 13 free VFs
//! each report one more 4 GB vGPU although only one more fits on the card. The pool is the truth:
//! a profile's `availableInstances` is `min(reportedInstances, pool.creatable(profile))`, and a
//! consumer that places several vGPUs charges the pool (gpu-core's `Pool::charge`) for each, never
//! the per-parent counts.

use std::collections::BTreeMap;

use gpu_core::{
    Gpu, MigGeometry, MigSlots, Parent, ParentId, Pool, Profile, VgpuFramework,
    nvidia::VgpuTypeName,
};

use super::parse;

/// Size facts of one existing instance.
struct InstanceSize {
    framebuffer_mib: Option<u64>,
    mig_slices: Option<u8>,
}

fn instance_size(parents: &[&Parent], inst: &gpu_core::Instance) -> InstanceSize {
    let profile = parents
        .iter()
        .flat_map(|p| p.profiles.iter())
        .find(|p| p.id == inst.profile);
    let from_name = inst
        .profile_name
        .as_deref()
        .and_then(parse::facts_from_type_name);
    InstanceSize {
        framebuffer_mib: inst
            .framebuffer_mib
            .or(profile.and_then(|p| p.framebuffer_mib))
            .or(from_name.map(|f| f.0)),
        mig_slices: profile
            .and_then(|p| p.mig_slices)
            .or(from_name.and_then(|f| f.1)),
    }
}

/// A pool built from what the parents of one GPU say, and whether its total is exact.
pub(crate) struct BuiltPool {
    pub pool: Pool,
    /// False when the total had to be inferred from the types still creatable (a lower bound).
    pub exact: bool,
}

/// The GPU-instance slots of a MIG-capable GPU whose geometry is known (by the GPU's PCI device
/// ID, else by the board of its MIG-backed type names). The existing MIG-backed vGPUs hold
/// GPU instances whose start sysfs does not show: each is recorded with an unknown start, and
/// a new one then fits only where it fits beside every placement they could have in which the
/// types the driver still lists (`creatable`) have a start too. An instance
/// whose profile cannot be told is recorded by what is known of it, so that the slots cannot be
/// established and MIG-backed types are refused there rather than guessed.
fn mig_slots(
    device_id: Option<u16>,
    parents: &[&Parent],
    sizes: &[InstanceSize],
) -> Option<MigSlots> {
    let named_board = || {
        let profiles = parents.iter().flat_map(|p| p.profiles.iter());
        let names = profiles
            .filter(|p| p.mig_slices.is_some())
            .map(|p| p.name.as_str())
            .chain(
                parents
                    .iter()
                    .flat_map(|p| p.instances.iter())
                    .filter_map(|i| i.profile_name.as_deref()),
            );
        names
            .filter_map(|n| VgpuTypeName::parse(n).ok())
            .filter(|n| n.mig_slices.is_some())
            .find_map(|n| MigGeometry::for_vgpu_board(&n.board))
    };
    let geometry = device_id
        .and_then(MigGeometry::for_device)
        .or_else(named_board)?;
    let mut slots = MigSlots::new(geometry);
    // What the driver still lists beside the existing instances narrows where they sit.
    for p in parents.iter().flat_map(|p| p.profiles.iter()) {
        let (Some(slices), Some(fb)) = (p.mig_slices, p.framebuffer_mib) else {
            continue;
        };
        if p.reported_instances.unwrap_or(p.available_instances) == 0 {
            continue;
        }
        if let Some(mp) = geometry.profile_for(slices, fb) {
            if !slots.creatable.iter().any(|n| n == mp.name) {
                slots.creatable.push(mp.name.to_owned());
            }
        }
    }
    for s in sizes {
        let Some(slices) = s.mig_slices else { continue };
        match s
            .framebuffer_mib
            .and_then(|fb| geometry.profile_for(slices, fb))
        {
            Some(p) => slots.unplaced.push(p.name.to_owned()),
            None => slots.unplaced.push(format!("{slices}g of unknown memory")),
        }
    }
    Some(slots)
}

/// Builds the pool of one key from all its parents (published or not: the pool is the GPU's).
/// `None` when no type of these parents has a known framebuffer size. `device_id` is the PCI
/// device ID of the physical GPU, when known.
pub(crate) fn build(
    key: &ParentId,
    parents: &[&Parent],
    device_id: Option<u16>,
) -> Option<BuiltPool> {
    let profiles: Vec<&Profile> = parents.iter().flat_map(|p| p.profiles.iter()).collect();
    let sizes: Vec<InstanceSize> = parents
        .iter()
        .flat_map(|p| p.instances.iter())
        .map(|i| instance_size(parents, i))
        .collect();

    let time_sliced = profiles
        .iter()
        .filter(|p| p.mig_slices.is_none())
        .filter_map(|p| p.framebuffer_mib.map(|fb| (p, fb)));
    let mut total_from_types: u64 = 0;
    let mut exact = false;
    let mut largest_creatable: u64 = 0;
    let mut any_size = false;
    for (p, fb) in time_sliced {
        any_size = true;
        let whole = match p.max_instances {
            Some(m) => {
                exact = true;
                fb.saturating_mul(u64::from(m))
            }
            None => fb,
        };
        total_from_types = total_from_types.max(whole);
        if p.reported_instances.unwrap_or(p.available_instances) > 0 {
            largest_creatable = largest_creatable.max(fb);
        }
    }
    let ts_instances: Vec<u64> = sizes
        .iter()
        .filter(|s| s.mig_slices.is_none())
        .filter_map(|s| s.framebuffer_mib)
        .collect();
    let used_mib: u64 = ts_instances.iter().sum();
    if sizes.is_empty() {
        // With nothing created, every type is still listed and the largest is the whole card.
        exact = true;
    }
    let mig_types: Vec<u8> = profiles.iter().filter_map(|p| p.mig_slices).collect();
    let mig_used: u8 = sizes
        .iter()
        .filter_map(|s| s.mig_slices)
        .fold(0u8, |a, b| a.saturating_add(b));
    any_size |= !mig_types.is_empty() || !ts_instances.is_empty();
    if !any_size {
        return None;
    }
    // A MIG-backed type's memory is a share of the card: the largest one bounds it from below
    // when time-sliced types are not listed (a GPU in MIG use lists only MIG-backed types).
    let largest_mig_fb = profiles
        .iter()
        .filter(|p| p.mig_slices.is_some())
        .filter_map(|p| p.framebuffer_mib)
        .max()
        .unwrap_or(0);
    let total_mib =
        total_from_types
            .max(largest_mig_fb)
            .max(used_mib)
            .max(if largest_creatable > 0 {
                used_mib.saturating_add(largest_creatable)
            } else {
                0
            });
    let mut distinct = ts_instances.clone();
    distinct.sort_unstable();
    distinct.dedup();
    // Instances of two sizes on one GPU can only exist in mixed-size mode.
    let mixed_size = distinct.len() > 1;
    let size_locked_mib = match (mixed_size, distinct.first()) {
        (false, Some(s)) => Some(*s),
        _ => None,
    };
    let mut slots = None;
    let (mig_slices_total, mig_slices_used) = if mig_types.is_empty() && mig_used == 0 {
        (None, None)
    } else {
        slots = mig_slots(device_id, parents, &sizes);
        // A MIG type's slices times its per-GPU maximum is the card (1g × 7 on H100/H200).
        let largest = profiles
            .iter()
            .filter_map(|p| {
                p.mig_slices.map(|s| {
                    s.saturating_mul(
                        p.max_instances
                            .map_or(1, |m| u8::try_from(m).unwrap_or(u8::MAX)),
                    )
                })
            })
            .max()
            .unwrap_or(0);
        let creatable_largest = profiles
            .iter()
            .filter(|p| p.reported_instances.unwrap_or(p.available_instances) > 0)
            .filter_map(|p| p.mig_slices)
            .max()
            .unwrap_or(0);
        let total = largest.max(mig_used).max(if creatable_largest > 0 {
            mig_used.saturating_add(creatable_largest)
        } else {
            0
        });
        (Some(total), Some(mig_used))
    };
    Some(BuiltPool {
        pool: Pool {
            gpu: key.clone(),
            parents: parents.iter().map(|p| p.id.clone()).collect(),
            total_mib,
            used_mib,
            size_locked_mib,
            mixed_size,
            mig_slices_total,
            mig_slices_used,
            mig_slots: slots,
        },
        exact,
    })
}

/// Builds every pool and caps each profile's `availableInstances` by its pool. Profiles whose
/// `device_api` is not `vfio-pci` cannot go to a VM and get 0. Returns the pools and, per pool
/// key, whether its total is exact. `gpus` give the physical GPUs' device IDs (MIG geometry).
pub(crate) fn build_all(
    parents: &mut [Parent],
    gpus: &[Gpu],
) -> (Vec<Pool>, BTreeMap<ParentId, bool>) {
    let mut keys: BTreeMap<ParentId, Vec<usize>> = BTreeMap::new();
    for (i, p) in parents.iter().enumerate() {
        keys.entry(p.pool_key()).or_default().push(i);
    }
    let mut pools = Vec::new();
    let mut exactness = BTreeMap::new();
    for (key, idxs) in &keys {
        let built = {
            let members: Vec<&Parent> = idxs.iter().map(|i| &parents[*i]).collect();
            let device_id = match key {
                ParentId::Pci(a) => gpus.iter().find(|g| g.address == *a).map(|g| g.device_id.0),
                ParentId::Named(_) => None,
            };
            build(key, &members, device_id)
        };
        for i in idxs {
            for prof in &mut parents[*i].profiles {
                let reported = prof.reported_instances.unwrap_or(prof.available_instances);
                let cap = built.as_ref().map_or(u32::MAX, |b| b.pool.creatable(prof));
                prof.available_instances = if prof.device_api == "vfio-pci" {
                    reported.min(cap)
                } else {
                    0
                };
            }
        }
        if let Some(b) = built {
            exactness.insert(key.clone(), b.exact);
            pools.push(b.pool);
        }
    }
    (pools, exactness)
}

/// True when the parents of a pool use the vendor-specific VFIO framework.
pub(crate) fn is_vendor_vfio(parents: &[Parent], key: &ParentId) -> bool {
    parents
        .iter()
        .any(|p| p.pool_key() == *key && p.framework == VgpuFramework::VendorVfio)
}
