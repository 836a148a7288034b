//! The intent record of the node's writes: what a write is about to change, kept in the node's
//! state directory (`var/lib/gpuslice/node/intent.json` under the root, written through the one
//! atomic writer, [`gpu_sysfs::Host::write_atomic`]) from before its first change until it
//! finished.
//!
//! Every one-call operation of [`crate::Node`] that changes the host records its intent under
//! the host-wide lock before the first write (`started`), and marks it `done` when it finished:
//! succeeded, or failed with everything it made undone. A write that stopped half-way (the
//! process killed, the machine down) or whose undo failed (`incomplete`) leaves the record as
//! it was; the next writer, or anyone reading the node ([`unfinished`]), finds it and is told
//! what was being done and what to check. The agent records its own promises around the steps
//! of a [`crate::Locked`] writer; those steps record nothing here.

use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use gpu_sysfs::Host;

/// The node's state directory, under the root.
pub const INTENT_DIR: &str = "var/lib/gpuslice/node";
/// The intent record, under the root.
pub const INTENT_FILE: &str = "var/lib/gpuslice/node/intent.json";
/// The largest intent record read.
const MAX_INTENT_BYTES: usize = 256 * 1024;

/// Where a write stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum IntentState {
    /// Begun: the host may be changed part of the way.
    Started,
    /// Finished: done, or failed with everything undone.
    Done,
    /// Failed, and undoing what it made failed too: `left` says what is still there.
    Incomplete,
}

/// What a write of the node is about to do.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Intent {
    /// The operation: `create-vgpu`, `remove-vgpu`, `bind-gpu`, `release-gpu`,
    /// `enable-sriov`, `disable-sriov`, `apply-layout`, `realize`; the fabric's
    /// `activate-partition`, `deactivate-partition`, `bind-gpu-set`, `release-gpu-set`,
    /// `create-vgpu-set`, `remove-vgpu-set` ([`crate::fabric`]).
    pub op: String,
    /// What it changes, as people read it (`create A2-4Q 1b4e… on 0000:08:00.0`).
    pub what: String,
    /// What to look at when it did not finish.
    pub check: String,
    /// Where it stands.
    pub state: IntentState,
    /// The writing process.
    pub pid: u32,
    /// When it began, in seconds since the Unix epoch.
    pub started: u64,
    /// What a failed undo left on the host (`incomplete`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub left: Vec<String>,
    /// What the write is about to create, so that a write killed half-way can be undone
    /// ([`crate::recover`]); empty for a write that creates nothing it could name.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub creates: Vec<Planned>,
}

/// One device a write is about to create.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(
    tag = "kind",
    rename_all = "kebab-case",
    rename_all_fields = "camelCase"
)]
pub enum Planned {
    /// An mdev instance of this UUID.
    Mdev {
        /// Its UUID.
        uuid: gpu_core::MdevUuid,
    },
    /// A vGPU type set on this vendor-VFIO VF.
    VfType {
        /// The VF.
        vf: gpu_core::PciAddress,
    },
    /// This GPU bound to vfio-pci.
    GpuBind {
        /// The GPU.
        gpu: gpu_core::PciAddress,
    },
    /// This NVSwitch fabric partition activated ([`crate::fabric`]).
    FabricPartition {
        /// Fabric Manager's partition ID.
        id: u32,
    },
}

impl Planned {
    /// The creation a first write names: an mdev's `create` (its UUID), a VF's
    /// `current_vgpu_type` set to a type (its address).
    pub(crate) fn of_write(path: &str, data: &[u8]) -> Option<Planned> {
        let path = path.trim_start_matches('/');
        let text = String::from_utf8_lossy(data);
        let text = text.trim();
        if path.ends_with("/create") && path.contains("/mdev_supported_types/") {
            return text
                .parse::<gpu_core::MdevUuid>()
                .ok()
                .map(|uuid| Planned::Mdev { uuid });
        }
        let vf = path
            .strip_prefix("sys/bus/pci/devices/")?
            .strip_suffix("/nvidia/current_vgpu_type")?;
        let set = text.parse::<u32>().is_ok_and(|t| t != 0);
        set.then(|| vf.parse().ok())
            .flatten()
            .map(|vf| Planned::VfType { vf })
    }
}

impl std::fmt::Display for Planned {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Planned::Mdev { uuid } => write!(f, "mdev {uuid}"),
            Planned::VfType { vf } => write!(f, "the vGPU type of VF {vf}"),
            Planned::GpuBind { gpu } => write!(f, "{gpu} on vfio-pci"),
            Planned::FabricPartition { id } => write!(f, "fabric partition {id} active"),
        }
    }
}

impl Intent {
    /// A write about to begin.
    pub fn new(op: &str, what: impl Into<String>, check: impl Into<String>) -> Self {
        let started = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        Intent {
            op: op.to_owned(),
            what: what.into(),
            check: check.into(),
            state: IntentState::Started,
            pid: std::process::id(),
            started,
            left: Vec::new(),
            creates: Vec::new(),
        }
    }

    /// This intent, naming what the write is about to create.
    #[must_use]
    pub fn creating(mut self, creates: Vec<Planned>) -> Self {
        self.creates = creates;
        self
    }

    /// Whether the write did not finish (`started` or `incomplete`).
    pub fn unfinished(&self) -> bool {
        self.state != IntentState::Done
    }

    /// How the unfinished write reads in a warning.
    pub fn describe(&self) -> String {
        let how = match self.state {
            IntentState::Incomplete => "failed and was not wholly undone",
            _ => "did not finish",
        };
        let mut s = format!(
            "an earlier gpuslice write (process {}, {}: {}) {how}",
            self.pid, self.op, self.what
        );
        if !self.left.is_empty() {
            s.push_str(&format!("; still there: {}", self.left.join(", ")));
        }
        s.push_str(&format!("; check: {}", self.check));
        s
    }
}

/// The unfinished write the node's record holds, if any. Reads only.
///
/// # Errors
/// [`crate::NodeError::Intent`] when the record cannot be read or does not decode.
pub fn unfinished(host: &dyn Host) -> Result<Option<Intent>, crate::NodeError> {
    let bytes = match host.read_bounded(INTENT_FILE, MAX_INTENT_BYTES) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => return Err(crate::NodeError::Intent { source }),
    };
    let intent: Intent = serde_json::from_slice(&bytes).map_err(|e| crate::NodeError::Intent {
        source: std::io::Error::new(std::io::ErrorKind::InvalidData, e),
    })?;
    Ok(intent.unfinished().then_some(intent))
}

/// Writes `intent` as the node's record.
///
/// # Errors
/// [`crate::NodeError::Intent`]: the state directory or the file cannot be written.
pub(crate) fn record(host: &dyn Host, intent: &Intent) -> Result<(), crate::NodeError> {
    let json = serde_json::to_vec_pretty(intent).map_err(|e| crate::NodeError::Intent {
        source: std::io::Error::new(std::io::ErrorKind::InvalidData, e),
    })?;
    host.create_dir_all(INTENT_DIR)
        .and_then(|()| host.write_atomic(INTENT_FILE, &json))
        .map_err(|source| crate::NodeError::Intent { source })
}

/// Runs `op` with its intent recorded around it: `started` before (a record that cannot be
/// written refuses the write, nothing changed), `done` after `op` returned (succeeded, or
/// failed with nothing left; `left_after` says what a failure left, making it `incomplete`).
/// A `done` that cannot be recorded is not the operation's failure: the host is as `op` says,
/// and the next writer overwrites the record.
pub(crate) fn around<T, E: From<crate::NodeError>>(
    host: &dyn Host,
    intent: Intent,
    left_after: impl Fn(&E) -> Vec<String>,
    op: impl FnOnce() -> Result<T, E>,
) -> Result<T, E> {
    record(host, &intent)?;
    let out = op();
    finish(host, intent, out.as_ref().err().map(&left_after));
    out
}

/// Marks `intent` finished: `done`, or `incomplete` when `left` names what a failure left. A
/// record that cannot be written is not the operation's failure (the next writer overwrites it).
pub(crate) fn finish(host: &dyn Host, mut intent: Intent, left: Option<Vec<String>>) {
    intent.left = left.unwrap_or_default();
    intent.state = match intent.left.is_empty() {
        true => IntentState::Done,
        false => IntentState::Incomplete,
    };
    let _ = record(host, &intent);
}
