//! A builder of fake host trees: real directories, files and symlinks in a tempdir, laid out as
//! the kernel lays out `/sys` (device directories under `sys/devices`, bus and class views as
//! symlinks), so discovery and actuation run their real code against them.

use std::io;
use std::path::{Path, PathBuf};

use gpu_core::{MdevUuid, PciAddress};

/// Attributes of a PCI function to create. Unset options leave the file out, as on hosts
/// where the kernel does not expose it.
#[derive(Debug, Clone)]
pub struct PciSpec {
    /// `vendor`.
    pub vendor: u16,
    /// `device`.
    pub device: u16,
    /// `subsystem_vendor`.
    pub subsystem_vendor: Option<u16>,
    /// `subsystem_device`.
    pub subsystem_device: Option<u16>,
    /// `class`.
    pub class: u32,
    /// Bound driver (creates the `driver` link and `sys/bus/pci/drivers/<name>`).
    pub driver: Option<String>,
    /// IOMMU group (creates the `iommu_group` link and the group's `devices/` entry).
    pub iommu_group: Option<u32>,
    /// `numa_node` (`-1` is what the kernel writes for none).
    pub numa_node: Option<i32>,
    /// `(current_link_width, max_link_width, current_link_speed, max_link_speed)`.
    pub link: Option<(u32, u32, String, String)>,
    /// `boot_vga`.
    pub boot_vga: Option<bool>,
}

impl PciSpec {
    /// A function with the given IDs and class, everything else unset.
    pub fn new(vendor: u16, device: u16, class: u32) -> Self {
        PciSpec {
            vendor,
            device,
            subsystem_vendor: None,
            subsystem_device: None,
            class,
            driver: None,
            iommu_group: None,
            numa_node: None,
            link: None,
            boot_vga: None,
        }
    }
    /// Sets the driver.
    pub fn driver(mut self, d: &str) -> Self {
        self.driver = Some(d.to_owned());
        self
    }
    /// Sets the IOMMU group.
    pub fn group(mut self, g: u32) -> Self {
        self.iommu_group = Some(g);
        self
    }
    /// Sets the NUMA node.
    pub fn numa(mut self, n: i32) -> Self {
        self.numa_node = Some(n);
        self
    }
    /// Sets the subsystem IDs.
    pub fn subsystem(mut self, v: u16, d: u16) -> Self {
        self.subsystem_vendor = Some(v);
        self.subsystem_device = Some(d);
        self
    }
    /// Sets the link attributes (speeds as the kernel prints them, e.g. `"16.0 GT/s PCIe"`).
    pub fn link(mut self, cur_w: u32, max_w: u32, cur_s: &str, max_s: &str) -> Self {
        self.link = Some((cur_w, max_w, cur_s.to_owned(), max_s.to_owned()));
        self
    }
}

/// An mdev type to create under a parent.
#[derive(Debug, Clone)]
pub struct MdevTypeSpec {
    /// Directory name (`nvidia-746`, `mbochs-small`).
    pub id: String,
    /// `name`.
    pub name: String,
    /// `available_instances`.
    pub available: u32,
    /// `description` (absent for mtty).
    pub description: Option<String>,
    /// `device_api`.
    pub device_api: String,
}

impl MdevTypeSpec {
    /// A `vfio-pci` type.
    pub fn new(id: &str, name: &str, available: u32, description: Option<&str>) -> Self {
        MdevTypeSpec {
            id: id.to_owned(),
            name: name.to_owned(),
            available,
            description: description.map(str::to_owned),
            device_api: "vfio-pci".to_owned(),
        }
    }
}

/// Builds a fake host tree. Methods chain; the first error is kept and returned by [`TreeBuilder::finish`].
#[derive(Debug)]
pub struct TreeBuilder {
    dir: Option<tempfile::TempDir>,
    root: PathBuf,
    error: Option<io::Error>,
}

/// A finished tree; the directory is removed when this is dropped (unless built with [`TreeBuilder::at`]).
#[derive(Debug)]
pub struct Tree {
    _dir: Option<tempfile::TempDir>,
    root: PathBuf,
}

impl Tree {
    /// The root directory standing for `/`.
    pub fn root(&self) -> &Path {
        &self.root
    }
    /// Keeps the directory on disk after drop and returns its path.
    pub fn keep(mut self) -> PathBuf {
        if let Some(d) = self._dir.take() {
            let _ = d.keep();
        }
        self.root.clone()
    }
}

const BUS_PCI: &str = "sys/bus/pci";

/// The target of a link at root-relative `at` pointing to root-relative `to` (both under
/// `sys/`), written as the kernel writes it: up to `sys/`, then down.
fn up_to(at: &str, to: &str) -> String {
    let ups = at.matches('/').count().saturating_sub(1);
    format!(
        "{}{}",
        "../".repeat(ups),
        to.strip_prefix("sys/").unwrap_or(to)
    )
}

impl TreeBuilder {
    /// A builder over a new temporary directory, with the empty bus and class directories a
    /// Linux host always has.
    pub fn new() -> Self {
        match tempfile::tempdir() {
            Ok(d) => {
                let root = d.path().to_path_buf();
                let mut b = TreeBuilder {
                    dir: Some(d),
                    root,
                    error: None,
                };
                b.skeleton();
                b
            }
            Err(e) => TreeBuilder {
                dir: None,
                root: PathBuf::new(),
                error: Some(e),
            },
        }
    }

    /// A builder over an existing (empty) directory that is kept.
    pub fn at(root: impl Into<PathBuf>) -> Self {
        let mut b = TreeBuilder {
            dir: None,
            root: root.into(),
            error: None,
        };
        b.skeleton();
        b
    }

    fn skeleton(&mut self) {
        for d in [
            "sys/devices/pci0000:00",
            "sys/bus/pci/devices",
            "sys/bus/pci/drivers",
            "sys/bus/mdev/devices",
            "sys/class/mdev_bus",
            "sys/kernel/iommu_groups",
            "proc",
            "dev/vfio",
            "run",
        ] {
            self.mkdir(d);
        }
        self.file(&format!("{BUS_PCI}/drivers_probe"), "");
        self.driver_dir("vfio-pci");
    }

    /// The root directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    fn track(&mut self, r: io::Result<()>) {
        if let (Err(e), None) = (r, &self.error) {
            self.error = Some(e);
        }
    }

    /// Creates a directory (and parents) under the root.
    pub fn mkdir(&mut self, rel: &str) -> &mut Self {
        let r = std::fs::create_dir_all(self.root.join(rel));
        self.track(r);
        self
    }

    /// Writes a file under the root (creating parents).
    pub fn file(&mut self, rel: &str, content: &str) -> &mut Self {
        let p = self.root.join(rel);
        let r = p
            .parent()
            .map(std::fs::create_dir_all)
            .unwrap_or(Ok(()))
            .and_then(|_| std::fs::write(&p, content));
        self.track(r);
        self
    }

    /// Creates a symlink `rel` → `target` (target written as given, usually relative).
    pub fn link(&mut self, rel: &str, target: &str) -> &mut Self {
        let p = self.root.join(rel);
        let r = p
            .parent()
            .map(std::fs::create_dir_all)
            .unwrap_or(Ok(()))
            .and_then(|_| {
                let _ = std::fs::remove_file(&p);
                std::os::unix::fs::symlink(target, &p)
            });
        self.track(r);
        self
    }

    /// The device directory of a PCI function (root-relative).
    pub fn pci_dir(addr: &PciAddress) -> String {
        format!("sys/devices/pci0000:00/{addr}")
    }

    fn driver_dir(&mut self, name: &str) {
        let d = format!("{BUS_PCI}/drivers/{name}");
        self.mkdir(&d);
        for f in ["bind", "unbind", "new_id", "remove_id"] {
            if !self.root.join(&d).join(f).exists() {
                self.file(&format!("{d}/{f}"), "");
            }
        }
    }

    /// The directory of PCI function `a` as the tree has it (where its bus link points: a
    /// recorded host keeps functions below their bridges), else [`TreeBuilder::pci_dir`].
    fn dev_dir(&self, a: &PciAddress) -> String {
        std::fs::canonicalize(self.root.join(format!("{BUS_PCI}/devices/{a}")))
            .ok()
            .and_then(|p| {
                let root = std::fs::canonicalize(&self.root).ok()?;
                Some(p.strip_prefix(root).ok()?.to_string_lossy().into_owned())
            })
            .filter(|d| d.starts_with("sys/devices/"))
            .unwrap_or_else(|| Self::pci_dir(a))
    }

    /// Adds a PCI function with its bus view, driver link and IOMMU group.
    pub fn pci(&mut self, addr: &str, spec: PciSpec) -> &mut Self {
        self.pci_in(None, addr, spec)
    }

    /// [`TreeBuilder::pci`] under the bridge directory `parent` (root-relative; `None`: where
    /// the function already is, else `sys/devices/pci0000:00`).
    fn pci_in(&mut self, parent: Option<&str>, addr: &str, spec: PciSpec) -> &mut Self {
        let a: PciAddress = match addr.parse() {
            Ok(a) => a,
            Err(e) => {
                self.track(Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    e.to_string(),
                )));
                return self;
            }
        };
        let dir = match parent {
            Some(p) => format!("{p}/{a}"),
            None => self.dev_dir(&a),
        };
        self.mkdir(&dir);
        self.file(
            &format!("{dir}/vendor"),
            &format!("0x{:04x}\n", spec.vendor),
        );
        self.file(
            &format!("{dir}/device"),
            &format!("0x{:04x}\n", spec.device),
        );
        self.file(&format!("{dir}/class"), &format!("0x{:06x}\n", spec.class));
        if let Some(v) = spec.subsystem_vendor {
            self.file(&format!("{dir}/subsystem_vendor"), &format!("0x{v:04x}\n"));
        }
        if let Some(v) = spec.subsystem_device {
            self.file(&format!("{dir}/subsystem_device"), &format!("0x{v:04x}\n"));
        }
        if let Some(n) = spec.numa_node {
            self.file(&format!("{dir}/numa_node"), &format!("{n}\n"));
        }
        if let Some(b) = spec.boot_vga {
            self.file(&format!("{dir}/boot_vga"), if b { "1\n" } else { "0\n" });
        }
        if let Some((cw, mw, cs, ms)) = &spec.link {
            self.file(&format!("{dir}/current_link_width"), &format!("{cw}\n"));
            self.file(&format!("{dir}/max_link_width"), &format!("{mw}\n"));
            self.file(&format!("{dir}/current_link_speed"), &format!("{cs}\n"));
            self.file(&format!("{dir}/max_link_speed"), &format!("{ms}\n"));
        }
        self.file(&format!("{dir}/driver_override"), "(null)\n");
        let bus_link = format!("{BUS_PCI}/devices/{a}");
        self.link(&bus_link, &up_to(&bus_link, &dir));
        if let Some(d) = &spec.driver {
            self.bind_driver(&a, d);
        }
        if let Some(g) = spec.iommu_group {
            let group = format!("sys/kernel/iommu_groups/{g}");
            self.mkdir(&format!("{group}/devices"));
            let at = format!("{dir}/iommu_group");
            self.link(&at, &up_to(&at, &group));
            let member = format!("{group}/devices/{a}");
            self.link(&member, &up_to(&member, &dir));
        }
        self
    }

    /// Points a function's `driver` link at `driver` (creating the driver directory).
    pub fn bind_driver(&mut self, a: &PciAddress, driver: &str) -> &mut Self {
        self.driver_dir(driver);
        let dir = self.dev_dir(a);
        let at = format!("{dir}/driver");
        self.link(&at, &up_to(&at, &format!("{BUS_PCI}/drivers/{driver}")));
        let entry = format!("{BUS_PCI}/drivers/{driver}/{a}");
        self.link(&entry, &up_to(&entry, &dir));
        self
    }

    /// Sets (or overwrites) an attribute file of a PCI function; `name` may contain `/`.
    pub fn attr(&mut self, addr: &str, name: &str, value: &str) -> &mut Self {
        match addr.parse::<PciAddress>() {
            Ok(a) => {
                let dir = self.dev_dir(&a);
                self.file(&format!("{dir}/{name}"), value)
            }
            Err(e) => {
                self.track(Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    e.to_string(),
                )));
                self
            }
        }
    }

    /// Adds `n` SR-IOV VFs to a PF (which must exist): VF functions at `offset + i*stride`
    /// routing IDs after the PF, `virtfnN`/`physfn` links and the `sriov_*` files. Each VF gets
    /// `vf_spec` (its own IOMMU group `first_group + i` when `first_group` is set).
    #[allow(clippy::too_many_arguments)]
    pub fn sriov(
        &mut self,
        pf: &str,
        n: u32,
        total: u32,
        offset: u32,
        stride: u32,
        vf_spec: PciSpec,
        first_group: Option<u32>,
    ) -> &mut Self {
        let Ok(p) = pf.parse::<PciAddress>() else {
            self.track(Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("bad PF {pf}"),
            )));
            return self;
        };
        // VFs sit beside their PF, below the same bridge.
        let pdir = self.dev_dir(&p);
        let bridge = pdir
            .rsplit_once('/')
            .map_or("sys/devices/pci0000:00", |(b, _)| b)
            .to_owned();
        self.file(&format!("{pdir}/sriov_totalvfs"), &format!("{total}\n"));
        self.file(&format!("{pdir}/sriov_numvfs"), &format!("{n}\n"));
        self.file(&format!("{pdir}/sriov_offset"), &format!("{offset}\n"));
        self.file(&format!("{pdir}/sriov_stride"), &format!("{stride}\n"));
        let rid =
            (u32::from(p.bus()) << 8) | (u32::from(p.device()) << 3) | u32::from(p.function());
        for i in 0..n {
            let vr = rid + offset + i * stride;
            let Ok(va) = PciAddress::new(
                p.domain(),
                ((vr >> 8) & 0xff) as u8,
                ((vr >> 3) & 0x1f) as u8,
                (vr & 7) as u8,
            ) else {
                continue;
            };
            let mut spec = vf_spec.clone();
            spec.iommu_group = first_group.map(|g| g + i);
            self.pci_in(Some(&bridge), &va.to_string(), spec);
            self.link(&format!("{pdir}/virtfn{i}"), &format!("../{va}"));
            self.link(&format!("{bridge}/{va}/physfn"), &format!("../{p}"));
        }
        self
    }

    /// The root-relative directory of an mdev parent: a PCI function's directory, or
    /// `sys/devices/virtual/<name>/<name>` for a virtual parent such as `mbochs`.
    pub fn parent_dir(parent: &str) -> String {
        match parent.parse::<PciAddress>() {
            Ok(a) => Self::pci_dir(&a),
            Err(_) => format!("sys/devices/virtual/{parent}/{parent}"),
        }
    }

    /// [`TreeBuilder::parent_dir`] where the tree has the PCI function.
    fn parent_dir_in_tree(&self, parent: &str) -> String {
        match parent.parse::<PciAddress>() {
            Ok(a) => self.dev_dir(&a),
            Err(_) => Self::parent_dir(parent),
        }
    }

    /// Registers an mdev parent (PCI address or virtual name) with its types.
    pub fn mdev_parent(&mut self, parent: &str, types: &[MdevTypeSpec]) -> &mut Self {
        let dir = self.parent_dir_in_tree(parent);
        self.mkdir(&dir);
        let depth = "../../";
        self.link(
            &format!("sys/class/mdev_bus/{parent}"),
            &format!("{depth}{}", dir.trim_start_matches("sys/")),
        );
        for t in types {
            self.mdev_type(parent, t.clone());
        }
        self
    }

    /// Adds or replaces one type under an mdev parent.
    pub fn mdev_type(&mut self, parent: &str, t: MdevTypeSpec) -> &mut Self {
        let tdir = format!(
            "{}/mdev_supported_types/{}",
            self.parent_dir_in_tree(parent),
            t.id
        );
        self.mkdir(&format!("{tdir}/devices"));
        self.file(&format!("{tdir}/name"), &format!("{}\n", t.name));
        self.file(
            &format!("{tdir}/available_instances"),
            &format!("{}\n", t.available),
        );
        self.file(
            &format!("{tdir}/device_api"),
            &format!("{}\n", t.device_api),
        );
        if let Some(d) = &t.description {
            self.file(&format!("{tdir}/description"), &format!("{d}\n"));
        }
        self.file(&format!("{tdir}/create"), "");
        self
    }

    /// Adds an existing mdev instance of `type_id` on `parent` (does not change counts).
    pub fn mdev_instance(&mut self, uuid: &str, parent: &str, type_id: &str) -> &mut Self {
        let u: MdevUuid = match uuid.parse() {
            Ok(u) => u,
            Err(e) => {
                self.track(Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    e.to_string(),
                )));
                return self;
            }
        };
        let pdir = self.parent_dir_in_tree(parent);
        let idir = format!("{pdir}/{u}");
        self.mkdir(&idir);
        self.link(
            &format!("{idir}/mdev_type"),
            &format!("../mdev_supported_types/{type_id}"),
        );
        self.file(&format!("{idir}/remove"), "");
        self.link(
            &format!("sys/bus/mdev/devices/{u}"),
            &format!("../../../{}", idir.trim_start_matches("sys/")),
        );
        self.link(
            &format!("{pdir}/mdev_supported_types/{type_id}/devices/{u}"),
            &format!("../../../{u}"),
        );
        self
    }

    /// Gives a VF the NVIDIA vendor-specific VFIO files: `nvidia/creatable_vgpu_types` (header plus
    /// `ID : name` lines) and `nvidia/current_vgpu_type`.
    pub fn vendor_vfio_vf(
        &mut self,
        vf: &str,
        creatable: &[(u32, &str)],
        current: u32,
    ) -> &mut Self {
        let mut text = String::from("ID    : vGPU Name\n");
        for (id, name) in creatable {
            text.push_str(&format!("{id:<6}: {name}\n"));
        }
        self.attr(vf, "nvidia/creatable_vgpu_types", &text);
        self.attr(vf, "nvidia/current_vgpu_type", &format!("{current}\n"));
        for f in ["gpu_instance_id", "placement_id", "vgpu_params"] {
            self.attr(vf, &format!("nvidia/{f}"), "");
        }
        self
    }

    /// Finishes the tree.
    ///
    /// # Errors
    /// The first I/O error met while building.
    pub fn finish(self) -> io::Result<Tree> {
        if let Some(e) = self.error {
            return Err(e);
        }
        Ok(Tree {
            _dir: self.dir,
            root: self.root,
        })
    }
}

impl Default for TreeBuilder {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::{Host, RealHost};

    #[test]
    fn builds_a_kernel_shaped_tree() {
        let mut b = TreeBuilder::new();
        b.pci(
            "0000:08:00.0",
            PciSpec::new(0x10de, 0x25b6, 0x030200)
                .driver("nvidia")
                .group(20)
                .numa(0),
        )
        .sriov(
            "0000:08:00.0",
            16,
            16,
            4,
            1,
            PciSpec::new(0x10de, 0x25b6, 0x030200).driver("nvidia"),
            Some(21),
        )
        .mdev_parent(
            "0000:08:00.4",
            &[MdevTypeSpec::new(
                "nvidia-746",
                "NVIDIA A2-4Q",
                1,
                Some("framebuffer=4096M, max_instance=4"),
            )],
        )
        .mdev_instance(
            "de306c9f-a714-4373-a290-dc15d4e49b71",
            "0000:08:00.4",
            "nvidia-746",
        )
        .mdev_parent(
            "mbochs",
            &[MdevTypeSpec::new("mbochs-small", "mbochs-small", 64, None)],
        );
        let t = b.finish().unwrap();
        let h = RealHost::new(t.root()).unwrap();
        assert_eq!(
            h.read_string("sys/bus/pci/devices/0000:08:00.0/vendor")
                .unwrap(),
            "0x10de"
        );
        assert_eq!(
            h.resolve_link("sys/bus/pci/devices/0000:08:00.0/virtfn15")
                .unwrap(),
            "sys/devices/pci0000:00/0000:08:02.3"
        );
        assert_eq!(
            h.resolve_link("sys/bus/pci/devices/0000:08:02.3/physfn")
                .unwrap(),
            "sys/devices/pci0000:00/0000:08:00.0"
        );
        assert_eq!(
            h.resolve_link("sys/bus/pci/devices/0000:08:00.0/iommu_group")
                .unwrap(),
            "sys/kernel/iommu_groups/20"
        );
        assert_eq!(
            h.resolve_link("sys/bus/pci/devices/0000:08:00.0/driver")
                .unwrap(),
            "sys/bus/pci/drivers/nvidia"
        );
        assert_eq!(
            h.list("sys/kernel/iommu_groups/21/devices").unwrap(),
            ["0000:08:00.4"]
        );
        assert_eq!(
            h.resolve_link("sys/class/mdev_bus/0000:08:00.4").unwrap(),
            "sys/devices/pci0000:00/0000:08:00.4"
        );
        assert_eq!(
            h.resolve_link("sys/class/mdev_bus/mbochs").unwrap(),
            "sys/devices/virtual/mbochs/mbochs"
        );
        let inst = "sys/bus/mdev/devices/de306c9f-a714-4373-a290-dc15d4e49b71";
        assert_eq!(
            h.resolve_link(inst).unwrap(),
            "sys/devices/pci0000:00/0000:08:00.4/de306c9f-a714-4373-a290-dc15d4e49b71"
        );
        assert_eq!(
            h.resolve_link(&format!("{}/mdev_type", h.resolve_link(inst).unwrap()))
                .unwrap(),
            "sys/devices/pci0000:00/0000:08:00.4/mdev_supported_types/nvidia-746"
        );
        assert!(h.exists("sys/devices/pci0000:00/0000:08:00.4/mdev_supported_types/nvidia-746/devices/de306c9f-a714-4373-a290-dc15d4e49b71/mdev_type"));
    }
}
