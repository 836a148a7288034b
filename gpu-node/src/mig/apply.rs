//! `gpuslice mig apply|assert` of a mig-parted config ([`gpu_core::mig::parted`]): which GPUs
//! an entry selects (NVIDIA's indices and device filters, as the vGPU layout file), and what
//! each must change to match. Every selected GPU is planned, and every plan checked (MIG mode
//! changes allowed, instances to destroy not in use, new ones placed on the lattice), before
//! the first write.

use gpu_core::PciAddress;
use gpu_core::layout::nvidia_indices;
use gpu_core::mig::MigOccupancy;
use gpu_core::mig::choose::best_span;
use gpu_core::mig::parted::MigPartedConfig;
use gpu_core::topology::Gpu;
use gpu_nvml::{GpuInstance, MigMode};
use serde::Serialize;

use super::{Mig, MigChange, MigError, board, occupancy};

/// What one GPU must change to match its entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct GpuMigPlan {
    /// The GPU.
    pub gpu: PciAddress,
    /// MIG mode wanted.
    pub mig_enabled: bool,
    /// Turn MIG mode to `mig_enabled`.
    pub set_mode: bool,
    /// Instances to destroy (IDs).
    pub destroy: Vec<u32>,
    /// Profiles to make, largest first.
    pub create: Vec<String>,
}

impl GpuMigPlan {
    /// True when the GPU already matches.
    pub fn matches(&self) -> bool {
        !self.set_mode && self.destroy.is_empty() && self.create.is_empty()
    }
}

/// The GPUs `config` selects, each with its entry (a GPU two entries select takes the last, as
/// mig-parted applies entries in order).
pub fn select<'c>(
    config: &'c MigPartedConfig,
    gpus: &[Gpu],
) -> Vec<(PciAddress, &'c gpu_core::mig::parted::MigPartedEntry)> {
    let indices = nvidia_indices(gpus);
    let mut out: Vec<(PciAddress, &gpu_core::mig::parted::MigPartedEntry)> = Vec::new();
    for e in &config.entries {
        for (addr, i) in &indices {
            let Some(gpu) = gpus.iter().find(|g| g.address == *addr) else {
                continue;
            };
            if e.devices.contains(*i)
                && (e.filters.is_empty() || e.filters.iter().any(|f| f.matches(gpu)))
            {
                out.retain(|(a, _)| a != addr);
                out.push((*addr, e));
            }
        }
    }
    out.sort_by_key(|(a, _)| *a);
    out
}

impl Mig<'_, '_> {
    /// The plan of one GPU: the instances whose profiles the entry wants are kept (as many as
    /// it wants), the rest destroyed, the missing made; checked as it would be written.
    fn plan_gpu(
        &self,
        gpu: &PciAddress,
        entry: &gpu_core::mig::parted::MigPartedEntry,
    ) -> Result<GpuMigPlan, MigError> {
        let modes = self.modes(gpu)?;
        let want_mode = if entry.mig_enabled {
            MigMode::Enabled
        } else {
            MigMode::Disabled
        };
        let set_mode = modes.current != want_mode || modes.pending != want_mode;
        let instances: Vec<GpuInstance> = board::instances(self.nvml, gpu)?;
        // The lattice is known from the table while MIG is off, from NVML once on.
        let board = board::read(self.host(), self.nvml, gpu, modes.current)?;
        let mut want: Vec<(String, u32)> = Vec::new();
        for (name, count) in &entry.mig_devices {
            let p = board
                .profile(name)
                .ok_or_else(|| MigError::UnknownProfile {
                    gpu: *gpu,
                    name: name.clone(),
                    known: board.names(),
                })?;
            want.push((p.name.clone(), *count));
        }
        let mut keep: Vec<GpuInstance> = Vec::new();
        let mut destroy = Vec::new();
        for gi in &instances {
            let name = board
                .profiles
                .iter()
                .find(|p| {
                    p.compute_slices == gi.slice_count
                        && p.spans.first().map(|(_, n)| u32::from(*n)) == Some(gi.placement.size)
                })
                .map(|p| p.name.clone());
            match want
                .iter_mut()
                .find(|(n, c)| Some(n) == name.as_ref() && *c > 0)
            {
                Some((_, c)) => {
                    *c -= 1;
                    keep.push(*gi);
                }
                None => destroy.push(gi.id),
            }
        }
        let mut create: Vec<String> = Vec::new();
        for (n, c) in &want {
            for _ in 0..*c {
                create.push(n.clone());
            }
        }
        // Largest first, each where it leaves the most: refused here if any finds no room.
        create.sort_by_key(|n| {
            std::cmp::Reverse(
                board
                    .profile(n)
                    .and_then(|p| p.spans.first().map(|(_, s)| *s))
                    .unwrap_or(0),
            )
        });
        let mut taken: MigOccupancy = occupancy(&keep);
        for n in &create {
            let p = board.profile(n).ok_or_else(|| MigError::UnknownProfile {
                gpu: *gpu,
                name: n.clone(),
                known: board.names(),
            })?;
            let (s, len) =
                best_span(&board.lattice(), taken, &p.spans).ok_or_else(|| MigError::NoRoom {
                    gpu: *gpu,
                    profile: n.clone(),
                    held: super::held_text(taken),
                })?;
            taken.hold_span(s, len);
        }
        if set_mode && modes.is_pending() {
            return Err(MigError::PendingReset {
                gpu: *gpu,
                pending: super::describe(modes.pending),
            });
        }
        if set_mode || !destroy.is_empty() {
            if let Some(what) = self.in_use_by_vgpus(gpu)? {
                return Err(MigError::InUse { gpu: *gpu, what });
            }
        }
        if set_mode {
            self.check_mode_change(gpu)?;
        }
        Ok(GpuMigPlan {
            gpu: *gpu,
            mig_enabled: entry.mig_enabled,
            set_mode,
            destroy,
            create,
        })
    }

    /// The plans of every GPU `config` selects among `gpus`. Reads only.
    ///
    /// # Errors
    /// The first GPU's refusal.
    pub fn plan(
        &self,
        config: &MigPartedConfig,
        gpus: &[Gpu],
    ) -> Result<Vec<GpuMigPlan>, MigError> {
        select(config, gpus)
            .into_iter()
            .map(|(gpu, e)| self.plan_gpu(&gpu, e))
            .collect()
    }

    /// Makes every GPU `config` selects match it: planned and checked for all GPUs first, then
    /// written GPU by GPU (destroy, MIG mode, create) under the host-wide lock.
    ///
    /// # Errors
    /// A refusal of [`Mig::plan`] (nothing written), or the write that failed.
    pub fn apply(
        &self,
        config: &MigPartedConfig,
        gpus: &[Gpu],
    ) -> Result<Vec<MigChange>, MigError> {
        let plans = self.plan(config, gpus)?;
        if plans.iter().all(GpuMigPlan::matches) {
            return Ok(plans.iter().map(|p| MigChange::new(p.gpu)).collect());
        }
        self.locked(format!("apply MIG config {}", config.name), || {
            let plans = self.plan(config, gpus)?;
            let mut out = Vec::with_capacity(plans.len());
            for p in plans {
                let mut change = MigChange::new(p.gpu);
                for id in &p.destroy {
                    self.unmake(&p.gpu, *id)?;
                    change.destroyed.push(*id);
                }
                if p.set_mode {
                    let mode = if p.mig_enabled {
                        MigMode::Enabled
                    } else {
                        MigMode::Disabled
                    };
                    self.write_mode(&p.gpu, mode)?;
                    change.mig_mode = Some(super::describe(mode));
                }
                if !p.create.is_empty() {
                    let board = board::read(self.host(), self.nvml, &p.gpu, MigMode::Enabled)?;
                    for n in &p.create {
                        let taken = occupancy(&board::instances(self.nvml, &p.gpu)?);
                        let (id, at) = self.place(&p.gpu, &board, n, taken)?;
                        let made =
                            self.make(&p.gpu, &board, id, at, super::owned::MADE_BY_MIG_APPLY)?;
                        change.created.push(made);
                    }
                }
                out.push(change);
            }
            Ok(out)
        })
    }
}
