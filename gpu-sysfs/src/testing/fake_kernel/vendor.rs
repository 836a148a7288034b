//! NVIDIA vendor-specific VFIO: the per-VF `creatable_vgpu_types` and `current_vgpu_type`.

use super::*;

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

    /// The types that fit on the GPU of a vendor-VFIO pool now.
    pub(super) fn vendor_creatable(
        &self,
        pf: &PciAddress,
        total: u64,
        types: &[(u32, String)],
    ) -> Vec<(u32, String)> {
        let size_of = |id: u32| {
            types
                .iter()
                .find(|(t, _)| *t == id)
                .and_then(|(_, n)| VgpuTypeName::parse(n).ok())
                .map(|n| n.framebuffer_mib())
        };
        let mut used = 0u64;
        let mut size = None;
        for vf in self.vfs_of(pf) {
            let t = self.vf_type(&vf);
            if t != 0 {
                if let Some(s) = size_of(t) {
                    used += s;
                    size = Some(s);
                }
            }
        }
        types
            .iter()
            .filter(|(id, _)| {
                size_of(*id).is_some_and(|s| used + s <= total && size.is_none_or(|cur| cur == s))
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
        self.write_file(&path, &format!("{n}\n"))?;
        self.recompute()
    }
}
