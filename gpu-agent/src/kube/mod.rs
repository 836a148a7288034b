//! The agent's Kubernetes API client: reads ResourceClaims for the kubelet plugin and keeps the
//! node's ResourceSlices true in the API server ([`publish`]).
//!
//! The client is built on the `kube` crate from a kubeconfig file (`--kubeconfig FILE`) or, when
//! none is given, from the pod's in-cluster service account. Every request is bounded: the
//! connection, each read and write, and the whole request have deadlines, so an API server that
//! went away shows as [`KubeError::Unavailable`] within [`ClientOptions::timeout`], never as a
//! hung task. At most [`ClientOptions::max_in_flight`] requests are on the wire at a time (the
//! others queue, fairly, outside their deadline), so a fleet publish keeps the server busy without
//! flooding it. Every answer is capped in bytes ([`ClientOptions::max_answer`], 16 MiB unless
//! told otherwise): the cap is enforced while the answer is read (nothing past it is ever
//! buffered), and an answer over it is [`KubeError::TooLarge`], naming the request and the cap,
//! and counted ([`KubeClient::refused_answers`]). The objects are sent and read as JSON (`serde_json::Value`): the slices are the
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
/// The largest answer the client reads, unless [`ClientOptions::max_answer`] says otherwise: a
/// node's ResourceSlices and a ResourceClaim are far smaller (the API server stores no object
/// over 1.5 MiB).
pub const MAX_ANSWER: u64 = 16 * 1024 * 1024;

/// Where the client finds its cluster, and how long it waits.
#[derive(Debug, Clone)]
pub struct ClientOptions {
    /// A kubeconfig file (its current context); `None` reads the in-cluster service account.
    pub kubeconfig: Option<PathBuf>,
    /// The longest one request may take, connection included.
    pub timeout: Duration,
    /// The most requests on the wire at a time (clones of the client share the bound).
    pub max_in_flight: usize,
    /// The largest answer read, in bytes (at least 1 KiB); a larger one is refused unread.
    pub max_answer: u64,
}

impl Default for ClientOptions {
    fn default() -> Self {
        Self {
            kubeconfig: None,
            timeout: REQUEST_TIMEOUT,
            max_in_flight: MAX_IN_FLIGHT,
            max_answer: MAX_ANSWER,
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
    /// The answer was larger than the client's cap: refused, and nothing past the cap read.
    #[error(
        "API server answer to {method} {url} is larger than {cap} bytes (the agent's cap, --max-apiserver-answer); refused"
    )]
    TooLarge {
        /// The request's method.
        method: String,
        /// The request's URL (the server's address and the path).
        url: String,
        /// The cap, in bytes.
        cap: u64,
    },
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
    max_answer: u64,
    refused: Arc<std::sync::atomic::AtomicU64>,
}

impl std::fmt::Debug for KubeClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeClient")
            .field("server", &self.server)
            .field("timeout", &self.timeout)
            .field("max_in_flight", &self.max_in_flight)
            .field("max_answer", &self.max_answer)
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
        Ok(Self::from_config(config, opts.timeout)?
            .with_max_in_flight(opts.max_in_flight)
            .with_max_answer(opts.max_answer))
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
            max_answer: MAX_ANSWER,
            refused: Arc::default(),
        })
    }

    /// The same client reading answers of at most `bytes` (at least 1 KiB).
    #[must_use]
    pub fn with_max_answer(mut self, bytes: u64) -> Self {
        self.max_answer = bytes.max(1024);
        self
    }

    /// The largest answer this client reads, in bytes.
    pub fn max_answer(&self) -> u64 {
        self.max_answer
    }

    /// How many answers this client (and its clones) refused for their size: a counter the
    /// agent serves as `gpuslice_agent_apiserver_answers_refused_total`.
    pub fn refused_answers(&self) -> Arc<std::sync::atomic::AtomicU64> {
        Arc::clone(&self.refused)
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
        let method = req.method().to_string();
        let exchange = async {
            let answer = self
                .client
                .send(req.map(::kube::client::Body::from))
                .await
                .map_err(|e| from_kube(path, e))?;
            let status = answer.status();
            let text = self.read_capped(&method, path, answer).await?;
            if status.is_client_error() || status.is_server_error() {
                return Err(status_error(status, &text));
            }
            Ok(text)
        };
        match tokio::time::timeout(self.timeout, exchange).await {
            Err(_) => Err(KubeError::Unavailable(format!(
                "{path}: no answer within {} ms",
                self.timeout.as_millis()
            ))),
            Ok(r) => r,
        }
    }

    /// The answer's body as text, read up to the cap: one announced larger is refused before
    /// any of it is read, one that grows past it as soon as it does (the connection is dropped,
    /// so the rest is never read).
    async fn read_capped(
        &self,
        method: &str,
        path: &str,
        answer: http::Response<::kube::client::Body>,
    ) -> Result<String, KubeError> {
        use http_body_util::BodyExt as _;
        let cap = self.max_answer;
        let too_large = || {
            self.refused
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let e = KubeError::TooLarge {
                method: method.to_owned(),
                url: format!("{}{}", self.server.trim_end_matches('/'), path),
                cap,
            };
            crate::log!("gpuslice agent: {e}");
            e
        };
        let announced = answer
            .headers()
            .get(http::header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<u64>().ok());
        if announced.is_some_and(|n| n > cap) {
            return Err(too_large());
        }
        let limit = usize::try_from(cap).unwrap_or(usize::MAX);
        // The pieces are kept as they came and joined once at the end, into one buffer of the
        // answer's size: a growing buffer would hold up to twice the cap while it grows.
        let mut pieces = Vec::new();
        let mut len = 0usize;
        let mut body = answer.into_body();
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|e| from_kube(path, e))?;
            if let Ok(data) = frame.into_data() {
                if data.len() > limit.saturating_sub(len) {
                    return Err(too_large());
                }
                len += data.len();
                pieces.push(data);
            }
        }
        let mut bytes = Vec::with_capacity(len);
        for piece in pieces {
            bytes.extend_from_slice(&piece);
        }
        String::from_utf8(bytes)
            .map_err(|e| KubeError::Invalid(format!("{path}: the answer is not UTF-8: {e}")))
    }
}

/// An error status's answer: the Status object's code, reason and message when it is one.
fn status_error(status: http::StatusCode, text: &str) -> KubeError {
    #[derive(serde::Deserialize)]
    struct Status {
        #[serde(default)]
        reason: String,
        #[serde(default)]
        message: String,
    }
    match serde_json::from_str::<Status>(text) {
        Ok(s) => KubeError::Status {
            code: status.as_u16(),
            reason: s.reason,
            message: s.message,
        },
        Err(_) => KubeError::Status {
            code: status.as_u16(),
            reason: status.canonical_reason().unwrap_or("").to_owned(),
            message: crate::shown::message(text.trim()).into_owned(),
        },
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
                Err(e @ KubeError::TooLarge { .. }) => {
                    return Err(ClaimFetchError::TooLarge(e.to_string()));
                }
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
