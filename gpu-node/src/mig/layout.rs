//! MIG for layouts (`vgpu apply`, `vgpu clear`): what each GPU of a layout's plan needs from
//! MIG is worked out and checked before the first write, so a layout that cannot be met is
//! refused with nothing cleared.
//!
//! - A GPU in MIG mode asked for a time-sliced type gets MIG mode off, but only while nothing
//!   uses it (no vGPU, no VF, no process, no GPU instance gpuslice did not make); otherwise the
//!   layout is refused naming the GPU and what is in the way.
//! - A GPU asked for MIG-backed types gets the GPU instances those types imply, as NVIDIA
//!   vgpu-device-manager's `ToMigConfigSpecSlice` derives them (per GPU, one instance of each
//!   type's profile per vGPU), made at the starts that keep the most later layouts
//!   ([`gpu_core::mig::choose::best_span`]) and recorded as gpuslice's; with MIG mode off and
//!   nothing in use, MIG mode goes on first and then SR-IOV's VFs (NVIDIA's order, cited in
//!   docs/partitions.md).
//! - A mode NVML leaves pending a reset stops the layout there ([`MigError::PendingReset`]).
//! - After the layout, gpuslice's instances made for vGPUs (not those `mig apply` made) that
//!   no vGPU holds any more are destroyed: `vgpu clear` takes them with the vGPUs.

use std::collections::BTreeMap;

use gpu_core::ParentId;
use gpu_core::PciAddress;
use gpu_core::layout::Plan;
use gpu_core::mig::choose::best_span;
use gpu_core::nvidia::VgpuTypeName;
use gpu_nvml::{MigMode, Placement};
use gpu_sysfs::actuate::SriovOptions;

use super::board::profile_of_type;
use super::{Mig, MigError, board, describe, held_text, occupancy, owned};

/// What MIG must do on one GPU before its layout is written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuNeeds {
    /// The GPU.
    pub gpu: PciAddress,
    /// The MIG mode to set first, when it must change.
    pub mode: Option<MigMode>,
    /// SR-IOV's VFs are enabled by the layout: after MIG mode, before the GPU instances.
    pub enable_sriov: bool,
    /// Profiles of GPU instances to make, largest first (the `ToMigConfigSpecSlice` of the
    /// GPU's MIG-backed types, less the instances there are).
    pub make: Vec<String>,
}

/// What [`Mig::prepare_layout`] did: instances to undo when the layout fails, and what to say.
#[derive(Debug, Default)]
pub struct Prepared {
    /// GPU instances made (GPU, ID).
    pub made: Vec<(PciAddress, u32)>,
    /// One line per change, for the report's warnings.
    pub notes: Vec<String>,
}

/// The MIG-backed and the time-sliced types of `types` (name, count) a GPU is to hold.
fn split(types: &[(String, u32)]) -> (Vec<(String, u32)>, Vec<String>) {
    let mut mig = Vec::new();
    let mut sliced = Vec::new();
    for (name, n) in types.iter().filter(|(_, n)| *n > 0) {
        match VgpuTypeName::parse(name) {
            Ok(t) if t.mig_slices.is_some() => mig.push((name.clone(), *n)),
            Ok(_) => sliced.push(name.clone()),
            Err(_) => {}
        }
    }
    (mig, sliced)
}

impl Mig<'_, '_> {
    /// What each GPU of `wants` (the types a layout gives it, with counts:
    /// `gpu_core::layout::wanted_counts`) needs from MIG, checked (reads only). A GPU without
    /// MIG, or whose types fit its mode and instances, needs nothing.
    ///
    /// # Errors
    /// [`MigError::InUse`] (MIG mode would have to change while something uses the GPU, or the
    /// layout mixes MIG-backed and time-sliced types on one GPU), [`MigError::PendingReset`],
    /// [`MigError::UnknownProfile`], [`MigError::NoRoom`], [`MigError::Nvml`].
    pub fn layout_needs(
        &self,
        wants: &BTreeMap<PciAddress, Vec<(String, u32)>>,
    ) -> Result<Vec<GpuNeeds>, MigError> {
        let mut out = Vec::new();
        for (gpu, types) in wants {
            if let Some(n) = self.gpu_needs(gpu, types)? {
                out.push(n);
            }
        }
        Ok(out)
    }

    fn gpu_needs(
        &self,
        gpu: &PciAddress,
        types: &[(String, u32)],
    ) -> Result<Option<GpuNeeds>, MigError> {
        let (mig, sliced) = split(types);
        if mig.is_empty() && sliced.is_empty() {
            return Ok(None);
        }
        let modes = match self.nvml.mig_mode(gpu) {
            Ok(m) => m,
            Err(e) if e.is_not_applicable() => return Ok(None),
            Err(e) => return Err(MigError::nvml(*gpu)(e)),
        };
        if modes.is_pending() {
            return Err(MigError::PendingReset {
                gpu: *gpu,
                pending: describe(modes.pending),
            });
        }
        if let (Some((m, _)), Some(s)) = (mig.first(), sliced.first()) {
            return Err(MigError::InUse {
                gpu: *gpu,
                what: format!(
                    "the layout asks for {m} (MIG-backed) and {s} (time-sliced) on it: NVIDIA's \
                     driver holds one kind per GPU"
                ),
            });
        }
        let mut needs = GpuNeeds {
            gpu: *gpu,
            mode: None,
            enable_sriov: gpu_sysfs::actuate::vfs_of(self.host(), gpu).is_empty(),
            make: Vec::new(),
        };
        let instances = board::instances(self.nvml, gpu)?;
        let (first, mig_backed) = match (mig.first(), sliced.first()) {
            (Some((m, _)), _) => (m.as_str(), true),
            (None, Some(s)) => (s.as_str(), false),
            (None, None) => return Ok(None),
        };
        needs.mode = self.mode_for_type(gpu, modes, first, mig_backed)?;
        if !mig_backed {
            return Ok(needs.mode.is_some().then_some(needs));
        }
        let board = board::read(self.host(), self.nvml, gpu, modes.current)?;
        // ToMigConfigSpecSlice: one instance of each type's profile per vGPU of it.
        let mut want: BTreeMap<String, u32> = BTreeMap::new();
        for (name, n) in &mig {
            let p = profile_of_type(&board, name).ok_or_else(|| MigError::UnknownProfile {
                gpu: *gpu,
                name: name.clone(),
                known: board.names(),
            })?;
            *want.entry(p.name.clone()).or_default() += n;
        }
        let mut taken = occupancy(&instances);
        let mut make: Vec<&super::board::BoardProfile> = Vec::new();
        for (name, n) in &want {
            let Some(p) = board.profile(name) else {
                continue;
            };
            let have = instances
                .iter()
                .filter(|gi| p.id == Some(gi.profile_id))
                .count();
            let have = u32::try_from(have).unwrap_or(u32::MAX);
            for _ in have..*n {
                make.push(p);
            }
        }
        make.sort_by_key(|p| std::cmp::Reverse(p.compute_slices));
        for p in &make {
            let (s, n) =
                best_span(&board.lattice(), taken, &p.spans).ok_or_else(|| MigError::NoRoom {
                    gpu: *gpu,
                    profile: format!(
                        "{} (the layout needs {} new instance(s); `gpuslice vgpu clear` frees \
                         the ones gpuslice made for vGPUs the layout replaces)",
                        p.name,
                        make.len()
                    ),
                    held: held_text(taken),
                })?;
            taken.hold_span(s, n);
            needs.make.push(p.name.clone());
        }
        Ok((needs.mode.is_some() || !needs.make.is_empty()).then_some(needs))
    }

    /// Does what `needs` says, in NVIDIA's order (MIG mode, SR-IOV's VFs, GPU instances), under
    /// the host-wide lock the caller holds. Instances made are recorded as made for `made_for`.
    /// On a failure the instances this call made are destroyed again.
    ///
    /// # Errors
    /// [`MigError::PendingReset`] when NVML left a mode pending a reset (nothing after it is
    /// done), what the writes answer.
    pub fn prepare_layout(
        &self,
        needs: &[GpuNeeds],
        sriov: &SriovOptions,
        made_for: &str,
    ) -> Result<Prepared, MigError> {
        let mut done = Prepared::default();
        match self.prepare_into(needs, sriov, made_for, &mut done) {
            Ok(()) => Ok(done),
            Err(e) => {
                self.undo(&done);
                Err(e)
            }
        }
    }

    fn prepare_into(
        &self,
        needs: &[GpuNeeds],
        sriov: &SriovOptions,
        made_for: &str,
        done: &mut Prepared,
    ) -> Result<(), MigError> {
        for n in needs {
            let gpu = &n.gpu;
            if let Some(mode) = n.mode {
                self.switch_mode(gpu, mode, &mut done.notes)?;
            }
            if n.enable_sriov && !n.make.is_empty() {
                gpu_sysfs::actuate::enable_sriov(self.host(), gpu, sriov).map_err(|source| {
                    crate::NodeError::EnableSriov {
                        pf: *gpu,
                        source: Box::new(source),
                    }
                })?;
                done.notes
                    .push(format!("{gpu}: SR-IOV enabled after MIG mode"));
            }
            for profile in &n.make {
                let board = board::read(self.host(), self.nvml, gpu, MigMode::Enabled)?;
                let taken = occupancy(&board::instances(self.nvml, gpu)?);
                let (id, at): (u32, Placement) = self.place(gpu, &board, profile, taken)?;
                let gi = self.make(gpu, &board, id, at, made_for)?;
                done.made.push((*gpu, gi.id));
                done.notes.push(format!(
                    "{gpu}: GPU instance {} ({}) made at start {} for the layout",
                    gi.id, gi.profile, gi.start
                ));
            }
        }
        Ok(())
    }

    /// Destroys the instances `done` made (those a vGPU took stay: NVML refuses them).
    pub fn undo(&self, done: &Prepared) {
        for (gpu, id) in done.made.iter().rev() {
            // Best effort: what stays is listed by `gpuslice mig list` as gpuslice's.
            let _ = self.unmake(gpu, *id);
        }
    }

    /// After a layout on `plan`'s GPUs: destroys the GPU instances gpuslice made for vGPUs
    /// (not those `mig apply` made, nor anyone else's) that no vGPU holds any more. Lines for
    /// the report.
    ///
    /// # Errors
    /// What discovery and NVML answer (an instance NVML finds in use is kept).
    pub fn release_unused(&self, plan: &Plan) -> Result<Vec<String>, MigError> {
        let mut notes = Vec::new();
        for g in &plan.gpus {
            let ParentId::Pci(gpu) = g.gpu else {
                continue;
            };
            let Ok(modes) = self.nvml.mig_mode(&gpu) else {
                continue;
            };
            if modes.current != MigMode::Enabled {
                continue;
            }
            let board = board::read(self.host(), self.nvml, &gpu, MigMode::Enabled)?;
            let held = self.held(&gpu, &board)?;
            let all = board::instances(self.nvml, &gpu)?;
            let mine = owned::read(self.host());
            for p in &board.profiles {
                let of: Vec<_> = all
                    .iter()
                    .filter(|gi| p.id == Some(gi.profile_id))
                    .collect();
                let spare = of
                    .len()
                    .saturating_sub(held.get(&p.name).copied().unwrap_or(0));
                let ours = of
                    .iter()
                    .rev()
                    .filter(|gi| owned::made_for_vgpus(&mine, &gpu, gi))
                    .take(spare);
                for gi in ours {
                    if self.unmake(&gpu, gi.id).is_ok() {
                        notes.push(format!(
                            "{gpu}: GPU instance {} ({}) destroyed with its vGPU",
                            gi.id, p.name
                        ));
                    }
                }
            }
        }
        Ok(notes)
    }
}

/// The MIG side of one `Node::apply_layout`: checked and prepared before the layout's first
/// write, finished after it.
#[derive(Debug, Default)]
pub(crate) struct LayoutHook<'n, 'h> {
    mig: Option<Mig<'n, 'h>>,
    done: Prepared,
}

impl<'n, 'h> LayoutHook<'n, 'h> {
    /// Before a layout is written on `node` (its lock held): with an NVML, the layout's plan
    /// checked for what MIG needs and that done; without one, nothing (the driver's answer
    /// stays the check, as before).
    pub(crate) fn before(
        node: &'n crate::Node<'h>,
        config: &gpu_core::layout::LayoutConfig,
        opts: &gpu_sysfs::apply::ApplyOptions,
    ) -> Result<Self, crate::NodeError> {
        let Some(nvml) = node.nvml_handle() else {
            return Ok(LayoutHook::default());
        };
        let mig = node.mig(nvml);
        let fail = |e: MigError| crate::NodeError::Mig(Box::new(e));
        let mut done = Prepared::default();
        if opts.mode == gpu_core::layout::Mode::Apply {
            // What the layout wants, before its types are resolved: a GPU in MIG mode lists a
            // MIG-backed type only once an instance for it exists. What cannot be read or
            // selected is left to the layout to report.
            let wants = gpu_sysfs::apply::observe(node.host, &opts.discover)
                .ok()
                .and_then(|t| gpu_core::layout::wanted_counts(config, &t).ok())
                .unwrap_or_default();
            let needs = mig.layout_needs(&wants).map_err(fail)?;
            done = mig
                .prepare_layout(&needs, &opts.sriov, &format!("layout {}", config.name))
                .map_err(fail)?;
        }
        Ok(LayoutHook {
            mig: Some(mig),
            done,
        })
    }

    /// After the layout: on success the instances no vGPU holds any more destroyed and every
    /// MIG change said among the report's warnings; on failure the instances made for it
    /// destroyed again.
    pub(crate) fn after(
        self,
        out: Result<gpu_sysfs::apply::ApplyReport, crate::NodeError>,
    ) -> Result<gpu_sysfs::apply::ApplyReport, crate::NodeError> {
        let Some(mig) = self.mig else {
            return out;
        };
        match out {
            Ok(mut report) => {
                let mut notes = self.done.notes;
                notes.extend(mig.release_unused(&report.plan).unwrap_or_default());
                report.plan.warnings.extend(notes);
                Ok(report)
            }
            Err(e) => {
                mig.undo(&self.done);
                Err(e)
            }
        }
    }
}
