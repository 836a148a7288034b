//! NVSwitch fabric partitions changed on a node: listed, activated and deactivated, and whole
//! GPUs handed out as a set with the partition whose members they are.
//!
//! A set of GPUs on an NVSwitch host reaches its members over NVLink only when Fabric Manager
//! has activated a partition whose members are exactly that set. So [`bind_set`] refuses, before
//! anything is written, a set that is no partition (naming the partitions that would do), and a
//! multi-GPU set when Fabric Manager cannot be reached; otherwise it activates the partition and
//! then binds each GPU to vfio-pci, in the order NVIDIA's DRA driver uses (the partition first,
//! then the VFIO devices: `docs/fabric.md`), undoing both when a bind fails. [`release_set`]
//! gives the GPUs back, then deactivates the partition.
//!
//! A partition whose member a process (a VM) holds open, or that shares a GPU with another
//! active partition, is not activated nor deactivated: the refusal names the holder. Every
//! change runs under the node's write lock ([`crate::Node::lock`]), the binds through the
//! writer's own steps.

use std::sync::Arc;

use gpu_core::fabric::{Fabric, FabricMode, Partition, SetRefusal};
use gpu_core::{ClassifiedError, ErrorKind, NodeTopology, PciAddress};
use gpu_fabric::{FabricManager, FmError};
use gpu_health::OpenedNode;
use gpu_health::fabric::FabricSource;
use gpu_sysfs::actuate::GpuBinding;
use serde::Serialize;

use crate::{Node, NodeError};

mod claim;
mod record;
mod set;
mod vgpu;

pub use claim::{activate_vfs_for_claim, claim_vf_gpus, vgpu_claim_partition};
pub use record::{ACTIVE_FILE, recorded, recover, restore_activated};
pub use set::{bind_set, release_set};
pub use vgpu::{VgpuSet, check_nvlink_type, create_vgpu_set, remove_vgpu_set};

/// Why a fabric operation did not happen.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FabricError {
    /// The node could not be discovered.
    #[error("cannot discover the node: {0}")]
    Discover(#[source] Box<gpu_sysfs::SysfsError>),
    /// The node has no NVSwitch.
    #[error("this node has no NVSwitch fabric")]
    NoFabric,
    /// The fabric exists but Fabric Manager cannot be reached.
    #[error(
        "this node has an NVSwitch fabric but Fabric Manager cannot be reached ({reason}): no multi-GPU set is handed out as if its GPUs could talk over NVLink"
    )]
    Unreachable {
        /// Why.
        reason: String,
    },
    /// Fabric Manager offers no partition with this ID.
    #[error("Fabric Manager offers no partition {id} (it offers {offered})")]
    UnknownPartition {
        /// The ID asked for.
        id: u32,
        /// The IDs on offer.
        offered: String,
    },
    /// The GPUs are not exactly the members of one partition.
    #[error(
        "{gpus} are not the members of one fabric partition; partitions that would do: {would_do}"
    )]
    NotAPartition {
        /// The GPUs asked for.
        gpus: String,
        /// The healthy partitions of that size, closest first.
        would_do: String,
    },
    /// The GPUs are exactly a partition, but Fabric Manager reports it degraded.
    #[error("{partition} is degraded ({reason}); partitions that would do: {would_do}")]
    Degraded {
        /// The partition.
        partition: String,
        /// Why (failed NVLinks, an NVSwitch down).
        reason: String,
        /// The healthy partitions of that size, closest first.
        would_do: String,
    },
    /// A vGPU asked to use NVLink is not one NVIDIA allows to (Fabric Manager's vGPU mode).
    #[error("{profile} on {gpu} cannot use NVLink: {why}")]
    NvlinkVgpu {
        /// The vGPU type asked for.
        profile: String,
        /// The GPU.
        gpu: String,
        /// NVIDIA's rule it breaks.
        why: String,
    },
    /// The operation needs Fabric Manager in another mode.
    #[error("{what} needs Fabric Manager in {needs} mode; it runs in {mode} mode")]
    Mode {
        /// The operation.
        what: &'static str,
        /// The mode it needs.
        needs: FabricMode,
        /// The mode FM runs in.
        mode: FabricMode,
    },
    /// A GPU named that the node does not have.
    #[error("{0}")]
    UnknownGpu(String),
    /// A member GPU is in use by something else.
    #[error("{partition}: {gpu} is in use by {holder}")]
    InUse {
        /// The partition.
        partition: String,
        /// The member.
        gpu: String,
        /// What holds it (a process, another active partition).
        holder: String,
    },
    /// Fabric Manager refused.
    #[error("cannot {action} partition {id}")]
    Fm {
        /// `activate` or `deactivate`.
        action: &'static str,
        /// The partition.
        id: u32,
        /// FM's answer.
        #[source]
        source: FmError,
    },
    /// A bind or release of a member failed (what was done before it was undone).
    #[error(transparent)]
    Node(#[from] NodeError),
}

impl ClassifiedError for FabricError {
    fn kind(&self) -> ErrorKind {
        match self {
            FabricError::Discover(e) => e.kind(),
            FabricError::NoFabric | FabricError::Unreachable { .. } => ErrorKind::NoDevice,
            FabricError::UnknownPartition { .. } | FabricError::UnknownGpu(_) => {
                ErrorKind::NotFound
            }
            FabricError::NotAPartition { .. } | FabricError::NvlinkVgpu { .. } => {
                ErrorKind::InvalidRequest
            }
            FabricError::Degraded { .. } => ErrorKind::Unhealthy,
            FabricError::Mode { .. } => ErrorKind::Unsupported,
            FabricError::InUse { .. } => ErrorKind::InUse,
            FabricError::Fm { source, .. } => source.kind(),
            FabricError::Node(e) => e.kind(),
        }
    }
}

/// A partition after an operation, and whether the operation changed it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PartitionChange {
    /// The partition as Fabric Manager lists it afterwards.
    pub partition: Partition,
    /// False when it already was as asked.
    pub changed: bool,
}

/// What [`bind_set`] or [`release_set`] did: the partition (none where the node needs none)
/// and each GPU's binding.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SetBinding {
    /// The partition activated or deactivated with the set.
    pub partition: Option<PartitionChange>,
    /// Each GPU, in the order given.
    pub gpus: Vec<GpuBinding>,
    /// What the caller should know (a single GPU handed out while Fabric Manager cannot be
    /// reached).
    pub warnings: Vec<String>,
}

/// A node's topology with its fabric composed, and the Fabric Manager that answered.
struct Read {
    topology: NodeTopology,
    fm: Option<Result<Arc<dyn FabricManager>, FmError>>,
}

/// A node's writer with where its Fabric Manager answers: what the fabric operations run on.
#[derive(Debug, Clone)]
pub struct FabricNode<'h> {
    /// The node's writer.
    pub node: Node<'h>,
    /// Where its Fabric Manager answers.
    pub source: FabricSource,
}

impl<'h> From<&'h OpenedNode> for FabricNode<'h> {
    fn from(opened: &'h OpenedNode) -> Self {
        FabricNode::of(opened)
    }
}

impl<'h> FabricNode<'h> {
    /// The fabric of a node opened by [`crate::open_node_host`].
    pub fn of(opened: &'h OpenedNode) -> Self {
        FabricNode {
            node: Node::of(opened),
            source: FabricSource::of(&opened.host),
        }
    }

    fn read(&self) -> Result<Read, FabricError> {
        let host = self.node.host();
        let mut topology = gpu_sysfs::discover::discover(host, self.node.discover())
            .map_err(|e| FabricError::Discover(Box::new(e)))?;
        let fm = gpu_health::fabric::fabric_at(&self.source, host, &mut topology);
        Ok(Read { topology, fm })
    }
}

impl Read {
    fn fabric(&self) -> Result<&Fabric, FabricError> {
        self.topology.fabric.as_ref().ok_or(FabricError::NoFabric)
    }

    /// The Fabric Manager, or why it cannot be reached.
    fn fm(&self) -> Result<&Arc<dyn FabricManager>, FabricError> {
        match &self.fm {
            None => Err(FabricError::NoFabric),
            Some(Ok(fm)) if self.fabric()?.fabric_manager.is_reachable() => Ok(fm),
            Some(Ok(_)) => Err(FabricError::Unreachable {
                reason: self
                    .fabric()?
                    .fabric_manager
                    .reason
                    .clone()
                    .unwrap_or_default(),
            }),
            Some(Err(e)) => Err(FabricError::Unreachable {
                reason: e.to_string(),
            }),
        }
    }

    fn partition(&self, id: u32) -> Result<&Partition, FabricError> {
        let fabric = self.fabric()?;
        self.fm()?;
        fabric
            .partition(id)
            .ok_or_else(|| FabricError::UnknownPartition {
                id,
                offered: ids(&fabric.partitions),
            })
    }

    fn name(&self, a: &PciAddress) -> String {
        self.topology
            .gpu_by_address(a)
            .map_or_else(|| a.to_string(), |g| g.name.clone())
    }

    /// Refuses when a member of `p` is held open by a process, or (for an activation) is a
    /// member of another active partition: the refusal names the holder.
    fn check_members(
        &self,
        host: &dyn gpu_sysfs::Host,
        p: &Partition,
        activating: bool,
    ) -> Result<(), FabricError> {
        let holders = gpu_sysfs::actuate::node_holders(host, &self.topology);
        let fabric = self.fabric()?;
        for a in &p.addresses {
            let busy = |holder: String| FabricError::InUse {
                partition: p.describe(),
                gpu: self.name(a),
                holder,
            };
            if let Some(h) = holders.gpu(a) {
                return Err(busy(h.to_string()));
            }
            if activating
                && let Some(other) = fabric
                    .partitions
                    .iter()
                    .find(|o| o.id != p.id && o.active && o.contains(a))
            {
                return Err(busy(format!("active {}", other.describe())));
            }
        }
        Ok(())
    }
}

fn ids(parts: &[Partition]) -> String {
    let all: Vec<String> = parts.iter().map(|p| p.id.to_string()).collect();
    if all.is_empty() {
        "none".to_owned()
    } else {
        all.join(", ")
    }
}

/// The node's fabric with what Fabric Manager answers (or why it cannot). Reads only.
///
/// # Errors
/// [`FabricError::Discover`], [`FabricError::NoFabric`].
pub fn list<'h>(on: impl Into<FabricNode<'h>>) -> Result<Fabric, FabricError> {
    let f = &on.into();
    let r = f.read()?;
    r.fabric().cloned()
}

fn relisted(f: &FabricNode<'_>, id: u32, changed: bool) -> Result<PartitionChange, FabricError> {
    let r = f.read()?;
    Ok(PartitionChange {
        partition: r.partition(id)?.clone(),
        changed,
    })
}

/// Activates partition `id` (refused while a member is in use by something else).
///
/// # Errors
/// [`FabricError::Unreachable`], [`FabricError::UnknownPartition`], [`FabricError::InUse`],
/// [`FabricError::Fm`], [`FabricError::Node`] (the lock).
pub fn activate<'h>(
    on: impl Into<FabricNode<'h>>,
    id: u32,
) -> Result<PartitionChange, FabricError> {
    switch(&on.into(), id, true)
}

/// Deactivates partition `id` (refused while a member is in use by something else).
///
/// # Errors
/// As [`activate`].
pub fn deactivate<'h>(
    on: impl Into<FabricNode<'h>>,
    id: u32,
) -> Result<PartitionChange, FabricError> {
    switch(&on.into(), id, false)
}

/// Partition `id` made active (`on`) or not, under the node's lock; nothing written when it
/// already is.
fn switch(f: &FabricNode<'_>, id: u32, on: bool) -> Result<PartitionChange, FabricError> {
    let r = f.read()?;
    let p = r.partition(id)?;
    if p.active == on {
        return relisted(f, id, false);
    }
    r.check_members(f.node.host(), p, on)?;
    let fm = r.fm()?;
    let host = f.node.host();
    {
        let _lock = f.node.lock()?;
        const CHECK: &str = "`gpuslice fabric list` (a partition may be active that no VM owns)";
        let intent = if on {
            crate::intent::Intent::new(
                "activate-partition",
                format!("activate {}", p.describe()),
                CHECK,
            )
            .creating(vec![crate::intent::Planned::FabricPartition { id }])
        } else {
            crate::intent::Intent::new(
                "deactivate-partition",
                format!("deactivate {}", p.describe()),
                CHECK,
            )
        };
        crate::intent::around(
            host,
            intent,
            |_| Vec::new(),
            || {
                set_active(fm.as_ref(), p.id, on)?;
                record::note(host, p.id, on);
                Ok::<_, FabricError>(())
            },
        )?;
    }
    relisted(f, id, true)
}

/// FM's activation (`on`) or deactivation of partition `id` (whole GPUs: shared NVSwitch mode;
/// in vGPU mode FM itself refuses a plain activation).
fn set_active(fm: &dyn FabricManager, id: u32, on: bool) -> Result<(), FabricError> {
    let (action, done) = if on {
        ("activate", fm.activate(id))
    } else {
        ("deactivate", fm.deactivate(id))
    };
    done.map_err(|source| FabricError::Fm { action, id, source })
}

/// A DRA claim's whole GPUs: the partition whose members they are exactly, activated before the
/// claim's devices are made (the order NVIDIA's DRA driver uses). `Ok(None)` where nothing is
/// to activate: no fabric, a mode without partitions, a partition already active, or a set that
/// is no partition or a Fabric Manager that cannot be reached (the claim's plan refuses those
/// before any write, `gpu_integrations::dra::partition::claim_partition`).
///
/// # Errors
/// [`FabricError::InUse`], [`FabricError::Fm`].
pub fn activate_for_claim(
    source: &FabricSource,
    host: &dyn gpu_sysfs::Host,
    topology: &NodeTopology,
    gpus: &[PciAddress],
) -> Result<Option<u32>, FabricError> {
    let Some(p) = claim_partition(topology, gpus)? else {
        return Ok(None);
    };
    if p.active {
        return Ok(None);
    }
    let fm = gpu_health::fabric::open_fabric_at(source, host, topology).map_err(|e| {
        FabricError::Unreachable {
            reason: e.to_string(),
        }
    })?;
    let holders = gpu_sysfs::actuate::node_holders(host, topology);
    if let Some((a, h)) = p
        .addresses
        .iter()
        .find_map(|a| holders.gpu(a).map(|h| (a, h)))
    {
        return Err(FabricError::InUse {
            partition: p.describe(),
            gpu: a.to_string(),
            holder: h.to_string(),
        });
    }
    set_active(fm.as_ref(), p.id, true)?;
    record::note(host, p.id, true);
    Ok(Some(p.id))
}

/// Deactivates the partition a DRA claim's whole GPUs were (after its devices are undone);
/// `Ok(None)` when none is active.
///
/// # Errors
/// [`FabricError::Fm`], [`FabricError::Unreachable`].
pub fn deactivate_for_claim(
    source: &FabricSource,
    host: &dyn gpu_sysfs::Host,
    topology: &NodeTopology,
    gpus: &[PciAddress],
) -> Result<Option<u32>, FabricError> {
    // A set that is no partition (or a partition degraded since) has nothing to deactivate
    // that gpuslice activated for it.
    let Some(p) = topology
        .fabric
        .as_ref()
        .filter(|f| f.requires_partitions() && f.fabric_manager.is_reachable() && !gpus.is_empty())
        .and_then(|f| f.exact(gpus))
        .filter(|p| p.active)
    else {
        return Ok(None);
    };
    let fm = gpu_health::fabric::open_fabric_at(source, host, topology).map_err(|e| {
        FabricError::Unreachable {
            reason: e.to_string(),
        }
    })?;
    set_active(fm.as_ref(), p.id, false)?;
    record::note(host, p.id, false);
    Ok(Some(p.id))
}

/// The partition a claim's (or a set's) GPUs are, by the one rule
/// ([`gpu_core::Fabric::partition_for_set`]); `None` where nothing constrains them.
fn claim_partition<'t>(
    topology: &'t NodeTopology,
    gpus: &[PciAddress],
) -> Result<Option<&'t Partition>, FabricError> {
    let Some(fabric) = topology.fabric.as_ref() else {
        return Ok(None);
    };
    fabric
        .partition_for_set(gpus)
        .map_err(|e| refusal(e, &|a| name_in(topology, a), gpus))
}

fn name_in(topology: &NodeTopology, a: &PciAddress) -> String {
    topology
        .gpu_by_address(a)
        .map_or_else(|| a.to_string(), |g| g.name.clone())
}

/// The fabric's refusal of a set, as a [`FabricError`].
fn refusal(
    e: SetRefusal<'_>,
    name: &dyn Fn(&PciAddress) -> String,
    gpus: &[PciAddress],
) -> FabricError {
    let names = || gpus.iter().map(name).collect::<Vec<_>>().join(", ");
    match e {
        SetRefusal::Unreachable { reason } => FabricError::Unreachable { reason },
        SetRefusal::Degraded { partition, .. } => FabricError::Degraded {
            partition: partition.describe(),
            reason: partition.degraded.clone().unwrap_or_default(),
            would_do: e.would_do(),
        },
        SetRefusal::NotAPartition { .. } => FabricError::NotAPartition {
            gpus: names(),
            would_do: e.would_do(),
        },
    }
}
