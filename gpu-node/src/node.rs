//! [`Node`]: the one writer of a node, and [`Locked`]: the same writer holding the host-wide
//! lock.
//!
//! Every operation is one call: it takes the lock (`run/gpuslice/vgpu.lock` under the root, the
//! lock `gpuslice vgpu apply`, the agent and every other writer of the host take), checks what
//! it needs before the first write (the target, the type, whether a VM holds the device), writes,
//! reads back what it touched (the actuation steps below check the kernel's answer, which a
//! successful write does not prove) and returns what it did.

use std::path::Path;
use std::time::Duration;

use gpu_core::layout::{Assertion, LayoutConfig, Mode};
use gpu_core::{MdevUuid, ParentId, PciAddress};
use gpu_sysfs::Host;
use gpu_sysfs::actuate::{
    self, CreateTarget, Created, GpuBinding, MdevRemoved, SriovDisabled, SriovEnabled,
    SriovOptions, VfCleared, VgpuListing,
};
use gpu_sysfs::apply::{self, ApplyError, ApplyEvent, ApplyOptions, ApplyReport, LayoutLock};
use gpu_sysfs::discover::DiscoverOptions;
use serde::Serialize;

use crate::NodeError;
use crate::intent::{self, Intent};
use crate::probe::Probe;
use crate::target::{Target, choose_target};

/// The host-wide write lock (`run/gpuslice/vgpu.lock` under the root), released on drop.
pub type WriteLock = LayoutLock;

/// Takes the host-wide write lock of `host` (`run/gpuslice/vgpu.lock` under its root), waiting
/// up to `timeout` (`None`: for ever) while another writer holds it; `waiting` is told once.
/// The one home of the lock: every [`Node`] operation, the agent's writer and `gpuslice dra
/// prepare|unprepare` take it here.
///
/// # Errors
/// [`NodeError::Lock`]: no root directory, a lock file that cannot be made, or the timeout.
pub fn lock_host(
    host: &dyn Host,
    timeout: Option<Duration>,
    waiting: &mut dyn FnMut(&Path),
) -> Result<WriteLock, NodeError> {
    lock_root(host, timeout, waiting).map_err(|e| NodeError::Lock(Box::new(e)))
}

/// [`lock_host`] with the lock's own error, for the callers in this crate with an error type
/// of their own (DRA prepare and unprepare).
pub(crate) fn lock_root(
    host: &dyn Host,
    timeout: Option<Duration>,
    waiting: &mut dyn FnMut(&Path),
) -> Result<WriteLock, ApplyError> {
    let root = host.root_dir().ok_or(ApplyError::NoRoot)?;
    LayoutLock::acquire(root, timeout, waiting)
}

/// What to look at after an unfinished vGPU write.
const CHECK_VGPUS: &str = "`gpuslice vgpu list` (a vGPU may be there that no VM owns, or missing)";
/// What to look at after an unfinished bind or release.
const CHECK_GPUS: &str =
    "`gpuslice gpu list` (the GPU or a companion function may be on either driver)";
/// What to look at after an unfinished SR-IOV change.
const CHECK_SRIOV: &str = "`gpuslice topology` (the GPU's VFs may be half made or half gone)";

/// What a layout write that failed left on the host: what its rollback could not undo.
fn layout_left(e: &NodeError) -> Vec<String> {
    match e {
        NodeError::Layout(a) => match a.as_ref() {
            ApplyError::Failed { report } => report
                .rollback
                .as_ref()
                .map(|rb| rb.leftover.iter().map(ToString::to_string).collect())
                .unwrap_or_default(),
            _ => Vec::new(),
        },
        _ => Vec::new(),
    }
}

/// What is told while another writer holds the host's lock: the lock file.
pub type LockWaiting<'h> = &'h (dyn Fn(&Path) + Sync);

/// The writer of one node: a host and the options it was discovered with.
///
/// Borrowed from whoever opened the node (the CLI's [`gpu_health::OpenedNode`], the agent's
/// host), so that making one costs nothing.
#[derive(Clone, Copy)]
pub struct Node<'h> {
    pub(crate) host: &'h dyn Host,
    pub(crate) discover: &'h DiscoverOptions,
    lock_timeout: Option<Duration>,
    waiting: Option<LockWaiting<'h>>,
    nvml: Option<&'h dyn gpu_nvml::NvmlDevices>,
    /// Mixed-size mode may be turned on by a create ([`Node::mixed_sizes_on_request`]).
    mixed_on: bool,
}

impl std::fmt::Debug for Node<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Node")
            .field("node", &self.discover.node)
            .field("lock_timeout", &self.lock_timeout)
            .finish_non_exhaustive()
    }
}

/// A vGPU by what names it: an mdev UUID, or the VF of a vendor-VFIO vGPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VgpuId {
    /// An mdev instance.
    Mdev(MdevUuid),
    /// A vendor-VFIO VF.
    Vf(PciAddress),
}

impl VgpuId {
    /// An mdev UUID, else a PCI address; `None` for neither.
    pub fn parse(s: &str) -> Option<Self> {
        if let Ok(u) = s.parse() {
            return Some(VgpuId::Mdev(u));
        }
        s.parse().ok().map(VgpuId::Vf)
    }
}

/// What a removal did: the mdev's or the VF's outcome, as each serializes on its own.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(untagged)]
pub enum Removed {
    /// An mdev instance removed (or found absent).
    Mdev(MdevRemoved),
    /// A VF's type cleared (or found without one).
    Vf(VfCleared),
}

impl Removed {
    /// True when this call changed the host.
    pub fn changed(&self) -> bool {
        match self {
            Removed::Mdev(r) => r.changed,
            Removed::Vf(r) => r.changed,
        }
    }
}

/// How to write a layout.
#[derive(Debug, Clone)]
pub struct LayoutWrite {
    /// Apply the config, or clear the GPUs it selects.
    pub mode: Mode,
    /// Remove instances a VM has open.
    pub force: bool,
    /// Plan only: write nothing and take no lock.
    pub dry_run: bool,
    /// How to run `sriov-manage` when a GPU needs SR-IOV first.
    pub sriov: SriovOptions,
}

impl Default for LayoutWrite {
    fn default() -> Self {
        LayoutWrite {
            mode: Mode::Apply,
            force: false,
            dry_run: false,
            sriov: SriovOptions::default(),
        }
    }
}

impl<'h> Node<'h> {
    /// The writer of `host`, discovered with `discover`; waits for the lock as long as it takes.
    pub fn new(host: &'h dyn Host, discover: &'h DiscoverOptions) -> Self {
        Node {
            host,
            discover,
            lock_timeout: None,
            waiting: None,
            nvml: None,
            mixed_on: false,
        }
    }

    /// The writer of a node opened by [`crate::open_node_host`].
    pub fn of(opened: &'h gpu_health::OpenedNode) -> Self {
        Node::new(opened.host.host(), &opened.discover)
    }

    /// Gives up waiting for another writer's lock after `timeout` (`None`: waits).
    #[must_use]
    pub fn lock_timeout(mut self, timeout: Option<Duration>) -> Self {
        self.lock_timeout = timeout;
        self
    }

    /// Places vGPUs of different sizes on one GPU already in mixed-size mode, as `nvml`
    /// answers ([`crate::mixed`]): [`Node::create_vgpu`] plans the vGPU's placement and
    /// refuses a mix that does not fit before any write. The mode itself is turned on only when
    /// asked ([`Node::mixed_sizes_on_request`]). Without NVML (no way to know), every GPU keeps
    /// one vGPU size.
    #[must_use]
    pub fn with_mixed_sizes(mut self, nvml: &'h dyn gpu_nvml::NvmlDevices) -> Self {
        self.nvml = Some(nvml);
        self
    }

    /// With `on`, a create on an idle GPU in same-size mode turns mixed-size mode on first
    /// (the operator's explicit opt-in: `--mixed-sizes`, a layout's `mixedSizes`, the agent's
    /// `mixedSizes`), refused naming why where NVIDIA's rules do not allow it (the scheduler, a
    /// GPU without the mode). Needs [`Node::with_mixed_sizes`].
    #[must_use]
    pub fn mixed_sizes_on_request(mut self, on: bool) -> Self {
        self.mixed_on = on;
        self
    }

    /// Gives this writer the node's NVML where there is one (the local driver's, a sandbox's
    /// saved fake): layouts then make and check what MIG needs ([`crate::mig::layout`]), and
    /// vGPUs of different sizes are placed as [`Node::with_mixed_sizes`] says.
    #[must_use]
    pub fn with_nvml(mut self, nvml: Option<&'h dyn gpu_nvml::NvmlDevices>) -> Self {
        self.nvml = nvml;
        self
    }

    pub(crate) fn nvml_handle(&self) -> Option<&'h dyn gpu_nvml::NvmlDevices> {
        self.nvml
    }

    /// Tells `waiting` once when another writer holds the lock.
    #[must_use]
    pub fn on_lock_wait(mut self, waiting: LockWaiting<'h>) -> Self {
        self.waiting = Some(waiting);
        self
    }

    /// The host.
    pub fn host(&self) -> &'h dyn Host {
        self.host
    }

    /// The discovery options.
    pub fn discover(&self) -> &'h DiscoverOptions {
        self.discover
    }

    /// Takes the host-wide write lock, waiting while another writer (a process, or another
    /// thread of this one) holds it.
    ///
    /// # Errors
    /// [`NodeError::Lock`]: no root directory, a lock file that cannot be made, or the timeout.
    pub fn lock(&self) -> Result<Locked<'_, 'h>, NodeError> {
        self.lock_telling(&mut |p| {
            if let Some(w) = self.waiting {
                w(p);
            }
        })
    }

    /// The host-wide write lock itself, for a caller that holds it across steps of its own
    /// (the agent's reconcile and DRA prepare); [`Node::lock`] is the writer holding it.
    ///
    /// # Errors
    /// As [`Node::lock`].
    pub fn acquire(&self) -> Result<WriteLock, NodeError> {
        self.acquire_telling(&mut |p| {
            if let Some(w) = self.waiting {
                w(p);
            }
        })
    }

    fn acquire_telling(&self, waiting: &mut dyn FnMut(&Path)) -> Result<WriteLock, NodeError> {
        lock_host(self.host, self.lock_timeout, waiting)
    }

    fn lock_telling(&self, waiting: &mut dyn FnMut(&Path)) -> Result<Locked<'_, 'h>, NodeError> {
        let lock = self.acquire_telling(waiting)?;
        Ok(Locked { node: self, lock })
    }

    /// Every vGPU on the host: mdev instances and vendor-VFIO VFs with a type. Reads only.
    ///
    /// # Errors
    /// [`NodeError::List`] when the host's device lists cannot be read.
    pub fn list_vgpus(&self) -> Result<VgpuListing, NodeError> {
        actuate::list_vgpus(self.host).map_err(|e| NodeError::List(Box::new(e)))
    }

    /// Creates a vGPU of `profile` on `parent` (see [`choose_target`]), named by `name` once
    /// the target is known (an mdev needs a UUID; `name` may refuse one for a VF), under the
    /// lock when anything is to be written (asking again for what exists writes nothing).
    ///
    /// # Errors
    /// [`NodeError::Lock`]; what `gpu_named` and `name` answer; the errors of
    /// [`Locked::choose_target`] and [`Locked::create_vgpu`].
    pub fn create_vgpu<E: From<NodeError>>(
        &self,
        parent: &ParentId,
        profile: &str,
        force: bool,
        gpu_named: impl Fn(&str) -> Result<PciAddress, E>,
        name: impl Fn(&Target) -> Result<Option<MdevUuid>, E>,
    ) -> Result<Created, E> {
        let intent = || {
            let what = format!("create a {profile} vGPU on {parent}");
            Intent::new("create-vgpu", what, CHECK_VGPUS)
        };
        let op = |host: &dyn Host| {
            let target = choose_target(host, parent, profile, None, &gpu_named)?;
            let uuid = name(&target)?;
            // A UUID that already exists on a parent of the GPU is found there again.
            let target = target.for_uuid(host, uuid.as_ref())?;
            let pool = match &target {
                Target::Mdev {
                    on_gpu: Some(gpu), ..
                } => ParentId::Pci(*gpu),
                t => t.parent(),
            };
            Ok(create_at(host, &target, uuid, force)
                .map_err(|e| crate::full::explained(host, &pool, profile, e))?)
        };
        let Some(nvml) = self.nvml else {
            if let Some(e) = crate::mixed_create::one_size_refusal(self.host, parent, profile) {
                return Err(e.into());
            }
            return self.check_then_write(intent, op);
        };
        // Mixed sizes: every check (the mix fits, the mode may change) before the first write.
        let Some(plan) =
            crate::mixed_create::check(self.host, nvml, parent, profile, self.mixed_on)?
        else {
            return self.check_then_write(intent, op);
        };
        let (plan, made) = if plan.turn_mode_on {
            // Two writes (the mode, then the type): under the lock, planned again there.
            let _lock = self.acquire()?;
            let plan = crate::mixed_create::check(self.host, nvml, parent, profile, self.mixed_on)?;
            let made = intent::around(
                self.host,
                intent(),
                |_| Vec::new(),
                || {
                    if let Some(p) = &plan {
                        crate::mixed::turn_on(nvml, p)
                            .map_err(|e| NodeError::Mixed(Box::new(e)))?;
                    }
                    op(self.host)
                },
            )?;
            (plan, made)
        } else {
            (Some(plan), self.check_then_write(intent, op)?)
        };
        if let Some(p) = &plan {
            crate::mixed_create::read_back(self.host, p, &made)?;
        }
        Ok(made)
    }

    /// Runs `op` on a [`Probe`] of the host first: when it gets through without trying to
    /// change anything, its answer (a refusal, or nothing to do) is the answer, and neither the
    /// lock nor the host was touched. Otherwise `op` runs again, for real, under the lock: the
    /// choices it makes are made again there, on the host as the lock leaves it.
    /// Under the lock the write's intent is recorded around it ([`crate::intent`]).
    fn check_then_write<T, E: From<NodeError>>(
        &self,
        intent: impl FnOnce() -> Intent,
        op: impl Fn(&dyn Host) -> Result<T, E>,
    ) -> Result<T, E> {
        let probe = Probe::new(self.host);
        let checked = op(&probe);
        if !probe.tried_to_write() {
            return checked;
        }
        // What the first write would make is named in the intent, so that a write killed
        // half-way can be undone ([`crate::recover`]).
        let first = probe.first_write();
        let planned = first.and_then(|(path, data)| intent::Planned::of_write(&path, &data));
        let intent = match planned {
            Some(p) => intent().creating(vec![p]),
            None => intent(),
        };
        let _lock = self.acquire()?;
        intent::around(self.host, intent, |_| Vec::new(), || op(self.host))
    }

    /// The write the node's intent record says did not finish, if any ([`intent::unfinished`]).
    /// Reads only.
    ///
    /// # Errors
    /// [`NodeError::Intent`] when the record cannot be read.
    pub fn unfinished(&self) -> Result<Option<Intent>, NodeError> {
        intent::unfinished(self.host)
    }

    /// Removes a vGPU: an mdev instance, or a VF's type. One a process (a VM) holds open is
    /// refused unless `force`.
    ///
    /// # Errors
    /// [`NodeError::Lock`], [`NodeError::RemoveMdev`], [`NodeError::ClearVf`].
    pub fn remove_vgpu(&self, id: &VgpuId, force: bool) -> Result<Removed, NodeError> {
        let what = || match id {
            VgpuId::Mdev(u) => format!("remove mdev {u}"),
            VgpuId::Vf(vf) => format!("clear the vGPU type of VF {vf}"),
        };
        let intent = || Intent::new("remove-vgpu", what(), CHECK_VGPUS);
        self.check_then_write(intent, |host| remove_at(host, id, force))
    }

    /// Binds the GPU `gpu` and its companion functions to vfio-pci.
    ///
    /// # Errors
    /// [`NodeError::Lock`], [`NodeError::Bind`].
    pub fn bind_gpu(&self, gpu: &PciAddress) -> Result<GpuBinding, NodeError> {
        let intent = || {
            let planned = vec![intent::Planned::GpuBind { gpu: *gpu }];
            Intent::new("bind-gpu", format!("bind {gpu} to vfio-pci"), CHECK_GPUS).creating(planned)
        };
        self.check_then_write(intent, |host| bind_at(host, gpu))
    }

    /// Gives the GPU `gpu` back to its host driver (refused while a process holds it, unless
    /// `force`).
    ///
    /// # Errors
    /// [`NodeError::Lock`], [`NodeError::Release`].
    pub fn release_gpu(&self, gpu: &PciAddress, force: bool) -> Result<GpuBinding, NodeError> {
        let what = || format!("release {gpu} to its host driver");
        let intent = || Intent::new("release-gpu", what(), CHECK_GPUS);
        self.check_then_write(intent, |host| release_at(host, gpu, force))
    }

    /// Enables SR-IOV on `pf` with `sriov-manage`, checked afterwards.
    ///
    /// # Errors
    /// [`NodeError::Lock`], [`NodeError::EnableSriov`].
    pub fn enable_sriov(
        &self,
        pf: &PciAddress,
        opts: &SriovOptions,
    ) -> Result<SriovEnabled, NodeError> {
        let intent = || {
            Intent::new(
                "enable-sriov",
                format!("enable SR-IOV on {pf}"),
                CHECK_SRIOV,
            )
        };
        self.check_then_write(intent, |host| enable_sriov_at(host, pf, opts))
    }

    /// Disables SR-IOV on `pf`; refused while a VF holds a vGPU or is open, naming it.
    ///
    /// # Errors
    /// [`NodeError::Lock`], [`NodeError::DisableSriov`].
    pub fn disable_sriov(&self, pf: &PciAddress) -> Result<SriovDisabled, NodeError> {
        let what = || format!("disable SR-IOV on {pf}");
        let intent = || Intent::new("disable-sriov", what(), CHECK_SRIOV);
        self.check_then_write(intent, |host| disable_sriov_at(host, pf))
    }

    /// Applies (or clears) a layout: planned against the host, then written under the lock,
    /// rolled back when a step fails. A dry run plans only and takes no lock.
    ///
    /// # Errors
    /// [`NodeError::Lock`]; [`NodeError::Layout`] (a layout that does not fit, with nothing
    /// written; a failed write, with the rollback's report).
    pub fn apply_layout(
        &self,
        config: &LayoutConfig,
        how: &LayoutWrite,
        events: &mut dyn FnMut(ApplyEvent<'_>),
    ) -> Result<ApplyReport, NodeError> {
        let opts = self.apply_options(how);
        if how.dry_run {
            return apply::apply_layout(self.host, config, &opts, events)
                .map_err(|e| NodeError::Layout(Box::new(e)));
        }
        let locked = self.lock_telling(&mut |path| events(ApplyEvent::WaitingForLock { path }))?;
        let mut opts = opts;
        crate::mixed_layout::before(self, config, &mut opts)?;
        let mig = crate::mig::layout::LayoutHook::before(self, config, &opts)?;
        let verb = match how.mode {
            Mode::Apply => "apply",
            Mode::Clear => "clear",
        };
        let what = format!("{verb} layout config {:?}", config.name);
        // A layout writes only when its plan has steps: the intent is recorded before the first
        // (a layout already in place, or refused by its plan, leaves no record).
        let mut recorded: Option<Intent> = None;
        let host = self.host;
        let out = apply::apply_layout_locked(host, config, &opts, &locked.lock, &mut |e| {
            if matches!(e, ApplyEvent::Step { .. }) && recorded.is_none() {
                let intent = Intent::new("apply-layout", what.clone(), CHECK_VGPUS);
                // Not recorded (a full disk) is not a refusal here: the plan is under way.
                recorded = intent::record(host, &intent).ok().map(|()| intent);
            }
            events(e);
        })
        .map_err(|e| NodeError::Layout(Box::new(e)));
        if let Some(intent) = recorded {
            intent::finish(host, intent, out.as_ref().err().map(layout_left));
        }
        mig.after(out)
    }

    /// Whether the host holds what `config` wants. Reads only.
    ///
    /// # Errors
    /// [`NodeError::Layout`]: discovery failed, or the config cannot be resolved here.
    pub fn assert_layout(&self, config: &LayoutConfig) -> Result<Assertion, NodeError> {
        apply::assert_config(self.host, config, self.discover)
            .map_err(|e| NodeError::Layout(Box::new(e)))
    }

    fn apply_options(&self, how: &LayoutWrite) -> ApplyOptions {
        let mut opts = ApplyOptions::new(self.discover.node.clone());
        opts.discover = self.discover.clone();
        opts.mode = how.mode;
        opts.force = how.force;
        opts.dry_run = how.dry_run;
        opts.lock_timeout = self.lock_timeout;
        opts.sriov = how.sriov.clone();
        opts.choose = Some(crate::target::choose_on_gpu);
        opts
    }
}

/// The writer of a node holding the host-wide lock (released on drop): for a caller that makes
/// several steps one operation (the agent records its promise between choosing and creating).
#[derive(Debug)]
pub struct Locked<'n, 'h> {
    pub(crate) node: &'n Node<'h>,
    lock: LayoutLock,
}

impl Locked<'_, '_> {
    /// The lock file held.
    pub fn path(&self) -> &Path {
        self.lock.path()
    }

    /// Where a vGPU of `profile` on `parent` goes ([`choose_target`]).
    ///
    /// # Errors
    /// As [`choose_target`].
    pub fn choose_target<E: From<NodeError>>(
        &self,
        parent: &ParentId,
        profile: &str,
        uuid: Option<&MdevUuid>,
        gpu_named: impl FnOnce(&str) -> Result<PciAddress, E>,
    ) -> Result<Target, E> {
        choose_target(self.node.host, parent, profile, uuid, gpu_named)
    }

    /// Makes the vGPU at `target`: the mdev instance `uuid`, or the VF's type (`force`: even
    /// while a process holds the VF open). Idempotent: asking again for what exists reports
    /// `changed: false` and writes nothing.
    ///
    /// # Errors
    /// [`NodeError::Unnamed`] for an mdev without a UUID; [`NodeError::CreateMdev`],
    /// [`NodeError::SetVfType`].
    pub fn create_vgpu(
        &self,
        target: &Target,
        uuid: Option<MdevUuid>,
        force: bool,
    ) -> Result<Created, NodeError> {
        create_at(self.node.host, target, uuid, force)
    }

    /// [`Node::remove_vgpu`] under this lock.
    ///
    /// # Errors
    /// [`NodeError::RemoveMdev`], [`NodeError::ClearVf`].
    pub fn remove_vgpu(&self, id: &VgpuId, force: bool) -> Result<Removed, NodeError> {
        remove_at(self.node.host, id, force)
    }

    /// [`Node::bind_gpu`] under this lock.
    ///
    /// # Errors
    /// [`NodeError::Bind`].
    pub fn bind_gpu(&self, gpu: &PciAddress) -> Result<GpuBinding, NodeError> {
        bind_at(self.node.host, gpu)
    }

    /// [`Node::release_gpu`] under this lock.
    ///
    /// # Errors
    /// [`NodeError::Release`].
    pub fn release_gpu(&self, gpu: &PciAddress, force: bool) -> Result<GpuBinding, NodeError> {
        release_at(self.node.host, gpu, force)
    }

    /// [`Node::enable_sriov`] under this lock.
    ///
    /// # Errors
    /// [`NodeError::EnableSriov`].
    pub fn enable_sriov(
        &self,
        pf: &PciAddress,
        opts: &SriovOptions,
    ) -> Result<SriovEnabled, NodeError> {
        enable_sriov_at(self.node.host, pf, opts)
    }

    /// [`Node::disable_sriov`] under this lock.
    ///
    /// # Errors
    /// [`NodeError::DisableSriov`].
    pub fn disable_sriov(&self, pf: &PciAddress) -> Result<SriovDisabled, NodeError> {
        disable_sriov_at(self.node.host, pf)
    }

    /// [`Node::apply_layout`] under this lock (a dry run too plans under it).
    ///
    /// # Errors
    /// [`NodeError::Layout`].
    pub fn apply_layout(
        &self,
        config: &LayoutConfig,
        how: &LayoutWrite,
        events: &mut dyn FnMut(ApplyEvent<'_>),
    ) -> Result<ApplyReport, NodeError> {
        let opts = self.node.apply_options(how);
        if how.dry_run {
            return apply::apply_layout(self.node.host, config, &opts, events)
                .map_err(|e| NodeError::Layout(Box::new(e)));
        }
        apply::apply_layout_locked(self.node.host, config, &opts, &self.lock, events)
            .map_err(|e| NodeError::Layout(Box::new(e)))
    }
}

/// Makes the vGPU at `target` on `host`.
pub(crate) fn create_at(
    host: &dyn Host,
    target: &Target,
    uuid: Option<MdevUuid>,
    force: bool,
) -> Result<Created, NodeError> {
    match target {
        Target::Mdev {
            parent,
            type_id,
            on_gpu,
        } => {
            let uuid = uuid.ok_or_else(|| NodeError::Unnamed {
                parent: parent.clone(),
            })?;
            let at = CreateTarget::Mdev {
                parent: parent.clone(),
                type_id: type_id.clone(),
            };
            actuate::create_vgpu(host, &at, Some(uuid), type_id.as_str(), force).map_err(|source| {
                NodeError::CreateMdev {
                    uuid,
                    parent: parent.clone(),
                    on_gpu: *on_gpu,
                    source: Box::new(source),
                }
            })
        }
        Target::VendorVfio { vf, type_num } => {
            let at = CreateTarget::VendorVfio {
                vf: *vf,
                type_num: *type_num,
            };
            actuate::create_vgpu(host, &at, None, "", force).map_err(|source| {
                NodeError::SetVfType {
                    vf: *vf,
                    type_num: *type_num,
                    source: Box::new(source),
                }
            })
        }
    }
}

/// Removes the vGPU `id` on `host`.
pub(crate) fn remove_at(host: &dyn Host, id: &VgpuId, force: bool) -> Result<Removed, NodeError> {
    match id {
        VgpuId::Mdev(uuid) => actuate::remove_mdev(host, uuid, force)
            .map(Removed::Mdev)
            .map_err(|source| NodeError::RemoveMdev {
                uuid: *uuid,
                source: Box::new(source),
            }),
        VgpuId::Vf(vf) => actuate::clear_vf(host, vf, force)
            .map(Removed::Vf)
            .map_err(|source| NodeError::ClearVf {
                vf: *vf,
                source: Box::new(source),
            }),
    }
}

pub(crate) fn bind_at(host: &dyn Host, gpu: &PciAddress) -> Result<GpuBinding, NodeError> {
    actuate::bind_gpu(host, gpu).map_err(|source| NodeError::Bind {
        gpu: *gpu,
        source: Box::new(source),
    })
}

pub(crate) fn release_at(
    host: &dyn Host,
    gpu: &PciAddress,
    force: bool,
) -> Result<GpuBinding, NodeError> {
    actuate::release_gpu(host, gpu, force).map_err(|source| NodeError::Release {
        gpu: *gpu,
        source: Box::new(source),
    })
}

fn enable_sriov_at(
    host: &dyn Host,
    pf: &PciAddress,
    opts: &SriovOptions,
) -> Result<SriovEnabled, NodeError> {
    actuate::enable_sriov(host, pf, opts).map_err(|source| NodeError::EnableSriov {
        pf: *pf,
        source: Box::new(source),
    })
}

fn disable_sriov_at(host: &dyn Host, pf: &PciAddress) -> Result<SriovDisabled, NodeError> {
    actuate::disable_sriov(host, pf).map_err(|source| NodeError::DisableSriov {
        pf: *pf,
        source: Box::new(source),
    })
}
