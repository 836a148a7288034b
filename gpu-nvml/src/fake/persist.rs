//! The fake NVML kept between processes, for the sandbox host: MIG modes (current, pending,
//! whether a reset is needed), GPU instances with their IDs and placements, and processes,
//! saved as JSON in the sandbox directory after every call that changed them and read back
//! before every call, so that `gpuslice mig ...` in one process sees what another made, as on
//! a host where the driver keeps that state. One fake answers ([`FakeNvml`], kept in a file by
//! [`FakeNvml::saved_in`]); this module only moves its MIG state in and out, and [`load`] lets
//! the sandbox's fake kernel read it.

use std::collections::BTreeMap;
use std::path::Path;

use gpu_core::PciAddress;
use serde::{Deserialize, Serialize};

use super::{FakeNvml, State};
use crate::error::{NvmlError, NvmlErrorKind};
use crate::types::{GpuInstance, MigMode, MigModes, Placement, VgpuMode};

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
    /// The vGPU size mode of a GPU with mixed-size support (`None`: none, or an older file).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vgpu_mode: Option<VgpuMode>,
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

/// The MIG state of every MIG-capable GPU of `state`, and the size mode of every GPU with
/// mixed-size support (MIG off and no instances where it has no MIG).
fn saved_of(state: &State) -> BTreeMap<PciAddress, SavedGpu> {
    state
        .gpus
        .iter()
        .filter_map(|(a, g)| {
            if g.mig.is_none() && g.vgpu_mode.is_none() {
                return None;
            }
            let m = g.mig.as_ref();
            Some((
                *a,
                SavedGpu {
                    current: m.map_or(MigMode::Disabled, |m| m.modes.current),
                    pending: m.map_or(MigMode::Disabled, |m| m.modes.pending),
                    needs_reset: m.is_some_and(|m| m.needs_reset),
                    instances: m
                        .map(|m| m.instances.as_slice())
                        .unwrap_or_default()
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
                    next_id: m.map_or(0, |m| m.next_id),
                    processes: g.processes,
                    vgpu_mode: g.vgpu_mode,
                },
            ))
        })
        .collect()
}

/// Puts back the MIG state `saved` names (GPUs it does not name keep theirs).
fn restore_into(state: &mut State, saved: &BTreeMap<PciAddress, SavedGpu>) {
    for (a, s) in saved {
        let Some(g) = state.gpus.get_mut(a) else {
            continue;
        };
        g.processes = s.processes;
        if let (Some(_), Some(mode)) = (g.vgpu_mode, s.vgpu_mode) {
            g.vgpu_mode = Some(mode);
        }
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

/// The MIG state saved in `dir` (empty where nothing was saved yet): what the sandbox's fake
/// kernel reads to list MIG-backed types as the driver would.
///
/// # Errors
/// A file that cannot be read or is not this format.
pub fn load(dir: &Path) -> std::io::Result<BTreeMap<PciAddress, SavedGpu>> {
    read_file(&dir.join(NVML_FILE))
}

fn read_file(file: &Path) -> std::io::Result<BTreeMap<PciAddress, SavedGpu>> {
    match std::fs::read(file) {
        Ok(b) => serde_json::from_slice(&b).map_err(std::io::Error::other),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(BTreeMap::new()),
        Err(e) => Err(e),
    }
}

/// Before a call of a fake kept in `file`: its saved state put back, and returned (to tell
/// afterwards whether the call changed it). Nothing for a fake kept in memory only.
pub(super) fn load_into(
    file: Option<&Path>,
    state: &mut State,
) -> Result<Option<BTreeMap<PciAddress, SavedGpu>>, NvmlError> {
    let Some(file) = file else {
        return Ok(None);
    };
    let saved = read_file(file)
        .map_err(|_| NvmlError::new("sandbox-load", NvmlErrorKind::OperatingSystem))?;
    restore_into(state, &saved);
    Ok(Some(saved_of(state)))
}

/// After a call of a fake kept in `file`: the state written back when it differs from
/// `before` (a read never writes, so a reader never undoes a writer's change).
pub(super) fn save_if_changed(
    file: Option<&Path>,
    state: &State,
    before: Option<&BTreeMap<PciAddress, SavedGpu>>,
) -> Result<(), NvmlError> {
    let Some(file) = file else {
        return Ok(());
    };
    let now = saved_of(state);
    if before == Some(&now) {
        return Ok(());
    }
    let fail = || NvmlError::new("sandbox-save", NvmlErrorKind::OperatingSystem);
    let text = serde_json::to_vec_pretty(&now).map_err(|_| fail())?;
    let tmp = file.with_extension("json.tmp");
    std::fs::write(&tmp, text)
        .and_then(|()| std::fs::rename(&tmp, file))
        .map_err(|_| fail())
}

impl FakeNvml {
    /// This fake with its MIG state kept in `dir/nvml.json` (the sandbox host's NVML): the
    /// state saved there put back now and before every call, written after every call that
    /// changed it. The callers' host-wide lock orders the writers.
    ///
    /// # Errors
    /// A saved file that cannot be read or is not this format.
    pub fn saved_in(mut self, dir: &Path) -> std::io::Result<Self> {
        let file = dir.join(NVML_FILE);
        let saved = read_file(&file)?;
        restore_into(&mut self.lock(), &saved);
        self.saved_at = Some(file);
        Ok(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::devices::NvmlDevices;
    use crate::fake::FakeGpu;
    use crate::types::MigActivation;

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
        let first = fresh().saved_in(dir.path()).unwrap();
        assert!(matches!(
            first.set_mig_mode(&gpu, MigMode::Enabled).unwrap(),
            MigActivation::Pending(NvmlErrorKind::ResetRequired)
        ));
        let second = fresh().saved_in(dir.path()).unwrap();
        assert!(second.mig_mode(&gpu).unwrap().is_pending());
        // Instances need MIG mode in force: NOT_SUPPORTED until the reset.
        let e = second.create_gpu_instance(&gpu, 19, Placement { start: 6, size: 1 });
        assert_eq!(e.unwrap_err().kind, NvmlErrorKind::NotSupported);
        second.reset(&gpu).unwrap();
        second
            .create_gpu_instance(&gpu, 19, Placement { start: 6, size: 1 })
            .unwrap();
        let third = fresh().saved_in(dir.path()).unwrap();
        let gis = third.gpu_instances(&gpu).unwrap();
        assert_eq!((gis.len(), gis[0].placement.start), (1, 6));
        // A process holds the GPU in one process: a reset is refused in the next.
        third.start_process(&gpu).unwrap();
        let fourth = fresh().saved_in(dir.path()).unwrap();
        assert_eq!(fourth.reset(&gpu).unwrap_err().kind, NvmlErrorKind::InUse);
    }
}
