//! What a vGPU asks of its GPU's MIG state before its type is written, decided in one place for
//! every door that makes vGPUs one at a time (`vgpu create`, the agent's `POST /v1/vgpus`,
//! `realize`): [`Mig::plan_asks`] reads and checks, [`Mig::carry_out`] writes.
//!
//! - A MIG-backed type on a GPU with MIG mode off: MIG mode goes on, but only while nothing uses
//!   the GPU ([`Mig::mode_for_type`], the check layouts make too); then SR-IOV's VFs where the
//!   GPU has none yet (the order MIG mode → `sriov-manage -e` → GPU instances → types is as
//!   reported, not confirmed in NVIDIA's documentation: docs/partitions.md).
//! - A MIG-backed type with no free GPU instance of its profile: one is made, at the start the
//!   caller names (an allocation's `gpuInstanceStart`, refused naming the start when it is not
//!   a legal start of the profile or is taken) or else at the start that keeps the most later
//!   placements, and recorded as gpuslice's.
//! - A time-sliced type on a GPU in MIG mode: MIG mode goes off, only while nothing uses the GPU
//!   and no GPU instance gpuslice did not make exists (its own are destroyed first).
//! - A mode NVML leaves pending a reset is an error naming the reset, never assumed in force.

use std::collections::BTreeMap;

use gpu_core::PciAddress;
use gpu_core::mig::choose::best_span;
use gpu_core::nvidia::VgpuTypeName;
use gpu_nvml::{MigMode, MigModes, Placement};

use super::board::profile_of_type;
use super::{InstanceView, Mig, MigError, board, describe, held_text, occupancy, owned};

/// One vGPU to be made on a GPU: its type's name and, where the caller decided it, the first
/// memory slice of its GPU instance.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VgpuAsk<'a> {
    /// The vGPU type's name (`NVIDIA H200X-3-71C`).
    pub type_name: &'a str,
    /// The GPU instance's start (an allocation's `gpuInstanceStart`), when given.
    pub start: Option<u8>,
}

/// A GPU instance to make for one ask.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToMake {
    /// The profile (`3g.71gb`).
    pub profile: String,
    /// The first memory slice.
    pub start: u8,
    /// Memory slices.
    pub size: u8,
}

/// What the asks of one GPU need from MIG, checked (see the [module documentation](self)).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AskPlan {
    /// The GPU.
    pub gpu: PciAddress,
    /// The MIG mode to set first, when it must change.
    pub mode: Option<MigMode>,
    /// SR-IOV's VFs are to be enabled after the mode change (the GPU has none).
    pub enable_sriov: bool,
    /// Per ask, in order: the GPU instance to make, none where a free one serves it.
    pub make: Vec<Option<ToMake>>,
}

impl AskPlan {
    /// True when nothing is to be written.
    pub fn is_nothing(&self) -> bool {
        self.mode.is_none() && self.make.iter().all(Option::is_none)
    }
}

impl Mig<'_, '_> {
    /// Whether `gpu`, in `modes`, must change MIG mode for a vGPU of `type_name` (MIG-backed:
    /// on; time-sliced: off), checked: nothing may use the GPU, and for MIG mode off no GPU
    /// instance gpuslice did not make may exist. The one check of layouts and of the doors
    /// that make vGPUs one at a time.
    ///
    /// # Errors
    /// [`MigError::PendingReset`], [`MigError::InUse`] naming what uses the GPU.
    pub(super) fn mode_for_type(
        &self,
        gpu: &PciAddress,
        modes: MigModes,
        type_name: &str,
        mig_backed: bool,
    ) -> Result<Option<MigMode>, MigError> {
        if modes.is_pending() {
            return Err(MigError::PendingReset {
                gpu: *gpu,
                pending: describe(modes.pending),
            });
        }
        match (mig_backed, modes.current) {
            (true, MigMode::Enabled) | (false, MigMode::Disabled) => Ok(None),
            (true, MigMode::Disabled) => match self.in_use(gpu)? {
                Some(what) => Err(MigError::InUse {
                    gpu: *gpu,
                    what: format!("{type_name} is MIG-backed (MIG mode must go on), and {what}"),
                }),
                None => Ok(Some(MigMode::Enabled)),
            },
            (false, MigMode::Enabled) => {
                let mine = owned::read(self.host());
                let theirs = board::instances(self.nvml, gpu)?
                    .iter()
                    .filter(|gi| !owned::made_by_us(&mine, gpu, gi))
                    .count();
                let busy = self.in_use(gpu)?.or_else(|| {
                    (theirs > 0)
                        .then(|| format!("{theirs} GPU instance(s) gpuslice did not make exist"))
                });
                match busy {
                    Some(what) => Err(MigError::InUse {
                        gpu: *gpu,
                        what: format!(
                            "it is in MIG mode, {type_name} is a time-sliced type (MIG mode must \
                             go off), and {what}"
                        ),
                    }),
                    None => Ok(Some(MigMode::Disabled)),
                }
            }
        }
    }

    /// What `asks` (vGPUs to be made on `gpu`, in order) need from MIG, checked before any
    /// write. `Ok(None)`: a GPU without MIG, or no ask names an NVIDIA type. Reads only.
    ///
    /// # Errors
    /// As [`Mig::mode_for_type`]; [`MigError::InUse`] for asks of both kinds;
    /// [`MigError::UnknownProfile`], [`MigError::UnknownGeometry`]; [`MigError::BadStart`] and
    /// [`MigError::StartTaken`] for a start that is not legal or not free; [`MigError::NoRoom`];
    /// [`MigError::Nvml`].
    pub fn plan_asks(
        &self,
        gpu: &PciAddress,
        asks: &[VgpuAsk<'_>],
    ) -> Result<Option<AskPlan>, MigError> {
        let modes = match self.nvml.mig_mode(gpu) {
            Ok(m) => m,
            Err(e) if e.is_not_applicable() => return Ok(None),
            Err(e) => return Err(MigError::nvml(*gpu)(e)),
        };
        let kinds: Vec<(&str, bool)> = asks
            .iter()
            .filter_map(|a| {
                let t = VgpuTypeName::parse(a.type_name).ok()?;
                Some((a.type_name, t.mig_slices.is_some()))
            })
            .collect();
        let Some(&(first, mig_backed)) = kinds.first() else {
            return Ok(None);
        };
        if let Some((other, _)) = kinds.iter().find(|(_, m)| *m != mig_backed) {
            return Err(MigError::InUse {
                gpu: *gpu,
                what: format!(
                    "{first} and {other} are asked of it: NVIDIA's driver holds MIG-backed and \
                     time-sliced types on separate GPUs"
                ),
            });
        }
        let mode = self.mode_for_type(gpu, modes, first, mig_backed)?;
        let sriov_capable = self
            .host()
            .exists(&format!("sys/bus/pci/devices/{gpu}/sriov_numvfs"));
        let mut plan = AskPlan {
            gpu: *gpu,
            mode,
            enable_sriov: mode.is_some()
                && sriov_capable
                && gpu_sysfs::actuate::vfs_of(self.host(), gpu).is_empty(),
            make: vec![None; asks.len()],
        };
        if !mig_backed {
            return Ok(Some(plan));
        }
        let board = board::read(self.host(), self.nvml, gpu, modes.current)?;
        let instances = board::instances(self.nvml, gpu)?;
        let mut taken = occupancy(&instances);
        let held = self.held(gpu, &board)?;
        let mut free: BTreeMap<String, usize> = BTreeMap::new();
        for p in &board.profiles {
            let have = instances
                .iter()
                .filter(|gi| p.id.is_some() && p.id == Some(gi.profile_id))
                .count();
            let used = held.get(&p.name).copied().unwrap_or(0);
            free.insert(p.name.clone(), have.saturating_sub(used));
        }
        for (ask, slot) in asks.iter().zip(plan.make.iter_mut()) {
            let Some(p) = profile_of_type(&board, ask.type_name) else {
                return Err(MigError::UnknownProfile {
                    gpu: *gpu,
                    name: ask.type_name.to_owned(),
                    known: board.names(),
                });
            };
            let spare = free.entry(p.name.clone()).or_default();
            let (start, size) = match ask.start {
                None if *spare > 0 => {
                    *spare -= 1;
                    continue;
                }
                None => best_span(&board.lattice(), taken, &p.spans).ok_or_else(|| {
                    MigError::NoRoom {
                        gpu: *gpu,
                        profile: p.name.clone(),
                        held: held_text(taken),
                    }
                })?,
                Some(s) => {
                    let Some(&(_, n)) = p.spans.iter().find(|(at, _)| *at == s) else {
                        let legal: Vec<String> =
                            p.spans.iter().map(|(at, _)| at.to_string()).collect();
                        return Err(MigError::BadStart {
                            gpu: *gpu,
                            profile: p.name.clone(),
                            start: s,
                            legal: legal.join(","),
                        });
                    };
                    let there = instances.iter().any(|gi| {
                        p.id == Some(gi.profile_id) && gi.placement.start == u32::from(s)
                    });
                    if there && *spare > 0 {
                        *spare -= 1;
                        continue;
                    }
                    if !taken.is_span_free(s, n) {
                        return Err(MigError::StartTaken {
                            gpu: *gpu,
                            profile: p.name.clone(),
                            start: s,
                            held: held_text(taken),
                        });
                    }
                    (s, n)
                }
            };
            taken.hold_span(start, size);
            *slot = Some(ToMake {
                profile: p.name.clone(),
                start,
                size,
            });
        }
        Ok(Some(plan))
    }

    /// Switches `gpu` to `mode` as a plan says, the caller holding the lock: for MIG mode off
    /// the GPU instances (all gpuslice's, as checked) are destroyed first. One line per change.
    ///
    /// # Errors
    /// [`MigError::PendingReset`] when NVML left the mode pending a reset; NVML's errors.
    pub(super) fn switch_mode(
        &self,
        gpu: &PciAddress,
        mode: MigMode,
        notes: &mut Vec<String>,
    ) -> Result<(), MigError> {
        if mode == MigMode::Disabled {
            for gi in board::instances(self.nvml, gpu)? {
                self.unmake(gpu, gi.id)?;
                notes.push(format!("{gpu}: GPU instance {} destroyed", gi.id));
            }
        }
        self.write_mode(gpu, mode)?;
        notes.push(format!("{gpu}: MIG mode {}", describe(mode)));
        Ok(())
    }

    /// Does what `plan` says for its ask number `which`, the caller holding the lock: the mode,
    /// SR-IOV's VFs, then the GPU instance, recorded as made for `made_for`. The instance made,
    /// if one was.
    ///
    /// # Errors
    /// [`MigError::PendingReset`] (nothing after the mode is done), what the writes answer.
    pub(super) fn carry_out(
        &self,
        plan: &AskPlan,
        which: usize,
        made_for: &str,
    ) -> Result<Option<InstanceView>, MigError> {
        let gpu = &plan.gpu;
        let mut notes = Vec::new();
        if let Some(mode) = plan.mode {
            self.switch_mode(gpu, mode, &mut notes)?;
        }
        if plan.enable_sriov {
            let opts = gpu_sysfs::actuate::SriovOptions::default();
            gpu_sysfs::actuate::enable_sriov(self.host(), gpu, &opts).map_err(|source| {
                crate::NodeError::EnableSriov {
                    pf: *gpu,
                    source: Box::new(source),
                }
            })?;
        }
        let Some(Some(m)) = plan.make.get(which) else {
            return Ok(None);
        };
        let board = board::read(self.host(), self.nvml, gpu, MigMode::Enabled)?;
        let p = board
            .profile(&m.profile)
            .ok_or_else(|| MigError::UnknownProfile {
                gpu: *gpu,
                name: m.profile.clone(),
                known: board.names(),
            })?;
        let id = p.id.ok_or(MigError::MigOff { gpu: *gpu })?;
        let at = Placement {
            start: u32::from(m.start),
            size: u32::from(m.size),
        };
        self.make(gpu, &board, id, at, made_for).map(Some)
    }

    /// The one door of a vGPU made one at a time: [`Mig::plan_asks`] for it, then, under the
    /// host-wide lock (taken here unless `held`), planned again and carried out.
    pub(super) fn before_one(
        &self,
        gpu: &PciAddress,
        ask: VgpuAsk<'_>,
        held: bool,
    ) -> Result<Option<InstanceView>, MigError> {
        let asks = [ask];
        match self.plan_asks(gpu, &asks)? {
            Some(p) if !p.is_nothing() => {}
            _ => return Ok(None),
        }
        let made_for = format!("a {} vGPU", ask.type_name);
        let run = || match self.plan_asks(gpu, &asks)? {
            Some(p) if !p.is_nothing() => self.carry_out(&p, 0, &made_for),
            _ => Ok(None),
        };
        if held {
            run()
        } else {
            self.locked(format!("MIG for a {} vGPU on {gpu}", ask.type_name), run)
        }
    }
}
