//! A fake kernel: a [`Host`] over a [`TreeBuilder`] tree whose special files react to writes as
//! Linux 6.x and NVIDIA's drivers do (`lab/FINDINGS.md` records where the real kernel was checked
//! against this fake; `../shared/lab-reference/FACTS.md` records the earlier runs).
//!
//! Reads go to the tree as it is. A 0-byte write to any sysfs attribute succeeds and does nothing
//! (sysfs never calls the store). Writes to these files act:
//! - mdev `mdev_supported_types/<type>/create`: the kernel takes 36 or 37 bytes and parses the first
//!   36 (so `<uuid>\n` and `<uuid>x` both work); a malformed UUID gives `EINVAL`, a UUID already
//!   used on any parent (either case) `EEXIST`, an exhausted pool `ENOSPC` (`mdpy`: `EUSERS`);
//!   success makes the instance as the kernel lays it out (`driver`, `iommu_group`, `mdev_type`,
//!   `power/`, `remove`, `subsystem`, `uevent`, the driver's `vendor/` or `nvidia/` files,
//!   `vfio-dev/vfioN`, bus, driver and type links), its own emulated IOMMU group (the lowest free
//!   number, `name` = `vfio-noiommu`, `type` = `unknown`) with its `/dev/vfio/<group>` node, and
//!   lowers `available_instances` of every type sharing the pool;
//! - mdev `<uuid>/remove`: parsed as an unsigned number (`kstrtoul`, base 0: `0x1`, `010`, `+1`
//!   work, `y`/`on` are `EINVAL`); any non-zero value removes and gives the capacity back, `0` does
//!   nothing;
//! - `nvidia/current_vgpu_type` of a vendor-VFIO VF: a type on a VF that has one gives `EPERM`, a
//!   type that does not fit the GPU `EIO`; success shrinks `creatable_vgpu_types` of every VF of
//!   the GPU; `0` clears;
//! - PCI `driver_override` (cut at the first newline; `"\n"` clears to `(null)`),
//!   `drivers/<drv>/unbind`, `drivers/<drv>/bind` (`ENODEV` when the driver does not match the
//!   device, even while it is bound; then `EBUSY` when it is bound; then the probe's own error:
//!   vfio-pci gives `EINVAL` for a device without an IOMMU group), `drivers_probe` (success even
//!   when no driver took it: the *silent probe failure*), `sriov_numvfs` (`kstrtou16`, base 0).
//!   Devices are named exactly as the kernel names them (`0000:01:00.0`, one trailing newline
//!   allowed); any other spelling is `ENODEV`. Binding to vfio-pci creates the device's
//!   `vfio-dev/vfioN` and its group's `/dev/vfio/<group>`, which goes when the group's last vfio
//!   device does; `/dev/vfio/vfio` always exists. New SR-IOV VFs of a PF in an IOMMU group take
//!   the lowest free group numbers;
//! - and [`Host::run`] of `/usr/lib/nvidia/sriov-manage -e <bdf>` (directly or through `chroot`)
//!   creates the VFs.
//!
//! Pools are declared with [`FakePool`]; presets build whole hosts ([`FakeKernel::sample_mdev_drivers`],
//! [`FakeKernel::a2_mdev_host`], [`FakeKernel::l40s_vendor_vfio_host`], [`FakeKernel::passthrough_host`]).
//! Faults are injected by name: [`FakeKernel::failing_at`], [`FakeKernel::hanging`],
//! [`FakeKernel::with_open_device`], [`FakeKernel::with_silent_probe_failure`],
//! [`FakeKernel::with_sriov_manage`]. Every write is logged ([`FakeKernel::writes`]).

use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use gpu_core::nvidia::{TypeDescription, VgpuTypeName};
use gpu_core::{MdevUuid, PciAddress};

use super::builder::{MdevTypeSpec, PciSpec, Tree, TreeBuilder};
use crate::actuate::error::errno;
use crate::host::{CommandOutput, Host, RealHost};

/// Where NVIDIA installs `sriov-manage`.
const SRIOV_MANAGE: &str = "/usr/lib/nvidia/sriov-manage";

/// A pool of capacity shared by types, and how it is counted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FakePool {
    /// The kernel's sample drivers: each type costs some units of one parent's total
    /// (`mbochs`: 256 MB with 4/16/64 MB types; `mtty`: 24 ports; `mdpy`: 4 instances).
    Units {
        /// Parent name under `sys/class/mdev_bus`.
        parent: String,
        /// Units in the pool.
        total: u32,
        /// `(type directory, units per instance)`.
        costs: Vec<(String, u32)>,
        /// Errno when full (`ENOSPC`; `mdpy` gives `EUSERS`).
        full_errno: i32,
    },
    /// NVIDIA mdev on one physical GPU: the card's framebuffer is `max_instance × framebuffer`
    /// from the types' `description`; all instances on the card have one size; each parent holds
    /// at most `per_parent` instances (1 for SR-IOV VFs).
    NvidiaMdev {
        /// Parent names under `sys/class/mdev_bus` (the VFs, or the PF on pre-Ampere cards).
        parents: Vec<String>,
        /// Instances per parent (1 on VFs).
        per_parent: Option<u32>,
    },
    /// NVIDIA vendor-specific VFIO on one physical GPU.
    VendorVfio {
        /// The physical function.
        pf: PciAddress,
        /// The card's framebuffer in MiB.
        framebuffer_mib: u64,
        /// `(type ID, name)`; sizes come from the names (`NVIDIA L40S-24Q` = 24 GiB).
        types: Vec<(u32, String)>,
    },
}

/// What the emulated `sriov-manage` does.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum SriovManage {
    /// Enables all VFs and exits 0.
    #[default]
    Works,
    /// Exits 0 without enabling anything (as the real script can).
    ExitsZeroWithoutEnabling,
    /// Exits 1 printing this on stderr.
    Fails(String),
    /// Never finishes (the caller's timeout kills it).
    Hangs,
}

/// One write the fake kernel received.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WriteRecord {
    /// Root-relative path as written.
    pub path: String,
    /// The data, lossily as text.
    pub data: String,
    /// The errno it failed with, if it failed.
    pub errno: Option<i32>,
}

/// One entry of a [`snapshot`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Entry {
    /// A directory.
    Dir,
    /// A file and its content.
    File(Vec<u8>),
    /// A symlink and its target as written.
    Link(PathBuf),
}

/// Every directory, file and link under `root`, by root-relative path: two snapshots are equal
/// exactly when the trees are.
///
/// # Errors
/// The I/O error of walking the tree.
pub fn snapshot(root: &Path) -> io::Result<BTreeMap<String, Entry>> {
    fn walk(root: &Path, dir: &Path, out: &mut BTreeMap<String, Entry>) -> io::Result<()> {
        for e in std::fs::read_dir(dir)? {
            let e = e?;
            let p = e.path();
            let rel = p
                .strip_prefix(root)
                .map_err(io::Error::other)?
                .to_string_lossy()
                .into_owned();
            let ft = e.file_type()?;
            if ft.is_symlink() {
                out.insert(rel, Entry::Link(std::fs::read_link(&p)?));
            } else if ft.is_dir() {
                out.insert(rel, Entry::Dir);
                walk(root, &p, out)?;
            } else {
                out.insert(rel, Entry::File(std::fs::read(&p)?));
            }
        }
        Ok(())
    }
    let mut out = BTreeMap::new();
    walk(root, root, &mut out)?;
    Ok(out)
}

#[derive(Debug, Default)]
struct State {
    writes: Vec<WriteRecord>,
    fail_at: Option<(usize, i32)>,
    hanging: BTreeSet<String>,
    sriov_manage: SriovManage,
    silent_probe: BTreeSet<PciAddress>,
    host_drivers: BTreeMap<PciAddress, String>,
    runs: Vec<(String, Vec<String>)>,
    next_pid: u32,
    /// Indices of the `vfio-dev/vfioN` devices that exist (the kernel hands out the lowest free).
    vfio_devs: BTreeSet<u32>,
    broken: Option<String>,
}

/// The fake kernel. See the module documentation.
#[derive(Debug)]
pub struct FakeKernel {
    _tree: Tree,
    root: PathBuf,
    fs: RealHost,
    pools: Vec<FakePool>,
    state: Mutex<State>,
    /// Held while a write reacts, so concurrent writers see the kernel's one-at-a-time order.
    serial: Mutex<()>,
}

fn err(code: i32) -> io::Error {
    io::Error::from_raw_os_error(code)
}

/// `"../"` repeated so that a link inside directory `dir` (root-relative) reaches `sys/`.
fn up_to_sys(dir: &str) -> String {
    "../".repeat(dir.split('/').count().saturating_sub(1))
}

fn strip_sys(p: &str) -> &str {
    p.strip_prefix("sys/").unwrap_or(p)
}

/// Splits a write's data the way sysfs attributes read it: one trailing newline dropped.
fn value(data: &[u8]) -> String {
    let s = String::from_utf8_lossy(data);
    s.strip_suffix('\n').unwrap_or(&s).to_owned()
}

/// What a store sees as a C string: the data up to its first NUL byte (sysfs terminates the
/// buffer after the written bytes).
fn c_str(data: &[u8]) -> &[u8] {
    data.iter()
        .position(|b| *b == 0)
        .map_or(data, |i| &data[..i])
}

/// The kernel's `kstrtoull(s, 0, ..)`: an optional `+`, digits in base 16 (`0x` followed by a hex
/// digit), 8 (a leading `0`) or 10, then at most one `\n`. `Err(EINVAL)` for anything else,
/// `Err(ERANGE)` past `u64::MAX`.
fn kstrtoull(data: &[u8]) -> Result<u64, i32> {
    let mut s = c_str(data);
    if let [b'+', rest @ ..] = s {
        s = rest;
    }
    let base: u8 = match s {
        [b'0', x, d, ..] if x.eq_ignore_ascii_case(&b'x') && d.is_ascii_hexdigit() => {
            s = &s[2..];
            16
        }
        [b'0', ..] => 8,
        _ => 10,
    };
    let mut value: u64 = 0;
    let mut digits = 0;
    let mut overflow = false;
    for &c in s {
        let d = match c {
            b'0'..=b'9' => c - b'0',
            b'a'..=b'f' => c - b'a' + 10,
            b'A'..=b'F' => c - b'A' + 10,
            _ => break,
        };
        if d >= base {
            break;
        }
        match value
            .checked_mul(u64::from(base))
            .and_then(|v| v.checked_add(u64::from(d)))
        {
            Some(v) => value = v,
            None => overflow = true,
        }
        digits += 1;
    }
    if overflow {
        return Err(errno::ERANGE);
    }
    if digits == 0 {
        return Err(errno::EINVAL);
    }
    match &s[digits..] {
        [] | [b'\n'] => Ok(value),
        _ => Err(errno::EINVAL),
    }
}

/// The PCI device named by a write to `bind`, `unbind` or `drivers_probe`: the kernel compares
/// the text with the device's name exactly (`sysfs_streq`: one trailing newline allowed), so
/// `01:00.0` or `0000:01:00.0 ` name nothing.
fn named_device(data: &[u8]) -> Option<PciAddress> {
    let s = c_str(data);
    let s = s.strip_suffix(b"\n").unwrap_or(s);
    let s = std::str::from_utf8(s).ok()?;
    let a: PciAddress = s.parse().ok()?;
    (a.to_string() == s).then_some(a)
}

/// The `power/` attributes of a device without runtime power management, as a real host's mdev
/// instances show them (harvester/pcidevices' A2 capture, Apache-2.0).
const POWER_ATTRS: &[(&str, &str)] = &[
    ("async", "disabled"),
    ("control", "auto"),
    ("runtime_active_kids", "0"),
    ("runtime_active_time", "0"),
    ("runtime_enabled", "disabled"),
    ("runtime_status", "unsupported"),
    ("runtime_suspended_time", "0"),
    ("runtime_usage", "0"),
];

/// The mdev driver NVIDIA's host driver registers.
const NVIDIA_MDEV_DRIVER: &str = "nvidia-vgpu-vfio";

/// Sysfs stores see at most a page; `driver_override` refuses one that long.
const PAGE_SIZE: usize = 4096;

impl FakeKernel {
    /// A fake kernel over a finished tree. Drivers bound at this point are remembered as the
    /// devices' host drivers (what `drivers_probe` binds when no override is set).
    ///
    /// # Errors
    /// The I/O error of opening the tree.
    pub fn new(tree: Tree) -> io::Result<Self> {
        let root = tree.root().to_path_buf();
        let fs = RealHost::new(&root)?;
        let mut state = State {
            next_pid: 4242,
            ..State::default()
        };
        for d in fs.list("sys/bus/pci/devices").unwrap_or_default() {
            let Ok(a) = d.parse::<PciAddress>() else {
                continue;
            };
            if let Some(drv) = link_last(&fs, &format!("sys/bus/pci/devices/{d}/driver")) {
                if drv != "vfio-pci" {
                    state.host_drivers.insert(a, drv);
                }
            }
        }
        let k = FakeKernel {
            _tree: tree,
            root,
            fs,
            pools: Vec::new(),
            state: Mutex::new(state),
            serial: Mutex::new(()),
        };
        k.settle()?;
        Ok(k)
    }

    /// Adds what a booted kernel has beside the tree as built: `/dev/vfio/vfio`, the driver of
    /// every mdev parent under `sys/bus/mdev/drivers`, and the VFIO device and group node of every
    /// device already bound to vfio-pci.
    fn settle(&self) -> io::Result<()> {
        std::fs::create_dir_all(self.root.join("dev/vfio"))?;
        let container = self.root.join("dev/vfio/vfio");
        if !container.exists() {
            std::fs::write(container, "")?;
        }
        for p in self.fs.list("sys/class/mdev_bus").unwrap_or_default() {
            if let Some(pd) = self.class_parent_dir(&p) {
                let drv = self.mdev_driver(&pd);
                std::fs::create_dir_all(self.root.join(format!("sys/bus/mdev/drivers/{drv}")))?;
            }
        }
        for d in self
            .fs
            .list("sys/bus/pci/drivers/vfio-pci")
            .unwrap_or_default()
        {
            let Ok(a) = d.parse::<PciAddress>() else {
                continue;
            };
            if let Some(dev) = self.dev_dir(&a) {
                if !self.fs.exists(&format!("{dev}/vfio-dev")) {
                    self.add_vfio_device(&dev)?;
                }
            }
        }
        Ok(())
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        match self.state.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        }
    }

    /// Declares a pool and brings the counts it governs in line with the instances present.
    pub fn with_pool(mut self, pool: FakePool) -> Self {
        self.pools.push(pool);
        if let Err(e) = self.recompute() {
            self.lock().broken = Some(format!("fake kernel: recomputing pools failed: {e}"));
        }
        self
    }

    /// Fails the `k`-th write (counting from 1, over the kernel's life) with `errno`, leaving the
    /// tree unchanged by it.
    pub fn failing_at(self, k: usize, errno: i32) -> Self {
        self.lock().fail_at = Some((k, errno));
        self
    }

    /// Makes `program` hang when run (reported as killed at the caller's timeout).
    pub fn hanging(self, program: &str) -> Self {
        self.lock().hanging.insert(program.to_owned());
        self
    }

    /// Sets what `sriov-manage` does.
    pub fn with_sriov_manage(self, behaviour: SriovManage) -> Self {
        self.lock().sriov_manage = behaviour;
        self
    }

    /// Makes probes that would bind `bdf` to `vfio-pci` fail: `drivers_probe` succeeds and the
    /// device stays unbound (silently); an explicit `drivers/vfio-pci/bind` gives `EINVAL`.
    pub fn with_silent_probe_failure(self, bdf: &str) -> Self {
        match bdf.parse::<PciAddress>() {
            Ok(a) => {
                self.lock().silent_probe.insert(a);
            }
            Err(e) => self.lock().broken = Some(format!("fake kernel: {e}")),
        }
        self
    }

    /// Sets the driver `drivers_probe` binds `bdf` to when it has no override.
    pub fn with_host_driver(self, bdf: &str, driver: &str) -> Self {
        match bdf.parse::<PciAddress>() {
            Ok(a) => {
                self.lock().host_drivers.insert(a, driver.to_owned());
            }
            Err(e) => self.lock().broken = Some(format!("fake kernel: {e}")),
        }
        self
    }

    /// Simulates a VM holding a device open: a process whose `fd/` has a link to the device's
    /// VFIO node. `path` is a node (`/dev/vfio/7`) or a device (`sys/bus/pci/devices/<bdf>`,
    /// `sys/bus/mdev/devices/<uuid>`), whose IOMMU group node is used.
    pub fn with_open_device(self, path: &str) -> Self {
        if let Err(e) = self.open_device(path) {
            self.lock().broken = Some(format!("fake kernel: {e}"));
        }
        self
    }

    /// Like [`FakeKernel::with_open_device`] on a running fake; returns the holder's pid.
    ///
    /// # Errors
    /// `NotFound` when the device has no VFIO node; I/O errors.
    pub fn open_device(&self, path: &str) -> io::Result<u32> {
        let node = if path.trim_start_matches('/').starts_with("dev/vfio/") {
            format!("/{}", path.trim_start_matches('/'))
        } else {
            let g = link_last(&self.fs, &format!("{path}/iommu_group")).ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::NotFound,
                    format!("{path} has no IOMMU group"),
                )
            })?;
            format!("/dev/vfio/{g}")
        };
        let pid = {
            let mut st = self.lock();
            st.next_pid += 1;
            st.next_pid
        };
        let node_file = self.root.join(node.trim_start_matches('/'));
        if let Some(p) = node_file.parent() {
            std::fs::create_dir_all(p)?;
        }
        if !node_file.exists() {
            std::fs::write(&node_file, "")?;
        }
        let pdir = self.root.join(format!("proc/{pid}"));
        std::fs::create_dir_all(pdir.join("fd"))?;
        std::fs::write(pdir.join("comm"), "qemu-system-x86\n")?;
        std::os::unix::fs::symlink("/dev/null", pdir.join("fd/0"))?;
        std::os::unix::fs::symlink(&node, pdir.join("fd/23"))?;
        Ok(pid)
    }

    /// Ends a process made by [`FakeKernel::open_device`].
    ///
    /// # Errors
    /// The I/O error of removing its directory.
    pub fn close_device(&self, pid: u32) -> io::Result<()> {
        std::fs::remove_dir_all(self.root.join(format!("proc/{pid}")))
    }

    /// Every write so far, in order.
    pub fn writes(&self) -> Vec<WriteRecord> {
        self.lock().writes.clone()
    }

    /// Every program run so far, with its arguments.
    pub fn runs(&self) -> Vec<(String, Vec<String>)> {
        self.lock().runs.clone()
    }

    /// The root of the tree.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// A [`snapshot`] of the whole tree.
    ///
    /// # Errors
    /// The I/O error of walking the tree.
    pub fn snapshot(&self) -> io::Result<BTreeMap<String, Entry>> {
        snapshot(&self.root)
    }

    // ----- presets ---------------------------------------------------------------------------

    /// The kernel's sample mdev drivers as observed on Linux 6.1: `mbochs` (256 MB pool,
    /// `mbochs-small`/`-medium`/`-large` = 4/16/64 MB), `mtty` (24 ports, `mtty-1`/`mtty-2`, no
    /// `description`) and `mdpy` (4 instances, `EUSERS` when full).
    ///
    /// # Errors
    /// The I/O error of building the tree.
    pub fn sample_mdev_drivers() -> io::Result<Self> {
        let mut b = TreeBuilder::new();
        add_sample_mdev_drivers(&mut b);
        let k = FakeKernel::new(b.finish()?)?;
        Ok(k.with_sample_pools())
    }

    /// Declares the pools of the sample drivers added by [`add_sample_mdev_drivers`].
    pub fn with_sample_pools(self) -> Self {
        self.with_pool(FakePool::Units {
            parent: "mbochs".to_owned(),
            total: 256,
            costs: vec![
                ("mbochs-small".to_owned(), 4),
                ("mbochs-medium".to_owned(), 16),
                ("mbochs-large".to_owned(), 64),
            ],
            full_errno: errno::ENOSPC,
        })
        .with_pool(FakePool::Units {
            parent: "mtty".to_owned(),
            total: 24,
            costs: vec![("mtty-1".to_owned(), 1), ("mtty-2".to_owned(), 2)],
            full_errno: errno::ENOSPC,
        })
        .with_pool(FakePool::Units {
            parent: "mdpy".to_owned(),
            total: 4,
            costs: vec![
                ("mdpy-vga".to_owned(), 1),
                ("mdpy-xga".to_owned(), 1),
                ("mdpy-hd".to_owned(), 1),
            ],
            full_errno: errno::EUSERS,
        })
    }

    /// An NVIDIA A2 (16 GB) at `0000:08:00.0` in the mdev framework: 16 VFs `0000:08:00.4` …
    /// `0000:08:02.3`, each an mdev parent of the driver's 15 types ([`A2_TYPES`]: `nvidia-742`
    /// A2-1B … `nvidia-746` A2-4Q … `nvidia-756` A2-16C).
    ///
    /// # Errors
    /// The I/O error of building the tree.
    pub fn a2_mdev_host() -> io::Result<Self> {
        let mut b = TreeBuilder::new();
        let parents = add_a2_mdev_gpu(&mut b);
        let k = FakeKernel::new(b.finish()?)?;
        Ok(k.with_pool(FakePool::NvidiaMdev {
            parents,
            per_parent: Some(1),
        }))
    }

    /// An NVIDIA L40S (48 GB) at `0000:26:00.0` in the vendor-specific VFIO framework, with
    /// `numvfs` VFs enabled (0: SR-IOV still off, `sriov_totalvfs` 32).
    ///
    /// # Errors
    /// The I/O error of building the tree.
    pub fn l40s_vendor_vfio_host(numvfs: u32) -> io::Result<Self> {
        let mut b = TreeBuilder::new();
        let pf = "0000:26:00.0";
        b.pci(
            pf,
            PciSpec::new(0x10de, 0x26b9, 0x030200)
                .driver("nvidia")
                .group(30)
                .numa(0),
        );
        b.attr(pf, "sriov_totalvfs", "32\n")
            .attr(pf, "sriov_numvfs", "0\n")
            .attr(pf, "sriov_offset", "4\n")
            .attr(pf, "sriov_stride", "1\n");
        let k = FakeKernel::new(b.finish()?)?;
        let pool = FakePool::VendorVfio {
            pf: pf.parse().map_err(io::Error::other)?,
            framebuffer_mib: 48 * 1024,
            types: L40S_TYPES
                .iter()
                .map(|(id, n)| (*id, (*n).to_owned()))
                .collect(),
        };
        let k = k.with_pool(pool);
        if numvfs > 0 {
            let a: PciAddress = pf.parse().map_err(io::Error::other)?;
            k.set_numvfs(&a, numvfs)?;
        }
        Ok(k)
    }

    /// A host for whole-GPU passthrough:
    /// - `0000:01:00.0` NVIDIA GPU (`nvidia`) and `0000:01:00.1` its HD audio (`snd_hda_intel`),
    ///   IOMMU group 1 with the root port `0000:00:01.0` (`pcieport`, a bridge: tolerated);
    /// - `0000:02:00.0` NVIDIA GPU sharing IOMMU group 2 with an Intel NIC `0000:03:00.0` (`e1000e`);
    /// - `0000:04:00.0` NVIDIA GPU without an IOMMU group;
    /// - `0000:05:00.0` AMD GPU (`amdgpu`) alone in group 5, with audio `0000:05:00.1`.
    ///
    /// # Errors
    /// The I/O error of building the tree.
    pub fn passthrough_host() -> io::Result<Self> {
        let mut b = TreeBuilder::new();
        add_passthrough_devices(&mut b);
        FakeKernel::new(b.finish()?)
    }

    // ----- pools -----------------------------------------------------------------------------

    fn class_parent_dir(&self, name: &str) -> Option<String> {
        self.fs
            .canonicalize(&format!("sys/class/mdev_bus/{name}"))
            .ok()
    }

    /// `(uuid, type)` of the instances under a parent directory.
    fn instances_in(&self, parent_dir: &str) -> Vec<(String, String)> {
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

    fn write_file(&self, rel: &str, content: &str) -> io::Result<()> {
        let p = self.root.join(rel);
        // Keep files byte-identical when unchanged (snapshots compare bytes).
        if std::fs::read(&p).ok().as_deref() == Some(content.as_bytes()) {
            return Ok(());
        }
        std::fs::write(p, content)
    }

    fn type_dirs(&self, parent_dir: &str) -> Vec<String> {
        self.fs
            .list(&format!("{parent_dir}/mdev_supported_types"))
            .unwrap_or_default()
    }

    /// Brings every pool's counts in line with the instances present.
    fn recompute(&self) -> io::Result<()> {
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
    fn nvidia_type_size(&self, tdir: &str) -> Option<(u64, u32)> {
        let d = self.fs.read_string(&format!("{tdir}/description")).ok()?;
        let d = TypeDescription::parse(&d).ok()?;
        Some((d.framebuffer_mib?, d.max_instance.unwrap_or(1)))
    }

    fn recompute_nvidia_mdev(&self, parents: &[String], per_parent: Option<u32>) -> io::Result<()> {
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

    fn vfs_of(&self, pf: &PciAddress) -> Vec<PciAddress> {
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

    fn vf_type(&self, vf: &PciAddress) -> u32 {
        self.fs
            .read_string(&format!(
                "sys/bus/pci/devices/{vf}/nvidia/current_vgpu_type"
            ))
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(0)
    }

    /// The types that fit on the GPU of a vendor-VFIO pool now.
    fn vendor_creatable(
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

    fn recompute_vendor_vfio(
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

    // ----- reactions to writes ---------------------------------------------------------------

    fn react(&self, path: &str, data: &[u8]) -> io::Result<()> {
        if !self.fs.exists(path) {
            return Err(err(errno::ENOENT));
        }
        let canon = self.fs.canonicalize(path)?;
        if data.is_empty() && canon.starts_with("sys/") {
            // sysfs returns 0 for an empty write without calling the attribute's store.
            return Ok(());
        }
        let (dir, file) = canon.rsplit_once('/').unwrap_or(("", canon.as_str()));
        let dir_name = dir.rsplit('/').next().unwrap_or("");
        let under_types = dir.rsplit_once('/').map(|(d, _)| d).unwrap_or("");
        match file {
            "create" if under_types.ends_with("/mdev_supported_types") => self.mdev_create(
                under_types.trim_end_matches("/mdev_supported_types"),
                dir_name,
                data,
            ),
            "remove" if dir_name.parse::<MdevUuid>().is_ok() => self.mdev_remove(dir, data),
            "current_vgpu_type" if dir.ends_with("/nvidia") => {
                let vf_dir = dir.trim_end_matches("/nvidia");
                let vf = vf_dir.rsplit('/').next().unwrap_or("");
                self.set_vgpu_type(vf.parse().map_err(|_| err(errno::EINVAL))?, data)
            }
            "driver_override" if dir_name.parse::<PciAddress>().is_ok() => {
                if data.len() >= PAGE_SIZE - 1 {
                    return Err(err(errno::EINVAL));
                }
                // Up to the first NUL, then cut at the first newline; nothing left clears.
                let s = c_str(data);
                let s = s.split(|b| *b == b'\n').next().unwrap_or(s);
                let content = if s.is_empty() {
                    "(null)\n".to_owned()
                } else {
                    format!("{}\n", String::from_utf8_lossy(s))
                };
                self.write_file(&canon, &content)
            }
            "drivers_probe" if dir == "sys/bus/pci" => self.probe(data),
            "unbind" if under_types == "sys/bus/pci/drivers" => self.unbind(dir_name, data),
            "bind" if under_types == "sys/bus/pci/drivers" => self.bind_store(dir_name, data),
            "sriov_numvfs" if dir_name.parse::<PciAddress>().is_ok() => {
                // kstrtou16(buf, 0, ..); any parse failure is EINVAL.
                let n = kstrtoull(data)
                    .ok()
                    .and_then(|n| u16::try_from(n).ok())
                    .ok_or_else(|| err(errno::EINVAL))?;
                let a: PciAddress = dir_name.parse().map_err(|_| err(errno::EINVAL))?;
                self.numvfs_store(&a, u32::from(n))
            }
            _ => self.fs.write(path, data),
        }
    }

    fn pool_errno(&self, parent_dir: &str) -> i32 {
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

    fn in_pool(&self, parent_dir: &str) -> bool {
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

    /// The lowest IOMMU group number not in use: the kernel allocates group IDs from an IDA, so a
    /// freed number is reused.
    fn free_group(&self) -> u32 {
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
    fn join_group(&self, dir: &str, g: u32) -> io::Result<()> {
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
    fn add_vfio_device(&self, dir: &str) -> io::Result<()> {
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
    fn remove_vfio_device(&self, dir: &str) -> io::Result<()> {
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

    /// Creates `dir/power` with the attributes of a device without runtime power management.
    fn power_dir(&self, dir: &str) -> io::Result<()> {
        let p = self.root.join(format!("{dir}/power"));
        std::fs::create_dir_all(&p)?;
        for (f, v) in POWER_ATTRS {
            std::fs::write(p.join(f), format!("{v}\n"))?;
        }
        Ok(())
    }

    /// The mdev driver that binds instances of the parent at `parent_dir`: the sample drivers
    /// are their own parents' names; NVIDIA's is `nvidia-vgpu-vfio`.
    fn mdev_driver(&self, parent_dir: &str) -> String {
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
    fn vendor_files(&self, driver: &str, tdir: &str, uuid: &MdevUuid) -> Vec<(String, String)> {
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

    fn link(&self, rel: &str, target: &str) -> io::Result<()> {
        let p = self.root.join(rel);
        if let Some(parent) = p.parent() {
            std::fs::create_dir_all(parent)?;
        }
        std::os::unix::fs::symlink(target, p)
    }

    fn mdev_create(&self, parent_dir: &str, type_id: &str, data: &[u8]) -> io::Result<()> {
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

    fn mdev_remove(&self, idir: &str, data: &[u8]) -> io::Result<()> {
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

    fn set_vgpu_type(&self, vf: PciAddress, data: &[u8]) -> io::Result<()> {
        let n: u32 = value(data).trim().parse().map_err(|_| err(errno::EINVAL))?;
        let path = format!("sys/bus/pci/devices/{vf}/nvidia/current_vgpu_type");
        let pf: Option<PciAddress> =
            link_last(&self.fs, &format!("sys/bus/pci/devices/{vf}/physfn"))
                .and_then(|p| p.parse().ok());
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

    fn dev_dir(&self, addr: &PciAddress) -> Option<String> {
        self.fs
            .canonicalize(&format!("sys/bus/pci/devices/{addr}"))
            .ok()
            .filter(|d| self.fs.exists(d))
    }

    fn do_bind(&self, addr: &PciAddress, dev: &str, driver: &str) -> io::Result<()> {
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

    fn do_unbind(&self, addr: &PciAddress, dev: &str, driver: &str) -> io::Result<()> {
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

    fn override_of(&self, dev: &str) -> Option<String> {
        self.fs
            .read_string(&format!("{dev}/driver_override"))
            .ok()
            .filter(|s| s != "(null)" && !s.is_empty())
    }

    /// What the probe of `driver` on `addr` returns now: `None` when it takes the device, else
    /// its errno (vfio-pci: `EINVAL` for a device without an IOMMU group, and for an injected
    /// probe failure).
    fn probe_error(&self, addr: &PciAddress, dev: &str, driver: &str) -> Option<i32> {
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

    fn probe(&self, data: &[u8]) -> io::Result<()> {
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

    fn unbind(&self, driver: &str, data: &[u8]) -> io::Result<()> {
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
    fn bind_store(&self, driver: &str, data: &[u8]) -> io::Result<()> {
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

    fn numvfs_store(&self, pf: &PciAddress, n: u32) -> io::Result<()> {
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

    fn remove_vfs(&self, pf: &PciAddress, dev: &str) -> io::Result<()> {
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
            let _ = std::fs::remove_file(self.root.join(format!("{dev}/virtfn{i}")));
        }
        self.write_file(&format!("{dev}/sriov_numvfs"), "0\n")
    }

    /// Creates `n` VFs on `pf` (what enabling SR-IOV does), with the vendor-VFIO files when `pf`
    /// has a [`FakePool::VendorVfio`] pool.
    fn set_numvfs(&self, pf: &PciAddress, n: u32) -> io::Result<()> {
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

    fn run_sriov_manage(&self, args: &[String]) -> io::Result<CommandOutput> {
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

fn link_last(fs: &RealHost, path: &str) -> Option<String> {
    fs.read_link(path)
        .ok()?
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
}

impl Host for FakeKernel {
    fn read(&self, path: &str) -> io::Result<Vec<u8>> {
        self.fs.read(path)
    }

    fn write(&self, path: &str, data: &[u8]) -> io::Result<()> {
        crate::host::check_relative(path)?;
        let (n, fail, broken) = {
            let mut st = self.lock();
            st.writes.push(WriteRecord {
                path: path.to_owned(),
                data: String::from_utf8_lossy(data).into_owned(),
                errno: None,
            });
            let n = st.writes.len();
            let fail = st.fail_at.and_then(|(k, e)| (k == n).then_some(e));
            (n, fail, st.broken.clone())
        };
        if let Some(b) = broken {
            return Err(io::Error::other(b));
        }
        let result = match fail {
            Some(e) => Err(err(e)),
            None => {
                let _serial = match self.serial.lock() {
                    Ok(g) => g,
                    Err(p) => p.into_inner(),
                };
                self.react(path, data)
            }
        };
        if let Err(e) = &result {
            let mut st = self.lock();
            if let Some(w) = st.writes.get_mut(n - 1) {
                w.errno = Some(e.raw_os_error().unwrap_or(-1));
            }
        }
        result
    }

    fn list(&self, dir: &str) -> io::Result<Vec<String>> {
        self.fs.list(dir)
    }

    fn read_link(&self, path: &str) -> io::Result<PathBuf> {
        self.fs.read_link(path)
    }

    fn exists(&self, path: &str) -> bool {
        self.fs.exists(path)
    }

    fn run(&self, program: &str, args: &[String], timeout: Duration) -> io::Result<CommandOutput> {
        let hangs = {
            let mut st = self.lock();
            st.runs.push((program.to_owned(), args.to_vec()));
            st.hanging.contains(program)
                || (program.ends_with("/chroot")
                    && args.get(1).is_some_and(|p| st.hanging.contains(p)))
        };
        let _ = timeout;
        if hangs {
            return Ok(CommandOutput {
                status: None,
                stdout: String::new(),
                stderr: String::new(),
                timed_out: true,
            });
        }
        if program == SRIOV_MANAGE {
            return self.run_sriov_manage(args);
        }
        if program.ends_with("/chroot") {
            if let [root, prog, rest @ ..] = args {
                if prog == SRIOV_MANAGE && Path::new(root).is_dir() {
                    return self.run_sriov_manage(rest);
                }
                return Ok(CommandOutput {
                    status: Some(127),
                    stdout: String::new(),
                    stderr: format!(
                        "chroot: failed to run command '{prog}': No such file or directory\n"
                    ),
                    timed_out: false,
                });
            }
        }
        Err(io::Error::new(
            io::ErrorKind::NotFound,
            format!("{program}: not found on the fake host"),
        ))
    }

    fn root_dir(&self) -> Option<&Path> {
        Some(&self.root)
    }
}

/// The L40S's vendor-VFIO types as a free VF of an idle card lists them (recorded on a real
/// host by harvester/pcidevices, Apache-2.0); sizes come from the names.
pub const L40S_TYPES: &[(u32, &str)] = &[
    (1145, "NVIDIA L40S-1B"),
    (1146, "NVIDIA L40S-2B"),
    (1147, "NVIDIA L40S-1Q"),
    (1148, "NVIDIA L40S-2Q"),
    (1149, "NVIDIA L40S-3Q"),
    (1150, "NVIDIA L40S-4Q"),
    (1151, "NVIDIA L40S-6Q"),
    (1152, "NVIDIA L40S-8Q"),
    (1153, "NVIDIA L40S-12Q"),
    (1154, "NVIDIA L40S-16Q"),
    (1155, "NVIDIA L40S-24Q"),
    (1156, "NVIDIA L40S-48Q"),
    (1157, "NVIDIA L40S-1A"),
    (1158, "NVIDIA L40S-2A"),
    (1159, "NVIDIA L40S-3A"),
    (1160, "NVIDIA L40S-4A"),
    (1161, "NVIDIA L40S-6A"),
    (1162, "NVIDIA L40S-8A"),
    (1163, "NVIDIA L40S-12A"),
    (1164, "NVIDIA L40S-16A"),
    (1165, "NVIDIA L40S-24A"),
    (1166, "NVIDIA L40S-48A"),
    (2164, "NVIDIA L40S-3B"),
];

/// Adds the `mbochs`, `mtty` and `mdpy` parents with their types and initial counts.
pub fn add_sample_mdev_drivers(b: &mut TreeBuilder) {
    b.mdev_parent(
        "mbochs",
        &[
            MdevTypeSpec::new(
                "mbochs-small",
                "mbochs-small",
                64,
                Some("virtual display, 4 MB video memory"),
            ),
            MdevTypeSpec::new(
                "mbochs-medium",
                "mbochs-medium",
                16,
                Some("virtual display, 16 MB video memory"),
            ),
            MdevTypeSpec::new(
                "mbochs-large",
                "mbochs-large",
                4,
                Some("virtual display, 64 MB video memory"),
            ),
        ],
    )
    .mdev_parent(
        "mtty",
        &[
            MdevTypeSpec::new("mtty-1", "Single port serial", 24, None),
            MdevTypeSpec::new("mtty-2", "Dual port serial", 12, None),
        ],
    )
    .mdev_parent(
        "mdpy",
        &[
            MdevTypeSpec::new(
                "mdpy-vga",
                "mdpy-vga",
                4,
                Some("virtual display, 640x480 framebuffer"),
            ),
            MdevTypeSpec::new(
                "mdpy-xga",
                "mdpy-xga",
                4,
                Some("virtual display, 1024x768 framebuffer"),
            ),
            MdevTypeSpec::new(
                "mdpy-hd",
                "mdpy-hd",
                4,
                Some("virtual display, 1920x1080 framebuffer"),
            ),
        ],
    );
}

/// The A2's mdev types as its driver lists them: `(directory, name, description)` (facts
/// recorded on a real host by harvester/pcidevices, Apache-2.0).
pub const A2_TYPES: &[(&str, &str, &str)] = &[
    (
        "nvidia-742",
        "NVIDIA A2-1B",
        "num_heads=4, frl_config=45, framebuffer=1024M, max_resolution=5120x2880, max_instance=16",
    ),
    (
        "nvidia-743",
        "NVIDIA A2-2B",
        "num_heads=4, frl_config=45, framebuffer=2048M, max_resolution=5120x2880, max_instance=8",
    ),
    (
        "nvidia-744",
        "NVIDIA A2-1Q",
        "num_heads=4, frl_config=60, framebuffer=1024M, max_resolution=5120x2880, max_instance=16",
    ),
    (
        "nvidia-745",
        "NVIDIA A2-2Q",
        "num_heads=4, frl_config=60, framebuffer=2048M, max_resolution=7680x4320, max_instance=8",
    ),
    (
        "nvidia-746",
        "NVIDIA A2-4Q",
        "num_heads=4, frl_config=60, framebuffer=4096M, max_resolution=7680x4320, max_instance=4",
    ),
    (
        "nvidia-747",
        "NVIDIA A2-8Q",
        "num_heads=4, frl_config=60, framebuffer=8192M, max_resolution=7680x4320, max_instance=2",
    ),
    (
        "nvidia-748",
        "NVIDIA A2-16Q",
        "num_heads=4, frl_config=60, framebuffer=16384M, max_resolution=7680x4320, max_instance=1",
    ),
    (
        "nvidia-749",
        "NVIDIA A2-1A",
        "num_heads=1, frl_config=60, framebuffer=1024M, max_resolution=1280x1024, max_instance=16",
    ),
    (
        "nvidia-750",
        "NVIDIA A2-2A",
        "num_heads=1, frl_config=60, framebuffer=2048M, max_resolution=1280x1024, max_instance=8",
    ),
    (
        "nvidia-751",
        "NVIDIA A2-4A",
        "num_heads=1, frl_config=60, framebuffer=4096M, max_resolution=1280x1024, max_instance=4",
    ),
    (
        "nvidia-752",
        "NVIDIA A2-8A",
        "num_heads=1, frl_config=60, framebuffer=8192M, max_resolution=1280x1024, max_instance=2",
    ),
    (
        "nvidia-753",
        "NVIDIA A2-16A",
        "num_heads=1, frl_config=60, framebuffer=16384M, max_resolution=1280x1024, max_instance=1",
    ),
    (
        "nvidia-754",
        "NVIDIA A2-4C",
        "num_heads=1, frl_config=60, framebuffer=4096M, max_resolution=4096x2400, max_instance=4",
    ),
    (
        "nvidia-755",
        "NVIDIA A2-8C",
        "num_heads=1, frl_config=60, framebuffer=8192M, max_resolution=4096x2400, max_instance=2",
    ),
    (
        "nvidia-756",
        "NVIDIA A2-16C",
        "num_heads=1, frl_config=60, framebuffer=16384M, max_resolution=4096x2400, max_instance=1",
    ),
];

/// Adds an NVIDIA A2 at `0000:08:00.0` with 16 VFs, each an mdev parent of [`A2_TYPES`];
/// returns the VF parents' names.
pub fn add_a2_mdev_gpu(b: &mut TreeBuilder) -> Vec<String> {
    let pf = "0000:08:00.0";
    let spec = PciSpec::new(0x10de, 0x25b6, 0x030200).driver("nvidia");
    b.pci(pf, spec.clone().group(20).numa(0).subsystem(0x10de, 0x157e))
        .sriov(pf, 16, 16, 4, 1, spec, Some(21));
    let types: Vec<MdevTypeSpec> = A2_TYPES
        .iter()
        .map(|(id, name, description)| MdevTypeSpec::new(id, name, 1, Some(description)))
        .collect();
    let mut parents = Vec::new();
    for i in 0..16u32 {
        let rid = (8u32 << 8) + 4 + i;
        let vf = format!("0000:08:{:02x}.{:x}", (rid >> 3) & 0x1f, rid & 7);
        b.mdev_parent(&vf, &types);
        parents.push(vf);
    }
    parents
}

/// Adds the devices of [`FakeKernel::passthrough_host`].
pub fn add_passthrough_devices(b: &mut TreeBuilder) {
    b.pci(
        "0000:00:01.0",
        PciSpec::new(0x8086, 0x1901, 0x060400)
            .driver("pcieport")
            .group(1),
    )
    .pci(
        "0000:01:00.0",
        PciSpec::new(0x10de, 0x2204, 0x030000)
            .driver("nvidia")
            .group(1)
            .subsystem(0x10de, 0x1454),
    )
    .pci(
        "0000:01:00.1",
        PciSpec::new(0x10de, 0x1aef, 0x040300)
            .driver("snd_hda_intel")
            .group(1),
    )
    .pci(
        "0000:02:00.0",
        PciSpec::new(0x10de, 0x1eb8, 0x030200)
            .driver("nvidia")
            .group(2),
    )
    .pci(
        "0000:03:00.0",
        PciSpec::new(0x8086, 0x10d3, 0x020000)
            .driver("e1000e")
            .group(2),
    )
    .pci(
        "0000:04:00.0",
        PciSpec::new(0x10de, 0x1eb8, 0x030200).driver("nvidia"),
    )
    .pci(
        "0000:05:00.0",
        PciSpec::new(0x1002, 0x73bf, 0x030000)
            .driver("amdgpu")
            .group(5),
    )
    .pci(
        "0000:05:00.1",
        PciSpec::new(0x1002, 0xab28, 0x040300)
            .driver("snd_hda_intel")
            .group(5),
    );
}
