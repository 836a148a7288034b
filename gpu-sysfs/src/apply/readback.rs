//! Where the driver put each MIG-backed vGPU, read back after its write.
//!
//! The plan orders a GPU's MIG-backed creations so that the driver's documented placement (each
//! new GPU instance at the lowest free allowed start of its profile) reaches a valid layout.
//! Where a type-name source reports GPU instances (NVML on a real host), the placement the
//! driver actually chose is read after each such write, and the rest of that GPU's creations are
//! checked against it: kept in order when they still land, put in another order that lands when
//! one exists, and otherwise the apply stops before the next write (and rolls back) rather than
//! making a write that could no longer fit.

use gpu_core::layout::Step;
use gpu_core::mig::{MigGeometry, MigOccupancy, MigProfile};
use gpu_core::nvidia::VgpuTypeName;
use gpu_core::{NodeTopology, ParentId, PciAddress, VgpuFramework};

use super::{ApplyOptions, describe};
use crate::resolver::GpuInstances;

/// The physical GPU and the GPU-instance profile of a MIG-backed vendor-VFIO creation.
fn mig_create(
    topo: &NodeTopology,
    step: &Step,
) -> Option<(PciAddress, &'static MigGeometry, &'static MigProfile)> {
    let Step::Create {
        gpu: ParentId::Pci(pf),
        instance,
    } = step
    else {
        return None;
    };
    if instance.framework != VgpuFramework::VendorVfio {
        return None;
    }
    let name = VgpuTypeName::parse(instance.type_name.as_deref()?).ok()?;
    let slices = name.mig_slices?;
    let geometry = topo
        .gpu_by_address(pf)
        .and_then(|g| MigGeometry::for_device(g.device_id.0))
        .or_else(|| MigGeometry::for_vgpu_board(&name.board))?;
    let profile = geometry.profile_for(slices, name.framebuffer_mib())?;
    Some((*pf, geometry, profile))
}

/// Why the creations still to come on a GPU can no longer be written, after the placement the
/// driver chose was read back.
#[derive(Debug, thiserror::Error)]
pub(super) enum Readback {
    /// NVML reports a GPU instance at a placement the product does not have.
    #[error(
        "after {written}: NVML reports GPU instance {id} of {pf} ({compute} compute slices at \
         memory slice {start} over {size}), which no {product} placement has; stopped before the \
         next write"
    )]
    UnknownPlacement {
        written: String,
        id: u32,
        pf: PciAddress,
        compute: u32,
        start: u32,
        size: u32,
        product: &'static str,
    },
    /// The creations still to come fit in no order around what the driver placed.
    #[error(
        "after {written}: the driver placed the GPU instances of {pf} at {shown} (read back \
         through NVML), where the {count} still to create ({names}) fit in no order; stopped \
         before writing them"
    )]
    NoOrder {
        written: String,
        pf: PciAddress,
        shown: String,
        count: usize,
        names: String,
    },
}

/// After step `done` (just written), re-checks the MIG-backed creations still to come on the
/// same GPU against the placements the resolver reports, reordering them in `steps` when
/// another order lands.
///
/// # Errors
/// Why the rest can no longer be written, naming the placements read back.
pub(super) fn recheck(
    topo: &NodeTopology,
    opts: &ApplyOptions,
    steps: &mut [Step],
    done: usize,
) -> Result<(), Readback> {
    let Some(resolver) = opts.discover.resolver.as_ref() else {
        return Ok(());
    };
    let Some((pf, geometry, _)) = steps.get(done).and_then(|s| mig_create(topo, s)) else {
        return Ok(());
    };
    let rest: Vec<(usize, &'static MigProfile)> = steps
        .iter()
        .enumerate()
        .skip(done + 1)
        .filter_map(|(i, s)| {
            mig_create(topo, s)
                .filter(|(g, _, _)| *g == pf)
                .map(|(_, _, p)| (i, p))
        })
        .collect();
    if rest.is_empty() {
        return Ok(());
    }
    let GpuInstances::Known(instances) = resolver.gpu_instances(&pf) else {
        return Ok(());
    };
    let written = describe(&steps[done]);
    let mut occupied = MigOccupancy::empty();
    let mut shown = Vec::new();
    for gi in &instances {
        let profile = geometry.profiles.iter().find(|p| {
            u32::from(p.compute_slices) == gi.compute_slices
                && u32::from(p.memory_slices) == gi.size
        });
        let start = u8::try_from(gi.start).ok();
        match (profile, start) {
            (Some(p), Some(s)) if p.starts.contains(&s) && occupied.is_free(s, p) => {
                occupied.hold(s, p);
                shown.push(format!("{} at {s}", p.name));
            }
            _ => {
                return Err(Readback::UnknownPlacement {
                    written,
                    id: gi.id,
                    pf,
                    compute: gi.compute_slices,
                    start: gi.start,
                    size: gi.size,
                    product: geometry.product,
                });
            }
        }
    }
    let new: Vec<&MigProfile> = rest.iter().map(|(_, p)| *p).collect();
    let lands = |order: &[usize]| {
        let mut occ = occupied;
        order.iter().all(|&i| match geometry.fits(occ, new[i]) {
            Some(s) => {
                occ.hold(s, new[i]);
                true
            }
            None => false,
        })
    };
    let planned: Vec<usize> = (0..new.len()).collect();
    if lands(&planned) {
        return Ok(());
    }
    let Some(order) = geometry.creation_order(&[occupied], &new) else {
        let names: Vec<&str> = new.iter().map(|p| p.name).collect();
        return Err(Readback::NoOrder {
            written,
            pf,
            shown: shown.join(", "),
            count: new.len(),
            names: names.join(", "),
        });
    };
    let moved: Vec<Step> = order.iter().map(|&i| steps[rest[i].0].clone()).collect();
    for ((at, _), step) in rest.iter().zip(moved) {
        steps[*at] = step;
    }
    Ok(())
}
