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

/// The claim store of a node.
#[derive(Debug)]
pub struct ClaimStore {
    /// The host the store is reached through; `None` when its base directory does not exist
    /// (or the root is a recording): there are no claims, and writing is refused.
    host: Option<RealHost>,
    /// The directory the host is rooted at.
    base: PathBuf,
    /// The store, relative to `base`.
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
                    fail!(Invalid, d.display(); "state directory {} has no name", d.display());
                };
                let parent = d
                    .parent()
                    .filter(|p| !p.as_os_str().is_empty())
                    .unwrap_or(Path::new("."));
                (parent.to_path_buf(), name.to_owned())
            }
        };
        let host = RealHost::new(&base).ok();
        Ok(ClaimStore { host, base, dir })
    }

    /// The store directory.
    pub fn dir(&self) -> PathBuf {
        self.base.join(&self.dir)
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
            fail!(Invalid, uid; "claim UID {uid:?} is not a Kubernetes UID");
        }
        Ok(format!("{}/claims/{uid}.json", self.dir))
    }

    /// The file of claim `uid`, as a path on this machine.
    ///
    /// # Errors
    /// When `uid` is not a Kubernetes UID (so it cannot name a path outside the store).
    pub fn claim_path(&self, uid: &str) -> Result<PathBuf> {
        Ok(self.base.join(self.claim_rel(uid)?))
    }

    fn read_rel(&self, host: &RealHost, rel: &str) -> Result<Option<PreparedClaim>> {
        let path = self.base.join(rel);
        let bytes = match host.read_bounded(rel, MAX_CLAIM_BYTES) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => {
                return Err(IntegrationError::state(
                    "cannot read prepared claim",
                    &path,
                    e,
                ));
            }
        };
        serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|e| IntegrationError::state("prepared claim", &path, e))
    }

    /// The prepared claim `uid`, or `None` when it is not recorded.
    ///
    /// # Errors
    /// An invalid UID; a claim file that cannot be read or parsed.
    pub fn read(&self, uid: &str) -> Result<Option<PreparedClaim>> {
        let rel = self.claim_rel(uid)?;
        match &self.host {
            Some(host) => self.read_rel(host, &rel),
            None => Ok(None),
        }
    }

    /// Every prepared claim, by node. A missing store is no claims.
    ///
    /// # Errors
    /// When the store cannot be listed or a claim file cannot be read or parsed.
    pub fn read_prepared(&self) -> Result<BTreeMap<String, Prepared>> {
        let mut out: BTreeMap<String, Prepared> = BTreeMap::new();
        let Some(host) = &self.host else {
            return Ok(out);
        };
        let claims = format!("{}/claims", self.dir);
        let names = match host.list(&claims) {
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(out),
            Err(e) => {
                return Err(IntegrationError::state(
                    "cannot list",
                    self.base.join(&claims),
                    e,
                ));
            }
        };
        for name in names.iter().filter(|n| n.ends_with(".json")) {
            let Some(claim) = self.read_rel(host, &format!("{claims}/{name}"))? else {
                continue;
            };
            let p = out.entry(claim.node.clone()).or_default();
            for a in claim.held() {
                a.record(p);
            }
        }
        Ok(out)
    }

    fn host(&self) -> Result<&RealHost> {
        self.host.as_ref().ok_or_else(|| IntegrationError::State {
            what: "cannot create the DRA state directory".to_owned(),
            path: self.dir(),
            source: Some(format!("{} is not a directory", self.base.display()).into()),
        })
    }

    /// Creates the store's directories (a component that is a link or a file is refused): a
    /// prepare calls it before it changes the host, so what it changes can be recorded.
    ///
    /// # Errors
    /// A base directory that does not exist; a component that is a link, a file, or cannot be
    /// created.
    pub fn create(&self) -> Result<()> {
        let claims = format!("{}/claims", self.dir);
        self.host()?;
        gpu_sysfs::host::make_state_dir(&self.base, &claims)
            .map(|_| ())
            .map_err(|e| IntegrationError::state("cannot create", self.base.join(&claims), e))
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
        self.host()?
            .write_atomic(&rel, text.as_bytes())
            .map_err(|e| IntegrationError::state("cannot write", self.base.join(&rel), e))
    }

    /// Forgets claim `uid` (after unprepare undid it). A claim not recorded is no error.
    ///
    /// # Errors
    /// An invalid UID; a store directory that is a link; a file that cannot be removed.
    pub fn remove(&self, uid: &str) -> Result<()> {
        let rel = self.claim_rel(uid)?;
        let host = self.host()?;
        let claims = format!("{}/claims", self.dir);
        if !host.exists(&claims) {
            return Ok(());
        }
        // The directory is checked component by component, so the file removed is in it.
        let dir = gpu_sysfs::host::make_state_dir(&self.base, &claims)
            .map_err(|e| IntegrationError::state("cannot open", self.base.join(&claims), e))?;
        let file = dir.join(format!("{uid}.json"));
        match std::fs::remove_file(&file) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(IntegrationError::state(
                "cannot remove",
                self.base.join(rel),
                e,
            )),
        }
    }
}
