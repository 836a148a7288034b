//! NVIDIA vendor-specific VFIO: the per-VF `creatable_vgpu_types` and `current_vgpu_type`.

use super::*;

use gpu_core::mig::{MigGeometry, MigOccupancy, MigProfile};

/// What NVML says of a GPU's MIG state (the driver's side, which sysfs does not show). Told to
/// the kernel ([`FakeKernel::set_mig`]), it lists and takes MIG-backed types as NVIDIA's driver
/// does: none while MIG mode is off; in MIG mode no time-sliced type, and a MIG-backed type
/// only while a GPU instance of its profile holds no vGPU. A GPU nobody told about is planned
/// on its geometry alone (any arrangement that holds the types).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct FakeMig {
    /// MIG mode in force.
    pub enabled: bool,
    /// The GPU instances, as (compute slices, memory slices) each.
    pub instances: Vec<(u8, u8)>,
    /// Mixed-size vGPU mode in force (NVML's heterogeneous mode), as
    /// [`FakeKernel::set_mixed_size`] says for a kernel told directly.
    pub mixed_size: bool,
}

impl FakeMig {
    /// The MIG state of `gpu` as `nvml` answers it (`None` where it does not: no MIG).
    pub fn of(nvml: &dyn gpu_nvml::NvmlDevices, gpu: &PciAddress) -> Option<FakeMig> {
        let modes = nvml.mig_mode(gpu).ok()?;
        let instances = nvml.gpu_instances(gpu).unwrap_or_default();
        Some(FakeMig {
            enabled: modes.current == gpu_nvml::MigMode::Enabled,
            instances: instances
                .iter()
                .filter_map(|gi| {
                    Some((
                        u8::try_from(gi.slice_count).ok()?,
                        u8::try_from(gi.placement.size).ok()?,
                    ))
                })
                .collect(),
            mixed_size: nvml
                .vgpu_heterogeneous_mode(gpu)
                .is_ok_and(|m| m == gpu_nvml::VgpuMode::Heterogeneous),
        })
    }

    /// Whether an instance of `p` is left beside the vGPUs of `held` (their profiles).
    fn has_free(&self, p: &MigProfile, held: &[&MigProfile]) -> bool {
        let same = |c: u8, m: u8| c == p.compute_slices && m == p.memory_slices;
        let have = self.instances.iter().filter(|(c, m)| same(*c, *m)).count();
        let used = held
            .iter()
            .filter(|h| same(h.compute_slices, h.memory_slices))
            .count();
        self.enabled && have > used
    }
}

/// Where the kernel reads a GPU's MIG state, each time it lists or takes a type.
#[derive(Clone)]
pub(super) struct MigSource(std::sync::Arc<MigFn>);

/// How the kernel asks a GPU's MIG state.
type MigFn = dyn Fn(&PciAddress) -> Option<FakeMig> + Send + Sync;

/// A vendor-VFIO pool: the GPU, its framebuffer in MiB and its types.
type VendorPool<'a> = (PciAddress, u64, &'a [(u32, String)]);

impl std::fmt::Debug for MigSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("MigSource")
    }
}

impl FakeKernel {
    /// Reads each GPU's MIG state from `source` (what NVML's MIG calls did on a real host: a
    /// test's fake NVML, the sandbox's saved one), every time a VF's list is made or a type is
    /// set; `None` for a GPU it does not know. The VFs' lists are made again now.
    #[must_use]
    pub fn with_mig_source(
        self,
        source: impl Fn(&PciAddress) -> Option<FakeMig> + Send + Sync + 'static,
    ) -> Self {
        self.lock().mig = Some(MigSource(std::sync::Arc::new(source)));
        if let Err(e) = self.recompute() {
            self.lock().broken = Some(format!("fake kernel: recomputing pools failed: {e}"));
        }
        self
    }

    /// Before a VF's `creatable_vgpu_types` is read, where the MIG state comes from outside
    /// (it may have changed since the last write): the list made again from it, as the driver
    /// answers each read.
    pub(super) fn refresh_list(&self, path: &str) -> io::Result<()> {
        let Some(vf) = path
            .strip_suffix("/nvidia/creatable_vgpu_types")
            .and_then(|d| d.rsplit('/').next())
            .and_then(|a| a.parse::<PciAddress>().ok())
        else {
            return Ok(());
        };
        if self.lock().mig.is_none() || self.vf_type(&vf) != 0 {
            return Ok(());
        }
        let Some((ppf, total, types)) = self.vendor_pool_of(&self.pf_of(&vf)) else {
            return Ok(());
        };
        let text = list_text(&self.vendor_creatable(&ppf, total, types));
        self.write_file(path, &text)
    }

    fn pf_of(&self, vf: &PciAddress) -> Option<PciAddress> {
        link_last(&self.fs, &format!("sys/bus/pci/devices/{vf}/physfn"))
            .and_then(|p| p.parse().ok())
    }

    /// The vendor-VFIO pool of GPU `pf`: its address, framebuffer and types.
    pub(super) fn vendor_pool_of(&self, pf: &Option<PciAddress>) -> Option<VendorPool<'_>> {
        self.pools.iter().find_map(|p| match p {
            FakePool::VendorVfio {
                pf: ppf,
                framebuffer_mib,
                types,
            } if Some(*ppf) == *pf => Some((*ppf, *framebuffer_mib, types.as_slice())),
            _ => None,
        })
    }

    pub(super) fn mig_of(&self, pf: &PciAddress) -> Option<FakeMig> {
        let source = self.lock().mig.clone()?;
        (source.0)(pf)
    }

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
    /// never mix on one GPU. Where the MIG state is known ([`FakeKernel::with_mig_source`]),
    /// MIG-backed types follow the GPU instances that exist ([`FakeMig`]).
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
        let told = self.mig_of(pf);
        let mig_on = told.as_ref().is_some_and(|m| m.enabled);
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
                (Some(p), Some(g)) => {
                    !held_sliced
                        && told
                            .as_ref()
                            .map_or_else(|| fits_beside(g, p), |m| m.has_free(p, &held_mig))
                }
                _ => {
                    !mig_on
                        && held_mig.is_empty()
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
            let text = if self.vf_type(&vf) == 0 {
                list_text(&creatable)
            } else {
                list_text(&[])
            };
            self.write_file(&f, &text)?;
        }
        Ok(())
    }

    pub(super) fn set_vgpu_type(&self, vf: PciAddress, data: &[u8]) -> io::Result<()> {
        let n: u32 = value(data).trim().parse().map_err(|_| err(errno::EINVAL))?;
        let path = format!("sys/bus/pci/devices/{vf}/nvidia/current_vgpu_type");
        let pf = self.pf_of(&vf);
        // The vGPU manager lives in the PF's `nvidia` driver: with the PF on another driver
        // (vfio-pci: passed through to a VM) no type can be set.
        let pf_driver =
            pf.and_then(|a| link_last(&self.fs, &format!("sys/bus/pci/devices/{a}/driver")));
        if n != 0 && pf_driver.as_deref() != Some("nvidia") {
            return Err(err(errno::ENODEV));
        }
        let pool = self.vendor_pool_of(&pf);
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

/// A VF's `creatable_vgpu_types` text listing `types`.
fn list_text(types: &[(u32, String)]) -> String {
    let mut text = String::from("ID    : vGPU Name\n");
    for (id, name) in types {
        text.push_str(&format!("{id:<6}: {name}\n"));
    }
    text
}
