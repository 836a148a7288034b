//! Framebuffer pool accounting shared by discovery and placement.
//!
//! Capacity is per physical GPU, not per parent: the GPU's framebuffer minus what existing vGPUs
//! use. Time-sliced vGPUs on one GPU must all have one framebuffer size unless the GPU runs in
//! mixed-size mode. MIG-backed vGPUs draw from the GPU's MIG slices instead, and a GPU holds either
//! kind, never both at once. Where the GPU's MIG geometry is known (`migSlots`), a MIG-backed
//! vGPU also needs a free start slot for its GPU instance wherever the existing ones sit
//! ([`crate::mig::MigSlots`]); otherwise only slice counts are checked.

use std::collections::BTreeMap;

use crate::ids::ParentId;
use crate::mig::{MigProfile, SlotMisfit};
use crate::topology::{NodeTopology, Parent, Pool, Profile};

/// Why a profile does not fit a pool.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Misfit {
    /// Not enough framebuffer left.
    Framebuffer {
        /// MiB needed.
        need_mib: u64,
        /// MiB free.
        free_mib: u64,
    },
    /// The GPU is locked to another time-sliced size.
    SizeLocked {
        /// The locked size.
        locked_mib: u64,
        /// The profile's size.
        size_mib: u64,
    },
    /// Not enough MIG slices left.
    MigSlices {
        /// Slices needed.
        need: u8,
        /// Slices free.
        free: u8,
    },
    /// Time-sliced and MIG-backed vGPUs cannot share a GPU.
    ModeConflict,
    /// No GPU-instance start slot for it (or the GPU's slots cannot be established).
    MigSlots(SlotMisfit),
}

impl std::fmt::Display for Misfit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Misfit::Framebuffer { need_mib, free_mib } => {
                write!(f, "needs {need_mib} MiB framebuffer, {free_mib} MiB free")
            }
            Misfit::SizeLocked {
                locked_mib,
                size_mib,
            } => {
                write!(
                    f,
                    "GPU is locked to {locked_mib} MiB vGPUs (same-size rule), profile is {size_mib} MiB"
                )
            }
            Misfit::MigSlices { need, free } => write!(f, "needs {need} MIG slices, {free} free"),
            Misfit::ModeConflict => {
                f.write_str("GPU already holds vGPUs of the other kind (time-sliced vs MIG-backed)")
            }
            Misfit::MigSlots(m) => write!(f, "{m}"),
        }
    }
}

impl Pool {
    /// Free framebuffer in MiB.
    pub fn free_mib(&self) -> u64 {
        self.total_mib.saturating_sub(self.used_mib)
    }

    /// Free MIG slices.
    pub fn free_mig_slices(&self) -> u8 {
        self.mig_slices_total
            .unwrap_or(0)
            .saturating_sub(self.mig_slices_used.unwrap_or(0))
    }

    /// The GPU-instance profile a MIG-backed `profile` takes in this pool's slots, where the
    /// pool tracks slots.
    fn mig_profile(&self, profile: &Profile) -> Option<Result<&'static MigProfile, SlotMisfit>> {
        let slices = profile.mig_slices?;
        let slots = self.mig_slots.as_ref()?;
        let mib = profile
            .framebuffer_mib
            .or(profile.mig_memory_gib.map(|g| u64::from(g) * 1024))
            .unwrap_or(0);
        Some(slots.profile_for(slices, mib))
    }

    fn has_time_sliced(&self) -> bool {
        self.used_mib > 0 && self.mig_slices_used.unwrap_or(0) == 0
    }

    /// Whether one more instance of `profile` fits.
    ///
    /// # Errors
    /// The [`Misfit`] explaining why not.
    pub fn check(&self, profile: &Profile) -> Result<(), Misfit> {
        self.room(profile).map(|_| ())
    }

    /// How many more instances of `profile` the pool holds (`u32::MAX` when the pool does not
    /// constrain it, e.g. unknown framebuffer size).
    pub fn creatable(&self, profile: &Profile) -> u32 {
        self.room(profile).unwrap_or(0)
    }

    /// [`Pool::check`] and [`Pool::creatable`] in one pass: how many more instances of
    /// `profile` the pool holds (at least one; `u32::MAX` when the pool does not constrain it),
    /// or why not even one fits. A MIG-backed profile's slots are looked up once and the count
    /// stops at what the free slices allow, which is what a placement asks of every GPU it
    /// considers.
    ///
    /// # Errors
    /// The [`Misfit`] explaining why no instance fits, as [`Pool::check`] says it.
    pub fn room(&self, profile: &Profile) -> Result<u32, Misfit> {
        if let Some(slices) = profile.mig_slices {
            if self.has_time_sliced() {
                return Err(Misfit::ModeConflict);
            }
            let by_slices = match self.mig_slices_total {
                Some(_) => {
                    let free = self.free_mig_slices();
                    if slices > free {
                        return Err(Misfit::MigSlices { need: slices, free });
                    }
                    free.checked_div(slices).map_or(u32::MAX, u32::from)
                }
                None => u32::MAX,
            };
            return match (&self.mig_slots, self.mig_profile(profile)) {
                (Some(slots), Some(mp)) => {
                    let mp = mp.map_err(Misfit::MigSlots)?;
                    slots.room(mp, by_slices).map_err(Misfit::MigSlots)
                }
                _ => Ok(by_slices),
            };
        }
        if self.mig_slices_used.unwrap_or(0) > 0 {
            return Err(Misfit::ModeConflict);
        }
        let Some(size) = profile.framebuffer_mib else {
            return Ok(u32::MAX);
        };
        if let (Some(locked), false) = (self.size_locked_mib, self.mixed_size) {
            if locked != size {
                return Err(Misfit::SizeLocked {
                    locked_mib: locked,
                    size_mib: size,
                });
            }
        }
        if size > self.free_mib() {
            return Err(Misfit::Framebuffer {
                need_mib: size,
                free_mib: self.free_mib(),
            });
        }
        Ok(self
            .free_mib()
            .checked_div(size)
            .map_or(u32::MAX, |n| u32::try_from(n).unwrap_or(u32::MAX)))
    }

    /// Charges one instance of `profile` (after a successful [`Pool::check`]). A MIG-backed one
    /// holds a GPU instance of unknown start: the driver picks the start when it is created.
    pub fn charge(&mut self, profile: &Profile) {
        self.charge_at(profile, None);
    }

    /// Where a GPU instance for a MIG-backed `profile` starts when chosen `how`
    /// ([`crate::mig::MigSlots::choose_start`]): `None` for a profile that is not MIG-backed, a
    /// pool that tracks no slots, or a start the driver must pick.
    pub fn choose_start(&self, profile: &Profile, how: crate::slots::SlotChoice) -> Option<u8> {
        let mp = self.mig_profile(profile)?.ok()?;
        self.mig_slots
            .as_ref()?
            .choose_start(mp, how)
            .ok()
            .flatten()
    }

    /// [`Pool::charge`], a MIG-backed instance's GPU instance held at `start` when given (the
    /// start [`Pool::choose_start`] chose).
    pub fn charge_at(&mut self, profile: &Profile, start: Option<u8>) {
        if let Some(slices) = profile.mig_slices {
            self.mig_slices_used = Some(self.mig_slices_used.unwrap_or(0).saturating_add(slices));
            if let Some(Ok(mp)) = self.mig_profile(profile) {
                if let Some(slots) = self.mig_slots.as_mut().map(std::sync::Arc::make_mut) {
                    match start {
                        Some(s) => slots.hold_at(mp, s),
                        None => slots.charge(mp),
                    }
                }
            }
            return;
        }
        if let Some(size) = profile.framebuffer_mib {
            self.used_mib = self.used_mib.saturating_add(size);
            if !self.mixed_size {
                self.size_locked_mib = Some(size);
            }
        }
    }

    /// Returns one instance of `profile`; the size lock is lifted when the pool empties. A
    /// MIG-backed one frees the slots of one GPU instance of its profile.
    pub fn release(&mut self, profile: &Profile) {
        self.release_at(profile, None);
    }

    /// [`Pool::release`], a MIG-backed instance's GPU instance freed at `start` when given.
    pub fn release_at(&mut self, profile: &Profile, start: Option<u8>) {
        if let Some(slices) = profile.mig_slices {
            self.mig_slices_used = Some(self.mig_slices_used.unwrap_or(0).saturating_sub(slices));
            if let Some(Ok(mp)) = self.mig_profile(profile) {
                if let Some(slots) = self.mig_slots.as_mut().map(std::sync::Arc::make_mut) {
                    match start {
                        Some(s) => slots.release_at(mp, s),
                        None => slots.release(mp),
                    };
                }
            }
            return;
        }
        if let Some(size) = profile.framebuffer_mib {
            self.used_mib = self.used_mib.saturating_sub(size);
            if self.used_mib == 0 {
                self.size_locked_mib = None;
            }
        }
    }
}

/// What one profile offers across a group of parents (the parents of one GPU, or one virtual
/// parent): `topology`'s per-profile free counts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProfileOffer {
    /// The profile's name.
    pub name: String,
    /// The type ID.
    pub id: String,
    /// The framebuffer per instance, when known.
    pub size_mib: Option<u64>,
    /// Parents that can take one now.
    pub parents_free: u32,
    /// How many more can be created in total: the parents' counts, capped by the pool.
    pub free: u32,
}

/// The profiles `parents` offer, in order of first appearance, with their free counts.
pub fn profile_offers(parents: &[&Parent], pool: Option<&Pool>) -> Vec<ProfileOffer> {
    let mut by_id: BTreeMap<String, ProfileOffer> = BTreeMap::new();
    let mut order: Vec<String> = Vec::new();
    for p in parents {
        for prof in &p.profiles {
            let key = prof.id.to_string();
            let line = by_id.entry(key.clone()).or_insert_with(|| {
                order.push(key.clone());
                ProfileOffer {
                    name: prof.name.clone(),
                    id: key,
                    size_mib: prof.framebuffer_mib,
                    parents_free: 0,
                    free: 0,
                }
            });
            line.parents_free += u32::from(prof.available_instances > 0);
            line.free = line.free.saturating_add(prof.available_instances);
            if let Some(pool) = pool {
                line.free = line.free.min(pool.creatable(prof));
            }
        }
    }
    order.into_iter().filter_map(|k| by_id.remove(&k)).collect()
}

/// The vGPU parents of `t` grouped by pool (physical GPU or virtual parent), in order of first
/// appearance.
pub fn parents_by_pool(t: &NodeTopology) -> Vec<(ParentId, Vec<&Parent>)> {
    let mut groups: Vec<(ParentId, Vec<&Parent>)> = Vec::new();
    for p in &t.mediated_devices.parents {
        let k = p.pool_key();
        match groups.iter_mut().find(|(key, _)| *key == k) {
            Some((_, members)) => members.push(p),
            None => groups.push((k, vec![p])),
        }
    }
    groups
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::{ParentId, VgpuTypeId};

    fn pool(total: u64, used: u64, locked: Option<u64>) -> Pool {
        Pool {
            gpu: ParentId::Named("g".into()),
            parents: vec![],
            total_mib: total,
            used_mib: used,
            size_locked_mib: locked,
            mixed_size: false,
            mig_slices_total: None,
            mig_slices_used: None,
            mig_slots: None,
        }
    }

    fn profile(fb: u64, mig: Option<u8>) -> Profile {
        Profile {
            id: VgpuTypeId::from_str_unchecked("t"),
            name: "t".into(),
            framebuffer_mib: Some(fb),
            max_instances: None,
            available_instances: 1,
            reported_instances: None,
            device_api: "vfio-pci".into(),
            mig_slices: mig,
            mig_memory_gib: None,
            description: None,
        }
    }

    #[test]
    fn a2_with_three_4g_vgpus_holds_one_more() {
        let p = pool(16384, 12288, Some(4096));
        assert_eq!(p.creatable(&profile(4096, None)), 1);
        assert_eq!(p.creatable(&profile(2048, None)), 0);
        assert_eq!(
            p.check(&profile(2048, None)),
            Err(Misfit::SizeLocked {
                locked_mib: 4096,
                size_mib: 2048
            })
        );
    }

    #[test]
    fn charge_locks_and_release_unlocks() {
        let mut p = pool(16384, 0, None);
        let two = profile(2048, None);
        p.charge(&two);
        assert_eq!(p.size_locked_mib, Some(2048));
        assert_eq!(p.creatable(&profile(4096, None)), 0);
        p.release(&two);
        assert_eq!(p.size_locked_mib, None);
        assert_eq!(p.creatable(&profile(4096, None)), 4);
    }

    #[test]
    fn mixed_size_mode_lifts_the_rule() {
        let mut p = pool(16384, 4096, Some(4096));
        p.mixed_size = true;
        assert_eq!(p.creatable(&profile(2048, None)), 6);
    }

    #[test]
    fn mig_slices_are_counted_and_exclusive_with_time_sliced() {
        let mut p = pool(144384, 0, None);
        p.mig_slices_total = Some(7);
        let one = profile(18432, Some(1));
        assert_eq!(p.creatable(&one), 7);
        p.charge(&one);
        assert_eq!(p.creatable(&profile(144384, Some(7))), 0);
        assert_eq!(p.check(&profile(4096, None)), Err(Misfit::ModeConflict));
    }
}
