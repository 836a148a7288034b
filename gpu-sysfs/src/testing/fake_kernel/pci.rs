//! PCI binding: `driver_override`, `bind`, `unbind`, `drivers_probe`, IOMMU groups and VFIO
//! device nodes.

use super::*;

impl FakeKernel {
    /// The lowest IOMMU group number not in use: the kernel allocates group IDs from an IDA, so a
    /// freed number is reused.
    pub(super) fn free_group(&self) -> u32 {
        let used: BTreeSet<u32> = self
            .fs
            .list("sys/kernel/iommu_groups")
            .unwrap_or_default()
            .iter()
            .filter_map(|g| g.parse::<u32>().ok())
            .collect();
        (0u32..).find(|g| !used.contains(g)).unwrap_or(u32::MAX)
    }

    /// Puts the device at `dir` (root-relative) in IOMMU group `g`, creating the group.
    pub(super) fn join_group(&self, dir: &str, g: u32) -> io::Result<()> {
        let name = dir.rsplit('/').next().unwrap_or(dir);
        std::fs::create_dir_all(
            self.root
                .join(format!("sys/kernel/iommu_groups/{g}/devices")),
        )?;
        self.link(
            &format!("{dir}/iommu_group"),
            &format!("{}kernel/iommu_groups/{g}", up_to_sys(dir)),
        )?;
        self.link(
            &format!("sys/kernel/iommu_groups/{g}/devices/{name}"),
            &format!("../../../../{}", strip_sys(dir)),
        )
    }

    /// Registers the device at `dir` with VFIO: its `vfio-dev/vfioN` (the lowest free index) and
    /// its IOMMU group's `/dev/vfio/<group>` node.
    pub(super) fn add_vfio_device(&self, dir: &str) -> io::Result<()> {
        let n = {
            let mut st = self.lock();
            let n = (0u32..)
                .find(|i| !st.vfio_devs.contains(i))
                .unwrap_or(u32::MAX);
            st.vfio_devs.insert(n);
            n
        };
        let name = dir.rsplit('/').next().unwrap_or(dir);
        let vd = format!("{dir}/vfio-dev/vfio{n}");
        self.power_dir(&vd)?;
        self.link(&format!("{vd}/device"), &format!("../../../{name}"))?;
        if let Some(g) = link_last(&self.fs, &format!("{dir}/iommu_group")) {
            let node = self.root.join(format!("dev/vfio/{g}"));
            if !node.exists() {
                std::fs::create_dir_all(self.root.join("dev/vfio"))?;
                std::fs::write(node, "")?;
            }
        }
        Ok(())
    }

    /// Unregisters the device at `dir` from VFIO; its group's `/dev/vfio` node goes with the
    /// group's last VFIO device.
    pub(super) fn remove_vfio_device(&self, dir: &str) -> io::Result<()> {
        let vdir = format!("{dir}/vfio-dev");
        for e in self.fs.list(&vdir).unwrap_or_default() {
            if let Some(n) = e.strip_prefix("vfio").and_then(|n| n.parse::<u32>().ok()) {
                self.lock().vfio_devs.remove(&n);
            }
        }
        if self.fs.exists(&vdir) {
            std::fs::remove_dir_all(self.root.join(&vdir))?;
        }
        if let Some(g) = link_last(&self.fs, &format!("{dir}/iommu_group")) {
            let members = format!("sys/kernel/iommu_groups/{g}/devices");
            let still_used = self
                .fs
                .list(&members)
                .unwrap_or_default()
                .iter()
                .any(|m| self.fs.exists(&format!("{members}/{m}/vfio-dev")));
            let node = self.root.join(format!("dev/vfio/{g}"));
            if !still_used && node.exists() {
                std::fs::remove_file(node)?;
            }
        }
        Ok(())
    }

    pub(super) fn dev_dir(&self, addr: &PciAddress) -> Option<String> {
        self.fs
            .canonicalize(&format!("sys/bus/pci/devices/{addr}"))
            .ok()
            .filter(|d| self.fs.exists(d))
    }

    pub(super) fn do_bind(&self, addr: &PciAddress, dev: &str, driver: &str) -> io::Result<()> {
        self.link(
            &format!("{dev}/driver"),
            &format!("{}bus/pci/drivers/{driver}", up_to_sys(dev)),
        )?;
        self.link(
            &format!("sys/bus/pci/drivers/{driver}/{addr}"),
            &format!("../../../../{}", strip_sys(dev)),
        )?;
        if driver == "vfio-pci" {
            self.add_vfio_device(dev)?;
        }
        Ok(())
    }

    pub(super) fn do_unbind(&self, addr: &PciAddress, dev: &str, driver: &str) -> io::Result<()> {
        std::fs::remove_file(self.root.join(format!("{dev}/driver")))?;
        let _ = std::fs::remove_file(
            self.root
                .join(format!("sys/bus/pci/drivers/{driver}/{addr}")),
        );
        if driver == "vfio-pci" {
            self.remove_vfio_device(dev)?;
        }
        Ok(())
    }

    pub(super) fn override_of(&self, dev: &str) -> Option<String> {
        self.fs
            .read_string(&format!("{dev}/driver_override"))
            .ok()
            .filter(|s| s != "(null)" && !s.is_empty())
    }

    /// What the probe of `driver` on `addr` returns now: `None` when it takes the device, else
    /// its errno (vfio-pci: `EINVAL` for a device without an IOMMU group, and for an injected
    /// probe failure).
    pub(super) fn probe_error(&self, addr: &PciAddress, dev: &str, driver: &str) -> Option<i32> {
        if !self.fs.exists(&format!("sys/bus/pci/drivers/{driver}")) {
            return Some(errno::ENODEV);
        }
        if driver == "vfio-pci"
            && (self.fs.read_link(&format!("{dev}/iommu_group")).is_err()
                || self.lock().silent_probe.contains(addr))
        {
            return Some(errno::EINVAL);
        }
        None
    }

    pub(super) fn probe(&self, data: &[u8]) -> io::Result<()> {
        let addr = named_device(data).ok_or_else(|| err(errno::ENODEV))?;
        let dev = self.dev_dir(&addr).ok_or_else(|| err(errno::ENODEV))?;
        if link_last(&self.fs, &format!("{dev}/driver")).is_some() {
            return Ok(());
        }
        let target = match self.override_of(&dev) {
            Some(o) => Some(o),
            None => self.lock().host_drivers.get(&addr).cloned(),
        };
        if let Some(d) = target {
            if self.probe_error(&addr, &dev, &d).is_none() {
                self.do_bind(&addr, &dev, &d)?;
            }
        }
        // Success whatever happened: the silent probe failure.
        Ok(())
    }

    pub(super) fn unbind(&self, driver: &str, data: &[u8]) -> io::Result<()> {
        let addr = named_device(data).ok_or_else(|| err(errno::ENODEV))?;
        let dev = self.dev_dir(&addr).ok_or_else(|| err(errno::ENODEV))?;
        if link_last(&self.fs, &format!("{dev}/driver")).as_deref() != Some(driver) {
            return Err(err(errno::ENODEV));
        }
        self.do_unbind(&addr, &dev, driver)
    }

    /// `drivers/<driver>/bind`, in the kernel's order: the device must exist and match the
    /// driver (`ENODEV`, even while it is bound elsewhere), then be unbound (`EBUSY`); then the
    /// probe's own error comes back.
    pub(super) fn bind_store(&self, driver: &str, data: &[u8]) -> io::Result<()> {
        let addr = named_device(data).ok_or_else(|| err(errno::ENODEV))?;
        let dev = self.dev_dir(&addr).ok_or_else(|| err(errno::ENODEV))?;
        let matches = match self.override_of(&dev) {
            Some(o) => o == driver,
            None => self.lock().host_drivers.get(&addr).map(String::as_str) == Some(driver),
        };
        if !matches {
            return Err(err(errno::ENODEV));
        }
        if link_last(&self.fs, &format!("{dev}/driver")).is_some() {
            return Err(err(errno::EBUSY));
        }
        if let Some(e) = self.probe_error(&addr, &dev, driver) {
            return Err(err(e));
        }
        self.do_bind(&addr, &dev, driver)
    }
}
