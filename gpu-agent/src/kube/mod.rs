//! The agent's Kubernetes API client: reads ResourceClaims for the kubelet plugin and keeps the
//! node's ResourceSlices true in the API server ([`publish`]).
//!
//! The client is built on the `kube` crate from a kubeconfig file (`--kubeconfig FILE`) or, when
//! none is given, from the pod's in-cluster service account. Every request is bounded: the
//! connection, each read and write, and the whole request have deadlines, so an API server that
//! went away shows as [`KubeError::Unavailable`] within [`ClientOptions::timeout`], never as a
//! hung task. At most [`ClientOptions::max_in_flight`] requests are on the wire at a time (the
//! others queue, fairly, outside their deadline), so a fleet publish keeps the server busy without
//! flooding it. The objects are sent and read as JSON (`serde_json::Value`): the slices are the
//! documents `gpuslice export dra` builds, and a claim goes to the plugin as the server sent it.

pub mod publish;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use gpu_integrations::dra::names::{is_dns_label, is_dns_subdomain};

use crate::claims::{BoxFuture, ClaimFetchError, ClaimSource};

pub use publish::{
    NodeOwner, NodeReport, Plan, PlanStep, PoolTarget, PublishOptions, PublishOutcome,
    PublishSummary, PublisherHandle, ServerInfo, SliceOptions, plan, publish_nodes, server_info,
    spawn_publisher, spawn_publisher_degrading, sync_pool,
};

/// How long a connection attempt may take.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a whole request may take, unless [`ClientOptions::timeout`] says otherwise.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(15);
/// How many requests one client has on the wire at a time, unless
/// [`ClientOptions::max_in_flight`] says otherwise.
pub const MAX_IN_FLIGHT: usize = 16;

/// Where the client finds its cluster, and how long it waits.
#[derive(Debug, Clone)]
pub struct ClientOptions {
    /// A kubeconfig file (its current context); `None` reads the in-cluster service account.
    pub kubeconfig: Option<PathBuf>,
    /// The longest one request may take, connection included.
    pub timeout: Duration,
    /// The most requests on the wire at a time (clones of the client share the bound).
    pub max_in_flight: usize,
}

impl Default for ClientOptions {
    fn default() -> Self {
        Self {
            kubeconfig: None,
            timeout: REQUEST_TIMEOUT,
            max_in_flight: MAX_IN_FLIGHT,
        }
    }
}

/// Why a request to the API server failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KubeError {
    /// The kubeconfig or the in-cluster configuration could not be read or used.
    #[error("kubernetes client configuration: {0}")]
    Config(String),
    /// The API server answered with an error status.
    #[error("API server answered {code} {reason}: {message}")]
    Status {
        /// The HTTP status code.
        code: u16,
        /// The `reason` of the Status object (`NotFound`, `Conflict`, `Forbidden`, …).
        reason: String,
        /// Its `message`.
        message: String,
    },
    /// The API server could not be reached or did not answer in time.
    #[error("API server unavailable: {0}")]
    Unavailable(String),
    /// The answer was not the JSON document asked for.
    #[error("API server answer not understood: {0}")]
    Invalid(String),
    /// The server lacks what the agent needs (an old release, no `resource.k8s.io/v1`).
    #[error("{0}")]
    Unsupported(String),
}

impl KubeError {
    /// The HTTP status, when the server answered with one.
    pub fn code(&self) -> Option<u16> {
        match self {
            KubeError::Status { code, .. } => Some(*code),
            _ => None,
        }
    }

    /// Whether the failure may pass by itself (no answer, a server error, throttling, a
    /// conflict), so a retry with back-off makes sense.
    pub fn is_transient(&self) -> bool {
        match self {
            KubeError::Unavailable(_) => true,
            KubeError::Status { code, .. } => *code >= 500 || *code == 429 || *code == 409,
            _ => false,
        }
    }
}

/// A bounded Kubernetes API client.
#[derive(Clone)]
pub struct KubeClient {
    client: ::kube::Client,
    timeout: Duration,
    server: String,
    in_flight: Arc<tokio::sync::Semaphore>,
    max_in_flight: usize,
}

impl std::fmt::Debug for KubeClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeClient")
            .field("server", &self.server)
            .field("timeout", &self.timeout)
            .field("max_in_flight", &self.max_in_flight)
            .finish()
    }
}

impl KubeClient {
    /// A client for the cluster of `opts.kubeconfig`'s current context, or for the in-cluster
    /// service account when no file is named. Nothing is sent yet.
    ///
    /// # Errors
    /// [`KubeError::Config`]: the file cannot be read or parsed, its context names no cluster,
    /// or (in-cluster) the service account's environment and files are missing.
    pub async fn connect(opts: &ClientOptions) -> Result<Self, KubeError> {
        let config = match &opts.kubeconfig {
            Some(path) => kubeconfig(path).await?,
            None => ::kube::Config::incluster().map_err(|e| {
                KubeError::Config(format!(
                    "no --kubeconfig given and not in a cluster ({e}); name a kubeconfig file"
                ))
            })?,
        };
        Ok(Self::from_config(config, opts.timeout)?.with_max_in_flight(opts.max_in_flight))
    }

    /// A client from a prepared `kube` configuration; its connect, read and write deadlines are
    /// set here unless already set shorter.
    ///
    /// # Errors
    /// [`KubeError::Config`]: the TLS or authentication setup of `config` cannot be built.
    pub fn from_config(mut config: ::kube::Config, timeout: Duration) -> Result<Self, KubeError> {
        let timeout = timeout.max(Duration::from_millis(1));
        let shorter = |t: Option<Duration>, cap: Duration| Some(t.map_or(cap, |t| t.min(cap)));
        config.connect_timeout = shorter(config.connect_timeout, CONNECT_TIMEOUT.min(timeout));
        config.read_timeout = shorter(config.read_timeout, timeout);
        config.write_timeout = shorter(config.write_timeout, timeout);
        let server = config.cluster_url.to_string();
        let client = ::kube::Client::try_from(config)
            .map_err(|e| KubeError::Config(format!("cannot build the client: {e}")))?;
        Ok(Self {
            client,
            timeout,
            server,
            in_flight: Arc::new(tokio::sync::Semaphore::new(MAX_IN_FLIGHT)),
            max_in_flight: MAX_IN_FLIGHT,
        })
    }

    /// The same client with at most `n` (at least 1) requests on the wire at a time; the bound
    /// is shared by the clones made from the result.
    #[must_use]
    pub fn with_max_in_flight(mut self, n: usize) -> Self {
        let n = n.clamp(1, tokio::sync::Semaphore::MAX_PERMITS);
        self.in_flight = Arc::new(tokio::sync::Semaphore::new(n));
        self.max_in_flight = n;
        self
    }

    /// The most requests this client has on the wire at a time.
    pub fn max_in_flight(&self) -> usize {
        self.max_in_flight
    }

    /// The API server's address.
    pub fn server(&self) -> &str {
        &self.server
    }

    /// `GET path` (absolute, from the server's root) as JSON.
    ///
    /// # Errors
    /// See [`KubeClient::request`].
    pub async fn get(&self, path: &str) -> Result<serde_json::Value, KubeError> {
        self.request(http::Method::GET, path, None).await
    }

    /// One request with an optional JSON body, its answer parsed as JSON, within the client's
    /// deadline ([`KubeClient::write`] when the answer is not needed).
    ///
    /// # Errors
    /// [`KubeError::Status`] for an error status, [`KubeError::Unavailable`] when the server
    /// cannot be reached or the deadline passes, [`KubeError::Invalid`] for an answer that is
    /// not JSON.
    pub async fn request(
        &self,
        method: http::Method,
        path: &str,
        body: Option<&serde_json::Value>,
    ) -> Result<serde_json::Value, KubeError> {
        let text = self.exchange(method, path, body).await?;
        serde_json::from_str(&text).map_err(|e| KubeError::Invalid(format!("{path}: {e}")))
    }

    /// As [`KubeClient::request`], but the answer (the object as stored) is not parsed: a
    /// write whose success is all that matters.
    ///
    /// # Errors
    /// As [`KubeClient::request`], without [`KubeError::Invalid`] for the answer.
    pub async fn write(
        &self,
        method: http::Method,
        path: &str,
        body: Option<&serde_json::Value>,
    ) -> Result<(), KubeError> {
        self.exchange(method, path, body).await.map(drop)
    }

    /// As [`KubeClient::write`] with a body already encoded as JSON (a document serialized
    /// straight from its typed form, never built as a `serde_json::Value`).
    ///
    /// # Errors
    /// As [`KubeClient::write`].
    pub async fn write_json(
        &self,
        method: http::Method,
        path: &str,
        json: Vec<u8>,
    ) -> Result<(), KubeError> {
        self.send(method, path, Some(json)).await.map(drop)
    }

    async fn exchange(
        &self,
        method: http::Method,
        path: &str,
        body: Option<&serde_json::Value>,
    ) -> Result<String, KubeError> {
        let bytes = match body {
            Some(b) => Some(serde_json::to_vec(b).map_err(|e| KubeError::Invalid(e.to_string()))?),
            None => None,
        };
        self.send(method, path, bytes).await
    }

    async fn send(
        &self,
        method: http::Method,
        path: &str,
        json: Option<Vec<u8>>,
    ) -> Result<String, KubeError> {
        let mut builder = http::Request::builder().method(method).uri(path);
        if json.is_some() {
            builder = builder.header(http::header::CONTENT_TYPE, "application/json");
        }
        let bytes = json.unwrap_or_default();
        let req = builder
            .header(http::header::ACCEPT, "application/json")
            .body(bytes)
            .map_err(|e| KubeError::Invalid(format!("request {path}: {e}")))?;
        // The wait for a turn is not part of the request's deadline: the requests ahead are
        // bounded by theirs.
        let _turn = self
            .in_flight
            .acquire()
            .await
            .map_err(|e| KubeError::Unavailable(format!("{path}: {e}")))?;
        let text = match tokio::time::timeout(self.timeout, self.client.request_text(req)).await {
            Err(_) => {
                return Err(KubeError::Unavailable(format!(
                    "{path}: no answer within {} ms",
                    self.timeout.as_millis()
                )));
            }
            Ok(r) => r.map_err(|e| from_kube(path, e))?,
        };
        Ok(text)
    }
}

async fn kubeconfig(path: &Path) -> Result<::kube::Config, KubeError> {
    let file = ::kube::config::Kubeconfig::read_from(path)
        .map_err(|e| KubeError::Config(format!("{}: {e}", path.display())))?;
    ::kube::Config::from_custom_kubeconfig(file, &::kube::config::KubeConfigOptions::default())
        .await
        .map_err(|e| KubeError::Config(format!("{}: {e}", path.display())))
}

/// The one place a `kube` error becomes a [`KubeError`].
fn from_kube(path: &str, e: ::kube::Error) -> KubeError {
    match e {
        ::kube::Error::Api(r) => KubeError::Status {
            code: r.code,
            reason: r.reason,
            message: r.message,
        },
        ::kube::Error::HyperError(e) => KubeError::Unavailable(format!("{path}: {e}")),
        ::kube::Error::Service(e) => KubeError::Unavailable(format!("{path}: {e}")),
        ::kube::Error::ReadEvents(e) => KubeError::Unavailable(format!("{path}: {e}")),
        ::kube::Error::Auth(e) => KubeError::Unavailable(format!("{path}: credentials: {e}")),
        other => KubeError::Invalid(format!("{path}: {other}")),
    }
}

impl ClaimSource for KubeClient {
    fn get<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
    ) -> BoxFuture<'a, Result<serde_json::Value, ClaimFetchError>> {
        Box::pin(async move {
            let not_found = || ClaimFetchError::NotFound {
                namespace: namespace.to_owned(),
                name: name.to_owned(),
            };
            // A name that could not be a claim's is never put into a path.
            if !is_dns_label(namespace) || !is_dns_subdomain(name) {
                return Err(not_found());
            }
            let path =
                format!("/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims/{name}");
            let doc = match KubeClient::get(self, &path).await {
                Ok(doc) => doc,
                Err(KubeError::Status { code: 404, .. }) => return Err(not_found()),
                Err(KubeError::Status {
                    code: code @ (401 | 403),
                    message,
                    ..
                }) => return Err(ClaimFetchError::Forbidden(format!("{code}: {message}"))),
                Err(KubeError::Status {
                    code,
                    reason,
                    message,
                }) if code >= 500 || code == 429 => {
                    return Err(ClaimFetchError::Unavailable(format!(
                        "{code} {reason}: {message}"
                    )));
                }
                Err(e @ KubeError::Status { .. }) => {
                    return Err(ClaimFetchError::Invalid(e.to_string()));
                }
                Err(KubeError::Unavailable(m)) => return Err(ClaimFetchError::Unavailable(m)),
                Err(e) => return Err(ClaimFetchError::Invalid(e.to_string())),
            };
            let kind = doc.get("kind").and_then(serde_json::Value::as_str);
            if !doc.is_object() || kind.is_some_and(|k| k != "ResourceClaim") {
                return Err(ClaimFetchError::Invalid(format!(
                    "{path}: kind {}",
                    kind.unwrap_or("(not an object)")
                )));
            }
            Ok(doc)
        })
    }
}
