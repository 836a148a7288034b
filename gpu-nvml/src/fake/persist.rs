//! The fake NVML kept between processes, for the sandbox host: MIG modes (current, pending,
//! whether a reset is needed), GPU instances with their IDs and placements, and processes,
//! saved as JSON in the sandbox directory after every NVML write and read back before every
//! call, so that `gpuslice mig ...` in one process sees what another made, as on a host
//! where the driver keeps that state.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use gpu_core::PciAddress;
use serde::{Deserialize, Serialize};

use super::FakeNvml;
use crate::devices::NvmlDevices;
use crate::error::{NvmlError, NvmlErrorKind};
use crate::types::{
    ActiveVgpu, GpuInstance, GpuInstanceProfile, HealthReads, MigActivation, MigMode, MigModes,
    Placement, VgpuMode, VgpuPlacements, VgpuScheduler, VgpuTypeInfo,
};

/// The file under the sandbox directory.
pub const NVML_FILE: &str = "nvml.json";

/// One GPU's saved MIG state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SavedGpu {
    /// Mode in force.
    pub current: MigMode,
    /// Mode after the next reset.
    pub pending: MigMode,
    /// Mode changes wait for a reset.
    pub needs_reset: bool,
    /// GPU instances: ID, profile ID, compute slices, start, size.
    pub instances: Vec<(u32, u32, u32, u32, u32)>,
    /// The next instance ID.
    pub next_id: u32,
    /// Processes holding the GPU.
    pub processes: u32,
}

impl<'de> Deserialize<'de> for MigMode {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        match String::deserialize(d)?.as_str() {
            "enabled" => Ok(MigMode::Enabled),
            "disabled" => Ok(MigMode::Disabled),
            other => Err(serde::de::Error::custom(format!(
                "unknown MIG mode {other:?}"
            ))),
        }
    }
}

impl FakeNvml {
    /// The MIG state of every MIG-capable GPU.
    pub fn saved(&self) -> BTreeMap<PciAddress, SavedGpu> {
        self.lock()
            .gpus
            .iter()
            .filter_map(|(a, g)| {
                let m = g.mig.as_ref()?;
                Some((
                    *a,
                    SavedGpu {
                        current: m.modes.current,
                        pending: m.modes.pending,
                        needs_reset: m.needs_reset,
                        instances: m
                            .instances
                            .iter()
                            .map(|i| {
                                (
                                    i.id,
                                    i.profile_id,
                                    i.slice_count,
                                    i.placement.start,
                                    i.placement.size,
                                )
                            })
                            .collect(),
                        next_id: m.next_id,
                        processes: g.processes,
                    },
                ))
            })
            .collect()
    }

    /// Puts back the MIG state `saved` names (GPUs it does not name keep theirs).
    pub fn restore(&self, saved: &BTreeMap<PciAddress, SavedGpu>) {
        let mut state = self.lock();
        for (a, s) in saved {
            let Some(g) = state.gpus.get_mut(a) else {
                continue;
            };
            g.processes = s.processes;
            if let Some(m) = g.mig.as_mut() {
                m.modes = MigModes {
                    current: s.current,
                    pending: s.pending,
                };
                m.needs_reset = s.needs_reset;
                m.next_id = s.next_id;
                m.instances = s
                    .instances
                    .iter()
                    .map(|(id, profile_id, slice_count, start, size)| GpuInstance {
                        id: *id,
                        profile_id: *profile_id,
                        slice_count: *slice_count,
                        placement: Placement {
                            start: *start,
                            size: *size,
                        },
                    })
                    .collect();
            }
        }
    }
}

/// A [`FakeNvml`] whose MIG state lives in `DIR/nvml.json`: read before each call, written
/// after each accepted write. The callers' host-wide lock orders the writers.
#[derive(Debug)]
pub struct SavedNvml {
    file: PathBuf,
    fake: FakeNvml,
}

impl SavedNvml {
    /// The fake `fake` (its GPUs as the sandbox's tree shows them), with the state saved in
    /// `dir` put back.
    ///
    /// # Errors
    /// A saved file that cannot be read or is not this format.
    pub fn open(dir: &Path, fake: FakeNvml) -> std::io::Result<Self> {
        let me = SavedNvml {
            file: dir.join(NVML_FILE),
            fake,
        };
        me.load()?;
        Ok(me)
    }

    fn load(&self) -> std::io::Result<()> {
        match std::fs::read(&self.file) {
            Ok(b) => {
                let saved: BTreeMap<PciAddress, SavedGpu> =
                    serde_json::from_slice(&b).map_err(std::io::Error::other)?;
                self.fake.restore(&saved);
                Ok(())
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(e),
        }
    }

    fn save(&self) -> Result<(), NvmlError> {
        let text = serde_json::to_vec_pretty(&self.fake.saved())
            .map_err(|_| NvmlError::new("sandbox-save", NvmlErrorKind::OperatingSystem))?;
        let tmp = self.file.with_extension("json.tmp");
        std::fs::write(&tmp, text)
            .and_then(|()| std::fs::rename(&tmp, &self.file))
            .map_err(|_| NvmlError::new("sandbox-save", NvmlErrorKind::OperatingSystem))
    }

    fn read<T>(&self, f: impl FnOnce(&FakeNvml) -> Result<T, NvmlError>) -> Result<T, NvmlError> {
        self.load()
            .map_err(|_| NvmlError::new("sandbox-load", NvmlErrorKind::OperatingSystem))?;
        f(&self.fake)
    }

    fn write<T>(&self, f: impl FnOnce(&FakeNvml) -> Result<T, NvmlError>) -> Result<T, NvmlError> {
        let out = self.read(f)?;
        self.save()?;
        Ok(out)
    }

    /// The GPU is reset (`nvidia-smi -r`): a pending MIG mode comes into force.
    ///
    /// # Errors
    /// `IN_USE` while something runs on it; as every call for an unknown GPU.
    pub fn reset(&self, gpu: &PciAddress) -> Result<(), NvmlError> {
        self.write(|f| f.reset(gpu))
    }

    /// A process starts on (`start`) or every process leaves (`!start`) the GPU.
    ///
    /// # Errors
    /// As every call for an unknown GPU.
    pub fn process(&self, gpu: &PciAddress, start: bool) -> Result<(), NvmlError> {
        self.write(|f| {
            if start {
                f.start_process(gpu)
            } else {
                f.end_processes(gpu)
            }
        })
    }
}

impl NvmlDevices for SavedNvml {
    fn vgpu_scheduler(&self, gpu: &PciAddress) -> Result<VgpuScheduler, NvmlError> {
        self.read(|f| f.vgpu_scheduler(gpu))
    }
    fn gpu_instance_vgpu_creatable_placements(
        &self,
        gpu: &PciAddress,
        gpu_instance: u32,
        type_id: u32,
    ) -> Result<VgpuPlacements, NvmlError> {
        self.read(|f| f.gpu_instance_vgpu_creatable_placements(gpu, gpu_instance, type_id))
    }
    fn driver_version(&self) -> Option<String> {
        self.fake.driver_version()
    }
    fn health_reads(&self, gpu: &PciAddress) -> Result<HealthReads, NvmlError> {
        self.read(|f| f.health_reads(gpu))
    }
    fn vgpu_supported_types(&self, gpu: &PciAddress) -> Result<Vec<VgpuTypeInfo>, NvmlError> {
        self.read(|f| f.vgpu_supported_types(gpu))
    }
    fn module_id(&self, gpu: &PciAddress) -> Result<u32, NvmlError> {
        self.read(|f| f.module_id(gpu))
    }
    fn mig_mode(&self, gpu: &PciAddress) -> Result<MigModes, NvmlError> {
        self.read(|f| f.mig_mode(gpu))
    }
    fn set_mig_mode(&self, gpu: &PciAddress, mode: MigMode) -> Result<MigActivation, NvmlError> {
        self.write(|f| f.set_mig_mode(gpu, mode))
    }
    fn gpu_instance_profiles(
        &self,
        gpu: &PciAddress,
    ) -> Result<Vec<GpuInstanceProfile>, NvmlError> {
        self.read(|f| f.gpu_instance_profiles(gpu))
    }
    fn gpu_instance_possible_placements(
        &self,
        gpu: &PciAddress,
        profile_id: u32,
    ) -> Result<Vec<Placement>, NvmlError> {
        self.read(|f| f.gpu_instance_possible_placements(gpu, profile_id))
    }
    fn gpu_instances(&self, gpu: &PciAddress) -> Result<Vec<GpuInstance>, NvmlError> {
        self.read(|f| f.gpu_instances(gpu))
    }
    fn create_gpu_instance(
        &self,
        gpu: &PciAddress,
        profile_id: u32,
        placement: Placement,
    ) -> Result<GpuInstance, NvmlError> {
        self.write(|f| f.create_gpu_instance(gpu, profile_id, placement))
    }
    fn destroy_gpu_instance(&self, gpu: &PciAddress, id: u32) -> Result<(), NvmlError> {
        self.write(|f| f.destroy_gpu_instance(gpu, id))
    }
    fn vgpu_heterogeneous_mode(&self, gpu: &PciAddress) -> Result<VgpuMode, NvmlError> {
        self.read(|f| f.vgpu_heterogeneous_mode(gpu))
    }
    fn set_vgpu_heterogeneous_mode(
        &self,
        gpu: &PciAddress,
        mode: VgpuMode,
    ) -> Result<(), NvmlError> {
        self.write(|f| f.set_vgpu_heterogeneous_mode(gpu, mode))
    }
    fn vgpu_type_supported_placements(
        &self,
        gpu: &PciAddress,
        type_id: u32,
        mode: VgpuMode,
    ) -> Result<VgpuPlacements, NvmlError> {
        self.read(|f| f.vgpu_type_supported_placements(gpu, type_id, mode))
    }
    fn vgpu_type_creatable_placements(
        &self,
        gpu: &PciAddress,
        type_id: u32,
        mode: VgpuMode,
    ) -> Result<VgpuPlacements, NvmlError> {
        self.read(|f| f.vgpu_type_creatable_placements(gpu, type_id, mode))
    }
    fn active_vgpus(&self, gpu: &PciAddress) -> Result<Vec<ActiveVgpu>, NvmlError> {
        self.read(|f| f.active_vgpus(gpu))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fake::FakeGpu;

    fn fresh() -> FakeNvml {
        let g = gpu_core::mig::MigGeometry::for_device(0x2330).unwrap();
        FakeNvml::new().with_gpu(
            "0000:41:00.0".parse().unwrap(),
            FakeGpu::mig(g).needing_reset(),
        )
    }

    #[test]
    fn mig_state_survives_from_one_process_to_the_next_with_its_pending_reset() {
        let dir = tempfile::tempdir().unwrap();
        let gpu: PciAddress = "0000:41:00.0".parse().unwrap();
        let first = SavedNvml::open(dir.path(), fresh()).unwrap();
        assert!(matches!(
            first.set_mig_mode(&gpu, MigMode::Enabled).unwrap(),
            MigActivation::Pending(NvmlErrorKind::ResetRequired)
        ));
        let second = SavedNvml::open(dir.path(), fresh()).unwrap();
        assert!(second.mig_mode(&gpu).unwrap().is_pending());
        // Instances need MIG mode in force: NOT_SUPPORTED until the reset.
        let e = second.create_gpu_instance(&gpu, 19, Placement { start: 6, size: 1 });
        assert_eq!(e.unwrap_err().kind, NvmlErrorKind::NotSupported);
        second.reset(&gpu).unwrap();
        second
            .create_gpu_instance(&gpu, 19, Placement { start: 6, size: 1 })
            .unwrap();
        let third = SavedNvml::open(dir.path(), fresh()).unwrap();
        let gis = third.gpu_instances(&gpu).unwrap();
        assert_eq!((gis.len(), gis[0].placement.start), (1, 6));
        // A process holds the GPU in one process: a reset is refused in the next.
        third.process(&gpu, true).unwrap();
        let fourth = SavedNvml::open(dir.path(), fresh()).unwrap();
        assert_eq!(fourth.reset(&gpu).unwrap_err().kind, NvmlErrorKind::InUse);
    }
}
