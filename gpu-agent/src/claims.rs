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

/// Claims kept in memory by namespace and name, as an API server would return them: the plugin's
/// claim source where there is no API server (tests, a kubelet stand-in).
#[derive(Debug, Default)]
pub struct MemoryClaims(
    std::sync::Mutex<std::collections::HashMap<(String, String), serde_json::Value>>,
);

impl MemoryClaims {
    /// Keeps `doc` under its `metadata.namespace` and `metadata.name` (a later one of the same
    /// name replaces it).
    ///
    /// # Errors
    /// [`ClaimFetchError::Invalid`] when the document names no namespace or name.
    pub fn put(&self, doc: serde_json::Value) -> Result<(), ClaimFetchError> {
        let field = |f: &str| {
            doc["metadata"][f]
                .as_str()
                .map(str::to_owned)
                .ok_or_else(|| ClaimFetchError::Invalid(format!("no metadata.{f}")))
        };
        let key = (field("namespace")?, field("name")?);
        let mut claims = match self.0.lock() {
            Ok(c) => c,
            Err(p) => p.into_inner(),
        };
        claims.insert(key, doc);
        Ok(())
    }
}

impl ClaimSource for MemoryClaims {
    fn get<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
    ) -> BoxFuture<'a, Result<serde_json::Value, ClaimFetchError>> {
        let claims = match self.0.lock() {
            Ok(c) => c,
            Err(p) => p.into_inner(),
        };
        let found = claims
            .get(&(namespace.to_owned(), name.to_owned()))
            .cloned();
        Box::pin(async move {
            found.ok_or_else(|| ClaimFetchError::NotFound {
                namespace: namespace.to_owned(),
                name: name.to_owned(),
            })
        })
    }
}
