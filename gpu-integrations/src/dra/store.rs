//! The node's DRA claim store: one JSON file per prepared claim, `<state>/claims/<uid>.json`,
//! written atomically, read back by `unprepare` and by the export (so what prepare created is
//! not subtracted twice).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::build::Prepared;
use super::prepare::PreparedClaim;
use crate::error::{IntegrationError, Result, fail};

fn state_error(what: &str, path: &Path, e: impl std::fmt::Display) -> IntegrationError {
    IntegrationError::State(format!("{what} {}: {e}", path.display()))
}

/// The file of claim `uid` under `state`.
///
/// # Errors
/// When `uid` is not a Kubernetes UID (so it cannot name a path outside the store).
pub fn claim_path(state: &Path, uid: &str) -> Result<PathBuf> {
    if uid.is_empty()
        || uid.len() > 128
        || !uid
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
        || uid.starts_with('.')
    {
        fail!(Invalid, "claim UID {uid:?} is not a Kubernetes UID");
    }
    Ok(state.join("claims").join(format!("{uid}.json")))
}

/// Reads every prepared claim under `state`, by node. A missing directory is no claims.
///
/// # Errors
/// When a claim file cannot be read or parsed.
pub fn read_prepared(state: &Path) -> Result<BTreeMap<String, Prepared>> {
    let dir = state.join("claims");
    let mut out: BTreeMap<String, Prepared> = BTreeMap::new();
    let entries = match std::fs::read_dir(&dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(out),
        Err(e) => return Err(state_error("cannot list", &dir, e)),
    };
    for entry in entries {
        let path = entry
            .map_err(|e| state_error("cannot list", &dir, e))?
            .path();
        if path.extension().and_then(|e| e.to_str()) != Some("json") {
            continue;
        }
        let claim = read_claim(&path)?;
        let p = out.entry(claim.node.clone()).or_default();
        for a in claim.held() {
            a.record(p);
        }
    }
    Ok(out)
}

/// Reads one prepared claim.
///
/// # Errors
/// When the file cannot be read or parsed.
pub fn read_claim(path: &Path) -> Result<PreparedClaim> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| state_error("cannot read prepared claim", path, e))?;
    serde_json::from_str(&text).map_err(|e| state_error("prepared claim", path, e))
}

/// Records a prepared claim, creating the store, with gpuslice's one atomic writer.
///
/// # Errors
/// When the directory or the file cannot be written.
pub fn write_claim(path: &Path, claim: &PreparedClaim) -> Result<()> {
    let dir = path
        .parent()
        .ok_or_else(|| IntegrationError::Invalid("claim file has no directory".into()))?;
    std::fs::create_dir_all(dir).map_err(|e| state_error("cannot create", dir, e))?;
    let text = serde_json::to_string_pretty(claim)
        .map_err(|e| IntegrationError::Internal(format!("cannot render the claim: {e}")))?;
    gpu_sysfs::atomic::write_file_atomic(path, text.as_bytes())
        .map_err(|e| state_error("cannot write", path, e))
}
