//! An interrupted write found and undone where that is safe.
//!
//! A write killed half-way (the process killed, the machine down) leaves its intent record
//! `started` ([`crate::intent`]). A create records what it was about to make
//! ([`Planned`]): the mdev UUID, the VF it types, the GPU it binds. [`Node::recover`] takes the
//! host-wide lock (so the writer is gone: a live one would hold it), reads the record, and
//! removes what the interrupted call made and nobody holds: an mdev it named that is there and
//! not open, a VF it typed that is not open, a GPU it bound to vfio-pci that is not open. A
//! device a process holds (a VM) is never removed: it is reported as kept. A record that names
//! nothing to undo (a removal, a layout, a record from before [`Planned`]) is reported and left
//! as it was, for a person to check. A fabric partition the write activated is deactivated
//! through Fabric Manager when the caller gives it (`gpu_node::fabric::recover`, the agent at
//! start), the last made first: a set's GPUs are released before its partition.

use serde::Serialize;

use gpu_core::PciAddress;
use gpu_sysfs::Host;

use crate::intent::{self, Intent, IntentState, Planned};
use crate::node::{release_at, remove_at};
use crate::{Node, NodeError, VgpuId};

/// What [`Node::recover`] found and did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Recovery {
    /// The record as it was found.
    pub intent: Intent,
    /// The record's warning, as people read it.
    pub message: String,
    /// What the interrupted call made and this removed.
    pub rolled_back: Vec<String>,
    /// What the interrupted call named and is still there, each with why (held by a process,
    /// or its removal failed).
    pub kept: Vec<String>,
    /// Whether the record is now finished (everything it named is gone).
    pub resolved: bool,
}

impl Node<'_> {
    /// Finds the write the node's intent record says did not finish and undoes what it made
    /// where that is safe (see the module's documentation); `None` when every write finished.
    ///
    /// # Errors
    /// [`NodeError::Lock`]; [`NodeError::Intent`] when the record cannot be read.
    pub fn recover(&self) -> Result<Option<Recovery>, NodeError> {
        self.recover_with(None)
    }

    /// [`Node::recover`], with `partition` undoing a fabric partition the write activated
    /// (`gpu_node::fabric::recover` gives Fabric Manager's); without it such a partition is
    /// reported as kept.
    ///
    /// # Errors
    /// As [`Node::recover`].
    pub fn recover_with(
        &self,
        partition: Option<&PartitionUndo<'_>>,
    ) -> Result<Option<Recovery>, NodeError> {
        if intent::unfinished(self.host)?.is_none() {
            return Ok(None);
        }
        let _lock = self.acquire()?;
        // Read again under the lock: the writer may have finished meanwhile.
        let Some(found) = intent::unfinished(self.host)? else {
            return Ok(None);
        };
        Ok(Some(roll_back(self.host, found, partition)))
    }
}

/// Undoes each planned creation of `found` that is there and not held, then records the
/// outcome: `done` when nothing is left, `incomplete` naming what is.
/// Undoes the activation of a fabric partition: what was done, `None` when it is not active,
/// or why it stays.
pub type PartitionUndo<'a> = dyn Fn(&dyn Host, u32) -> Result<Option<String>, String> + 'a;

fn roll_back(host: &dyn Host, found: Intent, partition: Option<&PartitionUndo<'_>>) -> Recovery {
    let message = found.describe();
    let mut rolled_back = Vec::new();
    let mut kept = Vec::new();
    let undoable = found.state == IntentState::Started && !found.creates.is_empty();
    if undoable {
        // The last made first: a set's GPUs are released before its partition is deactivated.
        for p in found.creates.iter().rev() {
            match undo(host, p, partition) {
                Ok(Some(done)) => rolled_back.push(done),
                Ok(None) => {}
                Err(why) => kept.push(format!("{p}: {why}")),
            }
        }
        let mut record = found.clone();
        record.state = IntentState::Started;
        intent::finish(host, record, Some(kept.clone()));
    }
    Recovery {
        intent: found,
        message,
        rolled_back,
        resolved: undoable && kept.is_empty(),
        kept,
    }
}

/// Undoes one planned creation: what was removed, `None` when it is not there, or why it stays.
fn undo(
    host: &dyn Host,
    p: &Planned,
    partition: Option<&PartitionUndo<'_>>,
) -> Result<Option<String>, String> {
    let shown = |e: NodeError| gpu_core::error_chain(&e);
    match p {
        Planned::Mdev { uuid } => {
            if !host.exists(&format!("sys/bus/mdev/devices/{uuid}")) {
                return Ok(None);
            }
            remove_at(host, &VgpuId::Mdev(*uuid), false).map_err(shown)?;
            Ok(Some(format!("removed mdev {uuid}")))
        }
        Planned::VfType { vf } => {
            if vf_type(host, vf) == 0 {
                return Ok(None);
            }
            remove_at(host, &VgpuId::Vf(*vf), false).map_err(shown)?;
            Ok(Some(format!("cleared the vGPU type of VF {vf}")))
        }
        Planned::GpuBind { gpu } => {
            let driver = host
                .read_link(&format!("sys/bus/pci/devices/{gpu}/driver"))
                .ok();
            let on_vfio = driver.is_some_and(|d| d.file_name().is_some_and(|n| n == "vfio-pci"));
            if !on_vfio {
                return Ok(None);
            }
            release_at(host, gpu, false).map_err(shown)?;
            Ok(Some(format!("released {gpu} from vfio-pci")))
        }
        Planned::FabricPartition { id } => match partition {
            Some(undo) => undo(host, *id),
            None => Err("Fabric Manager was not asked".to_owned()),
        },
    }
}

/// A VF's current vGPU type (0: none, or unreadable).
fn vf_type(host: &dyn Host, vf: &PciAddress) -> u32 {
    let path = format!("sys/bus/pci/devices/{vf}/nvidia/current_vgpu_type");
    host.read(&path)
        .ok()
        .and_then(|b| String::from_utf8_lossy(&b).trim().parse().ok())
        .unwrap_or(0)
}

/// The node's readiness checks ([`gpu_integrations::doctor::diagnose`]) and, when the node's
/// intent record says a write did not finish, `interrupted-write` (`warn`, naming the write
/// and what to check). Reads only.
///
/// # Errors
/// As [`gpu_integrations::doctor::diagnose`].
pub fn diagnose(
    host: &dyn Host,
    node: &str,
    opts: &gpu_integrations::doctor::GuestOptions,
) -> Result<gpu_sysfs::doctor::Diagnosis, gpu_sysfs::SysfsError> {
    use gpu_sysfs::doctor::{Check, Verdict};
    let mut d = gpu_integrations::doctor::diagnose(host, node, opts)?;
    let (message, fix) = match intent::unfinished(host) {
        Ok(None) => return Ok(d),
        Ok(Some(i)) => {
            let undo = match i.creates.is_empty() {
                true => String::new(),
                false => " (`gpuslice agent` undoes at start what it made where no VM holds it)"
                    .to_owned(),
            };
            (i.describe(), format!("check {}{undo}", i.check))
        }
        Err(e) => (
            gpu_core::error_chain(&e),
            format!("check {}", intent::INTENT_FILE),
        ),
    };
    d.checks.push(Check {
        check: "interrupted-write".to_owned(),
        subject: None,
        verdict: Verdict::Warn,
        message,
        fix: Some(fix),
    });
    d.verdict = d.verdict.max(Verdict::Warn);
    Ok(d)
}
