//! A reload of NVIDIA's vGPU manager (a DaemonSet restart, `rmmod`/`modprobe`, a reboot): every
//! vGPU the host held is gone afterwards. mdev instances are removed and every vendor-VFIO VF's
//! `current_vgpu_type` reads `0` again, with the pools' counts given back. Like the real module,
//! it will not unload while a VM holds one of them open.

use super::*;

/// What [`FakeKernel::reload_vgpu_manager`] dropped.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Reloaded {
    /// The mdev instances removed.
    pub mdevs: Vec<MdevUuid>,
    /// The VFs whose `current_vgpu_type` went back to 0.
    pub vfs: Vec<PciAddress>,
}

impl FakeKernel {
    /// Simulates a reload of the vGPU manager: every mdev instance (on any parent, the sample
    /// drivers' too, as reloading their module does) is removed and every VF with a
    /// `current_vgpu_type` is cleared to `0`. Nothing is changed when a vGPU is held open.
    ///
    /// # Errors
    /// `EBUSY` naming the device a process holds open (the module is in use); the I/O error of
    /// removing an instance or clearing a VF.
    pub fn reload_vgpu_manager(&self) -> io::Result<Reloaded> {
        let _serial = match self.serial.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        };
        let mut mdevs: Vec<MdevUuid> = self
            .fs
            .list("sys/bus/mdev/devices")
            .unwrap_or_default()
            .iter()
            .filter_map(|e| e.parse().ok())
            .collect();
        mdevs.sort();
        let vfs: Vec<PciAddress> = self
            .typed_vfs()
            .into_iter()
            .filter(|vf| self.vf_type(vf) != 0)
            .collect();
        let dirs = mdevs
            .iter()
            .map(|u| format!("sys/bus/mdev/devices/{u}"))
            .chain(vfs.iter().map(|vf| format!("sys/bus/pci/devices/{vf}")));
        for dir in dirs {
            if let Some(h) = crate::actuate::inuse::holder_of(self, &dir) {
                return Err(io::Error::new(
                    io::ErrorKind::ResourceBusy,
                    format!("{dir} is held open by {h}; the vGPU manager is in use"),
                ));
            }
        }
        for u in &mdevs {
            let idir = self.fs.canonicalize(&format!("sys/bus/mdev/devices/{u}"))?;
            self.mdev_remove(&idir, b"1")?;
        }
        for vf in &vfs {
            self.write_file(
                &format!("sys/bus/pci/devices/{vf}/nvidia/current_vgpu_type"),
                "0\n",
            )?;
        }
        self.recompute()?;
        Ok(Reloaded { mdevs, vfs })
    }

    /// Every PCI function with an `nvidia/current_vgpu_type` (the vendor-VFIO VFs).
    fn typed_vfs(&self) -> Vec<PciAddress> {
        let mut v: Vec<PciAddress> = self
            .fs
            .list("sys/bus/pci/devices")
            .unwrap_or_default()
            .iter()
            .filter_map(|d| d.parse().ok())
            .filter(|a| {
                self.fs
                    .exists(&format!("sys/bus/pci/devices/{a}/nvidia/current_vgpu_type"))
            })
            .collect();
        v.sort();
        v
    }
}
