//! The agent's promises: what it created for whom, kept in its state directory so a restarted
//! agent (or one on a rebooted host) can re-create it.
//!
//! The file lives in a [`gpu_sysfs::StateDir`], the state directory every gpuslice state file
//! shares: confined to the root (a directory linked out of it is refused, the link named),
//! replaced atomically (a `kill -9` at any point leaves the old or the new file, never a torn
//! one, and never writes through a planted link) and read bounded ([`MAX_STATE_BYTES`], regular
//! files only).
//!
//! Every change is recorded before the host changes: a create as `pending` before the kernel is
//! asked and `created` after; a removal as `removing` before and dropped after. A `pending`
//! record found on start is an interrupted create, which reconcile finishes (or drops, when it
//! cannot be done); a `removing` one is a removal that reconcile finishes, never undoes.

use gpu_core::ErrorKind;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use gpu_sysfs::{Host, StateDir};

use gpu_core::{MdevUuid, ParentId, PciAddress, VgpuTypeId};
use serde::{Deserialize, Serialize};

use crate::error::ApiError;

/// The state file's name in the state directory.
pub const STATE_FILE: &str = "promises.json";
/// The state directory relative to the host root, when `--state-dir` is not given.
pub const DEFAULT_STATE_DIR: &str = "var/lib/gpuslice/agent";
/// The version of the state file's format.
pub const STATE_VERSION: u32 = 1;
/// The largest state file read: larger is refused before it is read whole.
pub const MAX_STATE_BYTES: usize = 16 << 20;
/// How long a change of the state waits for another holder of the state directory's lock.
pub const LOCK_WAIT: Duration = Duration::from_secs(10);

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
    /// Its removal was asked for and is recorded; the device is gone or about to be. A restart
    /// finishes the removal's record and never re-creates it.
    Removing,
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
    /// The directory on this machine, for messages.
    path: PathBuf,
    /// The directory, or why it cannot be used (said on each use).
    dir: Result<StateDir, Arc<std::io::Error>>,
}

fn host_error(message: String) -> ApiError {
    ApiError::new(ErrorKind::HostError, message)
}

impl StateStore {
    /// A store in the directory `dir` on this machine (created on the first write).
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        let path = dir.into();
        let dir = StateDir::at(&path).map_err(Arc::new);
        StateStore { path, dir }
    }

    /// The store in `rel` (`var/lib/gpuslice/agent`) inside `host`'s root, reached through the
    /// host like every other file of it.
    ///
    /// # Errors
    /// A host without a root directory.
    pub fn in_root(host: Arc<dyn Host>, rel: &str) -> Result<Self, ApiError> {
        let dir = StateDir::in_root(host, rel)
            .map_err(|e| host_error(format!("state directory {rel}: {e}")))?;
        Ok(StateStore {
            path: dir.path(),
            dir: Ok(dir),
        })
    }

    /// The state directory.
    pub fn dir(&self) -> &Path {
        &self.path
    }

    /// The state file.
    pub fn file(&self) -> PathBuf {
        self.path.join(STATE_FILE)
    }

    fn state_dir(&self) -> Result<&StateDir, ApiError> {
        self.dir
            .as_ref()
            .map_err(|e| host_error(format!("state directory {}: {e}", self.path.display())))
    }

    /// Checks, before anything starts, that the state can be kept: no component of the
    /// directory is a link (one leading out of the root is named), and the state file, when
    /// there, reads.
    ///
    /// # Errors
    /// As [`StateStore::load`], and a directory reached through a link.
    pub fn check(&self) -> Result<(), ApiError> {
        self.state_dir()?
            .check()
            .map_err(|e| host_error(format!("state directory {}: {e}", self.path.display())))?;
        self.load().map(|_| ())
    }

    /// Reads the promises; no file is no promises.
    ///
    /// # Errors
    /// An unreadable, oversized or malformed file (named, with the reason): the agent refuses to
    /// start rather than forget promises.
    pub fn load(&self) -> Result<StateFile, ApiError> {
        let path = self.file();
        let bytes = match self.state_dir()?.read(STATE_FILE, MAX_STATE_BYTES) {
            Ok(Some(b)) => b,
            Ok(None) => {
                return Ok(StateFile {
                    version: STATE_VERSION,
                    promises: vec![],
                });
            }
            Err(e) => {
                return Err(host_error(format!(
                    "cannot read state file {}: {e}",
                    path.display()
                )));
            }
        };
        let state: StateFile = serde_json::from_slice(&bytes)
            .map_err(|e| host_error(format!("state file {} is malformed: {e}", path.display())))?;
        if state.version != STATE_VERSION {
            return Err(host_error(format!(
                "state file {} has version {}; this agent reads version {STATE_VERSION}",
                path.display(),
                state.version
            )));
        }
        Ok(state)
    }

    /// Replaces the file atomically with `state`; returns once it is on disk.
    ///
    /// # Errors
    /// A directory reached through a link, or a file that cannot be written, synced or renamed
    /// (a full or read-only disk): the file is then as it was. The errno is kept.
    pub fn save(&self, state: &StateFile) -> Result<(), ApiError> {
        let mut text = serde_json::to_string_pretty(state).map_err(|e| {
            ApiError::new(ErrorKind::Other, format!("cannot encode the state: {e}"))
        })?;
        text.push('\n');
        self.state_dir()?
            .write(STATE_FILE, text.as_bytes())
            .map_err(|e| {
                let mut a = host_error(format!("cannot record the promises: {e}"));
                a.errno = gpu_sysfs::state_dir::errno_of(&e);
                a.errno_name = a.errno.map(gpu_sysfs::actuate::error::errno::name);
                a
            })
    }

    /// Holds the state directory's lock while a change is read, decided and written, so two
    /// agents given one directory never interleave.
    ///
    /// # Errors
    /// The lock not taken within [`LOCK_WAIT`] (`busy`), or its file not opened.
    pub fn lock(&self) -> Result<gpu_sysfs::state_dir::StateLock, ApiError> {
        self.state_dir()?.lock(LOCK_WAIT).map_err(|e| {
            let kind = if e.kind() == std::io::ErrorKind::TimedOut {
                ErrorKind::Busy
            } else {
                ErrorKind::HostError
            };
            ApiError::new(
                kind,
                format!("cannot lock state directory {}: {e}", self.path.display()),
            )
        })
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
        let names: Vec<_> = std::fs::read_dir(dir.path().join("agent"))?
            .filter_map(Result::ok)
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.ends_with(".tmp"))
            .collect();
        assert!(names.is_empty(), "{names:?}");
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
