//! Mediated devices: pools shared by the types of a parent, `create` and `remove`.

use super::*;

impl FakeKernel {
    // ----- pools -----------------------------------------------------------------------------

    pub(super) fn class_parent_dir(&self, name: &str) -> Option<String> {
        self.fs
            .canonicalize(&format!("sys/class/mdev_bus/{name}"))
            .ok()
    }

    /// `(uuid, type)` of the instances under a parent directory.
    pub(super) fn instances_in(&self, parent_dir: &str) -> Vec<(String, String)> {
        self.fs
            .list(parent_dir)
            .unwrap_or_default()
            .into_iter()
            .filter(|e| e.parse::<MdevUuid>().is_ok())
            .filter_map(|e| {
                let t = link_last(&self.fs, &format!("{parent_dir}/{e}/mdev_type"))?;
                Some((e, t))
            })
            .collect()
    }

    pub(super) fn write_file(&self, rel: &str, content: &str) -> io::Result<()> {
        let p = self.root.join(rel);
        // Keep files byte-identical when unchanged (snapshots compare bytes).
        if std::fs::read(&p).ok().as_deref() == Some(content.as_bytes()) {
            return Ok(());
        }
        std::fs::write(p, content)
    }

    pub(super) fn type_dirs(&self, parent_dir: &str) -> Vec<String> {
        self.fs
            .list(&format!("{parent_dir}/mdev_supported_types"))
            .unwrap_or_default()
    }

    /// Brings every pool's counts in line with the instances present.
    pub(super) fn recompute(&self) -> io::Result<()> {
        for pool in &self.pools {
            match pool {
                FakePool::Units {
                    parent,
                    total,
                    costs,
                    ..
                } => {
                    let Some(pd) = self.class_parent_dir(parent) else {
                        continue;
                    };
                    let cost = |t: &str| costs.iter().find(|(n, _)| n == t).map(|(_, c)| *c);
                    let used: u32 = self
                        .instances_in(&pd)
                        .iter()
                        .filter_map(|(_, t)| cost(t))
                        .sum();
                    let free = total.saturating_sub(used);
                    for (t, c) in costs {
                        let f = format!("{pd}/mdev_supported_types/{t}/available_instances");
                        if self.fs.exists(&f) {
                            self.write_file(&f, &format!("{}\n", free / (*c).max(1)))?;
                        }
                    }
                }
                FakePool::NvidiaMdev {
                    parents,
                    per_parent,
                    ..
                } => self.recompute_nvidia_mdev(parents, *per_parent)?,
                FakePool::VendorVfio {
                    pf,
                    framebuffer_mib,
                    types,
                } => self.recompute_vendor_vfio(pf, *framebuffer_mib, types)?,
            }
        }
        Ok(())
    }

    /// `(framebuffer MiB, max_instance)` of an NVIDIA type directory, from its description.
    pub(super) fn nvidia_type_size(&self, tdir: &str) -> Option<(u64, u32)> {
        let d = self.fs.read_string(&format!("{tdir}/description")).ok()?;
        let d = TypeDescription::parse(&d).ok()?;
        Some((d.framebuffer_mib?, d.max_instance.unwrap_or(1)))
    }

    pub(super) fn recompute_nvidia_mdev(
        &self,
        parents: &[String],
        per_parent: Option<u32>,
    ) -> io::Result<()> {
        let dirs: Vec<String> = parents
            .iter()
            .filter_map(|p| self.class_parent_dir(p))
            .collect();
        let mut total: u64 = 0;
        let mut used: u64 = 0;
        let mut size: Option<u64> = None;
        for pd in &dirs {
            for t in self.type_dirs(pd) {
                if let Some((fb, max)) =
                    self.nvidia_type_size(&format!("{pd}/mdev_supported_types/{t}"))
                {
                    total = total.max(fb * u64::from(max));
                }
            }
            for (_, t) in self.instances_in(pd) {
                if let Some((fb, _)) =
                    self.nvidia_type_size(&format!("{pd}/mdev_supported_types/{t}"))
                {
                    used += fb;
                    size = Some(fb);
                }
            }
        }
        for pd in &dirs {
            let here = self.instances_in(pd).len() as u64;
            for t in self.type_dirs(pd) {
                let tdir = format!("{pd}/mdev_supported_types/{t}");
                let Some((fb, _)) = self.nvidia_type_size(&tdir) else {
                    continue;
                };
                let mut n = if size.is_some_and(|s| s != fb) {
                    0
                } else {
                    total.saturating_sub(used) / fb.max(1)
                };
                if let Some(pp) = per_parent {
                    n = n.min(u64::from(pp).saturating_sub(here));
                }
                self.write_file(&format!("{tdir}/available_instances"), &format!("{n}\n"))?;
            }
        }
        Ok(())
    }

    pub(super) fn pool_errno(&self, parent_dir: &str) -> i32 {
        for p in &self.pools {
            if let FakePool::Units {
                parent, full_errno, ..
            } = p
            {
                if self.class_parent_dir(parent).as_deref() == Some(parent_dir) {
                    return *full_errno;
                }
            }
        }
        errno::ENOSPC
    }

    pub(super) fn in_pool(&self, parent_dir: &str) -> bool {
        self.pools.iter().any(|p| match p {
            FakePool::Units { parent, .. } => {
                self.class_parent_dir(parent).as_deref() == Some(parent_dir)
            }
            FakePool::NvidiaMdev { parents, .. } => parents
                .iter()
                .any(|p| self.class_parent_dir(p).as_deref() == Some(parent_dir)),
            FakePool::VendorVfio { .. } => false,
        })
    }

    /// Creates `dir/power` with the attributes of a device without runtime power management.
    pub(super) fn power_dir(&self, dir: &str) -> io::Result<()> {
        let p = self.root.join(format!("{dir}/power"));
        std::fs::create_dir_all(&p)?;
        for (f, v) in POWER_ATTRS {
            std::fs::write(p.join(f), format!("{v}\n"))?;
        }
        Ok(())
    }

    /// The mdev driver that binds instances of the parent at `parent_dir`: the sample drivers
    /// are their own parents' names; NVIDIA's is `nvidia-vgpu-vfio`.
    pub(super) fn mdev_driver(&self, parent_dir: &str) -> String {
        let nvidia = self.pools.iter().any(|p| match p {
            FakePool::NvidiaMdev { parents, .. } => parents
                .iter()
                .any(|n| self.class_parent_dir(n).as_deref() == Some(parent_dir)),
            _ => false,
        });
        let name = parent_dir.rsplit('/').next().unwrap_or(parent_dir);
        if nvidia {
            return NVIDIA_MDEV_DRIVER.to_owned();
        }
        if name.parse::<PciAddress>().is_err() {
            return name.to_owned();
        }
        match link_last(&self.fs, &format!("{parent_dir}/driver")).as_deref() {
            Some("nvidia") | None => NVIDIA_MDEV_DRIVER.to_owned(),
            Some(d) => d.to_owned(),
        }
    }

    /// The driver's own attributes of a new instance, by path under the instance: `vendor/`
    /// of the sample drivers (`mbochs`: `memory`, `mdpy`: `resolution`, `mtty`:
    /// `sample_mdev_dev`), `nvidia/` of NVIDIA's.
    pub(super) fn vendor_files(
        &self,
        driver: &str,
        tdir: &str,
        uuid: &MdevUuid,
    ) -> Vec<(String, String)> {
        let description = self
            .fs
            .read_string(&format!("{tdir}/description"))
            .unwrap_or_default();
        let words: Vec<&str> = description
            .split(|c: char| c.is_whitespace() || c == ',')
            .filter(|w| !w.is_empty())
            .collect();
        match driver {
            "mbochs" => words
                .windows(2)
                .find(|w| w[1] == "MB")
                .map(|w| vec![("vendor/memory".to_owned(), format!("{} MB", w[0]))])
                .unwrap_or_default(),
            "mdpy" => words
                .iter()
                .find(|w| {
                    w.split_once('x').is_some_and(|(a, b)| {
                        !a.is_empty()
                            && !b.is_empty()
                            && a.bytes().chain(b.bytes()).all(|c| c.is_ascii_digit())
                    })
                })
                .map(|r| vec![("vendor/resolution".to_owned(), (*r).to_owned())])
                .unwrap_or_default(),
            "mtty" => vec![(
                "vendor/sample_mdev_dev".to_owned(),
                format!("This is MDEV {uuid}"),
            )],
            NVIDIA_MDEV_DRIVER => vec![
                ("nvidia/vgpu_params".to_owned(), String::new()),
                ("nvidia/vm_name".to_owned(), String::new()),
            ],
            _ => Vec::new(),
        }
    }

    pub(super) fn link(&self, rel: &str, target: &str) -> io::Result<()> {
        let p = self.root.join(rel);
        if let Some(parent) = p.parent() {
            std::fs::create_dir_all(parent)?;
        }
        std::os::unix::fs::symlink(target, p)
    }

    pub(super) fn mdev_create(
        &self,
        parent_dir: &str,
        type_id: &str,
        data: &[u8],
    ) -> io::Result<()> {
        // The kernel takes 36 or 37 bytes and parses the first 36: any one trailing byte is fine.
        if data.len() != 36 && data.len() != 37 {
            return Err(err(errno::EINVAL));
        }
        let text = &data[..36];
        let well_formed = text.iter().enumerate().all(|(i, b)| {
            if matches!(i, 8 | 13 | 18 | 23) {
                *b == b'-'
            } else {
                b.is_ascii_hexdigit()
            }
        });
        if !well_formed {
            return Err(err(errno::EINVAL));
        }
        let uuid: MdevUuid = String::from_utf8_lossy(text)
            .parse()
            .map_err(|_| err(errno::EINVAL))?;
        if self.fs.exists(&format!("sys/bus/mdev/devices/{uuid}")) {
            return Err(err(errno::EEXIST));
        }
        let tdir = format!("{parent_dir}/mdev_supported_types/{type_id}");
        let avail_path = format!("{tdir}/available_instances");
        let avail: u32 = self
            .fs
            .read_string(&avail_path)
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(0);
        if avail == 0 {
            return Err(err(self.pool_errno(parent_dir)));
        }
        let idir = format!("{parent_dir}/{uuid}");
        let up = up_to_sys(&idir);
        let driver = self.mdev_driver(parent_dir);
        std::fs::create_dir_all(self.root.join(&idir))?;
        self.link(
            &format!("{idir}/mdev_type"),
            &format!("../mdev_supported_types/{type_id}"),
        )?;
        std::fs::write(self.root.join(format!("{idir}/remove")), "")?;
        self.link(&format!("{idir}/subsystem"), &format!("{up}bus/mdev"))?;
        self.link(
            &format!("{idir}/driver"),
            &format!("{up}bus/mdev/drivers/{driver}"),
        )?;
        self.link(
            &format!("sys/bus/mdev/drivers/{driver}/{uuid}"),
            &format!("../../../../{}", strip_sys(&idir)),
        )?;
        std::fs::write(
            self.root.join(format!("{idir}/uevent")),
            format!("DRIVER={driver}\n"),
        )?;
        self.power_dir(&idir)?;
        for (f, v) in self.vendor_files(&driver, &tdir, &uuid) {
            let p = self.root.join(format!("{idir}/{f}"));
            if let Some(d) = p.parent() {
                std::fs::create_dir_all(d)?;
            }
            std::fs::write(p, format!("{v}\n"))?;
        }
        self.link(
            &format!("sys/bus/mdev/devices/{uuid}"),
            &format!("../../../{}", strip_sys(&idir)),
        )?;
        self.link(
            &format!("{tdir}/devices/{uuid}"),
            &format!("../../../{uuid}"),
        )?;
        // VFIO gives every mdev its own emulated IOMMU group, with or without an IOMMU.
        let g = self.free_group();
        self.join_group(&idir, g)?;
        let gdir = self.root.join(format!("sys/kernel/iommu_groups/{g}"));
        std::fs::write(gdir.join("name"), "vfio-noiommu\n")?;
        std::fs::write(gdir.join("type"), "unknown\n")?;
        std::fs::write(gdir.join("reserved_regions"), "")?;
        self.add_vfio_device(&idir)?;
        if self.in_pool(parent_dir) {
            self.recompute()
        } else {
            self.write_file(&avail_path, &format!("{}\n", avail - 1))
        }
    }

    pub(super) fn mdev_remove(&self, idir: &str, data: &[u8]) -> io::Result<()> {
        // kstrtoul(buf, 0, ..): any failure is EINVAL; any non-zero number removes.
        if kstrtoull(data).map_err(|_| err(errno::EINVAL))? == 0 {
            return Ok(());
        }
        let (parent_dir, uuid) = idir.rsplit_once('/').ok_or_else(|| err(errno::EINVAL))?;
        let type_id = link_last(&self.fs, &format!("{idir}/mdev_type"));
        self.remove_vfio_device(idir)?;
        if let Some(g) = link_last(&self.fs, &format!("{idir}/iommu_group")) {
            let _ = std::fs::remove_dir_all(self.root.join(format!("sys/kernel/iommu_groups/{g}")));
        }
        if let Some(d) = link_last(&self.fs, &format!("{idir}/driver")) {
            let _ =
                std::fs::remove_file(self.root.join(format!("sys/bus/mdev/drivers/{d}/{uuid}")));
        }
        if let Some(t) = &type_id {
            let _ = std::fs::remove_file(self.root.join(format!(
                "{parent_dir}/mdev_supported_types/{t}/devices/{uuid}"
            )));
        }
        std::fs::remove_file(self.root.join(format!("sys/bus/mdev/devices/{uuid}")))?;
        std::fs::remove_dir_all(self.root.join(idir))?;
        if self.in_pool(parent_dir) {
            self.recompute()
        } else if let Some(t) = type_id {
            let f = format!("{parent_dir}/mdev_supported_types/{t}/available_instances");
            let n: u32 = self
                .fs
                .read_string(&f)
                .ok()
                .and_then(|s| s.parse().ok())
                .unwrap_or(0);
            self.write_file(&f, &format!("{}\n", n + 1))
        } else {
            Ok(())
        }
    }
}
