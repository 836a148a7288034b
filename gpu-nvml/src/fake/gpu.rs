//! One fake GPU: what it is (built once) and its state (changed by the NVML writes and by the
//! kernel-side events a test plays: vGPUs started and stopped, processes, resets).

use gpu_core::mig::MigGeometry;

use crate::error::NvmlErrorKind;
use crate::types::{
    ActiveVgpu, GpuInstance, HealthReads, MigMode, MigModes, VgpuMode, VgpuPlacements,
    VgpuScheduler, VgpuTypeInfo,
};

/// A vGPU type of a fake GPU, with its placements.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FakeVgpuType {
    /// ID, name, framebuffer and per-GPU maximum.
    pub info: VgpuTypeInfo,
    /// Placements in heterogeneous (mixed-size) mode: size and legal IDs.
    pub heterogeneous: VgpuPlacements,
    /// Placements in homogeneous mode.
    pub homogeneous: VgpuPlacements,
    /// For a MIG-backed type, the GPU-instance profile ID it runs on.
    pub gpu_instance_profile: Option<u32>,
    /// How many vGPUs of the type one GPU instance holds: 1, or more where the GPU time-slices
    /// vGPUs inside MIG instances (the count the driver lists, set by the test).
    pub per_instance: u32,
}

impl FakeVgpuType {
    /// A time-sliced type `id` named `name` of `framebuffer_mib`, taking `size` slots at
    /// `placement_ids` in both modes (set the homogeneous ones apart with
    /// [`FakeVgpuType::homogeneous_at`]).
    pub fn new(
        id: u32,
        name: &str,
        framebuffer_mib: u64,
        size: u32,
        placement_ids: &[u32],
    ) -> Self {
        let placements = VgpuPlacements {
            placement_size: size,
            placement_ids: placement_ids.to_vec(),
        };
        FakeVgpuType {
            info: VgpuTypeInfo {
                id,
                name: name.to_owned(),
                framebuffer_mib: Some(framebuffer_mib),
                max_instances: u32::try_from(placement_ids.len()).ok(),
            },
            heterogeneous: placements.clone(),
            homogeneous: placements,
            gpu_instance_profile: None,
            per_instance: 1,
        }
    }

    /// The homogeneous-mode placements are `placement_ids`.
    pub fn homogeneous_at(mut self, placement_ids: &[u32]) -> Self {
        self.homogeneous.placement_ids = placement_ids.to_vec();
        self
    }

    /// A MIG-backed type running on GPU instances of profile `profile_id`.
    pub fn mig_backed(mut self, profile_id: u32) -> Self {
        self.gpu_instance_profile = Some(profile_id);
        self
    }

    /// Time-sliced inside each GPU instance: up to `count` vGPUs of the type share one
    /// instance (Blackwell RTX PRO; the count is the driver's, given by the test).
    pub fn time_sliced_in_instance(mut self, count: u32) -> Self {
        self.per_instance = count.max(1);
        self
    }
}

/// The MIG side of a fake GPU.
#[derive(Debug, Clone)]
pub(crate) struct MigState {
    pub geometry: &'static MigGeometry,
    pub modes: MigModes,
    /// Mode changes wait for [`crate::fake::FakeNvml::reset`] (pass-through, or a host where
    /// NVML does not reset the GPU itself).
    pub needs_reset: bool,
    pub instances: Vec<GpuInstance>,
    pub next_id: u32,
}

/// A fake GPU; build it with the constructors, hand it to [`crate::fake::FakeNvml::with_gpu`].
#[derive(Debug, Clone)]
pub struct FakeGpu {
    pub(crate) health: HealthReads,
    pub(crate) lost: bool,
    pub(crate) module_id: Option<u32>,
    pub(crate) mig: Option<MigState>,
    pub(crate) types: Vec<FakeVgpuType>,
    /// `None`: the GPU has no mixed-size vGPU support.
    pub(crate) vgpu_mode: Option<VgpuMode>,
    pub(crate) active: Vec<(ActiveVgpu, Option<u32>)>,
    pub(crate) next_vgpu: u32,
    pub(crate) processes: u32,
    pub(crate) scheduler: VgpuScheduler,
}

impl FakeGpu {
    /// A healthy GPU of `memory_mib` without MIG, vGPU types or a module ID.
    pub fn new(memory_mib: u64) -> Self {
        FakeGpu {
            health: HealthReads::nominal(memory_mib),
            lost: false,
            module_id: None,
            mig: None,
            types: Vec::new(),
            vgpu_mode: None,
            active: Vec::new(),
            next_vgpu: 1,
            processes: 0,
            scheduler: VgpuScheduler::BestEffort,
        }
    }

    /// A MIG-capable GPU of `geometry` (gpu-core's table), MIG mode off, no GPU instances; its
    /// memory is that of the geometry's largest profile.
    pub fn mig(geometry: &'static MigGeometry) -> Self {
        let memory_gb = geometry
            .profiles
            .iter()
            .map(|p| p.memory_gb)
            .max()
            .unwrap_or(0);
        let mut gpu = Self::new(u64::from(memory_gb) * 1024);
        gpu.mig = Some(MigState {
            geometry,
            modes: MigModes::settled(MigMode::Disabled),
            needs_reset: false,
            instances: Vec::new(),
            next_id: 1,
        });
        gpu
    }

    /// MIG mode already `mode` (a GPU without MIG is left as it is).
    pub fn with_mig_mode(mut self, mode: MigMode) -> Self {
        if let Some(m) = &mut self.mig {
            m.modes = MigModes::settled(mode);
        }
        self
    }

    /// MIG mode changes stay pending until [`crate::fake::FakeNvml::reset`]
    /// (`activationStatus` `NVML_ERROR_RESET_REQUIRED`).
    pub fn needing_reset(mut self) -> Self {
        if let Some(m) = &mut self.mig {
            m.needs_reset = true;
        }
        self
    }

    /// The GPU supports these vGPU types.
    pub fn with_vgpu_types(mut self, types: Vec<FakeVgpuType>) -> Self {
        self.types = types;
        self
    }

    /// The GPU supports mixed-size vGPUs, starting in `mode`.
    pub fn mixed_size(mut self, mode: VgpuMode) -> Self {
        self.vgpu_mode = Some(mode);
        self
    }

    /// The GPU runs the time-sliced vGPU scheduler `scheduler` (best effort, NVIDIA's default,
    /// unless set).
    pub fn with_scheduler(mut self, scheduler: VgpuScheduler) -> Self {
        self.scheduler = scheduler;
        self
    }

    /// The GPU sits on an HGX baseboard as module `id`.
    pub fn with_module_id(mut self, id: u32) -> Self {
        self.module_id = Some(id);
        self
    }

    /// The health signals it reports.
    pub fn with_health(mut self, health: HealthReads) -> Self {
        self.health = health;
        self
    }

    /// The GPU has fallen off the bus: every question about it answers `GPU_IS_LOST`.
    pub fn lost(mut self) -> Self {
        self.lost = true;
        self
    }

    pub(crate) fn mig_enabled(&self) -> bool {
        self.mig
            .as_ref()
            .is_some_and(|m| m.modes.current == MigMode::Enabled)
    }

    pub(crate) fn vgpu_type(&self, type_id: u32) -> Option<&FakeVgpuType> {
        self.types.iter().find(|t| t.info.id == type_id)
    }

    /// Something runs on the GPU: a vGPU or a process.
    pub(crate) fn busy(&self) -> bool {
        !self.active.is_empty() || self.processes > 0
    }

    /// The slots `[id, id + size)` the running vGPUs hold (heterogeneous placements).
    fn held(&self) -> Vec<(u32, u32)> {
        self.active
            .iter()
            .filter_map(|(v, _)| {
                let size = self.vgpu_type(v.type_id)?.heterogeneous.placement_size;
                Some((v.placement_id?, size))
            })
            .collect()
    }

    /// The placements `t` can take now in `mode`: in heterogeneous mode its supported IDs whose
    /// slots no running vGPU holds; in homogeneous mode its IDs not taken, and none while a vGPU
    /// of another type runs (one size per GPU).
    /// The placements `t` can still take inside GPU instance `gi`: slots `0..per_instance` of
    /// the instance, less those its running vGPUs hold; none beside a vGPU of another type.
    pub(crate) fn creatable_in_instance(&self, t: &FakeVgpuType, gi: u32) -> VgpuPlacements {
        let inside: Vec<&ActiveVgpu> = self
            .active
            .iter()
            .filter(|(_, g)| *g == Some(gi))
            .map(|(v, _)| v)
            .collect();
        let ids = if inside.iter().any(|v| v.type_id != t.info.id) {
            Vec::new()
        } else {
            (0..t.per_instance)
                .filter(|p| !inside.iter().any(|v| v.placement_id.unwrap_or(0) == *p))
                .collect()
        };
        VgpuPlacements {
            placement_size: 1,
            placement_ids: ids,
        }
    }

    pub(crate) fn creatable(&self, t: &FakeVgpuType, mode: VgpuMode) -> VgpuPlacements {
        match mode {
            VgpuMode::Heterogeneous => {
                let held = self.held();
                let size = t.heterogeneous.placement_size;
                let ids = t
                    .heterogeneous
                    .placement_ids
                    .iter()
                    .copied()
                    .filter(|id| {
                        held.iter().all(|(start, len)| {
                            id.saturating_add(size) <= *start || start.saturating_add(*len) <= *id
                        })
                    })
                    .collect();
                VgpuPlacements {
                    placement_size: size,
                    placement_ids: ids,
                }
            }
            VgpuMode::Homogeneous => {
                let other = self.active.iter().any(|(v, _)| v.type_id != t.info.id);
                let taken: Vec<u32> = self
                    .active
                    .iter()
                    .filter_map(|(v, _)| v.placement_id)
                    .collect();
                let ids = if other {
                    Vec::new()
                } else {
                    t.homogeneous
                        .placement_ids
                        .iter()
                        .copied()
                        .filter(|id| !taken.contains(id))
                        .collect()
                };
                VgpuPlacements {
                    placement_size: t.homogeneous.placement_size,
                    placement_ids: ids,
                }
            }
        }
    }

    /// Applies a pending MIG mode, as a GPU reset does; refused while something runs.
    pub(crate) fn reset(&mut self) -> Result<(), NvmlErrorKind> {
        if self.busy() {
            return Err(NvmlErrorKind::InUse);
        }
        if let Some(m) = &mut self.mig {
            m.modes.current = m.modes.pending;
            if m.modes.current == MigMode::Disabled {
                m.instances.clear();
            }
        }
        Ok(())
    }
}
