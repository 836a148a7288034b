//! Mixed-size placements on the fake kernel: on a GPU whose driver is in mixed-size mode
//! ([`FakeKernel::set_mixed_size`]) each time-sliced vGPU holds a run of slots, and its VF
//! reports where (`nvidia/placement_id`), so a writer's read-back is tested.
//!
//! The fake's lattice (**assumption**, the driver's own placements come from NVML's
//! `nvmlDeviceGetVgpuTypeSupportedPlacements`): one slot per framebuffer of the smallest
//! time-sliced type the GPU offers, as many slots as the largest type takes; a type takes
//! `size / smallest` slots at starts aligned to that many; the driver gives a new vGPU the
//! lowest free start (NVIDIA does not document its choice); a VF with no type reads
//! `Not Applicable`.

use super::*;

/// The lattice of `types`: (framebuffer of one slot, slots).
fn lattice(types: &[(u32, String)]) -> Option<(u64, u32)> {
    let sizes: Vec<u64> = types.iter().filter_map(|(_, n)| sliced_size(n)).collect();
    let unit = *sizes.iter().min()?;
    let width = u32::try_from(sizes.iter().max()? / unit).ok()?;
    Some((unit, width))
}

/// The framebuffer of a time-sliced type named `name`.
fn sliced_size(name: &str) -> Option<u64> {
    let n = VgpuTypeName::parse(name).ok()?;
    (n.mig_slices.is_none() && n.framebuffer_mib() > 0).then(|| n.framebuffer_mib())
}

impl FakeKernel {
    /// The mixed-size placements of each time-sliced type of `pf`'s vendor-VFIO pool on this
    /// fake's lattice (the **assumption** above): (type ID, name, placement size, placement
    /// IDs), so a fake NVML beside this kernel (the sandbox's) answers what it does. Empty for
    /// a GPU without such a pool.
    pub fn mixed_placements(&self, pf: &PciAddress) -> Vec<(u32, String, u32, Vec<u32>)> {
        let Some((_, _, types)) = self.vendor_pool_of(&Some(*pf)) else {
            return Vec::new();
        };
        let Some((unit, width)) = lattice(types) else {
            return Vec::new();
        };
        types
            .iter()
            .filter_map(|(id, name)| {
                let size = Self::slots_of(types, unit, *id)?;
                let ids = (0..width)
                    .step_by(size.max(1) as usize)
                    .filter(|s| s + size <= width)
                    .collect();
                Some((*id, name.clone(), size, ids))
            })
            .collect()
    }

    fn slots_of(types: &[(u32, String)], unit: u64, id: u32) -> Option<u32> {
        let fb = types
            .iter()
            .find(|(t, _)| *t == id)
            .and_then(|(_, n)| sliced_size(n))?;
        (fb % unit == 0).then(|| u32::try_from(fb / unit).ok())?
    }

    /// The lowest free start of type `id` on `pf` in mixed-size mode, beside what the GPU's
    /// other VFs hold (`except`: a VF not counted).
    pub(super) fn mixed_free_start(
        &self,
        pf: &PciAddress,
        types: &[(u32, String)],
        id: u32,
        except: Option<&PciAddress>,
    ) -> Option<u32> {
        let (unit, width) = lattice(types)?;
        let size = Self::slots_of(types, unit, id)?;
        let mut held = vec![false; usize::try_from(width).ok()?];
        for vf in self.vfs_of(pf) {
            if Some(&vf) == except {
                continue;
            }
            let t = self.vf_type(&vf);
            let (Some(start), Some(len)) = (
                crate::actuate::vendor::placement_id(&self.fs, &vf),
                Self::slots_of(types, unit, t),
            ) else {
                continue;
            };
            for i in start..start.saturating_add(len).min(width) {
                held[i as usize] = true;
            }
        }
        (0..width)
            .step_by(size.max(1) as usize)
            .filter(|s| s + size <= width)
            .find(|s| (*s..s + size).all(|i| !held[i as usize]))
    }

    /// After a type write on `vf` of `pf`: its placement in mixed-size mode (the lowest free
    /// start), `Not Applicable` once it has no type. Other modes leave the file as it is.
    pub(super) fn place_vf(
        &self,
        vf: &PciAddress,
        pf: &PciAddress,
        types: &[(u32, String)],
        id: u32,
    ) -> io::Result<()> {
        let path = format!("sys/bus/pci/devices/{vf}/nvidia/placement_id");
        if !self.is_mixed_size(pf) || !self.fs.exists(&path) {
            return Ok(());
        }
        if id == 0 {
            return self.write_file(&path, "Not Applicable\n");
        }
        match self.mixed_free_start(pf, types, id, Some(vf)) {
            Some(start) => self.write_file(&path, &format!("{start}\n")),
            None => Ok(()),
        }
    }
}
