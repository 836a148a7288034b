//! The GPU-instance slots of one GPU ([`MigSlots`]): instances at known starts, of unknown
//! start and pending, and whether one more instance of a profile fits beside them.

use serde::{Deserialize, Serialize};

use super::{MigGeometry, MigOccupancy, MigProfile};

/// One GPU instance at a known start slot.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct MigPlaced {
    /// Its GPU-instance profile (`1g.18gb`).
    pub profile: String,
    /// Its start slot.
    pub start: u8,
}

/// The GPU-instance slots of one MIG-capable GPU whose geometry gpuslice knows: instances at
/// known starts (from NVML's placements), existing instances whose start is not known (a
/// MIG-backed vGPU seen without NVML), narrowed by what the driver still listed beside them,
/// and pending ones (placed but not created yet: the driver picks the start at creation). A new
/// instance fits only where it fits beside every placement the unknown ones could have
/// ([`MigGeometry::fits_every_given`]). Why not one worst-case occupancy: none exists (a 1g at
/// slot 0 leaves a 3g, a 2g and a 1g room; one at slot 6 leaves a 4g room), so every placement
/// is tried; a GPU holds at most seven instances, which keeps that small.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct MigSlots {
    /// The vGPU board of the product (`H200X`): the key of its [`MigGeometry`].
    pub board: String,
    /// GPU instances at known start slots.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub placed: Vec<MigPlaced>,
    /// GPU-instance profiles of existing instances whose start slot is not known.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unplaced: Vec<String>,
    /// Profiles the driver listed as creatable beside the existing instances when the slots
    /// were read: those instances sit where each of these still has a start.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub creatable: Vec<String>,
    /// Instances placed by the scheduler and not created yet: the driver picks their start.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pending: Vec<String>,
}

/// Why a MIG-backed instance does not fit a GPU's slots.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SlotMisfit {
    /// gpuslice has no geometry for this board, or the GPU's slots name a profile the board
    /// does not have: it cannot tell where instances go.
    Unknown {
        /// What is not known.
        why: String,
    },
    /// The board has no GPU-instance profile for this vGPU type.
    NoProfile {
        /// The product.
        product: &'static str,
        /// The type's compute slices.
        slices: u8,
    },
    /// No start slot is free for it in some placement of what the GPU holds.
    NoStart {
        /// The product.
        product: &'static str,
        /// The profile that does not fit.
        profile: &'static str,
        /// Its allowed starts.
        starts: &'static [u8],
        /// Memory slots held in the placement that blocks it.
        held: u32,
        /// Memory slots of the GPU.
        total: u8,
    },
}

impl std::fmt::Display for SlotMisfit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SlotMisfit::Unknown { why } => write!(f, "MIG slots cannot be established: {why}"),
            SlotMisfit::NoProfile { product, slices } => {
                write!(
                    f,
                    "the {product} has no {slices}-slice GPU-instance profile"
                )
            }
            SlotMisfit::NoStart {
                product,
                profile,
                starts,
                held,
                total,
            } => write!(
                f,
                "no free start slot for a {profile} GPU instance (starts {starts:?}) on the \
                 {product}: {held} of {total} memory slices are held where the existing \
                 instances may sit"
            ),
        }
    }
}

/// [`MigSlots`] with its names looked up.
pub(super) struct Resolved {
    pub(super) geometry: &'static MigGeometry,
    pub(super) placed: MigOccupancy,
    pub(super) existing: Vec<&'static MigProfile>,
    still_fit: Vec<&'static MigProfile>,
    pub(super) pending: Vec<&'static MigProfile>,
}

impl Resolved {
    /// Whether one more `profile` fits, as a [`SlotMisfit`] when not.
    pub(super) fn check(&self, profile: &MigProfile) -> Result<(), SlotMisfit> {
        let g = self.geometry;
        self.fits(profile).map_err(|blocked| SlotMisfit::NoStart {
            product: g.product,
            profile: profile.name,
            starts: profile.starts,
            held: blocked.held(),
            total: g.memory_slices,
        })
    }

    fn fits(&self, profile: &MigProfile) -> Result<(), MigOccupancy> {
        self.geometry.fits_every_given(
            self.placed,
            &self.existing,
            &self.still_fit,
            &self.pending,
            profile,
        )
    }
}

impl MigSlots {
    /// Empty slots of a product.
    pub fn new(geometry: &MigGeometry) -> Self {
        MigSlots {
            board: geometry.vgpu_board.to_owned(),
            placed: Vec::new(),
            unplaced: Vec::new(),
            creatable: Vec::new(),
            pending: Vec::new(),
        }
    }

    /// The geometry these slots follow.
    ///
    /// # Errors
    /// [`SlotMisfit::Unknown`] for a board gpuslice has no geometry for.
    pub fn geometry(&self) -> Result<&'static MigGeometry, SlotMisfit> {
        MigGeometry::for_vgpu_board(&self.board).ok_or_else(|| SlotMisfit::Unknown {
            why: format!("no MIG geometry is known for board {:?}", self.board),
        })
    }

    pub(super) fn resolve(&self) -> Result<Resolved, SlotMisfit> {
        let g = self.geometry()?;
        let unknown = |name: &str| SlotMisfit::Unknown {
            why: format!("the {} has no GPU-instance profile {name:?}", g.product),
        };
        let mut occ = MigOccupancy::empty();
        for pl in &self.placed {
            let p = g
                .profile_named(&pl.profile)
                .ok_or_else(|| unknown(&pl.profile))?;
            if !p.starts.contains(&pl.start) || !occ.is_free(pl.start, p) {
                return Err(SlotMisfit::Unknown {
                    why: format!(
                        "a {} at slot {} overlaps another instance or is not an allowed start",
                        p.name, pl.start
                    ),
                });
            }
            occ.hold(pl.start, p);
        }
        let names = |list: &[String]| {
            list.iter()
                .map(|n| g.profile_named(n).ok_or_else(|| unknown(n)))
                .collect::<Result<Vec<_>, _>>()
        };
        Ok(Resolved {
            geometry: g,
            placed: occ,
            existing: names(&self.unplaced)?,
            still_fit: names(&self.creatable)?,
            pending: names(&self.pending)?,
        })
    }

    /// The memory slots held and the compute slices they add up to, when every instance on the
    /// GPU sits at a known start (none of unknown start, none pending) and the starts are
    /// consistent with the geometry; `None` when any of that is not known.
    pub fn known_occupancy(&self) -> Option<(MigOccupancy, u32)> {
        if !self.unplaced.is_empty() || !self.pending.is_empty() {
            return None;
        }
        let r = self.resolve().ok()?;
        let slices = self
            .placed
            .iter()
            .filter_map(|p| r.geometry.profile_named(&p.profile))
            .map(|p| u32::from(p.compute_slices))
            .sum();
        Some((r.placed, slices))
    }

    /// The GPU-instance profile of a MIG-backed vGPU type of `slices` compute slices and
    /// `framebuffer_mib` on this product.
    ///
    /// # Errors
    /// [`SlotMisfit::Unknown`] or [`SlotMisfit::NoProfile`].
    pub fn profile_for(
        &self,
        slices: u8,
        framebuffer_mib: u64,
    ) -> Result<&'static MigProfile, SlotMisfit> {
        let g = self.geometry()?;
        g.profile_for(slices, framebuffer_mib)
            .ok_or(SlotMisfit::NoProfile {
                product: g.product,
                slices,
            })
    }

    /// Whether one more instance of `profile` fits wherever the instances of unknown start sit.
    ///
    /// # Errors
    /// The [`SlotMisfit`] saying why not.
    pub fn check(&self, profile: &MigProfile) -> Result<(), SlotMisfit> {
        self.resolve()?.check(profile)
    }

    /// How many more instances of `profile` fit, one after another (each charged with an
    /// unknown start, as the driver picks it).
    pub fn creatable(&self, profile: &'static MigProfile) -> u32 {
        self.room(profile, u32::MAX).unwrap_or(0)
    }

    /// [`MigSlots::check`] and [`MigSlots::creatable`] in one pass, the names looked up once:
    /// how many more instances of `profile` fit one after another, counting no further than
    /// `limit` (one is counted when one fits, whatever `limit`; a GPU holds at most 16).
    ///
    /// # Errors
    /// The [`SlotMisfit`] saying why not even one fits.
    pub fn room(&self, profile: &'static MigProfile, limit: u32) -> Result<u32, SlotMisfit> {
        let mut r = self.resolve()?;
        r.check(profile)?;
        let mut n = 1;
        while n < limit.min(16) {
            r.pending.push(profile);
            if r.fits(profile).is_err() {
                break;
            }
            n += 1;
        }
        Ok(n)
    }

    /// Holds one instance of `profile`, start unknown (the driver picks it at creation).
    pub fn charge(&mut self, profile: &MigProfile) {
        self.pending.push(profile.name.to_owned());
    }

    /// Frees one instance of `profile`: a pending one first, then one of unknown start, then
    /// one at a known start. False when the slots hold no instance of `profile`.
    ///
    /// Which of several placed instances of the profile a removed vGPU held is not known (the
    /// slots say where GPU instances are, not which vGPU uses which), so the others of that
    /// profile lose their known starts: they are held wherever they may sit from then on. Only
    /// the last placed instance of a profile frees its own start.
    pub fn release(&mut self, profile: &MigProfile) -> bool {
        let is = |n: &str| n.eq_ignore_ascii_case(profile.name);
        for list in [&mut self.pending, &mut self.unplaced] {
            if let Some(i) = list.iter().position(|n| is(n)) {
                list.remove(i);
                return true;
            }
        }
        let Some(i) = self.placed.iter().position(|p| is(&p.profile)) else {
            return false;
        };
        self.placed.remove(i);
        let (others, rest): (Vec<MigPlaced>, Vec<MigPlaced>) = std::mem::take(&mut self.placed)
            .into_iter()
            .partition(|p| is(&p.profile));
        self.placed = rest;
        self.unplaced.extend(others.into_iter().map(|p| p.profile));
        true
    }
}

impl MigSlots {
    /// The occupancies this GPU can be in (known starts, and every placement of the instances of
    /// unknown start the driver's lists allow; pending ones count as of unknown start too), for
    /// [`MigGeometry::creation_order`].
    ///
    /// # Errors
    /// [`SlotMisfit::Unknown`] when the slots name what the geometry does not have.
    pub fn occupancies(&self) -> Result<(&'static MigGeometry, Vec<MigOccupancy>), SlotMisfit> {
        let r = self.resolve()?;
        let mut out: Vec<MigOccupancy> = Vec::new();
        for occ in r
            .geometry
            .placements_of(r.placed, &r.existing, &r.still_fit)
        {
            for o in r.geometry.placements_of(occ, &r.pending, &[]) {
                if !out.contains(&o) {
                    out.push(o);
                }
            }
        }
        Ok((r.geometry, out))
    }
}
