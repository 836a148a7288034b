//! Framebuffer pools per physical GPU, and the capping of every profile's count by its pool.
//!
//! The driver's per-parent counts overstate capacity on SR-IOV GPUs: on the A2 capture 13 free VFs
//! each report one more 4 GB vGPU although only one more fits on the card. The pool is the truth:
//! a profile's `availableInstances` is `min(reportedInstances, pool.creatable(profile))`, and a
//! consumer that places several vGPUs charges the pool (gpu-core's `Pool::charge`) for each, never
//! the per-parent counts.

use std::collections::BTreeMap;

use gpu_core::{
    Gpu, MigGeometry, MigOccupancy, MigPlaced, MigProfile, MigSlots, Parent, ParentId, Pool,
    Profile, VgpuFramework, nvidia::VgpuTypeName,
};

use super::parse;
use crate::resolver::{GpuInstancePlacement, GpuInstances, TypeNameResolver};

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
/// ID, else by the board of its MIG-backed type names).
///
/// Where NVML reports the GPU's GPU instances (`nvml`, [`GpuInstances::Known`]) and they agree
/// with sysfs (each MIG-backed vGPU has a GPU instance of its profile and each GPU instance a
/// vGPU, every placement is one the geometry allows, and every type the driver still lists has
/// a free start beside them), the slots hold exactly those placements. Otherwise the existing
/// MIG-backed vGPUs hold GPU instances whose start sysfs does not show: each is recorded with an
/// unknown start, and a new one then fits only where it fits beside every placement they could
/// have in which the types the driver still lists (`creatable`) have a start too. An instance
/// whose profile cannot be told is recorded by what is known of it, so that the slots cannot be
/// established and MIG-backed types are refused there rather than guessed. Why NVML's
/// placements were not used, when it answered, goes to `notes` (the GPU's warnings). The flag is
/// true when the slots are NVML's exact placements.
/// A GPU with MIG-backed types whose board gpuslice has no geometry for: its slots are those
/// of that board, so that every MIG-backed type is refused ("no MIG geometry is known") rather
/// than planned by compute slices past the GPU's memory slices. `None` when no type names a
/// board.
fn unknown_board(parents: &[&Parent], notes: &mut Vec<String>) -> Option<(MigSlots, bool)> {
    let board = parents
        .iter()
        .flat_map(|p| {
            p.profiles
                .iter()
                .map(|pr| pr.name.as_str())
                .chain(p.instances.iter().filter_map(|i| i.profile_name.as_deref()))
        })
        .filter_map(|n| VgpuTypeName::parse(n).ok())
        .find(|n| n.mig_slices.is_some())?
        .board;
    notes.push(format!(
        "no MIG geometry is known for board {board:?}: its MIG-backed types are not planned (their memory slices cannot be counted)"
    ));
    Some((
        MigSlots {
            board,
            placed: Vec::new(),
            unplaced: Vec::new(),
            creatable: Vec::new(),
            pending: Vec::new(),
        },
        false,
    ))
}

fn mig_slots(
    device_id: Option<u16>,
    parents: &[&Parent],
    sizes: &[InstanceSize],
    nvml: Option<&dyn Fn() -> GpuInstances>,
    notes: &mut Vec<String>,
) -> Option<(MigSlots, bool)> {
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
    let Some(geometry) = device_id
        .and_then(MigGeometry::for_device)
        .or_else(named_board)
    else {
        return unknown_board(parents, notes);
    };
    let mut slots = MigSlots::new(geometry);
    // What the driver still lists beside the existing instances narrows where they sit.
    let mut still_listed: Vec<&'static MigProfile> = Vec::new();
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
                still_listed.push(mp);
            }
        }
    }
    // Each existing MIG-backed vGPU: its profile when its size tells it, else its slice count.
    let existing: Vec<(u8, Option<&'static MigProfile>)> = sizes
        .iter()
        .filter_map(|s| {
            let slices = s.mig_slices?;
            let profile = s
                .framebuffer_mib
                .and_then(|fb| geometry.profile_for(slices, fb));
            Some((slices, profile))
        })
        .collect();
    // The lists and the held types must agree: a list that offers what no placement beside the
    // held instances leaves room for (a 7g listed beside a 1g) contradicts them. Say so, name
    // the VFs and both readings, and keep what exists: the lists are not used to narrow.
    let known: Vec<&'static MigProfile> = existing.iter().filter_map(|(_, p)| *p).collect();
    if !known.is_empty()
        && known.len() == existing.len()
        && !still_listed.is_empty()
        && geometry
            .placements_of(MigOccupancy::empty(), &known, &still_listed)
            .is_empty()
    {
        let held: Vec<String> = parents
            .iter()
            .flat_map(|p| {
                p.instances.iter().map(move |i| {
                    format!(
                        "VF {} holds {} ({})",
                        p.id,
                        i.profile_name.as_deref().unwrap_or("?"),
                        i.profile
                    )
                })
            })
            .collect();
        let listing: Vec<String> = parents
            .iter()
            .filter(|p| {
                p.profiles.iter().any(|pr| {
                    pr.mig_slices.is_some()
                        && pr.reported_instances.unwrap_or(pr.available_instances) > 0
                })
            })
            .map(|p| p.id.to_string())
            .collect();
        let shown = |v: &[String]| match v.len() {
            0..=3 => v.join(", "),
            n => format!("{} and {} more", v[..3].join(", "), n - 3),
        };
        let names: Vec<&str> = still_listed.iter().map(|m| m.name).collect();
        notes.push(format!(
            "MIG slots: sysfs contradicts itself: {}, yet VF {} still list(s) types needing {} \
             beside them, which no placement leaves room for; the lists are not used and the \
             existing instances are kept, held wherever they may sit",
            shown(&held),
            shown(&listing),
            names.join(", ")
        ));
        slots.creatable.clear();
        still_listed.clear();
    }
    let fallback = "each MIG-backed vGPU is held wherever it may sit";
    match nvml.map(|read| read()) {
        Some(GpuInstances::Known(instances)) => {
            match exact_placements(geometry, &instances, &existing, &still_listed) {
                Ok(exact) => {
                    slots.placed = exact;
                    return Some((slots, true));
                }
                Err(why) => notes.push(format!(
                    "MIG slots: NVML's GPU-instance placements disagree with sysfs ({why}); \
                     {fallback}"
                )),
            }
        }
        Some(GpuInstances::Failed(why)) => notes.push(format!(
            "MIG slots: NVML could not list the GPU instances ({why}); {fallback}"
        )),
        Some(GpuInstances::Unsupported(_)) | None => {}
    }
    for (slices, profile) in existing {
        match profile {
            Some(p) => slots.unplaced.push(p.name.to_owned()),
            None => slots.unplaced.push(format!("{slices}g of unknown memory")),
        }
    }
    Some((slots, false))
}

/// How NVML's GPU-instance placements disagree with what sysfs shows (said in a discovery note).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
enum Disagreement {
    /// A GPU instance whose compute and memory slices match no profile of the product.
    #[error(
        "GPU instance {id} has {compute_slices} compute slices over {memory_slices} memory \
         slices, which no {product} profile has"
    )]
    NoProfile {
        id: u32,
        compute_slices: u32,
        memory_slices: u32,
        product: &'static str,
    },
    /// A GPU instance at a start its profile does not allow, or over another one.
    #[error(
        "GPU instance {id} ({profile}) at memory slice {start} is not an allowed start or \
         overlaps another"
    )]
    BadStart {
        id: u32,
        profile: &'static str,
        start: u32,
    },
    /// The MIG-backed vGPUs and the GPU instances do not pair off (`summary` lists both).
    #[error("{summary}")]
    Unpaired { summary: String },
    /// GPU instances are left over once every vGPU has one.
    #[error(
        "{summary}; {left} GPU instance(s) hold no MIG-backed vGPU, and whether a new vGPU \
         takes one or needs a GPU instance of its own is the driver's choice"
    )]
    Unused { summary: String, left: usize },
    /// A type the driver still lists has no free start beside the placements.
    #[error("the driver still lists a {profile} type, which has no free start beside them")]
    StillListed { profile: &'static str },
}

/// The GPU instances NVML reports as placements of `geometry`'s profiles, when they agree with
/// what sysfs shows: each placement is an allowed start of a profile of its compute and memory
/// slices and overlaps no other, the `existing` MIG-backed vGPUs and the GPU instances pair off
/// by profile (by slice count where a vGPU's memory is not known), and each profile the driver
/// still lists (`still_listed`) has a free start beside them.
///
/// # Errors
/// The [`Disagreement`] found first.
fn exact_placements(
    geometry: &MigGeometry,
    instances: &[GpuInstancePlacement],
    existing: &[(u8, Option<&'static MigProfile>)],
    still_listed: &[&'static MigProfile],
) -> Result<Vec<MigPlaced>, Disagreement> {
    let mut occupied = MigOccupancy::empty();
    let mut placed: Vec<(&'static MigProfile, u8)> = Vec::new();
    for gi in instances {
        let profile = geometry.profiles.iter().find(|p| {
            u32::from(p.compute_slices) == gi.compute_slices
                && u32::from(p.memory_slices) == gi.size
        });
        let Some(profile) = profile else {
            return Err(Disagreement::NoProfile {
                id: gi.id,
                compute_slices: gi.compute_slices,
                memory_slices: gi.size,
                product: geometry.product,
            });
        };
        let start = u8::try_from(gi.start)
            .ok()
            .filter(|s| profile.starts.contains(s));
        let Some(start) = start.filter(|s| occupied.is_free(*s, profile)) else {
            return Err(Disagreement::BadStart {
                id: gi.id,
                profile: profile.name,
                start: gi.start,
            });
        };
        occupied.hold(start, profile);
        placed.push((profile, start));
    }
    let mut unmatched: Vec<usize> = (0..placed.len()).collect();
    let summary = |existing: &[(u8, Option<&MigProfile>)]| {
        let shown: Vec<String> = existing
            .iter()
            .map(|(s, p)| p.map_or_else(|| format!("{s}g"), |p| p.name.to_owned()))
            .collect();
        let reported: Vec<String> = placed
            .iter()
            .map(|(p, s)| format!("{} at {s}", p.name))
            .collect();
        format!(
            "sysfs shows {} MIG-backed vGPU(s) [{}], NVML {} GPU instance(s) [{}]",
            existing.len(),
            shown.join(", "),
            placed.len(),
            reported.join(", ")
        )
    };
    for (slices, profile) in existing {
        let hit = unmatched.iter().position(|i| match profile {
            Some(want) => placed[*i].0.name == want.name,
            None => placed[*i].0.compute_slices == *slices,
        });
        match hit {
            Some(k) => {
                unmatched.remove(k);
            }
            None => {
                return Err(Disagreement::Unpaired {
                    summary: summary(existing),
                });
            }
        }
    }
    if !unmatched.is_empty() {
        // A GPU instance without a vGPU (created ahead, as the vGPU setup guides do) may be
        // the one a new vGPU of its profile takes, or hold slots a new one cannot: that is the
        // driver's choice, so neither is assumed.
        return Err(Disagreement::Unused {
            summary: summary(existing),
            left: unmatched.len(),
        });
    }
    if let Some(p) = still_listed
        .iter()
        .find(|p| geometry.fits(occupied, p).is_none())
    {
        return Err(Disagreement::StillListed { profile: p.name });
    }
    Ok(placed
        .into_iter()
        .map(|(p, start)| MigPlaced {
            profile: p.name.to_owned(),
            start,
        })
        .collect())
}

/// Builds the pool of one key from all its parents (published or not: the pool is the GPU's).
/// `None` when no type of these parents has a known framebuffer size. `device_id` is the PCI
/// device ID of the physical GPU, when known; `nvml` reads its GPU instances, asked only for a
/// MIG-capable GPU. Notes on the MIG slots go to `notes`.
pub(crate) fn build(
    key: &ParentId,
    parents: &[&Parent],
    device_id: Option<u16>,
    nvml: Option<&dyn Fn() -> GpuInstances>,
    notes: &mut Vec<String>,
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
    // What one parent can still take of one type: its count times the type's size (the
    // per-parent counts of one GPU's VFs are each 0 or 1, so this never adds parents up).
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
        let count = p.reported_instances.unwrap_or(p.available_instances);
        largest_creatable = largest_creatable.max(fb.saturating_mul(u64::from(count)));
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
    let mut total_mib =
        total_from_types
            .max(largest_mig_fb)
            .max(used_mib)
            .max(if largest_creatable > 0 {
                used_mib.saturating_add(largest_creatable)
            } else {
                0
            });
    // A product whose MIG geometry is known by its device ID has its memory on record: the
    // profile that takes the whole GPU (7g.141gb on an H200) is the card, whatever is in use.
    let product = device_id.and_then(MigGeometry::for_device);
    if let Some(whole) = product.and_then(|g| {
        g.profiles
            .iter()
            .find(|p| p.compute_slices == g.compute_slices)
    }) {
        total_mib = total_mib.max(u64::from(whole.memory_gb).saturating_mul(1024));
        exact = true;
    }
    let mut distinct = ts_instances.clone();
    distinct.sort_unstable();
    distinct.dedup();
    // Instances of two sizes on one GPU can only exist in mixed-size mode. The same-size rule
    // is NVIDIA's: the kernel's sample drivers (mbochs) mix sizes freely.
    let nvidia = parents
        .iter()
        .any(|p| p.framework == VgpuFramework::VendorVfio)
        || profiles
            .iter()
            .any(|p| VgpuTypeName::parse(&p.name).is_ok());
    let mixed_size = distinct.len() > 1 || !nvidia;
    let size_locked_mib = match (mixed_size, distinct.first()) {
        (false, Some(s)) => Some(*s),
        _ => None,
    };
    let mut slots = None;
    let (mig_slices_total, mig_slices_used) = if mig_types.is_empty() && mig_used == 0 {
        (None, None)
    } else {
        let read = mig_slots(device_id, parents, &sizes, nvml, notes);
        // With every GPU instance placed by NVML, the product's compute slices are the total;
        // otherwise what the lists show is a lower bound.
        let exact_total = read
            .as_ref()
            .filter(|(_, exact)| *exact)
            .and_then(|(s, _)| s.geometry().ok())
            .map(|g| g.compute_slices);
        slots = read.map(|(s, _)| s);
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
        let total = largest
            .max(mig_used)
            .max(if creatable_largest > 0 {
                mig_used.saturating_add(creatable_largest)
            } else {
                0
            })
            .max(exact_total.unwrap_or(0))
            .max(product.map_or(0, |g| g.compute_slices));
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
            mig_slots: slots.map(std::sync::Arc::new),
        },
        exact,
    })
}

/// Every pool of a host, whether each total is exact, and the notes on each GPU's MIG slots.
pub(crate) struct BuiltPools {
    /// The pools.
    pub pools: Vec<Pool>,
    /// Per pool key, whether its total is exact.
    pub exact: BTreeMap<ParentId, bool>,
    /// Per physical GPU, why NVML's GPU-instance placements were not used, where NVML answered.
    pub notes: BTreeMap<gpu_core::PciAddress, Vec<String>>,
}

/// Builds every pool and caps each profile's `availableInstances` by its pool. Profiles whose
/// `device_api` is not `vfio-pci` cannot go to a VM and get 0. `gpus` give the physical GPUs'
/// device IDs (MIG geometry); `resolver` (NVML) the GPU instances of MIG-enabled ones.
pub(crate) fn build_all(
    parents: &mut [Parent],
    gpus: &[Gpu],
    resolver: Option<&dyn TypeNameResolver>,
) -> BuiltPools {
    let mut keys: BTreeMap<ParentId, Vec<usize>> = BTreeMap::new();
    for (i, p) in parents.iter().enumerate() {
        keys.entry(p.pool_key()).or_default().push(i);
    }
    let mut pools = Vec::new();
    let mut exactness = BTreeMap::new();
    let mut all_notes = BTreeMap::new();
    for (key, idxs) in &keys {
        let built = {
            let members: Vec<&Parent> = idxs.iter().map(|i| &parents[*i]).collect();
            let gpu = match key {
                ParentId::Pci(a) => gpus.iter().find(|g| g.address == *a),
                ParentId::Named(_) => None,
            };
            let read = gpu.and_then(|g| {
                let r = resolver?;
                let address = g.address;
                Some(move || r.gpu_instances(&address))
            });
            let mut notes = Vec::new();
            let b = build(
                key,
                &members,
                gpu.map(|g| g.device_id.0),
                read.as_ref().map(|f| f as &dyn Fn() -> GpuInstances),
                &mut notes,
            );
            if let (Some(g), false) = (gpu, notes.is_empty()) {
                all_notes.insert(g.address, notes);
            }
            b
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
    BuiltPools {
        pools,
        exact: exactness,
        notes: all_notes,
    }
}

/// True when the parents of a pool use the vendor-specific VFIO framework.
pub(crate) fn is_vendor_vfio(parents: &[Parent], key: &ParentId) -> bool {
    parents
        .iter()
        .any(|p| p.pool_key() == *key && p.framework == VgpuFramework::VendorVfio)
}
