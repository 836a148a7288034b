//! Where the kubelet plugin reads a ResourceClaim: the seam between the plugin (which prepares
//! what a claim's allocation names) and the API server client (which fetches it).
//!
//! The plugin asks for a claim by namespace and name, as the kubelet's `NodePrepareResources`
//! names it, and gets the object as the API server returns it (`resource.k8s.io/v1`
//! `ResourceClaim` JSON). It then checks the UID and the allocation itself. Tests put a fake in
//! place of the client; the agent uses the Kubernetes client (`gpu_agent::kube`).

use std::future::Future;
use std::pin::Pin;

/// A boxed future, for a trait that stays object-safe.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Why a claim could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ClaimFetchError {
    /// The API server has no claim of that name in that namespace (HTTP 404).
    #[error("resourceclaim {namespace}/{name} not found")]
    NotFound {
        /// The namespace asked for.
        namespace: String,
        /// The name asked for.
        name: String,
    },
    /// The API server refused the read (HTTP 401 or 403): the message says what it said.
    #[error("reading resourceclaim refused: {0}")]
    Forbidden(String),
    /// The API server could not be reached or did not answer in time; the kubelet retries.
    #[error("API server unavailable: {0}")]
    Unavailable(String),
    /// The answer was not a ResourceClaim document.
    #[error("API server answer is not a ResourceClaim: {0}")]
    Invalid(String),
    /// The answer was larger than the agent reads (its cap), and refused unread.
    #[error("{0}")]
    TooLarge(String),
}

/// Reads ResourceClaims from wherever they are kept (the API server; a fake in tests).
pub trait ClaimSource: Send + Sync {
    /// The claim `namespace/name` as the API server returns it (`resource.k8s.io/v1` JSON).
    fn get<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
    ) -> BoxFuture<'a, Result<serde_json::Value, ClaimFetchError>>;
}

/// The most entries of a claims directory looked at per read.
pub const MAX_DIR_ENTRIES: usize = 4096;

/// Allocated ResourceClaims kept as files in a directory (`gpuslice agent --dra --claims-dir
/// DIR`) instead of in an API server: each `*.yaml`, `*.yml` or `*.json` file holds one claim as
/// the API server would return it (JSON or YAML). A claim is found by its `metadata.namespace`
/// and `metadata.name`, whatever the file is called.
///
/// Every read is bounded and confined: the directory is opened once per read, its entries are
/// looked at without following links, only regular files are opened (never a link, FIFO or
/// device; a link out of the directory is refused, naming it), each at most the document cap,
/// and at most [`MAX_DIR_ENTRIES`] entries are looked at.
#[derive(Debug, Clone)]
pub struct DirClaims {
    dir: std::path::PathBuf,
    limit: gpu_sysfs::DocumentLimit,
}

impl DirClaims {
    /// Claims read from `dir`, each file at most `limit`.
    pub fn new(dir: impl Into<std::path::PathBuf>, limit: gpu_sysfs::DocumentLimit) -> Self {
        DirClaims {
            dir: dir.into(),
            limit,
        }
    }

    /// The directory.
    pub fn dir(&self) -> &std::path::Path {
        &self.dir
    }

    /// The claim `namespace/name` from the directory (blocking file reads).
    ///
    /// # Errors
    /// [`ClaimFetchError::NotFound`] when no file holds it; [`ClaimFetchError::Unavailable`]
    /// when the directory cannot be read.
    pub fn find(&self, namespace: &str, name: &str) -> Result<serde_json::Value, ClaimFetchError> {
        use gpu_integrations::dra::names::{is_dns_label, is_dns_subdomain};
        let not_found = || ClaimFetchError::NotFound {
            namespace: crate::shown::name(namespace).into_owned(),
            name: crate::shown::name(name).into_owned(),
        };
        if !is_dns_label(namespace) || !is_dns_subdomain(name) {
            return Err(not_found());
        }
        let unavailable = |e: std::io::Error| {
            ClaimFetchError::Unavailable(format!("{}: {e}", self.dir.display()))
        };
        let dir = gpu_sysfs::atomic::Dir::open(&self.dir).map_err(unavailable)?;
        let names = dir.list().map_err(unavailable)?;
        for file in names
            .iter()
            .filter(|n| [".yaml", ".yml", ".json"].iter().any(|x| n.ends_with(x)))
            .take(MAX_DIR_ENTRIES)
        {
            let text = match dir.read(file, self.limit.bytes()) {
                Ok(Some(bytes)) => match String::from_utf8(bytes) {
                    Ok(t) => t,
                    Err(_) => {
                        log!(
                            "gpuslice agent: {}: not UTF-8 text; skipped",
                            dir.file_path(file).display()
                        );
                        continue;
                    }
                },
                Ok(None) => continue,
                Err(e) => {
                    log!(
                        "gpuslice agent: claims directory: {}; skipped",
                        crate::shown::message(&e.to_string())
                    );
                    continue;
                }
            };
            let doc: serde_json::Value =
                match gpu_core::decode_text_max("ResourceClaim", &text, self.limit.bytes()) {
                    Ok(d) => d,
                    Err(e) => {
                        log!(
                            "gpuslice agent: {}: {}; skipped",
                            dir.file_path(file).display(),
                            crate::shown::message(&e.to_string())
                        );
                        continue;
                    }
                };
            let meta = |key: &str| {
                doc.pointer(&format!("/metadata/{key}"))
                    .and_then(serde_json::Value::as_str)
            };
            let is_claim =
                doc.get("kind").and_then(serde_json::Value::as_str) == Some("ResourceClaim");
            if is_claim
                && meta("namespace").unwrap_or("default") == namespace
                && meta("name") == Some(name)
            {
                return Ok(doc);
            }
        }
        Err(not_found())
    }
}

impl ClaimSource for DirClaims {
    fn get<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
    ) -> BoxFuture<'a, Result<serde_json::Value, ClaimFetchError>> {
        Box::pin(async move {
            let me = self.clone();
            let (ns, n) = (namespace.to_owned(), name.to_owned());
            tokio::task::spawn_blocking(move || me.find(&ns, &n))
                .await
                .map_err(|e| {
                    ClaimFetchError::Unavailable(format!("the claims directory's reader: {e}"))
                })?
        })
    }
}
