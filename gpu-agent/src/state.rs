//! The agent's promises: what it created for whom, kept in its state directory so a restarted
//! agent (or one on a rebooted host) can re-create it.
//!
//! The file is replaced atomically (written to a temporary file in the same directory, synced,
//! renamed over the old one, the directory synced), so a `kill -9` at any point leaves either the
//! old or the new file, never a torn one. A create is recorded as `pending` before the kernel is
//! asked and marked `created` after; a pending record found on start is an interrupted create,
//! which reconcile finishes (or drops, when it cannot be done).

use gpu_core::ErrorKind;
use std::io::Write as _;
use std::path::{Path, PathBuf};

use gpu_core::{MdevUuid, ParentId, PciAddress, VgpuTypeId};
use serde::{Deserialize, Serialize};

use crate::error::ApiError;

/// The state file's name in the state directory.
pub const STATE_FILE: &str = "promises.json";
/// The state directory relative to the host root, when `--state-dir` is not given.
pub const DEFAULT_STATE_DIR: &str = "var/lib/gpuslice/agent";
/// The version of the state file's format.
pub const STATE_VERSION: u32 = 1;

/// Who a device was made for: a Machine's request, or a caller-given UUID.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Owner {
    /// The Machine.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub machine: Option<String>,
    /// The device request's name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request: Option<String>,
    /// The device's index within the request.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub index: Option<u32>,
}

/// Where a promise stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Phase {
    /// Recorded; the create was not confirmed (in flight, or interrupted by a crash).
    Pending,
    /// Created and confirmed.
    Created,
}

/// The device a promise stands for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "framework", rename_all = "kebab-case", deny_unknown_fields)]
pub enum Device {
    /// An mdev instance.
    #[serde(rename_all = "camelCase")]
    Mdev {
        /// Its UUID.
        uuid: MdevUuid,
        /// Its parent.
        parent: ParentId,
        /// Its type.
        type_id: VgpuTypeId,
    },
    /// A vGPU type set on an NVIDIA vendor-VFIO VF.
    #[serde(rename_all = "camelCase")]
    VendorVfio {
        /// The VF.
        vf: PciAddress,
        /// The type number written to `current_vgpu_type`.
        type_num: u32,
    },
}

impl Device {
    /// The identity the API names it by: the UUID or the VF address.
    pub fn id(&self) -> String {
        match self {
            Device::Mdev { uuid, .. } => uuid.to_string(),
            Device::VendorVfio { vf, .. } => vf.to_string(),
        }
    }
}

/// One recorded promise.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Promise {
    /// The device.
    pub device: Device,
    /// Who it is for.
    #[serde(flatten)]
    pub owner: Owner,
    /// The profile as the caller gave it.
    pub profile: String,
    /// Where the promise stands.
    pub phase: Phase,
}

/// The state file's content.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct StateFile {
    /// Format version ([`STATE_VERSION`]).
    pub version: u32,
    /// The promises, in the order they were made.
    pub promises: Vec<Promise>,
}

/// The state directory and its file.
#[derive(Debug, Clone)]
pub struct StateStore {
    dir: PathBuf,
}

impl StateStore {
    /// A store in `dir` (created on the first write).
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        StateStore { dir: dir.into() }
    }

    /// The state directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The state file.
    pub fn file(&self) -> PathBuf {
        self.dir.join(STATE_FILE)
    }

    /// Reads the promises; no file is no promises.
    ///
    /// # Errors
    /// An unreadable or malformed file (named, with the decoder's message): the agent refuses to
    /// start rather than forget promises.
    pub fn load(&self) -> Result<StateFile, ApiError> {
        let path = self.file();
        let text = match std::fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Ok(StateFile {
                    version: STATE_VERSION,
                    promises: vec![],
                });
            }
            Err(e) => {
                return Err(ApiError::new(
                    ErrorKind::HostError,
                    format!("cannot read state file {}: {e}", path.display()),
                ));
            }
        };
        let state: StateFile = serde_json::from_str(&text).map_err(|e| {
            ApiError::new(
                ErrorKind::HostError,
                format!("state file {} is malformed: {e}", path.display()),
            )
        })?;
        if state.version != STATE_VERSION {
            return Err(ApiError::new(
                ErrorKind::HostError,
                format!(
                    "state file {} has version {}; this agent reads version {STATE_VERSION}",
                    path.display(),
                    state.version
                ),
            ));
        }
        Ok(state)
    }

    /// Replaces the file atomically with `state`; returns once it is on disk.
    ///
    /// # Errors
    /// A directory or file that cannot be created, written, synced or renamed.
    pub fn save(&self, state: &StateFile) -> Result<(), ApiError> {
        let io = |what: &str, e: std::io::Error| {
            ApiError::new(
                ErrorKind::HostError,
                format!(
                    "cannot {what} in state directory {}: {e}",
                    self.dir.display()
                ),
            )
        };
        std::fs::create_dir_all(&self.dir).map_err(|e| io("create it", e))?;
        let text = serde_json::to_string_pretty(state).map_err(|e| {
            ApiError::new(ErrorKind::Other, format!("cannot encode the state: {e}"))
        })?;
        let tmp = self.dir.join(format!(".{STATE_FILE}.tmp"));
        {
            let mut f = std::fs::File::create(&tmp).map_err(|e| io("create a file", e))?;
            f.write_all(text.as_bytes())
                .map_err(|e| io("write the state", e))?;
            f.write_all(b"\n").map_err(|e| io("write the state", e))?;
            f.sync_all().map_err(|e| io("sync the state", e))?;
        }
        std::fs::rename(&tmp, self.file()).map_err(|e| io("rename the state file", e))?;
        if let Ok(d) = std::fs::File::open(&self.dir) {
            // Makes the rename itself durable; a filesystem that cannot sync a directory still
            // has the rename, so a failure here is not an error.
            let _ = d.sync_all();
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn promise(uuid: &str) -> Result<Promise, gpu_core::CoreError> {
        Ok(Promise {
            device: Device::Mdev {
                uuid: uuid.parse()?,
                parent: "mbochs".parse()?,
                type_id: "mbochs-small".parse()?,
            },
            owner: Owner {
                machine: Some("vm1".to_owned()),
                request: Some("gpu".to_owned()),
                index: Some(0),
            },
            profile: "mbochs-small".to_owned(),
            phase: Phase::Created,
        })
    }

    #[test]
    fn a_saved_state_loads_back_the_same() -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let store = StateStore::new(dir.path().join("agent"));
        assert!(store.load()?.promises.is_empty(), "no file is no promises");
        let state = StateFile {
            version: STATE_VERSION,
            promises: vec![promise("0b4d6d8e-6d38-4b0c-9b0a-6f0c1f7c2a11")?],
        };
        store.save(&state)?;
        assert_eq!(store.load()?, state);
        assert!(!dir.path().join("agent").join(".promises.json.tmp").exists());
        Ok(())
    }

    #[test]
    fn a_malformed_state_file_is_refused_by_name() -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let store = StateStore::new(dir.path());
        std::fs::write(store.file(), "{\"version\": 1, \"promises\": [{\"x\": 1}]}")?;
        let e = store.load().err().ok_or("a malformed file loaded")?;
        assert!(e.message.contains("promises.json"), "{}", e.message);
        Ok(())
    }
}
