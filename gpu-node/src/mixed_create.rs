//! The hook of mixed-size placement ([`crate::mixed`]) into the one writer's create
//! ([`crate::Node::create_vgpu`]), for a [`crate::Node`] given NVML
//! ([`crate::Node::with_mixed_sizes`]).
//!
//! On a GPU whose driver answers the mixed-size mode question (`nvmlDeviceGetVgpuHeterogeneousMode`;
//! `NOT_SUPPORTED` or a GPU NVML does not know keeps today's one-size rule):
//! - already in mixed-size mode: the type's placement is planned on the slot model; a mix that
//!   does not fit is refused naming the type and the placements left, before any write;
//! - in same-size mode with vGPUs of another size: refused (the mode changes only on an idle GPU);
//! - in same-size mode and idle: nothing changes unless the operator asked for mixed sizes
//!   (`turn_on`, [`crate::Node::mixed_sizes_on_request`]); then the mode is turned on under the
//!   lock just before the type write, or the create is refused naming why NVIDIA's rules do
//!   not allow it (the scheduler configured and the ones allowed, a GPU without the mode).
//!
//! Everything here reads; [`crate::mixed::turn_on`] is the one NVML write, made by the caller.

use gpu_core::{ParentId, PciAddress};
use gpu_nvml::{NvmlDevices, VgpuMode};
use gpu_sysfs::Host;
use gpu_sysfs::actuate::{self, Created};

use crate::NodeError;
use crate::mixed::{self, MixedError, PlacementPlan, ask};
use crate::probe::Probe;

fn boxed(e: MixedError) -> NodeError {
    NodeError::Mixed(Box::new(e))
}

/// The GPU of `addr`: its physical function when `addr` is a VF, else `addr`.
pub(crate) fn gpu_of(host: &dyn Host, addr: &PciAddress) -> PciAddress {
    host.read_link(&format!("sys/bus/pci/devices/{addr}/physfn"))
        .ok()
        .and_then(|p| p.file_name()?.to_str()?.parse().ok())
        .unwrap_or(*addr)
}

/// Whether the driver's type name (`NVIDIA L40S-12Q`) is the profile asked for (`L40S-12Q`,
/// or the full name).
fn names(driver: &str, profile: &str) -> bool {
    driver == profile || driver.strip_prefix("NVIDIA ") == Some(profile)
}

/// What a create of `profile` on `parent` must do first on a GPU in (or going to) mixed-size
/// mode: `None` where today's one-size rule applies unchanged. Reads only.
///
/// # Errors
/// [`NodeError::Mixed`]: a mix that does not fit ([`MixedError::NoPlacement`]), another size
/// beside vGPUs on a same-size GPU ([`MixedError::InUse`]), a scheduler that forbids it, an
/// NVML question that failed; [`NodeError::List`] when the host's vGPUs cannot be listed.
pub(crate) fn check(
    host: &dyn Host,
    nvml: &dyn NvmlDevices,
    parent: &ParentId,
    profile: &str,
    turn_on: bool,
) -> Result<Option<PlacementPlan>, NodeError> {
    let ParentId::Pci(addr) = parent else {
        return Ok(None);
    };
    let gpu = gpu_of(host, addr);
    let mode = match nvml.vgpu_heterogeneous_mode(&gpu) {
        Ok(m) => m,
        Err(e) if e.is_not_applicable() && turn_on => {
            return Err(boxed(MixedError::Unsupported { gpu }));
        }
        Err(e) if e.is_not_applicable() => {
            return Ok(None);
        }
        Err(source) => {
            return Err(boxed(MixedError::Nvml {
                gpu,
                step: "reading the vGPU size mode",
                source,
            }));
        }
    };
    let types = ask(&gpu, "listing vGPU types", nvml.vgpu_supported_types(&gpu)).map_err(boxed)?;
    let Some(wanted) = types.iter().find(|t| names(&t.name, profile)) else {
        // A profile NVML does not list here: choosing the target refuses it as today.
        return Ok(None);
    };
    let typed = typed_on(host, &gpu)?;
    let active = ask(&gpu, "listing running vGPUs", nvml.active_vgpus(&gpu)).map_err(boxed)?;
    let size_of = |id: u32| {
        nvml.vgpu_type_supported_placements(&gpu, id, VgpuMode::Heterogeneous)
            .ok()
            .map(|p| p.placement_size)
    };
    let want = size_of(wanted.id);
    let present: Vec<u32> = typed
        .iter()
        .map(|(t, _)| *t)
        .chain(active.iter().map(|v| v.type_id))
        .collect();
    let other_size = present.iter().any(|t| size_of(*t) != want);
    if mode == VgpuMode::Homogeneous && !other_size {
        if !present.is_empty() {
            // Same size beside same size: today's rule.
            return Ok(None);
        }
        // Idle: the one moment the mode can change, and only when asked. Where NVIDIA's rules
        // do not allow it (the scheduler, no mixed-size placement for the type), refused.
        if !turn_on {
            return Ok(None);
        }
    }
    mixed::plan_with(nvml, &gpu, wanted.id, &typed)
        .map(Some)
        .map_err(boxed)
}

/// Each VF of `gpu` given a type: (type ID, the placement the VF reports).
///
/// # Errors
/// [`NodeError::List`] when the host's vGPUs cannot be listed.
pub(crate) fn typed_on(
    host: &dyn Host,
    gpu: &PciAddress,
) -> Result<Vec<(u32, Option<u32>)>, NodeError> {
    let listing = actuate::list_vgpus(host).map_err(|e| NodeError::List(Box::new(e)))?;
    Ok(listing
        .vendor_vfio
        .iter()
        .filter(|v| v.pf == Some(*gpu))
        .filter_map(|v| Some((v.type_id.vendor_vfio_number()?, v.placement_id)))
        .collect())
}

/// After the type write: the placement the VF reports (`nvidia/placement_id`, read back into
/// the create's answer) must be one the plan found free for the type; the driver places the
/// vGPU itself, so another free one than gpuslice's choice is the driver's word, not an error.
/// A VF that reports none leaves it unknown (never guessed); NVML's running vGPU is checked by
/// [`mixed::check_placed`] once a VM starts it.
///
/// # Errors
/// [`MixedError::ReadBack`] naming the placement found.
pub(crate) fn read_back(
    host: &dyn Host,
    plan: &PlacementPlan,
    made: &Created,
) -> Result<(), NodeError> {
    let Created::VendorVfio(set) = made else {
        return Ok(());
    };
    match actuate::vendor::placement_id(host, &set.vf) {
        Some(found) if found != plan.placement_id && !plan.free.contains(&found) => {
            Err(boxed(MixedError::ReadBack {
                gpu: plan.gpu,
                type_id: plan.type_id,
                wanted: plan.placement_id,
                found: Some(found),
            }))
        }
        _ => Ok(()),
    }
}

/// Without NVML: when a create of `profile` on the GPU `parent` names would be refused and the
/// GPU holds vGPUs of another size (by their type names), that refusal saying why mixing sizes
/// was not tried ([`MixedError::OneSize`]). `None` otherwise: the create goes on as it would.
/// Reads only (the target is chosen on a [`Probe`]).
pub(crate) fn one_size_refusal(
    host: &dyn Host,
    parent: &ParentId,
    profile: &str,
) -> Option<NodeError> {
    let ParentId::Pci(addr) = parent else {
        return None;
    };
    let gpu = gpu_of(host, addr);
    // Time-sliced types only: MIG-backed ones take GPU-instance slices, not one size.
    let size = |name: &str| {
        gpu_core::nvidia::VgpuTypeName::parse(name)
            .ok()
            .filter(|n| n.mig_slices.is_none())
            .map(|n| n.framebuffer_mib())
    };
    let want = size(profile)?;
    let listing = actuate::list_vgpus(host).ok()?;
    let mut present: Vec<u64> = listing
        .vendor_vfio
        .iter()
        .filter(|v| v.pf == Some(gpu))
        .filter_map(|v| size(v.type_name.as_deref()?))
        .collect();
    present.sort_unstable();
    present.dedup();
    if present.iter().all(|s| *s == want) {
        return None;
    }
    let probe = Probe::new(host);
    // A PCI parent is never resolved by name.
    let refusal = crate::target::choose_target::<NodeError>(&probe, parent, profile, None, |_| {
        Err(NodeError::Unnamed {
            parent: parent.clone(),
        })
    })
    .err()?;
    let present = present
        .iter()
        .map(|s| format!("{s} MiB"))
        .collect::<Vec<_>>()
        .join(", ");
    Some(NodeError::Mixed(Box::new(MixedError::OneSize {
        gpu,
        present,
        refusal: Box::new(refusal),
    })))
}
