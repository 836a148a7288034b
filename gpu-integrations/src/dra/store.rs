//! The node's DRA claim store: one JSON file per prepared claim, `<state>/claims/<uid>.json`,
//! read back by `unprepare` and by the export (so what prepare created is not subtracted twice).
//!
//! Every read and write goes through a [`Host`] rooted where the store lives: the default store
//! is [`DEFAULT_STATE_DIR`] inside the node's root, an explicit directory is reached through a
//! host rooted at its parent. So the store is created with [`gpu_sysfs::host::make_state_dir`]
//! (a component that is a link or a file is refused, nothing is written through it) and files
//! are replaced with [`Host::write_atomic`], as every other state file of gpuslice.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use gpu_sysfs::{Host, RealHost};

use super::build::Prepared;
use super::prepare::PreparedClaim;
use crate::error::{IntegrationError, Result, fail};

/// Where prepared claims are recorded, inside the node's root, unless a directory is given.
pub const DEFAULT_STATE_DIR: &str = "var/lib/gpuslice/dra";

/// The largest claim file read back.
const MAX_CLAIM_BYTES: usize = 4 << 20;

fn state_error(what: &str, path: &Path, e: impl Into<crate::error::Cause>) -> IntegrationError {
    IntegrationError::state(what, path, e)
}

/// The one seam between the claim store and the file system: every read, list, directory
/// creation, write and removal of the store goes through these few primitives, all confined to
/// `base` (a directory component that is a link or a file is refused). Porting the store onto
/// another state-directory type means replacing this struct only.
#[derive(Debug)]
struct StateFiles {
    /// The host the store is reached through; `None` when `base` does not exist (or the root is
    /// a recording): there are no claims, and writing is refused.
    host: Option<RealHost>,
    /// The directory the host is rooted at.
    base: PathBuf,
}

impl StateFiles {
    fn new(base: PathBuf) -> Self {
        StateFiles {
            host: RealHost::new(&base).ok(),
            base,
        }
    }

    /// The bytes of `rel`, `None` when it (or the whole base) does not exist.
    fn read(&self, rel: &str, max: usize) -> std::io::Result<Option<Vec<u8>>> {
        let Some(host) = &self.host else {
            return Ok(None);
        };
        match host.read_bounded(rel, max) {
            Ok(b) => Ok(Some(b)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// The names in directory `rel`; none when it does not exist.
    fn list(&self, rel: &str) -> std::io::Result<Vec<String>> {
        let Some(host) = &self.host else {
            return Ok(vec![]);
        };
        match host.list(rel) {
            Ok(n) => Ok(n),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(vec![]),
            Err(e) => Err(e),
        }
    }

    fn writable(&self) -> std::io::Result<&RealHost> {
        self.host.as_ref().ok_or_else(|| {
            std::io::Error::new(
                std::io::ErrorKind::NotFound,
                format!("{} is not a directory", self.base.display()),
            )
        })
    }

    /// Creates directory `rel`, component by component; returns it as a path on this machine.
    fn create_dir(&self, rel: &str) -> std::io::Result<PathBuf> {
        self.writable()?;
        gpu_sysfs::host::make_state_dir(&self.base, rel)
    }

    /// Replaces `rel` atomically.
    fn write(&self, rel: &str, data: &[u8]) -> std::io::Result<()> {
        self.writable()?.write_atomic(rel, data)
    }

    /// Removes `name` from directory `dir`; a file or directory that does not exist is no error.
    fn remove(&self, dir: &str, name: &str) -> std::io::Result<()> {
        if !self.writable()?.exists(dir) {
            return Ok(());
        }
        // The directory is checked component by component, so the file removed is in it.
        let file = self.create_dir(dir)?.join(name);
        match std::fs::remove_file(&file) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            other => other,
        }
    }
}

/// The claim store of a node.
#[derive(Debug)]
pub struct ClaimStore {
    files: StateFiles,
    /// The store, relative to the files' base.
    dir: String,
}

impl ClaimStore {
    /// The store of the node at `root`: `state_dir` as given, else [`DEFAULT_STATE_DIR`] inside
    /// `root`. Nothing is created until a claim is written.
    ///
    /// # Errors
    /// A `state_dir` that names no directory (`/`, `..`).
    pub fn open(root: &Path, state_dir: Option<&Path>) -> Result<Self> {
        let (base, dir) = match state_dir {
            None => (root.to_path_buf(), DEFAULT_STATE_DIR.to_owned()),
            Some(d) => {
                let name = d
                    .file_name()
                    .and_then(|n| n.to_str())
                    .filter(|n| !n.is_empty() && *n != "..");
                let Some(name) = name else {
                    fail!(Invalid, "state directory"; "state directory {} has no name", d.display());
                };
                let parent = d
                    .parent()
                    .filter(|p| !p.as_os_str().is_empty())
                    .unwrap_or(Path::new("."));
                (parent.to_path_buf(), name.to_owned())
            }
        };
        Ok(ClaimStore {
            files: StateFiles::new(base),
            dir,
        })
    }

    /// The store directory.
    pub fn dir(&self) -> PathBuf {
        self.files.base.join(&self.dir)
    }

    /// The file of claim `uid`, relative to the host.
    fn claim_rel(&self, uid: &str) -> Result<String> {
        if uid.is_empty()
            || uid.len() > 128
            || !uid
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
            || uid.starts_with('.')
        {
            fail!(Invalid, "claim UID"; "claim UID {uid:?} is not a Kubernetes UID");
        }
        Ok(format!("{}/claims/{uid}.json", self.dir))
    }

    /// The file of claim `uid`, as a path on this machine.
    ///
    /// # Errors
    /// When `uid` is not a Kubernetes UID (so it cannot name a path outside the store).
    pub fn claim_path(&self, uid: &str) -> Result<PathBuf> {
        Ok(self.files.base.join(self.claim_rel(uid)?))
    }

    fn read_rel(&self, rel: &str) -> Result<Option<PreparedClaim>> {
        let path = self.files.base.join(rel);
        let Some(bytes) = self
            .files
            .read(rel, MAX_CLAIM_BYTES)
            .map_err(|e| state_error("cannot read prepared claim", &path, e))?
        else {
            return Ok(None);
        };
        serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|e| state_error("prepared claim", &path, e))
    }

    /// The prepared claim `uid`, or `None` when it is not recorded.
    ///
    /// # Errors
    /// An invalid UID; a claim file that cannot be read or parsed.
    pub fn read(&self, uid: &str) -> Result<Option<PreparedClaim>> {
        self.read_rel(&self.claim_rel(uid)?)
    }

    /// Every prepared claim, by node. A missing store is no claims.
    ///
    /// # Errors
    /// When the store cannot be listed or a claim file cannot be read or parsed.
    pub fn read_prepared(&self) -> Result<BTreeMap<String, Prepared>> {
        let mut out: BTreeMap<String, Prepared> = BTreeMap::new();
        let claims = format!("{}/claims", self.dir);
        let names = self
            .files
            .list(&claims)
            .map_err(|e| state_error("cannot list", &self.files.base.join(&claims), e))?;
        for name in names.iter().filter(|n| n.ends_with(".json")) {
            let Some(claim) = self.read_rel(&format!("{claims}/{name}"))? else {
                continue;
            };
            let p = out.entry(claim.node.clone()).or_default();
            for a in claim.held() {
                a.record(p);
            }
        }
        Ok(out)
    }

    fn unwritable(&self, e: std::io::Error, what: &str, rel: &str) -> IntegrationError {
        if self.files.host.is_none() {
            return IntegrationError::State {
                what: "cannot create the DRA state directory".to_owned(),
                path: self.dir(),
                source: Some(format!("{} is not a directory", self.files.base.display()).into()),
            };
        }
        state_error(what, &self.files.base.join(rel), e)
    }

    /// Creates the store's directories (a component that is a link or a file is refused): a
    /// prepare calls it before it changes the host, so what it changes can be recorded.
    ///
    /// # Errors
    /// A base directory that does not exist; a component that is a link, a file, or cannot be
    /// created.
    pub fn create(&self) -> Result<()> {
        let claims = format!("{}/claims", self.dir);
        self.files
            .create_dir(&claims)
            .map(|_| ())
            .map_err(|e| self.unwritable(e, "cannot create", &claims))
    }

    /// Records a prepared claim, creating the store, with gpuslice's one atomic writer.
    ///
    /// # Errors
    /// An invalid UID; a store directory that is a link or cannot be created; a file that
    /// cannot be written.
    pub fn write(&self, claim: &PreparedClaim) -> Result<()> {
        let rel = self.claim_rel(&claim.claim_uid)?;
        let text = serde_json::to_string_pretty(claim)
            .map_err(|e| IntegrationError::render("the claim", e))?;
        self.files
            .write(&rel, text.as_bytes())
            .map_err(|e| self.unwritable(e, "cannot write", &rel))
    }

    /// Forgets claim `uid` (after unprepare undid it). A claim not recorded is no error.
    ///
    /// # Errors
    /// An invalid UID; a store directory that is a link; a file that cannot be removed.
    pub fn remove(&self, uid: &str) -> Result<()> {
        let rel = self.claim_rel(uid)?;
        let claims = format!("{}/claims", self.dir);
        self.files
            .remove(&claims, &format!("{uid}.json"))
            .map_err(|e| self.unwritable(e, "cannot remove", &rel))
    }
}
