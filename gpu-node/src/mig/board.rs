//! A GPU's MIG lattice as gpuslice plans on it: each GPU-instance profile with its legal
//! placements, read from NVML where it can (profiles and possible placements, so a board
//! gpuslice has no table for is planned on what the driver says) and from gpu-core's table
//! while MIG mode is off (NVML lists profiles only in MIG mode). Neither: unknown, refused.

use gpu_core::PciAddress;
use gpu_core::mig::MigGeometry;
use gpu_core::mig::choose::Span;
use gpu_core::nvidia::VgpuTypeName;
use gpu_nvml::{GpuInstance, MigMode, NvmlDevices, NvmlErrorKind};
use gpu_sysfs::Host;
use serde::Serialize;

use super::MigError;

/// One GPU-instance profile of a GPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BoardProfile {
    /// NVML's profile ID (known once MIG mode is on).
    pub id: Option<u32>,
    /// NVIDIA's name (`3g.71gb`): gpu-core's table's where the board is known, else made from
    /// NVML's slices and memory as `nvidia-smi` prints it.
    pub name: String,
    /// Compute slices.
    pub compute_slices: u32,
    /// Memory in MiB.
    pub memory_mib: u64,
    /// Legal placements (first memory slice, slices).
    pub spans: Vec<Span>,
}

/// The lattice of one GPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Board {
    /// Its profiles, smallest first.
    pub profiles: Vec<BoardProfile>,
    /// Where they came from: `nvml` or `table`.
    pub source: &'static str,
}

impl Board {
    /// Every profile's spans.
    pub fn lattice(&self) -> Vec<Vec<Span>> {
        self.profiles.iter().map(|p| p.spans.clone()).collect()
    }

    /// The profile named `name` (case-insensitive, `MIG ` prefix allowed).
    pub fn profile(&self, name: &str) -> Option<&BoardProfile> {
        let name = name.trim();
        let name = name.strip_prefix("MIG ").unwrap_or(name);
        self.profiles
            .iter()
            .find(|p| p.name.eq_ignore_ascii_case(name))
    }

    /// The profile of NVML ID `id`.
    pub fn by_id(&self, id: u32) -> Option<&BoardProfile> {
        self.profiles.iter().find(|p| p.id == Some(id))
    }

    /// Every profile's name, for messages.
    pub fn names(&self) -> String {
        let v: Vec<&str> = self.profiles.iter().map(|p| p.name.as_str()).collect();
        v.join(", ")
    }
}

/// The PCI device ID of `gpu`, read from sysfs.
pub fn device_id(host: &dyn Host, gpu: &PciAddress) -> Option<u16> {
    let s = host
        .read_string(&format!("sys/bus/pci/devices/{gpu}/device"))
        .ok()?;
    u16::from_str_radix(s.trim().trim_start_matches("0x"), 16).ok()
}

/// `nvidia-smi`'s name of a profile it has no table for: compute slices and memory rounded to
/// GB (`1g.10gb` for 9984 MiB).
fn made_name(compute: u32, memory_mib: u64) -> String {
    format!("{compute}g.{}gb", (memory_mib + 512) / 1024)
}

/// The lattice of `gpu` in MIG mode `mode`.
///
/// # Errors
/// [`MigError::UnknownGeometry`] when MIG mode is off and gpu-core has no table for the board,
/// or NVML lists a placement past slot 15; [`MigError::Nvml`] for a failed NVML call.
pub fn read(
    host: &dyn Host,
    nvml: &dyn NvmlDevices,
    gpu: &PciAddress,
    mode: MigMode,
) -> Result<Board, MigError> {
    let table = device_id(host, gpu).and_then(MigGeometry::for_device);
    if mode == MigMode::Enabled {
        let listed = nvml
            .gpu_instance_profiles(gpu)
            .map_err(MigError::nvml(*gpu))?;
        let mut profiles = Vec::with_capacity(listed.len());
        for p in listed {
            let placements = nvml
                .gpu_instance_possible_placements(gpu, p.id)
                .map_err(MigError::nvml(*gpu))?;
            let mut spans = Vec::with_capacity(placements.len());
            for pl in placements {
                let span = u8::try_from(pl.start)
                    .ok()
                    .zip(u8::try_from(pl.size).ok())
                    .filter(|(s, n)| u32::from(*s) + u32::from(*n) <= 16 && *n > 0);
                let Some(span) = span else {
                    return Err(MigError::UnknownGeometry {
                        gpu: *gpu,
                        why: format!(
                            "NVML lists profile {} at memory slice {} for {} slices",
                            p.id, pl.start, pl.size
                        ),
                    });
                };
                spans.push(span);
            }
            let size = spans.first().map(|(_, n)| *n);
            let name = table
                .and_then(|g| {
                    g.profiles.iter().find(|t| {
                        u32::from(t.compute_slices) == p.slice_count
                            && Some(t.memory_slices) == size
                    })
                })
                .map(|t| t.name.to_owned())
                .unwrap_or_else(|| made_name(p.slice_count, p.memory_mib));
            profiles.push(BoardProfile {
                id: Some(p.id),
                name,
                compute_slices: p.slice_count,
                memory_mib: p.memory_mib,
                spans,
            });
        }
        return Ok(Board {
            profiles,
            source: "nvml",
        });
    }
    let Some(g) = table else {
        return Err(MigError::UnknownGeometry {
            gpu: *gpu,
            why: "no table for this board, and NVML lists its profiles only in MIG mode".to_owned(),
        });
    };
    Ok(Board {
        profiles: g
            .profiles
            .iter()
            .map(|p| BoardProfile {
                id: None,
                name: p.name.to_owned(),
                compute_slices: u32::from(p.compute_slices),
                memory_mib: u64::from(p.memory_gb) * 1024,
                spans: p.starts.iter().map(|s| (*s, p.memory_slices)).collect(),
            })
            .collect(),
        source: "table",
    })
}

/// The GPU instances of `gpu` (none while MIG mode is off).
///
/// # Errors
/// [`MigError::Nvml`].
pub fn instances(nvml: &dyn NvmlDevices, gpu: &PciAddress) -> Result<Vec<GpuInstance>, MigError> {
    match nvml.gpu_instances(gpu) {
        Ok(v) => Ok(v),
        Err(e) if e.kind == NvmlErrorKind::NotSupported => Ok(Vec::new()),
        Err(e) => Err(MigError::Nvml {
            gpu: *gpu,
            source: e,
        }),
    }
}

/// How `gpuslice mig list` shows one GPU instance.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct InstanceView {
    /// NVML's ID.
    pub id: u32,
    /// Its profile's name (`3g.71gb`).
    pub profile: String,
    /// Its profile ID.
    pub profile_id: u32,
    /// First memory slice.
    pub start: u32,
    /// Memory slices held.
    pub slices: u32,
    /// Compute slices.
    pub compute_slices: u32,
    /// `gpuslice` or `other`.
    pub made_by: &'static str,
}

/// How `gpuslice mig list` shows one profile.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ProfileView {
    /// NVIDIA's name.
    pub name: String,
    /// NVML's profile ID, once MIG mode is on.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub id: Option<u32>,
    /// Compute slices.
    pub slices: u32,
    /// Memory slices one instance holds.
    pub memory_slices: u32,
    /// Memory in MiB.
    #[serde(rename = "memoryMiB")]
    pub memory_mib: u64,
    /// The legal starts still free.
    pub placements: Vec<u32>,
}

/// The profile of `board` a vGPU type named `type_name` runs on: `None` for a time-sliced type
/// or a name that is not NVIDIA's. The profile of the type's slices whose memory is nearest
/// the type's framebuffer.
pub fn profile_of_type<'b>(board: &'b Board, type_name: &str) -> Option<&'b BoardProfile> {
    let t = VgpuTypeName::parse(type_name).ok()?;
    let slices = u32::from(t.mig_slices?);
    let fb = t.framebuffer_mib();
    board
        .profiles
        .iter()
        .filter(|p| p.compute_slices == slices)
        .min_by_key(|p| p.memory_mib.abs_diff(fb))
}
