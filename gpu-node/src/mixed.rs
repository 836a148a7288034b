//! Mixed-size ("heterogeneous") vGPUs by placement: where a vGPU of a type goes on a GPU that
//! holds vGPUs of other sizes, and the mode that allows it.
//!
//! Everything is read from NVML, never from a table: whether the GPU supports mixed-size mode
//! (`nvmlDeviceGetVgpuHeterogeneousMode`), the scheduler it runs
//! (`nvmlDeviceGetVgpuSchedulerState`), each supported type's placement size and legal IDs
//! (`nvmlDeviceGetVgpuTypeSupportedPlacements`), what the driver still lists as creatable
//! (`...CreatablePlacements`) and where the running vGPUs sit (`nvmlVgpuInstanceGetPlacementId`).
//! The placements are runs on gpu-core's one slot model ([`gpu_core::slots`]), the same as MIG
//! GPU instances; the start is chosen to keep the most room for every size the GPU supports.
//!
//! The order NVIDIA documents is kept: the mode is turned on only where no vGPU runs (after the
//! VFs are enabled, before any type is written), and only under the Best Effort or Equal Share
//! scheduler (docs/partitions.md, "Mixed-size vGPUs"). Everything is checked before the one
//! write ([`turn_on`]); a refusal writes nothing.

use gpu_core::error::ClassifiedError;
use gpu_core::slots::{self, MAX_SLOTS, ShapeError, SlotChoice, SlotMask, SlotShape};
use gpu_core::{ErrorKind, PciAddress};
use gpu_nvml::{NvmlDevices, NvmlError, NvmlErrorKind, VgpuMode, VgpuScheduler};

/// Where a vGPU of a type goes on a GPU in mixed-size mode, and what must change first.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PlacementPlan {
    /// The GPU (physical function).
    pub gpu: PciAddress,
    /// The vGPU type ID.
    pub type_id: u32,
    /// The placement ID chosen (the first slot of its run).
    pub placement_id: u32,
    /// Slots the type's vGPU holds (`placementSize`).
    pub placement_size: u32,
    /// The GPU is in homogeneous mode with nothing running: mixed-size mode must be turned on
    /// first ([`turn_on`]).
    pub turn_mode_on: bool,
    /// Every legal placement of the type free when planned (the chosen one among them): the
    /// driver places the vGPU itself (NVIDIA documents no way to ask for a placement on a
    /// vendor-VFIO VF), so a read-back at any of them is the mix fitting as planned.
    pub free: Vec<u32>,
}

/// Why a vGPU cannot be placed by size on a GPU. Nothing was written.
#[derive(Debug, thiserror::Error)]
pub enum MixedError {
    /// An NVML question failed.
    #[error("GPU {gpu}: {step}")]
    Nvml {
        /// The GPU.
        gpu: PciAddress,
        /// What was asked.
        step: &'static str,
        /// NVML's answer.
        #[source]
        source: NvmlError,
    },
    /// The GPU or its driver has no mixed-size vGPU mode (or the GPU is in MIG mode).
    #[error(
        "GPU {gpu} does not support mixed-size vGPUs (NVML answers NOT_SUPPORTED); its vGPUs must all have one size"
    )]
    Unsupported {
        /// The GPU.
        gpu: PciAddress,
    },
    /// The configured scheduler is not one NVIDIA allows in mixed-size mode.
    #[error(
        "GPU {gpu} runs the {scheduler} vGPU scheduler; NVIDIA supports mixed-size vGPUs only under best effort or equal share: configure one of those (RmPVMRL) first"
    )]
    Scheduler {
        /// The GPU.
        gpu: PciAddress,
        /// The scheduler it runs.
        scheduler: VgpuScheduler,
    },
    /// The scheduler could not be read: it is not guessed.
    #[error(
        "GPU {gpu}: the vGPU scheduler cannot be read, so whether mixed-size mode is allowed is unknown"
    )]
    SchedulerUnknown {
        /// The GPU.
        gpu: PciAddress,
        /// NVML's answer.
        #[source]
        source: NvmlError,
    },
    /// Homogeneous mode with vGPUs running: the mode can change only on an idle GPU.
    #[error(
        "GPU {gpu} is in same-size mode with {running} vGPU(s) running; mixed-size mode can be turned on only where no vGPU runs"
    )]
    InUse {
        /// The GPU.
        gpu: PciAddress,
        /// How many vGPUs run.
        running: usize,
    },
    /// The driver's placements do not fit one slot lattice.
    #[error("GPU {gpu}: vGPU type {type_id}'s placements cannot be used")]
    Placements {
        /// The GPU.
        gpu: PciAddress,
        /// The type.
        type_id: u32,
        /// What is wrong with them.
        #[source]
        source: ShapeError,
    },
    /// No legal placement of the type is free.
    #[error(
        "vGPU type {type_id} does not fit GPU {gpu}: it takes {size} slots at placements {legal:?}, none free; placements left: {left}"
    )]
    NoPlacement {
        /// The GPU.
        gpu: PciAddress,
        /// The type.
        type_id: u32,
        /// Its placement size.
        size: u32,
        /// Its legal placement IDs.
        legal: Vec<u32>,
        /// What the GPU can still take: `TYPE at [IDs]` per supported type, or `none`.
        left: String,
    },
    /// No GPU instance of a time-sliced MIG-backed type's profile has room
    /// ([`crate::mig_vgpu::choose_instance`]).
    #[error(
        "vGPU type {type_id} does not fit GPU {gpu}: no GPU instance of its profile has a free placement ({seen})"
    )]
    NoInstanceRoom {
        /// The GPU.
        gpu: PciAddress,
        /// The type.
        type_id: u32,
        /// Each instance looked at and its free placements, or `no GPU instance`.
        seen: String,
    },
    /// No NVML to ask (a node opened without it): a GPU that holds vGPUs of another size keeps
    /// one size, since whether its driver allows mixed sizes cannot be known. The refusal of
    /// the create, with why it was not tried as a mixed-size vGPU.
    #[error(
        "{refusal}; GPU {gpu} holds vGPUs of another size ({present}) and, without NVML to ask whether its driver supports mixed-size vGPUs, keeps one size"
    )]
    OneSize {
        /// The GPU.
        gpu: PciAddress,
        /// The sizes present (`24576 MiB`).
        present: String,
        /// The create's own refusal.
        refusal: Box<crate::NodeError>,
    },
    /// Mixed-size mode was asked for where there is no NVML to ask whether the GPU allows it.
    #[error("mixed-size vGPUs need NVML, and this node has none ({why})")]
    NoNvml {
        /// Why there is none.
        why: String,
    },
    /// The vGPU started but NVML reports another placement than the one chosen.
    #[error(
        "GPU {gpu}: vGPU type {type_id} was placed at {found:?}, not at the chosen placement {wanted}"
    )]
    ReadBack {
        /// The GPU.
        gpu: PciAddress,
        /// The type.
        type_id: u32,
        /// The placement chosen.
        wanted: u32,
        /// What NVML reports (`None`: no running vGPU of the type there).
        found: Option<u32>,
    },
}

impl ClassifiedError for MixedError {
    fn kind(&self) -> ErrorKind {
        match self {
            MixedError::Nvml { source, .. } | MixedError::SchedulerUnknown { source, .. } => {
                match source.kind {
                    NvmlErrorKind::NoPermission => ErrorKind::NotPermitted,
                    NvmlErrorKind::NotFound => ErrorKind::NotFound,
                    _ => ErrorKind::HostError,
                }
            }
            MixedError::Unsupported { .. } | MixedError::Scheduler { .. } => {
                ErrorKind::NotCreatable
            }
            MixedError::NoNvml { .. } => ErrorKind::Unsupported,
            MixedError::InUse { .. } => ErrorKind::InUse,
            MixedError::OneSize { refusal, .. } => refusal.kind(),
            MixedError::Placements { .. } | MixedError::ReadBack { .. } => ErrorKind::Unexpected,
            MixedError::NoPlacement { .. } | MixedError::NoInstanceRoom { .. } => {
                ErrorKind::Exhausted
            }
        }
    }
}

pub(crate) fn ask<T>(
    gpu: &PciAddress,
    step: &'static str,
    r: Result<T, NvmlError>,
) -> Result<T, MixedError> {
    r.map_err(|source| MixedError::Nvml {
        gpu: *gpu,
        step,
        source,
    })
}

/// One supported type on the GPU's lattice.
pub(crate) struct TypeShape {
    pub(crate) id: u32,
    pub(crate) name: String,
    pub(crate) size: u32,
    pub(crate) ids: Vec<u32>,
}

/// Every supported type's mixed-size placements on `gpu` (types without any left out), the
/// lattice's width in slots, and each type's [`SlotShape`] on it (same order).
///
/// # Errors
/// [`MixedError::Nvml`]; [`MixedError::Placements`] for a driver answer off the lattice.
pub(crate) fn lattice(
    nvml: &dyn NvmlDevices,
    gpu: &PciAddress,
) -> Result<(Vec<TypeShape>, u8, Vec<SlotShape>), MixedError> {
    let types = ask(gpu, "listing vGPU types", nvml.vgpu_supported_types(gpu))?;
    let mut shapes = Vec::new();
    for t in &types {
        let p = ask(
            gpu,
            "reading supported placements",
            nvml.vgpu_type_supported_placements(gpu, t.id, VgpuMode::Heterogeneous),
        )?;
        if p.placement_ids.is_empty() {
            continue;
        }
        shapes.push(TypeShape {
            id: t.id,
            name: t.name.clone(),
            size: p.placement_size,
            ids: p.placement_ids,
        });
    }
    // The lattice is as wide as the furthest run any supported type may take.
    let width = shapes
        .iter()
        .flat_map(|s| s.ids.iter().map(move |i| u64::from(*i) + u64::from(s.size)))
        .max()
        .unwrap_or(0);
    let slots = u8::try_from(width).unwrap_or(u8::MAX).min(MAX_SLOTS);
    let on_lattice = shapes
        .iter()
        .map(|s| {
            SlotShape::of_placements(s.size, &s.ids, slots).map_err(|source| {
                MixedError::Placements {
                    gpu: *gpu,
                    type_id: s.id,
                    source,
                }
            })
        })
        .collect::<Result<_, _>>()?;
    Ok((shapes, slots, on_lattice))
}

/// Plans a vGPU of `type_id` on `gpu` by placement: checks the mode and the scheduler, reads
/// every supported type's placements and the running vGPUs', and chooses a free placement that
/// the driver also lists as creatable, keeping the most room for every supported size.
///
/// # Errors
/// [`MixedError::Unsupported`], [`MixedError::Scheduler`], [`MixedError::SchedulerUnknown`],
/// [`MixedError::InUse`] (same-size mode with vGPUs running), [`MixedError::NoPlacement`]
/// naming the type's legal IDs and what is left, [`MixedError::Placements`] for a driver answer
/// off the lattice, [`MixedError::Nvml`].
pub fn plan(
    nvml: &dyn NvmlDevices,
    gpu: &PciAddress,
    type_id: u32,
) -> Result<PlacementPlan, MixedError> {
    plan_with(nvml, gpu, type_id, &[])
}

/// [`plan`] counting also the vGPUs the host shows that NVML may not list as running yet: each
/// `(type ID, placement ID the VF reports)` of a VF given a type on the GPU. Any of them keeps
/// the mode from changing; those with a placement hold its slots.
///
/// # Errors
/// As [`plan`].
pub fn plan_with(
    nvml: &dyn NvmlDevices,
    gpu: &PciAddress,
    type_id: u32,
    typed: &[(u32, Option<u32>)],
) -> Result<PlacementPlan, MixedError> {
    let mode = match nvml.vgpu_heterogeneous_mode(gpu) {
        Ok(m) => m,
        Err(e) if e.kind == NvmlErrorKind::NotSupported => {
            return Err(MixedError::Unsupported { gpu: *gpu });
        }
        Err(source) => {
            return Err(MixedError::Nvml {
                gpu: *gpu,
                step: "reading the vGPU size mode",
                source,
            });
        }
    };
    match nvml.vgpu_scheduler(gpu) {
        Ok(s) if s.allows_mixed_size() => {}
        Ok(scheduler) => {
            return Err(MixedError::Scheduler {
                gpu: *gpu,
                scheduler,
            });
        }
        Err(source) => return Err(MixedError::SchedulerUnknown { gpu: *gpu, source }),
    }
    let active = ask(gpu, "listing running vGPUs", nvml.active_vgpus(gpu))?;
    let turn_mode_on = mode == VgpuMode::Homogeneous;
    let running = active.len().max(typed.len());
    if turn_mode_on && running > 0 {
        return Err(MixedError::InUse { gpu: *gpu, running });
    }
    let (shapes, slots, later) = lattice(nvml, gpu)?;
    let Some(target_at) = shapes.iter().position(|s| s.id == type_id) else {
        return Err(MixedError::NoPlacement {
            gpu: *gpu,
            type_id,
            size: 0,
            legal: Vec::new(),
            left: "the GPU lists no mixed-size placement for this type".to_owned(),
        });
    };
    let target = &shapes[target_at];
    let mut mask = SlotMask::empty();
    let held = active
        .iter()
        .map(|v| (v.type_id, v.placement_id))
        .chain(typed.iter().copied());
    for (held_type, placement) in held {
        let (Some(id), Some(s)) = (placement, shapes.iter().find(|s| s.id == held_type)) else {
            continue;
        };
        let start = u8::try_from(id).unwrap_or(u8::MAX);
        let size = u8::try_from(s.size).unwrap_or(u8::MAX);
        mask.hold(start, size);
    }
    let mut shape = later[target_at].clone();
    if !turn_mode_on {
        // The driver's word wins: keep only what it still lists as creatable.
        let creatable = ask(
            gpu,
            "reading creatable placements",
            nvml.vgpu_type_creatable_placements(gpu, type_id, VgpuMode::Heterogeneous),
        )?;
        shape
            .starts
            .retain(|s| creatable.placement_ids.contains(&u32::from(*s)));
    }
    let free = mask
        .free_starts(&shape)
        .into_iter()
        .map(u32::from)
        .collect();
    match slots::choose(mask, slots, &shape, &later, SlotChoice::KeepMost) {
        Ok(start) => Ok(PlacementPlan {
            gpu: *gpu,
            type_id,
            placement_id: u32::from(start),
            placement_size: target.size,
            turn_mode_on,
            free,
        }),
        Err(_) => Err(MixedError::NoPlacement {
            gpu: *gpu,
            type_id,
            size: target.size,
            legal: target.ids.clone(),
            left: left(mask, &shapes, slots),
        }),
    }
}

pub(crate) fn left(mask: SlotMask, shapes: &[TypeShape], slots: u8) -> String {
    let parts: Vec<String> = shapes
        .iter()
        .filter_map(|s| {
            let shape = SlotShape::of_placements(s.size, &s.ids, slots.min(MAX_SLOTS)).ok()?;
            let free = mask.free_starts(&shape);
            (!free.is_empty()).then(|| format!("{} ({}) at {free:?}", s.name, s.id))
        })
        .collect();
    if parts.is_empty() {
        "none".to_owned()
    } else {
        parts.join(", ")
    }
}

/// Turns mixed-size mode on where `plan` says so, and reads it back. Does nothing otherwise.
///
/// # Errors
/// [`MixedError::Nvml`] for the write (`IN_USE` when a vGPU started meanwhile) or a read-back
/// that does not show the mode.
pub fn turn_on(nvml: &dyn NvmlDevices, plan: &PlacementPlan) -> Result<(), MixedError> {
    if !plan.turn_mode_on {
        return Ok(());
    }
    let gpu = &plan.gpu;
    ask(
        gpu,
        "turning mixed-size mode on",
        nvml.set_vgpu_heterogeneous_mode(gpu, VgpuMode::Heterogeneous),
    )?;
    let now = ask(
        gpu,
        "reading the vGPU size mode back",
        nvml.vgpu_heterogeneous_mode(gpu),
    )?;
    if now == VgpuMode::Heterogeneous {
        Ok(())
    } else {
        Err(MixedError::Nvml {
            gpu: *gpu,
            step: "reading the vGPU size mode back (still same-size)",
            source: NvmlError::new("nvmlDeviceGetVgpuHeterogeneousMode", NvmlErrorKind::Unknown),
        })
    }
}

/// Checks that a vGPU of the plan's type runs at the plan's placement, as NVML reports it.
///
/// # Errors
/// [`MixedError::ReadBack`] naming what NVML reports; [`MixedError::Nvml`].
pub fn check_placed(nvml: &dyn NvmlDevices, plan: &PlacementPlan) -> Result<(), MixedError> {
    let active = ask(
        &plan.gpu,
        "listing running vGPUs",
        nvml.active_vgpus(&plan.gpu),
    )?;
    let of_type: Vec<Option<u32>> = active
        .iter()
        .filter(|v| v.type_id == plan.type_id)
        .map(|v| v.placement_id)
        .collect();
    if of_type.contains(&Some(plan.placement_id)) {
        return Ok(());
    }
    Err(MixedError::ReadBack {
        gpu: plan.gpu,
        type_id: plan.type_id,
        wanted: plan.placement_id,
        found: of_type.into_iter().flatten().next(),
    })
}
