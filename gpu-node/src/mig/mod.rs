//! MIG GPU instances, made and destroyed through NVML ([`gpu_nvml::NvmlDevices`]) by the one
//! writer of the node.
//!
//! NVIDIA's order for MIG-backed vGPUs (docs/partitions.md cites each source): MIG mode on
//! while nothing uses the GPU, before SR-IOV's VFs are enabled (`sriov-manage -e`); then the
//! GPU instances; then a MIG-backed vGPU type on a VF. Every operation here checks its part of
//! that order, and what uses the GPU, before its first write; a MIG mode that waits for a GPU
//! reset is reported ([`MigError::PendingReset`]), never assumed in force.
//!
//! A new GPU instance goes where it leaves the most later placements possible
//! ([`gpu_core::mig::choose::best_span`]) on the lattice NVML lists ([`board`]). gpuslice
//! records each instance it makes ([`owned`]) and destroys only those unless told otherwise.

pub mod apply;
pub mod ask;
pub mod board;
mod error;
pub mod layout;
pub mod open;
pub mod owned;
pub mod realize;
#[cfg(feature = "sandbox")]
pub mod sandbox;
pub mod text;
pub mod vgpu;

use gpu_core::PciAddress;
use gpu_core::mig::MigOccupancy;
use gpu_core::mig::choose::best_span;
use gpu_nvml::{
    GpuInstance, MigActivation, MigMode, MigModes, NvmlDevices, NvmlErrorKind, Placement,
};
use gpu_sysfs::Host;
use serde::Serialize;

pub use board::{Board, InstanceView, ProfileView};
pub use error::MigError;
pub use owned::OwnedInstance;

use crate::Node;
use crate::intent::{self, Intent};

/// What to look at after an unfinished MIG write.
const CHECK_MIG: &str = "`gpuslice mig list` (a GPU instance may be there that no record names)";

/// One GPU's MIG state as `gpuslice mig list -o json` shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct GpuMig {
    /// The GPU.
    pub gpu: PciAddress,
    /// `enabled`, `disabled` or `pending reset`.
    pub mig_mode: &'static str,
    /// Its GPU instances, by start.
    pub gpu_instances: Vec<InstanceView>,
    /// Its profiles with the legal starts still free.
    pub profiles: Vec<ProfileView>,
    /// Where the profiles came from: `nvml`, `table`, or `unknown`.
    pub geometry: &'static str,
    /// Why the profiles are not known, where they are not.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

/// What a MIG write did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct MigChange {
    /// The GPU.
    pub gpu: PciAddress,
    /// The MIG mode set, when it changed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mig_mode: Option<&'static str>,
    /// GPU instances destroyed (IDs).
    pub destroyed: Vec<u32>,
    /// GPU instances made.
    pub created: Vec<InstanceView>,
}

impl MigChange {
    fn new(gpu: PciAddress) -> Self {
        MigChange {
            gpu,
            mig_mode: None,
            destroyed: Vec::new(),
            created: Vec::new(),
        }
    }

    /// True when the host changed.
    pub fn changed(&self) -> bool {
        self.mig_mode.is_some() || !self.destroyed.is_empty() || !self.created.is_empty()
    }
}

/// The MIG writer of a node: its host (for sysfs checks and records) and its NVML.
#[derive(Clone, Copy)]
pub struct Mig<'n, 'h> {
    node: &'n Node<'h>,
    nvml: &'n dyn NvmlDevices,
}

impl std::fmt::Debug for Mig<'_, '_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mig")
            .field("node", self.node)
            .finish_non_exhaustive()
    }
}

impl<'h> Node<'h> {
    /// The MIG writer of this node, over `nvml`.
    pub fn mig<'n>(&'n self, nvml: &'n dyn NvmlDevices) -> Mig<'n, 'h> {
        Mig { node: self, nvml }
    }
}

fn view(
    board: Option<&Board>,
    owned: &[OwnedInstance],
    gpu: &PciAddress,
    gi: &GpuInstance,
) -> InstanceView {
    let profile = board
        .and_then(|b| b.by_id(gi.profile_id))
        .map(|p| p.name.clone())
        .unwrap_or_else(|| format!("profile {}", gi.profile_id));
    InstanceView {
        id: gi.id,
        profile,
        profile_id: gi.profile_id,
        start: gi.placement.start,
        slices: gi.placement.size,
        compute_slices: gi.slice_count,
        made_by: if owned::made_by_us(owned, gpu, gi) {
            "gpuslice"
        } else {
            "other"
        },
    }
}

/// The slots `instances` hold.
fn occupancy(instances: &[GpuInstance]) -> MigOccupancy {
    let mut occ = MigOccupancy::empty();
    for gi in instances {
        if let (Ok(s), Ok(n)) = (
            u8::try_from(gi.placement.start),
            u8::try_from(gi.placement.size),
        ) {
            occ.hold_span(s, n);
        }
    }
    occ
}

fn held_text(occ: MigOccupancy) -> String {
    let v: Vec<String> = (0..16u8)
        .filter(|s| occ.is_held(*s))
        .map(|s| s.to_string())
        .collect();
    if v.is_empty() {
        "none".to_owned()
    } else {
        v.join(",")
    }
}

impl<'n, 'h> Mig<'n, 'h> {
    fn host(&self) -> &'h dyn Host {
        self.node.host
    }

    /// The MIG mode of `gpu`.
    ///
    /// # Errors
    /// [`MigError::NotMigCapable`], [`MigError::Nvml`].
    pub fn modes(&self, gpu: &PciAddress) -> Result<MigModes, MigError> {
        self.nvml.mig_mode(gpu).map_err(|e| match e.kind {
            NvmlErrorKind::NotSupported => MigError::NotMigCapable { gpu: *gpu },
            _ => MigError::Nvml {
                gpu: *gpu,
                source: e,
            },
        })
    }

    /// The MIG state of `gpu`. Reads only.
    ///
    /// # Errors
    /// As [`Mig::modes`]; NVML failures listing profiles or instances.
    pub fn status(&self, gpu: &PciAddress) -> Result<GpuMig, MigError> {
        let modes = self.modes(gpu)?;
        let instances = board::instances(self.nvml, gpu)?;
        let owned = owned::read(self.host());
        let (board, note) = match board::read(self.host(), self.nvml, gpu, modes.current) {
            Ok(b) => (Some(b), None),
            Err(MigError::UnknownGeometry { why, .. }) => (None, Some(why)),
            Err(e) => return Err(e),
        };
        let occ = occupancy(&instances);
        let profiles = board
            .as_ref()
            .map(|b| {
                b.profiles
                    .iter()
                    .map(|p| ProfileView {
                        name: p.name.clone(),
                        id: p.id,
                        slices: p.compute_slices,
                        memory_slices: p.spans.first().map_or(0, |(_, n)| u32::from(*n)),
                        memory_mib: p.memory_mib,
                        placements: p
                            .spans
                            .iter()
                            .filter(|(s, n)| occ.is_span_free(*s, *n))
                            .map(|(s, _)| u32::from(*s))
                            .collect(),
                    })
                    .collect()
            })
            .unwrap_or_default();
        Ok(GpuMig {
            gpu: *gpu,
            mig_mode: modes.describe(),
            gpu_instances: instances
                .iter()
                .map(|gi| view(board.as_ref(), &owned, gpu, gi))
                .collect(),
            profiles,
            geometry: board.as_ref().map_or("unknown", |b| b.source),
            note,
        })
    }

    /// What uses `gpu` so that its MIG mode cannot change: running vGPUs (NVML), VFs holding
    /// a vGPU type, and VFs at all (NVIDIA's order: MIG mode before `sriov-manage -e`).
    fn in_use(&self, gpu: &PciAddress) -> Result<Option<String>, MigError> {
        if let Some(what) = self.in_use_by_vgpus(gpu)? {
            return Ok(Some(what));
        }
        let vfs = gpu_sysfs::actuate::vfs_of(self.host(), gpu);
        if !vfs.is_empty() {
            return Ok(Some(format!(
                "its {} SR-IOV VFs are enabled (NVIDIA's order is MIG mode first, then \
                 `sriov-manage -e`: `gpuslice sriov disable {gpu}` first)",
                vfs.len()
            )));
        }
        Ok(None)
    }

    /// Running vGPUs (NVML) and VFs holding a vGPU type.
    fn in_use_by_vgpus(&self, gpu: &PciAddress) -> Result<Option<String>, MigError> {
        match self.nvml.active_vgpus(gpu) {
            Ok(v) if !v.is_empty() => return Ok(Some(format!("{} vGPU(s) run on it", v.len()))),
            Ok(_) => {}
            Err(e) if e.kind == NvmlErrorKind::NotSupported => {}
            Err(e) => {
                return Err(MigError::Nvml {
                    gpu: *gpu,
                    source: e,
                });
            }
        }
        let vfs = gpu_sysfs::actuate::vfs_of(self.host(), gpu);
        for vf in &vfs {
            let t = self
                .host()
                .read_string(&format!(
                    "sys/bus/pci/devices/{vf}/nvidia/current_vgpu_type"
                ))
                .ok()
                .and_then(|s| s.trim().parse::<u32>().ok())
                .unwrap_or(0);
            if t != 0 {
                return Ok(Some(format!("VF {vf} holds vGPU type {t}")));
            }
        }
        Ok(None)
    }

    /// Checks a MIG mode change of `gpu` to `mode` beyond the pending state: nothing uses it,
    /// no VF exists, and no GPU instance is left when turning MIG off.
    fn check_mode_change(&self, gpu: &PciAddress) -> Result<(), MigError> {
        if let Some(what) = self.in_use(gpu)? {
            return Err(MigError::InUse { gpu: *gpu, what });
        }
        Ok(())
    }

    /// Checks that `gpu`'s MIG mode can become `mode`: `Ok(false)` when it already is.
    fn check_mode(&self, gpu: &PciAddress, mode: MigMode) -> Result<bool, MigError> {
        let modes = self.modes(gpu)?;
        if modes.is_pending() {
            return Err(MigError::PendingReset {
                gpu: *gpu,
                pending: modes.describe_pending(),
            });
        }
        if modes.current == mode {
            return Ok(false);
        }
        if let Some(what) = self.in_use(gpu)? {
            return Err(MigError::InUse { gpu: *gpu, what });
        }
        if mode == MigMode::Disabled && !board::instances(self.nvml, gpu)?.is_empty() {
            return Err(MigError::InUse {
                gpu: *gpu,
                what: "GPU instances exist (`gpuslice mig clear` first)".to_owned(),
            });
        }
        Ok(true)
    }

    fn write_mode(&self, gpu: &PciAddress, mode: MigMode) -> Result<(), MigError> {
        match self
            .nvml
            .set_mig_mode(gpu, mode)
            .map_err(MigError::nvml(*gpu))?
        {
            MigActivation::Active => Ok(()),
            MigActivation::Pending(_) => Err(MigError::PendingReset {
                gpu: *gpu,
                pending: describe(mode),
            }),
        }
    }

    /// Sets `gpu`'s MIG mode, checked first ([`MigError::InUse`] naming what uses it, a
    /// pending mode reported); `Ok(false)` when it already was.
    ///
    /// # Errors
    /// As above; [`MigError::PendingReset`] when NVML accepted the mode but it waits for a
    /// reset.
    pub fn set_mode(&self, gpu: &PciAddress, mode: MigMode) -> Result<bool, MigError> {
        if !self.check_mode(gpu, mode)? {
            return Ok(false);
        }
        self.locked(format!("set MIG mode {} on {gpu}", describe(mode)), || {
            if !self.check_mode(gpu, mode)? {
                return Ok(false);
            }
            self.write_mode(gpu, mode).map(|()| true)
        })
    }

    /// Runs `op` under the host-wide lock with its intent recorded.
    fn locked<T>(
        &self,
        what: String,
        op: impl FnOnce() -> Result<T, MigError>,
    ) -> Result<T, MigError> {
        let _lock = self.node.acquire()?;
        intent::around(
            self.host(),
            Intent::new("mig", what, CHECK_MIG),
            |_| Vec::new(),
            op,
        )
    }

    /// The span a new `profile` instance takes on `gpu` now, and its profile ID.
    fn place(
        &self,
        gpu: &PciAddress,
        board: &Board,
        profile: &str,
        taken: MigOccupancy,
    ) -> Result<(u32, Placement), MigError> {
        let p = board
            .profile(profile)
            .ok_or_else(|| MigError::UnknownProfile {
                gpu: *gpu,
                name: profile.to_owned(),
                known: board.names(),
            })?;
        let id = p.id.ok_or(MigError::MigOff { gpu: *gpu })?;
        let (start, size) =
            best_span(&board.lattice(), taken, &p.spans).ok_or_else(|| MigError::NoRoom {
                gpu: *gpu,
                profile: p.name.clone(),
                held: held_text(taken),
            })?;
        Ok((
            id,
            Placement {
                start: u32::from(start),
                size: u32::from(size),
            },
        ))
    }

    /// Makes a GPU instance of `profile` on `gpu` (MIG mode must be on) where it leaves the
    /// most later placements, and records it as gpuslice's, made for `made_for`.
    ///
    /// # Errors
    /// [`MigError::MigOff`], [`MigError::PendingReset`], [`MigError::UnknownProfile`],
    /// [`MigError::NoRoom`], [`MigError::Nvml`], [`MigError::Record`].
    pub fn create(
        &self,
        gpu: &PciAddress,
        profile: &str,
        made_for: &str,
    ) -> Result<InstanceView, MigError> {
        self.check_create(gpu, profile)?;
        self.locked(format!("create a {profile} GPU instance on {gpu}"), || {
            self.create_held(gpu, profile, made_for)
        })
    }

    /// [`Mig::create`] for a caller that holds the host-wide lock already (the agent, a DRA
    /// prepare): checked again and made, with no lock of its own.
    ///
    /// # Errors
    /// As [`Mig::create`].
    pub fn create_held(
        &self,
        gpu: &PciAddress,
        profile: &str,
        made_for: &str,
    ) -> Result<InstanceView, MigError> {
        let (board, id, at) = self.check_create(gpu, profile)?;
        self.make(gpu, &board, id, at, made_for)
    }

    fn check_create(
        &self,
        gpu: &PciAddress,
        profile: &str,
    ) -> Result<(Board, u32, Placement), MigError> {
        let modes = self.modes(gpu)?;
        if modes.is_pending() {
            return Err(MigError::PendingReset {
                gpu: *gpu,
                pending: modes.describe_pending(),
            });
        }
        if modes.current != MigMode::Enabled {
            return Err(MigError::MigOff { gpu: *gpu });
        }
        let board = board::read(self.host(), self.nvml, gpu, MigMode::Enabled)?;
        let taken = occupancy(&board::instances(self.nvml, gpu)?);
        let (id, at) = self.place(gpu, &board, profile, taken)?;
        Ok((board, id, at))
    }

    fn make(
        &self,
        gpu: &PciAddress,
        board: &Board,
        id: u32,
        at: Placement,
        made_for: &str,
    ) -> Result<InstanceView, MigError> {
        let gi = self
            .nvml
            .create_gpu_instance(gpu, id, at)
            .map_err(MigError::nvml(*gpu))?;
        let mut owned = owned::read(self.host());
        owned.push(OwnedInstance {
            gpu: *gpu,
            id: gi.id,
            profile_id: gi.profile_id,
            start: gi.placement.start,
            size: gi.placement.size,
            made_for: made_for.to_owned(),
        });
        owned::write(self.host(), &owned).map_err(MigError::Record)?;
        Ok(view(Some(board), &owned, gpu, &gi))
    }

    /// Destroys GPU instance `id` of `gpu`: only one gpuslice made unless `any`; NVML refuses
    /// one a vGPU uses (`IN_USE`).
    ///
    /// # Errors
    /// [`MigError::NotOurs`], [`MigError::Nvml`] (`NOT_FOUND`, `IN_USE`), [`MigError::Record`].
    pub fn destroy(&self, gpu: &PciAddress, id: u32, any: bool) -> Result<(), MigError> {
        let check = || -> Result<(), MigError> {
            let all = board::instances(self.nvml, gpu)?;
            let Some(gi) = all.iter().find(|g| g.id == id) else {
                return Err(MigError::Nvml {
                    gpu: *gpu,
                    source: gpu_nvml::NvmlError::new(
                        "nvmlDeviceGetGpuInstanceById",
                        NvmlErrorKind::NotFound,
                    ),
                });
            };
            if !any && !owned::made_by_us(&owned::read(self.host()), gpu, gi) {
                return Err(MigError::NotOurs {
                    gpu: *gpu,
                    id,
                    why: "was not made by gpuslice (`--all` destroys it anyway)".to_owned(),
                });
            }
            Ok(())
        };
        check()?;
        self.locked(format!("destroy GPU instance {id} of {gpu}"), || {
            check()?;
            self.unmake(gpu, id)
        })
    }

    pub(crate) fn unmake(&self, gpu: &PciAddress, id: u32) -> Result<(), MigError> {
        self.nvml
            .destroy_gpu_instance(gpu, id)
            .map_err(MigError::nvml(*gpu))?;
        let mut owned = owned::read(self.host());
        owned.retain(|o| !(o.gpu == *gpu && o.id == id));
        owned::write(self.host(), &owned).map_err(MigError::Record)
    }

    /// Destroys the GPU instances of `gpu` that gpuslice made (every one with `any`), skipping
    /// those a vGPU uses (NVML's `IN_USE`), which are reported in `kept`.
    ///
    /// # Errors
    /// [`MigError::Nvml`] other than `IN_USE`, [`MigError::Record`].
    pub fn clear(&self, gpu: &PciAddress, any: bool) -> Result<(MigChange, Vec<u32>), MigError> {
        let mut change = MigChange::new(*gpu);
        let mut kept = Vec::new();
        let wanted = |all: &[GpuInstance], owned: &[OwnedInstance]| -> Vec<u32> {
            all.iter()
                .filter(|gi| any || owned::made_by_us(owned, gpu, gi))
                .map(|gi| gi.id)
                .collect()
        };
        if wanted(
            &board::instances(self.nvml, gpu)?,
            &owned::read(self.host()),
        )
        .is_empty()
        {
            return Ok((change, kept));
        }
        self.locked(format!("destroy the GPU instances of {gpu}"), || {
            let ids = wanted(
                &board::instances(self.nvml, gpu)?,
                &owned::read(self.host()),
            );
            for id in ids {
                match self.unmake(gpu, id) {
                    Ok(()) => change.destroyed.push(id),
                    Err(MigError::Nvml { source, .. }) if source.kind == NvmlErrorKind::InUse => {
                        kept.push(id)
                    }
                    Err(e) => return Err(e),
                }
            }
            Ok(())
        })?;
        Ok((change, kept))
    }
}

fn describe(mode: MigMode) -> &'static str {
    match mode {
        MigMode::Enabled => "enabled",
        MigMode::Disabled => "disabled",
    }
}

/// The pending half of a GPU's modes, as words.
trait PendingWord {
    fn describe_pending(self) -> &'static str;
}

impl PendingWord for MigModes {
    fn describe_pending(self) -> &'static str {
        describe(self.pending)
    }
}

#[cfg(test)]
mod tests;
