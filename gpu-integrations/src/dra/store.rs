//! The node's DRA claim store: one JSON file per prepared claim, `<state>/claims/<uid>.json`,
//! read back by `unprepare` and by the export (so what prepare created is not subtracted twice).
//!
//! Every read and write goes through a [`gpu_sysfs::StateDir`], gpuslice's one state directory
//! (the agent keeps its promises in one too): the default store is [`DEFAULT_STATE_DIR`] inside
//! the node's root, an explicit directory is reached from its parent. A component that is a link
//! or a file is refused (nothing is read or written through it), files are read bounded and
//! replaced with [`gpu_sysfs::Host::write_atomic`].

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use std::sync::Arc;

use gpu_sysfs::{Host, RealHost, StateDir};

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

/// The claim store's files: one [`StateDir`] (gpuslice's one state directory: confined to its
/// base, no component a link, files read bounded and replaced atomically), the store's
/// `claims/` directory. `None` when the base does not exist (or the root is a recording): there
/// are no claims, and writing is refused.
#[derive(Debug)]
struct StateFiles {
    claims: Option<StateDir>,
    /// The directory the store is reached from (the root, or the named directory's parent).
    base: PathBuf,
}

impl StateFiles {
    fn new(base: PathBuf, claims_rel: &str) -> Self {
        let claims = RealHost::new(&base)
            .ok()
            .and_then(|h| StateDir::in_root(Arc::new(h), claims_rel).ok());
        StateFiles { claims, base }
    }

    fn on_host(host: Arc<dyn Host>, claims_rel: &str) -> Self {
        let base = host.root_dir().map(Path::to_path_buf).unwrap_or_default();
        let claims = StateDir::in_root(host, claims_rel).ok();
        StateFiles { claims, base }
    }

    /// The bytes of claim file `name`, `None` when it (or the whole base) does not exist.
    fn read(&self, name: &str, max: usize) -> std::io::Result<Option<Vec<u8>>> {
        match &self.claims {
            Some(d) => d.read(name, max),
            None => Ok(None),
        }
    }

    /// The claim file names; none when the store does not exist.
    fn list(&self) -> std::io::Result<Vec<String>> {
        match &self.claims {
            Some(d) => d.list(""),
            None => Ok(vec![]),
        }
    }

    fn writable(&self) -> std::io::Result<&StateDir> {
        self.claims.as_ref().ok_or_else(|| {
            std::io::Error::new(
                std::io::ErrorKind::NotFound,
                format!("{} is not a directory", self.base.display()),
            )
        })
    }

    /// Refuses a claims directory reached through a link (or a file), creating nothing; a
    /// store not there yet is fine.
    fn check(&self) -> std::io::Result<()> {
        match &self.claims {
            Some(d) => d.check(),
            None => Ok(()),
        }
    }

    /// Creates the claims directory and its parents (refusing links).
    fn create(&self) -> std::io::Result<()> {
        self.writable()?.create()
    }

    /// Replaces claim file `name` atomically, creating the directory first.
    fn write(&self, name: &str, data: &[u8]) -> std::io::Result<()> {
        let d = self.writable()?;
        d.create()?;
        d.write(name, data)
    }

    /// Removes claim file `name`; one that does not exist is no error.
    fn remove(&self, name: &str) -> std::io::Result<()> {
        self.writable()?.remove(name)
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
            files: StateFiles::new(base, &format!("{dir}/claims")),
            dir,
        })
    }

    /// The store at [`DEFAULT_STATE_DIR`] inside `host`'s root, written through `host` (the
    /// store's writes then go where the host's do: a test's fault-injecting host sees them
    /// too). A host without a root directory has no claims, and writing is refused.
    pub fn on_host(host: Arc<dyn Host>) -> Self {
        let dir = DEFAULT_STATE_DIR.to_owned();
        ClaimStore {
            files: StateFiles::on_host(host, &format!("{dir}/claims")),
            dir,
        }
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
        Ok(format!("{}/claims/{}", self.dir, claim_file(uid)))
    }

    /// The file of claim `uid`, as a path on this machine.
    ///
    /// # Errors
    /// When `uid` is not a Kubernetes UID (so it cannot name a path outside the store).
    pub fn claim_path(&self, uid: &str) -> Result<PathBuf> {
        Ok(self.files.base.join(self.claim_rel(uid)?))
    }

    fn read_file(&self, name: &str) -> Result<Option<PreparedClaim>> {
        let path = self.dir().join("claims").join(name);
        let Some(bytes) = self
            .files
            .read(name, MAX_CLAIM_BYTES)
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
        self.claim_rel(uid)?;
        self.read_file(&claim_file(uid))
    }

    /// Every prepared claim, by node. A missing store is no claims.
    ///
    /// # Errors
    /// When the store cannot be listed or a claim file cannot be read or parsed.
    pub fn read_prepared(&self) -> Result<BTreeMap<String, Prepared>> {
        let mut out: BTreeMap<String, Prepared> = BTreeMap::new();
        for claim in self.read_all()? {
            let p = out.entry(claim.node.clone()).or_default();
            for a in claim.held() {
                a.record(p);
            }
        }
        Ok(out)
    }

    /// Every recorded claim, started or completed, in file-name order. A missing store is none.
    ///
    /// # Errors
    /// When the store cannot be listed or a claim file cannot be read or parsed.
    pub fn read_all(&self) -> Result<Vec<PreparedClaim>> {
        let mut names = self
            .files
            .list()
            .map_err(|e| state_error("cannot list", &self.dir().join("claims"), e))?;
        names.sort();
        let mut out = Vec::new();
        for name in names.iter().filter(|n| n.ends_with(".json")) {
            if let Some(claim) = self.read_file(name)? {
                out.push(claim);
            }
        }
        Ok(out)
    }

    fn unwritable(&self, e: std::io::Error, what: &str, rel: &str) -> IntegrationError {
        if self.files.claims.is_none() {
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
            .create()
            .map_err(|e| self.unwritable(e, "cannot create", &claims))
    }

    /// Refuses a store reached through a link (or a file) without creating anything: a caller
    /// that locks or changes the host first asks this, so a store that could not take the
    /// record is refused before anything else is touched.
    ///
    /// # Errors
    /// A component of the store that is a link or a file.
    pub fn check(&self) -> Result<()> {
        let claims = format!("{}/claims", self.dir);
        self.files
            .check()
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
            .write(&claim_file(&claim.claim_uid), text.as_bytes())
            .map_err(|e| self.unwritable(e, "cannot write", &rel))
    }

    /// Forgets claim `uid` (after unprepare undid it). A claim not recorded is no error.
    ///
    /// # Errors
    /// An invalid UID; a store directory that is a link; a file that cannot be removed.
    pub fn remove(&self, uid: &str) -> Result<()> {
        let rel = self.claim_rel(uid)?;
        self.files
            .remove(&claim_file(uid))
            .map_err(|e| self.unwritable(e, "cannot remove", &rel))
    }
}

/// The file name of claim `uid` in the store's `claims/` (the UID checked first).
fn claim_file(uid: &str) -> String {
    format!("{uid}.json")
}
