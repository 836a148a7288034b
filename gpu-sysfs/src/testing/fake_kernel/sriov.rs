//! SR-IOV: `sriov_numvfs` and the emulated `sriov-manage`.

use super::*;

impl FakeKernel {
    pub(super) fn numvfs_store(&self, pf: &PciAddress, n: u32) -> io::Result<()> {
        let dev = self.dev_dir(pf).ok_or_else(|| err(errno::ENODEV))?;
        let read_u32 = |f: &str| -> u32 {
            self.fs
                .read_string(&format!("{dev}/{f}"))
                .ok()
                .and_then(|s| s.parse().ok())
                .unwrap_or(0)
        };
        let total = read_u32("sriov_totalvfs");
        let cur = read_u32("sriov_numvfs");
        if n > total {
            return Err(err(errno::ERANGE));
        }
        if n == cur {
            return Ok(());
        }
        if n != 0 && cur != 0 {
            return Err(err(errno::EBUSY));
        }
        if n == 0 {
            self.remove_vfs(pf, &dev)
        } else {
            self.set_numvfs(pf, n)
        }
    }

    pub(super) fn remove_vfs(&self, pf: &PciAddress, dev: &str) -> io::Result<()> {
        for (i, vf) in self.vfs_of(pf).into_iter().enumerate() {
            if let Some(vdir) = self.dev_dir(&vf) {
                if self.fs.exists(&format!("{vdir}/vfio-dev")) {
                    self.remove_vfio_device(&vdir)?;
                }
                if let Some(d) = link_last(&self.fs, &format!("{vdir}/driver")) {
                    let _ = std::fs::remove_file(
                        self.root.join(format!("sys/bus/pci/drivers/{d}/{vf}")),
                    );
                }
                if let Some(g) = link_last(&self.fs, &format!("{vdir}/iommu_group")) {
                    let _ = std::fs::remove_dir_all(
                        self.root.join(format!("sys/kernel/iommu_groups/{g}")),
                    );
                }
                std::fs::remove_dir_all(self.root.join(&vdir))?;
            }
            let _ = std::fs::remove_file(self.root.join(format!("sys/bus/pci/devices/{vf}")));
            // A VF that was an mdev parent leaves the mdev bus with it.
            let _ = std::fs::remove_file(self.root.join(format!("sys/class/mdev_bus/{vf}")));
            let _ = std::fs::remove_file(self.root.join(format!("{dev}/virtfn{i}")));
        }
        self.write_file(&format!("{dev}/sriov_numvfs"), "0\n")
    }

    /// Creates `n` VFs on `pf` (what enabling SR-IOV does), with the vendor-VFIO files when `pf`
    /// has a [`FakePool::VendorVfio`] pool.
    pub(super) fn set_numvfs(&self, pf: &PciAddress, n: u32) -> io::Result<()> {
        let dev = self.dev_dir(pf).ok_or_else(|| err(errno::ENODEV))?;
        let read = |f: &str| {
            self.fs
                .read_string(&format!("{dev}/{f}"))
                .unwrap_or_default()
        };
        let num = |f: &str, d: u32| read(f).parse::<u32>().unwrap_or(d);
        let hex = |f: &str| u32::from_str_radix(read(f).trim_start_matches("0x"), 16).unwrap_or(0);
        let vendor_vfio = self
            .pools
            .iter()
            .any(|p| matches!(p, FakePool::VendorVfio { pf: p, .. } if p == pf));
        let mut spec = PciSpec::new(hex("vendor") as u16, hex("device") as u16, hex("class"));
        if vendor_vfio {
            spec = spec.driver("nvidia");
        }
        let mut b = TreeBuilder::at(&self.root);
        b.sriov(
            &pf.to_string(),
            n,
            num("sriov_totalvfs", n),
            num("sriov_offset", 1),
            num("sriov_stride", 1),
            spec,
            None,
        );
        if vendor_vfio {
            for vf in self.vfs_of(pf) {
                b.vendor_vfio_vf(&vf.to_string(), &[], 0);
            }
        }
        // The mdev driver registers each new VF that was a parent of the GPU's pool again.
        for pool in &self.pools {
            let FakePool::NvidiaMdev { parents, types, .. } = pool else {
                continue;
            };
            let specs: Vec<MdevTypeSpec> = types
                .iter()
                .map(|(id, name, d)| MdevTypeSpec::new(id, name, 0, d.as_deref()))
                .collect();
            for vf in self.vfs_of(pf) {
                let name = vf.to_string();
                if !specs.is_empty() && parents.contains(&name) {
                    b.mdev_parent(&name, &specs);
                }
            }
        }
        b.finish()?;
        // Behind an IOMMU each VF gets its own group, numbered as the kernel allocates them.
        if self.fs.read_link(&format!("{dev}/iommu_group")).is_ok() {
            for vf in self.vfs_of(pf) {
                if let Some(vdir) = self.dev_dir(&vf) {
                    let g = self.free_group();
                    self.join_group(&vdir, g)?;
                }
            }
        }
        self.recompute()
    }

    pub(super) fn run_sriov_manage(&self, args: &[String]) -> io::Result<CommandOutput> {
        let behaviour = self.lock().sriov_manage.clone();
        let target = match args {
            [flag, t] if flag == "-e" => t.clone(),
            _ => {
                return Ok(CommandOutput {
                    status: Some(2),
                    stdout: String::new(),
                    stderr: "usage: sriov-manage <-e|-d> <ssss:bb:dd.f|ALL>\n".to_owned(),
                    timed_out: false,
                });
            }
        };
        let out = |status, stdout: &str, stderr: &str| CommandOutput {
            status,
            stdout: stdout.to_owned(),
            stderr: stderr.to_owned(),
            timed_out: false,
        };
        match behaviour {
            SriovManage::Hangs => Ok(CommandOutput {
                status: None,
                stdout: String::new(),
                stderr: String::new(),
                timed_out: true,
            }),
            SriovManage::Fails(msg) => Ok(out(Some(1), "", &msg)),
            SriovManage::ExitsZeroWithoutEnabling => {
                Ok(out(Some(0), &format!("Enabling VFs on {target}\n"), ""))
            }
            SriovManage::Works => {
                let pfs: Vec<PciAddress> = if target == "ALL" {
                    self.fs
                        .list("sys/bus/pci/devices")
                        .unwrap_or_default()
                        .iter()
                        .filter(|d| {
                            self.fs
                                .exists(&format!("sys/bus/pci/devices/{d}/sriov_totalvfs"))
                        })
                        .filter_map(|d| d.parse().ok())
                        .collect()
                } else {
                    match target.parse() {
                        Ok(a) => vec![a],
                        Err(_) => return Ok(out(Some(1), "", &format!("Invalid BDF {target}\n"))),
                    }
                };
                for pf in pfs {
                    let Some(dev) = self.dev_dir(&pf) else {
                        return Ok(out(Some(1), "", &format!("{pf}: no such device\n")));
                    };
                    let total: u32 = self
                        .fs
                        .read_string(&format!("{dev}/sriov_totalvfs"))
                        .ok()
                        .and_then(|s| s.parse().ok())
                        .unwrap_or(0);
                    let cur: u32 = self
                        .fs
                        .read_string(&format!("{dev}/sriov_numvfs"))
                        .ok()
                        .and_then(|s| s.parse().ok())
                        .unwrap_or(0);
                    if total > 0 && cur == 0 {
                        self.set_numvfs(&pf, total)?;
                    }
                }
                Ok(out(Some(0), &format!("Enabling VFs on {target}\n"), ""))
            }
        }
    }
}
