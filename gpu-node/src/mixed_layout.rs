//! Mixed sizes from a layout (`vgpu apply`; docs/partitions.md, "Mixed-size vGPUs"): an
//! NVIDIA-form entry with `mixed-sizes: true` may give its GPUs vGPUs of different sizes.
//!
//! Before the layout's first write, for every GPU the layout gives vGPUs:
//! - already in mixed-size mode (NVML says so): the whole mix the layout wants is placed on the
//!   driver's placement lattice ([`crate::mixed::lattice`], largest first, keep-most), and a mix
//!   that does not fit is refused naming the type and the placements left;
//! - in same-size mode, asked (`mixed-sizes: true`) and given more than one size: the checks of a
//!   create's turn-on ([`crate::mixed::plan_with`]: the mode supported, Best Effort or Equal
//!   Share scheduler, no vGPU on the GPU), the same fit; the mode is turned on only once every
//!   GPU passed, so a refusal writes nothing;
//! - otherwise nothing changes: the same-size rule holds.
//!
//! The GPUs in mixed-size mode are then planned without the same-size rule
//! ([`gpu_sysfs::apply::ApplyOptions::mixed_sizes`]); the driver places each vGPU (NVIDIA
//! documents no placement write on a vendor-VFIO VF).

use gpu_core::PciAddress;
use gpu_core::layout::{LayoutConfig, Mode, mixed_sizes_asked, wanted_counts};
use gpu_core::nvidia::VgpuTypeName;
use gpu_core::slots::{self, SlotChoice, SlotMask};
use gpu_nvml::{NvmlDevices, VgpuMode};
use gpu_sysfs::apply::ApplyOptions;

use crate::mixed::{self, MixedError, ask};
use crate::{Node, NodeError};

fn boxed(e: MixedError) -> NodeError {
    NodeError::Mixed(Box::new(e))
}

/// Whether the driver's type name (`NVIDIA L40S-12Q`) is the layout's (`L40S-12Q`).
fn names(driver: &str, wanted: &str) -> bool {
    gpu_core::nvidia::names_match(driver, wanted)
}

/// Places every vGPU of `want` (type name, count) on `gpu`'s lattice, largest first, each at the
/// start that keeps the most room (the final state the layout asks for).
///
/// # Errors
/// [`MixedError::NoPlacement`] naming the type that does not fit and the placements left;
/// what [`mixed::lattice`] answers.
pub(crate) fn fit(
    nvml: &dyn NvmlDevices,
    gpu: &PciAddress,
    want: &[(String, u32)],
) -> Result<(), MixedError> {
    let (shapes, width, on_lattice) = mixed::lattice(nvml, gpu)?;
    let mut runs: Vec<(usize, u32)> = want
        .iter()
        .filter_map(|(n, count)| Some((shapes.iter().position(|s| names(&s.name, n))?, *count)))
        .collect();
    runs.sort_by_key(|(i, _)| std::cmp::Reverse(shapes.get(*i).map_or(0, |s| s.size)));
    let mut mask = SlotMask::empty();
    for (i, count) in runs {
        let (Some(shape), Some(on)) = (shapes.get(i), on_lattice.get(i)) else {
            continue;
        };
        for _ in 0..count {
            match slots::choose(mask, width, on, &on_lattice, SlotChoice::KeepMost) {
                Ok(start) => mask.hold(start, on.size),
                Err(_) => {
                    return Err(MixedError::NoPlacement {
                        gpu: *gpu,
                        type_id: shape.id,
                        size: shape.size,
                        legal: shape.ids.clone(),
                        left: mixed::left(mask, &shapes, width),
                    });
                }
            }
        }
    }
    Ok(())
}

/// Distinct framebuffer sizes among the time-sliced types of `want`.
fn sizes(want: &[(String, u32)]) -> usize {
    let mut s: Vec<u64> = want
        .iter()
        .filter(|(_, c)| *c > 0)
        .filter_map(|(n, _)| VgpuTypeName::parse(n).ok())
        .filter(|n| n.mig_slices.is_none())
        .map(|n| n.framebuffer_mib())
        .collect();
    s.sort_unstable();
    s.dedup();
    s.len()
}

/// The step before a layout's writes: checks every GPU the layout gives vGPUs of several sizes,
/// turns mixed-size mode on where the layout asks and every check passed, and names the GPUs in
/// mixed-size mode in `opts`. Nothing without NVML, or for a clear.
///
/// # Errors
/// [`NodeError::Mixed`]: a mix that does not fit, a GPU that cannot turn to mixed-size mode (in
/// use, its scheduler, no support), an NVML question or the mode's write that failed.
pub(crate) fn before(
    node: &Node<'_>,
    config: &LayoutConfig,
    opts: &mut ApplyOptions,
) -> Result<(), NodeError> {
    let Some(nvml) = node.nvml_handle() else {
        return Ok(());
    };
    if opts.mode != Mode::Apply {
        return Ok(());
    }
    // What cannot be read or selected is left to the layout to report.
    let Ok(topo) = gpu_sysfs::apply::observe(node.host, &opts.discover) else {
        return Ok(());
    };
    let asked = mixed_sizes_asked(config, &topo).unwrap_or_default();
    let wants = wanted_counts(config, &topo).unwrap_or_default();
    let mut turn = Vec::new();
    for (gpu, want) in &wants {
        let mode = match nvml.vgpu_heterogeneous_mode(gpu) {
            Ok(m) => m,
            Err(e) if e.is_not_applicable() => {
                if asked.contains(gpu) && sizes(want) > 1 {
                    return Err(boxed(MixedError::Unsupported { gpu: *gpu }));
                }
                continue;
            }
            Err(source) => {
                return Err(boxed(MixedError::Nvml {
                    gpu: *gpu,
                    step: "reading the vGPU size mode",
                    source,
                }));
            }
        };
        match mode {
            VgpuMode::Heterogeneous => {
                fit(nvml, gpu, want).map_err(boxed)?;
                opts.mixed_sizes.insert(*gpu);
            }
            VgpuMode::Homogeneous if asked.contains(gpu) && sizes(want) > 1 => {
                let types = ask(gpu, "listing vGPU types", nvml.vgpu_supported_types(gpu))
                    .map_err(boxed)?;
                let Some(first) = want
                    .iter()
                    .find_map(|(n, _)| types.iter().find(|t| names(&t.name, n)))
                else {
                    continue;
                };
                let typed = crate::mixed_create::typed_on(node.host, gpu)?;
                let plan = mixed::plan_with(nvml, gpu, first.id, &typed).map_err(boxed)?;
                fit(nvml, gpu, want).map_err(boxed)?;
                turn.push(plan);
            }
            VgpuMode::Homogeneous => {}
        }
    }
    // Every GPU passed: the writes.
    for plan in turn {
        mixed::turn_on(nvml, &plan).map_err(boxed)?;
        opts.mixed_sizes.insert(plan.gpu);
    }
    Ok(())
}
