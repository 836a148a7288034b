//! Applying a vGPU layout to a host: discover, plan (pure, in `gpu_core::layout`), then write,
//! under a host-wide lock, undoing everything on a failure.
//!
//! The order is fixed so that capacity is free before it is needed and nothing is written until
//! the whole plan has been checked against the host:
//!
//! 1. take the exclusive lock `run/gpuslice/vgpu.lock` under the root (a second apply waits, or
//!    gives up after the lock timeout);
//! 2. discover the host and mark the instances a process holds open;
//! 3. plan; a layout that does not fit, names an unknown type, or is ambiguous is refused here,
//!    with nothing changed;
//! 4. when a GPU still needs SR-IOV, enable it (NVIDIA's `sriov-manage`), discover and plan
//!    again, and refuse (turning SR-IOV back off) if the plan no longer holds;
//! 5. remove the surplus, then create the missing instances largest framebuffer first. The
//!    actuation functions re-read capacity right before each write.
//!
//! Every write that changed something is journalled. When a step fails, the journal is undone in
//! reverse order (created instances removed, removed ones re-created with their UUIDs, cleared VFs
//! given their types back, SR-IOV turned off again) and the report carries both the failure and
//! what the rollback achieved.

mod choose;
mod lock;
mod readback;
mod run;
pub mod text;

use std::path::Path;
use std::time::Duration;

use serde::Serialize;

use gpu_core::layout::{
    Assertion, LayoutConfig, LayoutError, Mode, Plan, PlanOptions, PlannedInstance, Step,
    TypeNames, assert_layout_named, plan_layout_named,
};
use gpu_core::nvidia::{VgpuTypeName, names_match};
use gpu_core::{MdevUuid, NodeTopology, ParentId, PciAddress, VgpuFramework, VgpuTypeId};

pub use crate::remembered::{NAMES_PATH, RememberedNames};
pub use lock::{LOCK_PATH, LayoutLock};

use crate::actuate::{
    ActuateError, MdevCreate, SriovOptions, clear_vf, creatable_types, create_mdev, enable_sriov,
    holder_of, remove_mdev, set_vf_type,
};
use crate::discover::{DiscoverOptions, discover};
use crate::error::SysfsError;
use crate::host::Host;
use run::{Replan, Run};

/// How to apply.
#[derive(Debug, Clone)]
pub struct ApplyOptions {
    /// Discovery options (node name, resolver, parent filter).
    pub discover: DiscoverOptions,
    /// Apply the config, or clear the GPUs it selects.
    pub mode: Mode,
    /// Remove instances a VM has open.
    pub force: bool,
    /// Plan only; write nothing and take no lock.
    pub dry_run: bool,
    /// Give up waiting for another apply after this long (`None`: wait).
    pub lock_timeout: Option<Duration>,
    /// How to run `sriov-manage`.
    pub sriov: SriovOptions,
    /// Where a creation on a GPU goes, chosen again right before its write: the node's one
    /// chooser (`gpu_node::target::choose_on_gpu`, what `vgpu create` and the agent ask). `None`
    /// keeps the planned VF of a vendor-VFIO creation and asks [`crate::actuate::mdev_parent_on_gpu`]
    /// for an mdev one.
    pub choose: Option<Chooser>,
    /// GPUs in mixed-size mode (or turned to it for this layout by the node's writer): planned
    /// without the same-size rule, the driver placing each vGPU.
    pub mixed_sizes: std::collections::BTreeSet<PciAddress>,
}

/// A chooser of [`ApplyOptions::choose`]: the parent a vGPU of `profile` (a type ID or name)
/// asked on GPU `gpu` goes to (mdev `uuid`, when it has one), leaving out the parents in `kept`.
pub type Chooser = fn(
    host: &dyn Host,
    gpu: &PciAddress,
    profile: &str,
    uuid: Option<&MdevUuid>,
    kept: &[ParentId],
) -> Result<ParentId, crate::actuate::ActuateError>;

impl ApplyOptions {
    /// Applying on node `node`, waiting for the lock, not forcing.
    pub fn new(node: impl Into<String>) -> Self {
        ApplyOptions {
            discover: DiscoverOptions::new(node),
            mode: Mode::Apply,
            force: false,
            dry_run: false,
            lock_timeout: None,
            sriov: SriovOptions::default(),
            choose: None,
            mixed_sizes: std::collections::BTreeSet::new(),
        }
    }
}

/// What an apply reports while it runs (for progress bars and logs).
#[derive(Debug)]
pub enum ApplyEvent<'a> {
    /// Another apply holds the lock; this one waits.
    WaitingForLock {
        /// The lock file.
        path: &'a Path,
    },
    /// The plan is made and checked; writes follow.
    Planned {
        /// The plan.
        plan: &'a Plan,
    },
    /// A write is about to be made.
    Step {
        /// 0-based index.
        index: usize,
        /// Steps in all.
        total: usize,
        /// What it does.
        step: &'a Step,
    },
    /// A step failed; the journal is being undone.
    RollingBack {
        /// Changes to undo.
        changes: usize,
    },
}

/// How an apply ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ApplyStatus {
    /// The host already matched; nothing was written.
    Unchanged,
    /// Every step was made.
    Applied,
    /// Every step was made, but GPUs with instances in use were left unchanged (see the plan).
    Incomplete,
    /// Only planned (`--dry-run`).
    DryRun,
    /// A step failed and every change was undone.
    RolledBack,
    /// A step failed and some changes could not be undone (see `rollback.leftover`).
    RollbackIncomplete,
}

impl ApplyStatus {
    /// The exit status of a command that ended so: 0 applied (or nothing to do), 1 GPUs left
    /// unchanged because a VM uses their vGPUs, 3 a write failed and every change was rolled
    /// back, 4 a write failed and the rollback was incomplete.
    #[must_use]
    pub fn exit_status(self) -> u8 {
        match self {
            ApplyStatus::Unchanged | ApplyStatus::Applied | ApplyStatus::DryRun => 0,
            ApplyStatus::Incomplete => 1,
            ApplyStatus::RolledBack => 3,
            ApplyStatus::RollbackIncomplete => 4,
        }
    }
}

/// One change made on the host.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Change {
    /// `remove`, `create` or `enable-sriov`.
    pub op: &'static str,
    /// The physical GPU, or the virtual mdev parent (`mbochs`).
    pub gpu: ParentId,
    /// The mdev UUID or VF address (the GPU for `enable-sriov`).
    pub device: String,
    /// The type, when there is one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub type_id: Option<VgpuTypeId>,
}

/// What a rollback achieved.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Rollback {
    /// Every change was undone.
    pub complete: bool,
    /// Changes undone, most recent first.
    pub undone: Vec<String>,
    /// Changes that could not be undone, with why.
    pub leftover: Vec<String>,
}

/// The result of an apply or clear.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ApplyReport {
    /// How it ended.
    pub status: ApplyStatus,
    /// The plan that was executed (after SR-IOV was enabled, when it had to be).
    pub plan: Plan,
    /// Changes made, in order (before any rollback).
    pub changes: Vec<Change>,
    /// The failure, when a step failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure: Option<String>,
    /// What the rollback did, when there was one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollback: Option<Rollback>,
}

/// Why an apply did not happen or did not finish.
#[derive(Debug, thiserror::Error)]
pub enum ApplyError {
    /// The host is not a directory tree, so there is nowhere to put the lock.
    #[error("the host has no root directory to hold {LOCK_PATH}")]
    NoRoot,
    /// The lock file could not be created or locked.
    #[error("cannot lock {path}")]
    Lock {
        /// The lock file.
        path: String,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// Another apply held the lock for longer than the timeout.
    #[error("another gpuslice apply holds {path}; gave up after {waited:?}")]
    LockTimeout {
        /// The lock file.
        path: String,
        /// How long this one waited.
        waited: Duration,
    },
    /// Discovery failed.
    #[error("cannot discover the host")]
    Discover(#[from] SysfsError),
    /// The layout cannot be planned on this host; nothing was changed.
    #[error(transparent)]
    Layout(#[from] LayoutError),
    /// A step failed after writes began; the report says what was undone.
    #[error("{}", failed_message(report))]
    Failed {
        /// The full report.
        report: Box<ApplyReport>,
    },
}

impl ApplyError {
    /// The kind of this error: the layout's or discovery's kind, `busy` when another apply holds
    /// the lock, `host-error` when the lock cannot be taken, `rollback-incomplete` or
    /// `not-applied` when a step failed after writes began.
    pub fn kind(&self) -> gpu_core::ErrorKind {
        use gpu_core::ErrorKind as K;
        match self {
            ApplyError::NoRoot | ApplyError::Lock { .. } => K::HostError,
            ApplyError::LockTimeout { .. } => K::Busy,
            ApplyError::Discover(e) => e.kind(),
            ApplyError::Layout(e) => e.kind(),
            ApplyError::Failed { report } => match &report.rollback {
                Some(rb) if !rb.complete => K::RollbackIncomplete,
                _ => K::NotApplied,
            },
        }
    }
}

fn failed_message(r: &ApplyReport) -> String {
    let failure = r.failure.as_deref().unwrap_or("a step failed");
    match &r.rollback {
        Some(rb) if rb.complete => format!(
            "{failure}; rolled back: the host is as before ({} changes undone)",
            rb.undone.len()
        ),
        Some(rb) => format!(
            "{failure}; ROLLBACK INCOMPLETE, left on the host: {}",
            rb.leftover.join("; ")
        ),
        None => failure.to_owned(),
    }
}

/// Discovers the host and marks every instance a process holds open (`inUse`), which discovery
/// leaves unknown. Vendor-VFIO type numbers that no VF lists any more are named from the options'
/// resolver, then from the names gpuslice remembered (see [`RememberedNames`]).
///
/// # Errors
/// [`SysfsError`] from discovery.
pub fn observe(host: &dyn Host, opts: &DiscoverOptions) -> Result<NodeTopology, SysfsError> {
    observe_with(host, opts).map(|(t, _)| t)
}

/// The GPUs of `mixed` planned without the same-size rule (mixed-size mode).
pub(crate) fn lift_same_size(
    topo: &mut NodeTopology,
    mixed: &std::collections::BTreeSet<PciAddress>,
) {
    for pool in &mut topo.mediated_devices.pools {
        if matches!(&pool.gpu, ParentId::Pci(a) if mixed.contains(a)) {
            pool.mixed_size = true;
        }
    }
}

fn observe_with(
    host: &dyn Host,
    opts: &DiscoverOptions,
) -> Result<(NodeTopology, Option<RememberedNames>), SysfsError> {
    let memory = host
        .root_dir()
        .map(|root| RememberedNames::load(root, opts.resolver.clone()));
    // Discovery names types from the same memory itself.
    let mut topo = discover(host, opts)?;
    for p in &mut topo.mediated_devices.parents {
        for i in &mut p.instances {
            let dir = match (i.uuid, i.address, p.id.pci()) {
                (Some(u), _, _) => format!("sys/bus/mdev/devices/{u}"),
                (None, Some(a), _) | (None, None, Some(a)) => format!("sys/bus/pci/devices/{a}"),
                _ => continue,
            };
            i.in_use = Some(holder_of(host, &dir).is_some());
        }
    }
    Ok((topo, memory))
}

/// The names the planner may use beyond the topology's own: the remembered ones.
fn known_names(memory: Option<&RememberedNames>) -> TypeNames {
    memory.map(|m| m.names().clone()).unwrap_or_default()
}

/// Checks whether the host holds what `config` wants (selected GPUs only, normalized names).
///
/// # Errors
/// [`ApplyError::Discover`], [`ApplyError::Layout`].
pub fn assert_config(
    host: &dyn Host,
    config: &LayoutConfig,
    opts: &DiscoverOptions,
) -> Result<Assertion, ApplyError> {
    let (topo, memory) = observe_with(host, opts)?;
    Ok(assert_layout_named(
        config,
        &topo,
        &known_names(memory.as_ref()),
    )?)
}

/// Applies (or clears, per `opts.mode`) `config` on `host`. See the module documentation.
///
/// # Errors
/// [`ApplyError::NoRoot`], [`ApplyError::Lock`], [`ApplyError::LockTimeout`] before anything is
/// read; [`ApplyError::Discover`] and [`ApplyError::Layout`] before anything is written;
/// [`ApplyError::Failed`] when a write failed, with the rollback's outcome.
pub fn apply_layout(
    host: &dyn Host,
    config: &LayoutConfig,
    opts: &ApplyOptions,
    events: &mut dyn FnMut(ApplyEvent<'_>),
) -> Result<ApplyReport, ApplyError> {
    let plan_opts = PlanOptions {
        mode: opts.mode,
        force: opts.force,
    };
    if opts.dry_run {
        let (mut topo, memory) = observe_with(host, &opts.discover)?;
        lift_same_size(&mut topo, &opts.mixed_sizes);
        let plan = plan_layout_named(config, &topo, &plan_opts, &known_names(memory.as_ref()))?;
        return Ok(ApplyReport {
            status: ApplyStatus::DryRun,
            plan,
            changes: vec![],
            failure: None,
            rollback: None,
        });
    }
    let root = host.root_dir().ok_or(ApplyError::NoRoot)?;
    let lock = LayoutLock::acquire(root, opts.lock_timeout, &mut |path| {
        events(ApplyEvent::WaitingForLock { path })
    })?;
    apply_layout_locked(host, config, opts, &lock, events)
}

/// [`apply_layout`] for a caller that holds the host's lock already (`gpu_node`'s writer, which
/// takes it once around a whole operation); `opts.dry_run` and `opts.lock_timeout` are not
/// looked at.
///
/// # Errors
/// [`ApplyError::Discover`] and [`ApplyError::Layout`] before anything is written;
/// [`ApplyError::Failed`] when a write failed, with the rollback's outcome.
pub fn apply_layout_locked(
    host: &dyn Host,
    config: &LayoutConfig,
    opts: &ApplyOptions,
    _held: &LayoutLock,
    events: &mut dyn FnMut(ApplyEvent<'_>),
) -> Result<ApplyReport, ApplyError> {
    let plan_opts = PlanOptions {
        mode: opts.mode,
        force: opts.force,
    };
    let (mut topo, mut memory) = observe_with(host, &opts.discover)?;
    lift_same_size(&mut topo, &opts.mixed_sizes);
    if let Some(m) = memory.as_mut() {
        if m.learn(&topo) {
            // Only a memory: a root where it cannot be kept still applies, it just re-learns.
            let _ = m.save(host);
        }
    }
    let names = known_names(memory.as_ref());
    let mut plan = plan_layout_named(config, &topo, &plan_opts, &names)?;
    let mut run = Run {
        host,
        opts,
        journal: vec![],
        changes: vec![],
        memory,
    };
    if plan.needs_sriov() {
        let enables: Vec<Step> = plan
            .steps
            .iter()
            .filter(|s| matches!(s, Step::EnableSriov { .. }))
            .cloned()
            .collect();
        events(ApplyEvent::Planned { plan: &plan });
        for (index, step) in enables.iter().enumerate() {
            events(ApplyEvent::Step {
                index,
                total: enables.len(),
                step,
            });
            if let Err(e) = run.step(step) {
                return Err(run.fail(plan, e.to_string(), events));
            }
        }
        // The VFs exist now: their types are known, so plan again and check everything before
        // the first instance is written.
        let again = observe(host, &opts.discover)
            .map_err(Replan::Discover)
            .and_then(|mut t| {
                lift_same_size(&mut t, &opts.mixed_sizes);
                plan_layout_named(config, &t, &plan_opts, &names).map_err(Replan::Plan)
            });
        plan = match again {
            Ok(p) if !p.needs_sriov() => p,
            Ok(p) => {
                let gpus: Vec<String> = p
                    .gpus
                    .iter()
                    .filter(|g| g.enable_sriov)
                    .map(|g| g.label())
                    .collect();
                let why = format!(
                    "SR-IOV was enabled but no vGPU parents appeared on {}",
                    gpus.join(", ")
                );
                return Err(run.fail(p, why, events));
            }
            Err(why) => return Err(run.fail(plan, why.to_string(), events)),
        };
    }
    if plan.is_noop() && run.changes.is_empty() {
        let status = if plan.refused().next().is_some() {
            ApplyStatus::Incomplete
        } else {
            ApplyStatus::Unchanged
        };
        return Ok(ApplyReport {
            status,
            plan,
            changes: vec![],
            failure: None,
            rollback: None,
        });
    }
    events(ApplyEvent::Planned { plan: &plan });
    let total = plan.steps.len();
    let mut steps = plan.steps.clone();
    let pinned = choose::pinned(config);
    let mut index = 0;
    while index < steps.len() {
        if let Err(e) = choose::rechoose(host, opts.choose, &pinned, &mut steps, index) {
            let why = format!("{}: {e}", describe(&steps[index]));
            return Err(run.fail(plan, why, events));
        }
        let step = &steps[index];
        events(ApplyEvent::Step { index, total, step });
        if let Err(e) = run.step(step) {
            let why = format!("{}: {e}", describe(step));
            return Err(run.fail(plan, why, events));
        }
        if let Err(why) = readback::recheck(&topo, opts, &mut steps, index) {
            return Err(run.fail(plan, why.to_string(), events));
        }
        index += 1;
    }
    plan.steps = steps;
    let status = if plan.refused().next().is_some() {
        ApplyStatus::Incomplete
    } else {
        ApplyStatus::Applied
    };
    Ok(ApplyReport {
        status,
        plan,
        changes: run.changes,
        failure: None,
        rollback: None,
    })
}

/// How a step reads in messages: `create A2-4Q (nvidia-746) 1b4e… on 0000:08:00.4`.
pub fn describe(step: &Step) -> String {
    match step {
        Step::EnableSriov { gpu } => format!("enable SR-IOV on {gpu}"),
        Step::Remove { instance, .. } => match instance.framework {
            VgpuFramework::Mdev => format!(
                "remove {} {} from {}",
                instance.type_label(),
                instance.label(),
                instance.parent
            ),
            VgpuFramework::VendorVfio => {
                format!(
                    "clear {} from VF {}",
                    instance.type_label(),
                    instance.parent
                )
            }
        },
        Step::Create { instance, .. } => match instance.framework {
            VgpuFramework::Mdev => format!(
                "create {} {} on {}",
                instance.type_label(),
                instance.label(),
                instance.parent
            ),
            VgpuFramework::VendorVfio => {
                format!("set {} on VF {}", instance.type_label(), instance.parent)
            }
        },
    }
}

impl gpu_core::ClassifiedError for ApplyError {
    fn kind(&self) -> gpu_core::ErrorKind {
        self.kind()
    }

    /// Discovery's errno, when discovery failed.
    fn errno(&self) -> Option<i32> {
        match self {
            ApplyError::Discover(e) => e.errno(),
            _ => None,
        }
    }

    /// Discovery's detail, when discovery failed.
    fn detail(&self) -> gpu_core::ErrorDetail {
        match self {
            ApplyError::Discover(e) => gpu_core::ClassifiedError::detail(e),
            _ => gpu_core::ErrorDetail::None,
        }
    }
}
