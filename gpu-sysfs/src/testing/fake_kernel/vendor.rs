//! NVIDIA vendor-specific VFIO: the per-VF `creatable_vgpu_types` and `current_vgpu_type`.

use super::*;

use gpu_core::mig::{MigGeometry, MigOccupancy};

impl FakeKernel {
    pub(super) fn vfs_of(&self, pf: &PciAddress) -> Vec<PciAddress> {
        let dir = format!("sys/bus/pci/devices/{pf}");
        let mut v: Vec<(u32, PciAddress)> = self
            .fs
            .list(&dir)
            .unwrap_or_default()
            .into_iter()
            .filter_map(|e| {
                let n: u32 = e.strip_prefix("virtfn")?.parse().ok()?;
                Some((n, link_last(&self.fs, &format!("{dir}/{e}"))?.parse().ok()?))
            })
            .collect();
        v.sort();
        v.into_iter().map(|(_, a)| a).collect()
    }

    pub(super) fn vf_type(&self, vf: &PciAddress) -> u32 {
        self.fs
            .read_string(&format!(
                "sys/bus/pci/devices/{vf}/nvidia/current_vgpu_type"
            ))
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(0)
    }

    /// The types that fit on the GPU of a vendor-VFIO pool now. Time-sliced types share the
    /// framebuffer at one size; MIG-backed types of a product whose geometry gpu-core knows need
    /// a free GPU-instance slot range at an allowed start (the driver places each new instance
    /// at the lowest start that fits; held ones are counted largest first), and the two kinds
    /// never mix on one GPU.
    pub(super) fn vendor_creatable(
        &self,
        pf: &PciAddress,
        total: u64,
        types: &[(u32, String)],
    ) -> Vec<(u32, String)> {
        let name_of = |id: u32| {
            types
                .iter()
                .find(|(t, _)| *t == id)
                .and_then(|(_, n)| VgpuTypeName::parse(n).ok())
        };
        let size_of = |id: u32| name_of(id).map(|n| n.framebuffer_mib());
        let geometry = self
            .fs
            .read_string(&format!("sys/bus/pci/devices/{pf}/device"))
            .ok()
            .and_then(|s| u16::from_str_radix(s.trim().trim_start_matches("0x"), 16).ok())
            .and_then(MigGeometry::for_device);
        let mig_profile = |id: u32| {
            let n = name_of(id)?;
            geometry?.profile_for(n.mig_slices?, n.framebuffer_mib())
        };
        let mixed_size = self.is_mixed_size(pf);
        let mut used = 0u64;
        let mut size = None;
        let mut held_mig = Vec::new();
        let mut held_sliced = false;
        for vf in self.vfs_of(pf) {
            let t = self.vf_type(&vf);
            if t == 0 {
                continue;
            }
            match mig_profile(t) {
                Some(p) => held_mig.push(p),
                None => {
                    held_sliced = true;
                    if let Some(s) = size_of(t) {
                        used += s;
                        size = Some(s);
                    }
                }
            }
        }
        // The held GPU instances with one more of `p`: some placement of them all must exist
        // (the fake does not track starts, so it grants whatever some arrangement holds; an
        // apply that reads NVML back checks the driver's real choice).
        let fits_beside = |g: &MigGeometry, p| {
            let mut all = held_mig.clone();
            all.push(p);
            g.place_all(MigOccupancy::empty(), &all).is_ok()
        };
        types
            .iter()
            .filter(|(id, _)| match (mig_profile(*id), geometry) {
                (Some(p), Some(g)) => !held_sliced && fits_beside(g, p),
                _ => {
                    held_mig.is_empty()
                        && size_of(*id).is_some_and(|s| {
                            used + s <= total
                                && if mixed_size {
                                    self.mixed_free_start(pf, types, *id, None).is_some()
                                } else {
                                    size.is_none_or(|cur| cur == s)
                                }
                        })
                }
            })
            .cloned()
            .collect()
    }

    pub(super) fn recompute_vendor_vfio(
        &self,
        pf: &PciAddress,
        total: u64,
        types: &[(u32, String)],
    ) -> io::Result<()> {
        let creatable = self.vendor_creatable(pf, total, types);
        for vf in self.vfs_of(pf) {
            let f = format!("sys/bus/pci/devices/{vf}/nvidia/creatable_vgpu_types");
            if !self.fs.exists(&f) {
                continue;
            }
            let mut text = String::from("ID    : vGPU Name\n");
            if self.vf_type(&vf) == 0 {
                for (id, name) in &creatable {
                    text.push_str(&format!("{id:<6}: {name}\n"));
                }
            }
            self.write_file(&f, &text)?;
        }
        Ok(())
    }

    pub(super) fn set_vgpu_type(&self, vf: PciAddress, data: &[u8]) -> io::Result<()> {
        let n: u32 = value(data).trim().parse().map_err(|_| err(errno::EINVAL))?;
        let path = format!("sys/bus/pci/devices/{vf}/nvidia/current_vgpu_type");
        let pf: Option<PciAddress> =
            link_last(&self.fs, &format!("sys/bus/pci/devices/{vf}/physfn"))
                .and_then(|p| p.parse().ok());
        // The vGPU manager lives in the PF's `nvidia` driver: with the PF on another driver
        // (vfio-pci: passed through to a VM) no type can be set.
        let pf_driver =
            pf.and_then(|a| link_last(&self.fs, &format!("sys/bus/pci/devices/{a}/driver")));
        if n != 0 && pf_driver.as_deref() != Some("nvidia") {
            return Err(err(errno::ENODEV));
        }
        let pool = self.pools.iter().find_map(|p| match p {
            FakePool::VendorVfio {
                pf: ppf,
                framebuffer_mib,
                types,
            } if Some(*ppf) == pf => Some((*ppf, *framebuffer_mib, types)),
            _ => None,
        });
        if n == 0 {
            self.write_file(&path, "0\n")?;
            if let Some((ppf, _, types)) = pool {
                self.place_vf(&vf, &ppf, types, 0)?;
            }
            return self.recompute();
        }
        if self.vf_type(&vf) != 0 {
            return Err(err(errno::EPERM));
        }
        match pool {
            Some((ppf, total, types)) => {
                if !types.iter().any(|(id, _)| *id == n) {
                    return Err(err(errno::EINVAL));
                }
                if !self
                    .vendor_creatable(&ppf, total, types)
                    .iter()
                    .any(|(id, _)| *id == n)
                {
                    return Err(err(errno::EIO));
                }
            }
            None => {
                let listed = self
                    .fs
                    .read_string(&format!(
                        "sys/bus/pci/devices/{vf}/nvidia/creatable_vgpu_types"
                    ))
                    .unwrap_or_default();
                if !crate::actuate::vendor::parse_creatable(&listed)
                    .iter()
                    .any(|(id, _)| *id == n)
                {
                    return Err(err(errno::EIO));
                }
            }
        }
        if let Some((ppf, _, types)) = pool {
            self.place_vf(&vf, &ppf, types, n)?;
        }
        self.write_file(&path, &format!("{n}\n"))?;
        self.recompute()
    }
}
