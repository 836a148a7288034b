//! What gpuslice activated, kept on the node, and what it is for:
//!
//! - after a Fabric Manager restart, NVIDIA's FM needs to be told which partitions are active
//!   (`fmSetActivatedFabricPartitions`, FM user guide "Set Activated Partition List after a
//!   Fabric Manager Restart"): [`restore_activated`] tells it what gpuslice recorded, once, when
//!   the agent starts;
//! - a set bind or an activation killed half-way names the partition in the node's intent
//!   record ([`crate::intent::Planned::FabricPartition`]); [`recover`] undoes it through Fabric
//!   Manager, as [`crate::Node::recover`] undoes the binds.
//!
//! The record is `var/lib/gpuslice/node/fabric-active.json` under the root (`{"active": [4]}`),
//! written through the one atomic writer after each activation and deactivation gpuslice makes.

use std::collections::BTreeSet;

use gpu_sysfs::Host;
use serde::{Deserialize, Serialize};

use super::{FabricError, FabricNode};
use crate::NodeError;
use crate::recover::Recovery;

/// The record of the partitions gpuslice activated, under the root.
pub const ACTIVE_FILE: &str = "var/lib/gpuslice/node/fabric-active.json";
const MAX_BYTES: usize = 64 * 1024;

#[derive(Debug, Default, Serialize, Deserialize)]
struct Active {
    active: BTreeSet<u32>,
}

/// The partitions gpuslice recorded as active (none when there is no record).
///
/// # Errors
/// [`NodeError::Intent`] when the record cannot be read or does not decode.
pub fn recorded(host: &dyn Host) -> Result<BTreeSet<u32>, NodeError> {
    let bytes = match host.read_bounded(ACTIVE_FILE, MAX_BYTES) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(BTreeSet::new()),
        Err(source) => return Err(NodeError::Intent { source }),
    };
    let a: Active = serde_json::from_slice(&bytes).map_err(|e| NodeError::Intent {
        source: std::io::Error::new(std::io::ErrorKind::InvalidData, e),
    })?;
    Ok(a.active)
}

/// Notes that partition `id` is now active (`on`) or not. A record that cannot be written is
/// not the operation's failure: Fabric Manager changed, and the next change rewrites it.
pub(super) fn note(host: &dyn Host, id: u32, on: bool) {
    let mut a = Active {
        active: recorded(host).unwrap_or_default(),
    };
    if on {
        a.active.insert(id);
    } else {
        a.active.remove(&id);
    }
    if let Ok(json) = serde_json::to_vec_pretty(&a) {
        let _ = host
            .create_dir_all(crate::intent::INTENT_DIR)
            .and_then(|()| host.write_atomic(ACTIVE_FILE, &json));
    }
}

/// After a Fabric Manager restart: when the partitions FM lists as active are not those
/// gpuslice recorded, tells FM the recorded ones (those it still offers) with
/// `fmSetActivatedFabricPartitions`. `Ok(None)` when nothing was to tell (no fabric, a mode
/// without partitions, FM already agreeing); the IDs given otherwise.
///
/// # Errors
/// [`FabricError::Unreachable`], [`FabricError::Fm`] (action `set activated`),
/// [`FabricError::Node`] (the record, the lock).
pub fn restore_activated<'h>(
    on: impl Into<FabricNode<'h>>,
) -> Result<Option<Vec<u32>>, FabricError> {
    let f = &on.into();
    if f.source == gpu_health::fabric::FabricSource::None {
        return Ok(None);
    }
    let r = f.read()?;
    let Some(fabric) = r.topology.fabric.as_ref() else {
        return Ok(None);
    };
    if !fabric.requires_partitions() {
        return Ok(None);
    }
    let fm = r.fm()?;
    let host = f.node.host();
    let want: Vec<u32> = recorded(host)?
        .into_iter()
        .filter(|id| fabric.partition(*id).is_some())
        .collect();
    let listed: Vec<u32> = fabric
        .partitions
        .iter()
        .filter(|p| p.active)
        .map(|p| p.id)
        .collect();
    if want == listed {
        return Ok(None);
    }
    let _lock = f.node.lock()?;
    fm.set_activated(&want).map_err(|source| FabricError::Fm {
        action: "set activated",
        id: want.first().copied().unwrap_or_default(),
        source,
    })?;
    Ok(Some(want))
}

/// [`crate::Node::recover`] with Fabric Manager at hand: a partition the interrupted write
/// activated is deactivated too (after its GPUs were released), unless a member is held.
///
/// # Errors
/// As [`crate::Node::recover`].
pub fn recover<'h>(on: impl Into<FabricNode<'h>>) -> Result<Option<Recovery>, NodeError> {
    let f = on.into();
    let undo = |host: &dyn Host, id: u32| undo_activation(&f, host, id);
    f.node.recover_with(Some(&undo))
}

/// Deactivates partition `id` when it is active and no member is held: what was done, `None`
/// when it is not active, or why it stays.
fn undo_activation(f: &FabricNode<'_>, host: &dyn Host, id: u32) -> Result<Option<String>, String> {
    let shown = |e: FabricError| gpu_core::error_chain(&e);
    let mut topology = gpu_sysfs::discover::discover(host, f.node.discover())
        .map_err(|e| gpu_core::error_chain(&e))?;
    let fm = match gpu_health::fabric::fabric_at(&f.source, host, &mut topology) {
        Some(Ok(fm)) => fm,
        Some(Err(e)) => return Err(e.to_string()),
        None => return Err("this node has no NVSwitch fabric".to_owned()),
    };
    let Some(p) = topology.fabric.as_ref().and_then(|fab| fab.partition(id)) else {
        return Err(format!("Fabric Manager offers no partition {id}"));
    };
    if !p.active {
        return Ok(None);
    }
    let holders = gpu_sysfs::actuate::node_holders(host, &topology);
    if let Some((a, h)) = p
        .addresses
        .iter()
        .find_map(|a| holders.gpu(a).map(|h| (a, h)))
    {
        return Err(format!("{a} is held by {h}"));
    }
    super::set_active(fm.as_ref(), id, false).map_err(shown)?;
    note(host, id, false);
    Ok(Some(format!("deactivated partition {id}")))
}
