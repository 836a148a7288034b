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
//!   type that does not fit the GPU `EIO`, any type while the PF is not bound to `nvidia`
//!   `ENODEV`; success shrinks `creatable_vgpu_types` of every VF of
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
//! [`FakeKernel::with_sriov_manage`]. A reload of the vGPU manager, which drops every vGPU, is
//! [`FakeKernel::reload_vgpu_manager`]. Every write is logged ([`FakeKernel::writes`]).

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

mod mdev;
mod parse;
mod pci;
mod placement;
mod presets;
mod reload;
mod sriov;
mod vendor;

use parse::{
    NVIDIA_MDEV_DRIVER, PAGE_SIZE, POWER_ATTRS, c_str, err, kstrtoull, named_device, strip_sys,
    up_to_sys, value,
};
pub use presets::{
    A2_TYPES, L40S_TYPES, add_a2_mdev_gpu, add_passthrough_devices, add_sample_mdev_drivers,
    sample_pools,
};
pub use reload::Reloaded;
pub use vendor::FakeMig;

/// Where NVIDIA installs `sriov-manage`.
const SRIOV_MANAGE: &str = "/usr/lib/nvidia/sriov-manage";

/// A pool of capacity shared by types, and how it is counted. Its serde form is what a
/// sandbox keeps in its state file (`crate::sandbox`).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase", tag = "kind")]
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
    #[serde(rename_all = "camelCase")]
    NvidiaMdev {
        /// Parent names under `sys/class/mdev_bus` (the VFs, or the PF on pre-Ampere cards).
        parents: Vec<String>,
        /// Instances per parent (1 on VFs).
        per_parent: Option<u32>,
        /// The types the driver registers on each parent, as `(type directory, name,
        /// description)` (`device_api` `vfio-pci`): what a VF made again by enabling SR-IOV
        /// offers. Empty: parents made again offer none.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        types: Vec<(String, String, Option<String>)>,
    },
    /// NVIDIA vendor-specific VFIO on one physical GPU.
    #[serde(rename_all = "camelCase")]
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
    /// GPUs whose driver is in mixed-size vGPU mode (turned on through NVML on a real host).
    mixed_size: BTreeSet<PciAddress>,
    /// Where the driver's MIG state is read (`with_mig_source`).
    mig: Option<vendor::MigSource>,
    fail_at: Option<(usize, i32)>,
    /// Every write from this one on fails (counting from 1), with this errno.
    fail_from: Option<(usize, i32)>,
    /// State-file writes ([`Host::write_atomic`]) so far, and the ones that fail, with errno.
    state_writes: usize,
    state_fail_at: BTreeMap<usize, i32>,
    /// Every state-file write fails with this errno while set (a full or read-only disk).
    state_failing: Option<i32>,
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
        // A tree written by an earlier kernel (a sandbox's, in another process) already holds
        // VFIO devices: their indices are taken.
        for bus in ["sys/bus/pci/devices", "sys/bus/mdev/devices"] {
            for d in fs.list(bus).unwrap_or_default() {
                for e in fs.list(&format!("{bus}/{d}/vfio-dev")).unwrap_or_default() {
                    if let Some(n) = e.strip_prefix("vfio").and_then(|n| n.parse().ok()) {
                        state.vfio_devs.insert(n);
                    }
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

    /// The driver of the GPU `pf` is now in mixed-size vGPU mode (what
    /// `nvmlDeviceSetVgpuHeterogeneousMode` does on a real host): its VFs list time-sliced types
    /// of every size that fits the framebuffer left, not only the size already there. The
    /// placement stays the driver's (NVML's) business.
    ///
    /// # Errors
    /// The I/O error of rewriting the VFs' lists.
    pub fn set_mixed_size(&self, pf: PciAddress) -> io::Result<()> {
        self.lock().mixed_size.insert(pf);
        self.recompute()
    }

    pub(super) fn is_mixed_size(&self, pf: &PciAddress) -> bool {
        let told = self.lock().mixed_size.contains(pf);
        told || self.mig_of(pf).is_some_and(|m| m.mixed_size)
    }

    /// Fails the `k`-th write (counting from 1, over the kernel's life) with `errno`, leaving the
    /// tree unchanged by it.
    pub fn failing_at(self, k: usize, errno: i32) -> Self {
        self.lock().fail_at = Some((k, errno));
        self
    }

    /// Fails every write from the `k`-th on (counting from 1, over the kernel's life) with
    /// `errno`, as a device that went away mid-operation: what was written before stays, and an
    /// undo of it fails too.
    pub fn failing_from(self, k: usize, errno: i32) -> Self {
        self.lock().fail_from = Some((k, errno));
        self
    }

    /// Fails the state-file writes ([`Host::write_atomic`], counting from 1 over the kernel's
    /// life) numbered in `at` with `errno` (`ENOSPC`: a full disk; `EROFS`: a read-only one),
    /// leaving the file as it was.
    pub fn failing_state_writes(self, at: impl IntoIterator<Item = usize>, errno: i32) -> Self {
        self.fail_state_writes(at, errno);
        self
    }

    /// As [`FakeKernel::failing_state_writes`], on a running kernel (numbers as
    /// [`FakeKernel::state_writes`] counts them: the next write is `state_writes() + 1`).
    pub fn fail_state_writes(&self, at: impl IntoIterator<Item = usize>, errno: i32) {
        self.lock()
            .state_fail_at
            .extend(at.into_iter().map(|k| (k, errno)));
    }

    /// From now on every state-file write fails with `errno` (`Some`: the disk filled up or
    /// turned read-only), or none does (`None`, which also disarms the numbered failures).
    pub fn set_state_failing(&self, errno: Option<i32>) {
        let mut st = self.lock();
        st.state_failing = errno;
        if errno.is_none() {
            st.state_fail_at.clear();
        }
    }

    /// How many state-file writes were asked for so far (failed ones included).
    pub fn state_writes(&self) -> usize {
        self.lock().state_writes
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
            // Processes made by an earlier kernel over the same tree keep their numbers.
            while self.root.join(format!("proc/{}", st.next_pid)).exists() {
                st.next_pid += 1;
            }
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

    /// Rebinds PCI device `bdf` from its driver `from` to `to` the way an administrator does by
    /// hand, outside gpuslice: `driver_override`, `unbind`, then `drivers_probe`.
    ///
    /// # Errors
    /// The first write's error (the kernel's errno for a write it refuses).
    pub fn bind_by_hand(&self, bdf: &str, from: &str, to: &str) -> io::Result<()> {
        self.write(
            &format!("sys/bus/pci/devices/{bdf}/driver_override"),
            to.as_bytes(),
        )?;
        self.write(
            &format!("sys/bus/pci/drivers/{from}/unbind"),
            bdf.as_bytes(),
        )?;
        self.write("sys/bus/pci/drivers_probe", bdf.as_bytes())
    }

    /// Every write so far, in order.
    pub fn writes(&self) -> Vec<WriteRecord> {
        self.lock().writes.clone()
    }

    /// The driver `drivers_probe` binds each device to when it has no override: those bound at
    /// [`FakeKernel::new`] (vfio-pci aside) and those set by [`FakeKernel::with_host_driver`].
    pub fn host_drivers(&self) -> BTreeMap<PciAddress, String> {
        self.lock().host_drivers.clone()
    }

    /// The pools declared with [`FakeKernel::with_pool`].
    pub fn pools(&self) -> &[FakePool] {
        &self.pools
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
}

fn link_last(fs: &RealHost, path: &str) -> Option<String> {
    fs.read_link(path)
        .ok()?
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
}

impl Host for FakeKernel {
    fn read(&self, path: &str) -> io::Result<Vec<u8>> {
        self.refresh_list(path)?;
        self.fs.read(path)
    }

    fn read_bounded(&self, path: &str, max: usize) -> io::Result<Vec<u8>> {
        self.refresh_list(path)?;
        self.fs.read_bounded(path, max)
    }

    fn write_atomic(&self, path: &str, data: &[u8]) -> io::Result<()> {
        let fail = {
            let mut st = self.lock();
            st.state_writes += 1;
            let n = st.state_writes;
            st.state_failing
                .or_else(|| st.state_fail_at.get(&n).copied())
        };
        if let Some(errno) = fail {
            return Err(io::Error::from_raw_os_error(errno));
        }
        self.fs.write_atomic(path, data)
    }

    fn create_dir_all(&self, path: &str) -> io::Result<()> {
        self.fs.create_dir_all(path)
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
            let fail = fail.or_else(|| st.fail_from.and_then(|(k, e)| (n >= k).then_some(e)));
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
