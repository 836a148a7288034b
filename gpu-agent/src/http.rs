//! The versioned HTTP API: routes, JSON bodies and error documents.

use gpu_core::ErrorKind;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::{Path, Query, Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use futures_util::StreamExt as _;
use serde::Deserialize;

use crate::agent::{Agent, CreateRequest};
use crate::error::ApiError;
use crate::events::{Event, EventKind};

/// The largest request body accepted (a layout document is a few KiB).
pub const MAX_BODY: usize = 1024 * 1024;
/// How long a client may take to send its request body.
pub const BODY_TIMEOUT: Duration = Duration::from_secs(10);
/// How often an SSE stream sends a keep-alive comment.
const SSE_KEEPALIVE: Duration = Duration::from_secs(15);

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = StatusCode::from_u16(self.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        json_text(status, self.to_json())
    }
}

fn json_text(status: StatusCode, body: String) -> Response {
    let mut r = Response::new(Body::from(body));
    *r.status_mut() = status;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    r
}

fn json_value(status: StatusCode, v: &serde_json::Value) -> Response {
    json_text(status, v.to_string())
}

/// The router of the API, over `agent`.
pub fn router(agent: Arc<Agent>) -> Router {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/metrics", get(metrics))
        .route("/v1/topology", get(topology))
        .route("/v1/health", get(health))
        .route("/v1/vgpus", get(list_vgpus).post(create_vgpu))
        .route("/v1/vgpus/{id}", axum::routing::delete(delete_vgpu))
        .route("/v1/gpus/bind", post(bind_set))
        .route("/v1/gpus/release", post(release_set))
        .route("/v1/gpus/{gpu}/bind", post(bind_gpu))
        .route("/v1/gpus/{gpu}/release", post(release_gpu))
        .route("/v1/layout", put(put_layout))
        .route("/v1/realize", post(realize))
        .route("/v1/promises", get(promises))
        .route("/v1/events", get(events))
        .fallback(unknown_route)
        .method_not_allowed_fallback(wrong_method)
        .with_state(agent)
}

/// Renders metrics text on each scrape: the body, or why not (served as a 500 naming it).
pub type Render = Arc<dyn Fn() -> Result<String, crate::error::RenderError> + Send + Sync>;

/// A router serving only `GET /metrics` (and HEAD) from `render`, with the API's JSON errors for
/// other routes and methods: what `gpuslice metrics --listen` serves.
pub fn metrics_router(render: Render, content_type: String) -> Router {
    let handler = move || {
        let render = Arc::clone(&render);
        let content_type = content_type.clone();
        async move {
            // Rendering a fleet file reads it: off the async threads.
            let out = tokio::task::spawn_blocking(move || render())
                .await
                .unwrap_or_else(|e| Err(crate::error::RenderError::new(e)));
            match out {
                Ok(text) => {
                    let mut r = Response::new(Body::from(text));
                    if let Ok(v) = HeaderValue::from_str(&content_type) {
                        r.headers_mut().insert(header::CONTENT_TYPE, v);
                    }
                    r
                }
                Err(e) => ApiError::from_render(&e).into_response(),
            }
        }
    };
    Router::new()
        .route("/metrics", get(handler))
        .fallback(unknown_route)
        .method_not_allowed_fallback(wrong_method)
}

/// Why [`serve_metrics`] stopped.
#[derive(Debug, thiserror::Error)]
pub enum MetricsServeError {
    /// The server's runtime could not be started.
    #[error("cannot start the server's runtime")]
    Runtime(#[source] std::io::Error),
    /// The address could not be listened on.
    #[error("cannot listen on {addr}")]
    Listen {
        /// The address asked for.
        addr: String,
        /// Why not.
        #[source]
        source: std::io::Error,
    },
    /// Serving failed, or the termination signals could not be watched.
    #[error(transparent)]
    Serve(#[from] std::io::Error),
}

/// Serves [`metrics_router`] at `addr` on the agent's server (one task per connection,
/// deadlines for slow clients, no keep-alive) until SIGTERM or SIGINT, or after `max_requests`
/// answers; `bound` is told the address listened on (`tcp:HOST:PORT`) once it is. Blocks.
///
/// # Errors
/// A [`MetricsServeError`].
pub fn serve_metrics(
    addr: &str,
    render: Render,
    content_type: String,
    max_requests: Option<u64>,
    bound: impl FnOnce(&str),
) -> Result<(), MetricsServeError> {
    let rt = crate::runtime().map_err(MetricsServeError::Runtime)?;
    rt.block_on(async move {
        let listener = crate::Listener::bind_tcp_read_routes(addr).map_err(|source| {
            MetricsServeError::Listen {
                addr: addr.to_owned(),
                source,
            }
        })?;
        bound(&listener.address());
        let opts = crate::ServeOptions {
            keep_alive: false,
            max_requests,
        };
        let router = metrics_router(render, content_type);
        crate::serve_router(router, vec![listener], crate::on_terminate()?, opts).await?;
        Ok(())
    })
}

async fn unknown_route(req: Request) -> ApiError {
    ApiError::new(
        ErrorKind::UnknownRoute,
        format!(
            "no route {} {}; the API is under /v1",
            req.method(),
            req.uri().path()
        ),
    )
}

async fn wrong_method(req: Request) -> ApiError {
    ApiError::new(
        ErrorKind::MethodNotAllowed,
        format!("{} is not allowed on {}", req.method(), req.uri().path()),
    )
}

async fn healthz(State(a): State<Arc<Agent>>) -> Response {
    let mut doc = serde_json::json!({ "status": "ok", "revision": a.events().revision() });
    // The agent serves whatever the API server says; a publisher it keeps waiting shows here.
    if let Some(p) = a.stats().publisher() {
        doc["slicePublisher"] = serde_json::to_value(p).unwrap_or_default();
    }
    // A write of an earlier process that did not finish, found at start (and what was undone).
    if let Some(r) = a.interrupted() {
        doc["interruptedWrite"] = serde_json::to_value(r).unwrap_or_default();
    }
    // So does a kubelet plugin whose sockets another process holds.
    if let Some(p) = a.stats().plugin() {
        doc["draPlugin"] = serde_json::to_value(p).unwrap_or_default();
    }
    json_value(StatusCode::OK, &doc)
}

async fn metrics(State(a): State<Arc<Agent>>) -> Response {
    match a.metrics_text() {
        None => ApiError::not_found("this agent serves no metrics").into_response(),
        Some(Err(e)) => e.into_response(),
        Some(Ok((text, ct))) => {
            let mut r = Response::new(Body::from(text));
            if let Ok(v) = HeaderValue::from_str(&ct) {
                r.headers_mut().insert(header::CONTENT_TYPE, v);
            }
            r
        }
    }
}

async fn topology(State(a): State<Arc<Agent>>, headers: HeaderMap) -> Response {
    a.snapshot().topology_doc().respond(&headers)
}

async fn health(State(a): State<Arc<Agent>>, headers: HeaderMap) -> Response {
    a.snapshot().health_doc().respond(&headers)
}

async fn promises(State(a): State<Arc<Agent>>) -> Result<Response, ApiError> {
    let me = Arc::clone(&a);
    let state = tokio::task::spawn_blocking(move || me.store().load())
        .await
        .map_err(|e| ApiError::new(ErrorKind::Other, e.to_string()))??;
    Ok(json_value(
        StatusCode::OK,
        &serde_json::json!({
            "stateFile": a.store().file(),
            "promises": state.promises,
            "reconciled": a.reconciled(),
        }),
    ))
}

async fn list_vgpus(State(a): State<Arc<Agent>>) -> Result<Response, ApiError> {
    let v = tokio::task::spawn_blocking(move || a.list_blocking())
        .await
        .map_err(|e| ApiError::new(ErrorKind::Other, e.to_string()))??;
    Ok(json_value(StatusCode::OK, &v))
}

/// Refuses a body its `Content-Length` announces larger than [`MAX_BODY`], before any of it
/// is read (an immediate 413, not a wait for a body that would be refused anyway).
fn check_length(headers: &HeaderMap) -> Result<(), ApiError> {
    match announced_length(headers) {
        Some(n) if n > MAX_BODY as u64 => Err(ApiError::new(
            ErrorKind::TooLarge,
            format!("the request body is {n} bytes; at most {MAX_BODY} are accepted"),
        )),
        _ => Ok(()),
    }
}

/// The body's length as its `Content-Length` announces it.
fn announced_length(headers: &HeaderMap) -> Option<u64> {
    headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok())
}

/// How much of a refused body is read and thrown away while the refusal is answered, so a
/// client that sends it anyway sees the answer instead of a broken pipe.
const DRAIN_MAX: usize = 4 * MAX_BODY;

/// Reads and discards `body` for at most [`BODY_TIMEOUT`] and [`DRAIN_MAX`] bytes, then lets
/// the connection close.
async fn drain(body: Body) {
    let mut stream = body.into_data_stream();
    let mut seen = 0usize;
    let _ = tokio::time::timeout(BODY_TIMEOUT, async {
        while let Some(Ok(chunk)) = stream.next().await {
            seen += chunk.len();
            if seen > DRAIN_MAX {
                break;
            }
        }
    })
    .await;
}

/// Reads a whole body within [`MAX_BODY`] and [`BODY_TIMEOUT`], refusing one announced larger
/// at once: the answer goes out before any of the body is read. A body announced within
/// [`DRAIN_MAX`] is thrown away as it arrives (bounded), so its sender sees the answer; a larger
/// one is not waited for at all: the connection closes after the answer.
async fn read_body(headers: &HeaderMap, body: Body) -> Result<axum::body::Bytes, ApiError> {
    if let Err(e) = check_length(headers) {
        if announced_length(headers).is_some_and(|n| n <= DRAIN_MAX as u64) {
            tokio::spawn(drain(body));
        } else {
            // Dropped unread: hyper stops reading and closes the connection once answered.
            drop(body);
        }
        return Err(e);
    }
    match tokio::time::timeout(BODY_TIMEOUT, axum::body::to_bytes(body, MAX_BODY)).await {
        Err(_) => Err(ApiError::new(
            ErrorKind::Timeout,
            format!("the request body did not arrive within {BODY_TIMEOUT:?}"),
        )
        .with_status(408)),
        Ok(Err(e)) => {
            let too_large = std::error::Error::source(&e)
                .is_some_and(|s| s.is::<http_body_util::LengthLimitError>());
            if too_large {
                Err(ApiError::new(
                    ErrorKind::TooLarge,
                    format!("the request body is larger than {MAX_BODY} bytes"),
                ))
            } else {
                Err(ApiError::invalid(format!(
                    "cannot read the request body: {e}"
                )))
            }
        }
        Ok(Ok(b)) => Ok(b),
    }
}

fn parse_json<T: serde::de::DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    serde_json::from_slice(bytes)
        .map_err(|e| ApiError::invalid(format!("the request body is not a valid document: {e}")))
}

fn query<T>(q: Result<Query<T>, axum::extract::rejection::QueryRejection>) -> Result<T, ApiError> {
    q.map(|Query(v)| v)
        .map_err(|e| ApiError::invalid(format!("query: {}", e.body_text())))
}

fn path<T>(p: Result<Path<T>, axum::extract::rejection::PathRejection>) -> Result<T, ApiError> {
    p.map(|Path(v)| v)
        .map_err(|e| ApiError::invalid(format!("path: {}", e.body_text())))
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct NoQuery {}

async fn create_vgpu(
    State(a): State<Arc<Agent>>,
    q: Result<Query<NoQuery>, axum::extract::rejection::QueryRejection>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    query(q)?;
    let bytes = read_body(&headers, body).await?;
    let req: CreateRequest = parse_json(&bytes)?;
    let v = a.create(req).await?;
    let status = if v.get("changed").and_then(serde_json::Value::as_bool) == Some(false) {
        StatusCode::OK
    } else {
        StatusCode::CREATED
    };
    Ok(json_value(status, &v))
}

/// `POST /v1/gpus/bind` and `/release`: several whole GPUs as one set (on an NVSwitch host one
/// fabric partition's members, activated with the bind).
async fn bind_set(
    State(a): State<Arc<Agent>>,
    q: Result<Query<NoQuery>, axum::extract::rejection::QueryRejection>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    set(a, q, headers, body, true).await
}

async fn release_set(
    State(a): State<Arc<Agent>>,
    q: Result<Query<NoQuery>, axum::extract::rejection::QueryRejection>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    set(a, q, headers, body, false).await
}

async fn set(
    a: Arc<Agent>,
    q: Result<Query<NoQuery>, axum::extract::rejection::QueryRejection>,
    headers: HeaderMap,
    body: Body,
    bind: bool,
) -> Result<Response, ApiError> {
    query(q)?;
    let bytes = read_body(&headers, body).await?;
    let req: crate::agent::SetRequest = parse_json(&bytes)?;
    Ok(json_value(StatusCode::OK, &a.bind_set(req, bind).await?))
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct ForceQuery {
    #[serde(default)]
    force: bool,
}

async fn delete_vgpu(
    State(a): State<Arc<Agent>>,
    p: Result<Path<String>, axum::extract::rejection::PathRejection>,
    q: Result<Query<ForceQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Response, ApiError> {
    let id = path(p)?;
    let q = query(q)?;
    let v = a.remove(id, q.force).await?;
    Ok(json_value(StatusCode::OK, &v))
}

async fn bind_gpu(
    State(a): State<Arc<Agent>>,
    p: Result<Path<String>, axum::extract::rejection::PathRejection>,
    q: Result<Query<ForceQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Response, ApiError> {
    let gpu = path(p)?;
    let q = query(q)?;
    Ok(json_value(
        StatusCode::OK,
        &a.bind(gpu, true, q.force).await?,
    ))
}

async fn release_gpu(
    State(a): State<Arc<Agent>>,
    p: Result<Path<String>, axum::extract::rejection::PathRejection>,
    q: Result<Query<ForceQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Response, ApiError> {
    let gpu = path(p)?;
    let q = query(q)?;
    Ok(json_value(
        StatusCode::OK,
        &a.bind(gpu, false, q.force).await?,
    ))
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct RealizeQuery {
    #[serde(default)]
    machine: Option<String>,
    #[serde(default)]
    force: bool,
}

async fn realize(
    State(a): State<Arc<Agent>>,
    q: Result<Query<RealizeQuery>, axum::extract::rejection::QueryRejection>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let q = query(q)?;
    let bytes = read_body(&headers, body).await?;
    let text = std::str::from_utf8(&bytes)
        .map_err(|e| ApiError::invalid(format!("the request body is not UTF-8 text: {e}")))?;
    let v = a.realize(text, q.machine.as_deref(), q.force).await?;
    let status = if v.get("changed").and_then(serde_json::Value::as_bool) == Some(false) {
        StatusCode::OK
    } else {
        StatusCode::CREATED
    };
    Ok(json_value(status, &v))
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct LayoutQuery {
    #[serde(default)]
    dry_run: bool,
    #[serde(default)]
    force: bool,
    #[serde(default)]
    config: Option<String>,
}

async fn put_layout(
    State(a): State<Arc<Agent>>,
    q: Result<Query<LayoutQuery>, axum::extract::rejection::QueryRejection>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let q = query(q)?;
    let bytes = read_body(&headers, body).await?;
    let text = String::from_utf8(bytes.to_vec())
        .map_err(|_| ApiError::invalid("the layout document is not UTF-8"))?;
    let v = a.apply_layout(text, q.config, q.dry_run, q.force).await?;
    Ok(json_value(StatusCode::OK, &v))
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct EventsQuery {
    #[serde(default)]
    since: Option<u64>,
    #[serde(default)]
    format: Option<String>,
}

fn frame(e: &Event, sse: bool) -> axum::body::Bytes {
    let json = serde_json::to_string(e).unwrap_or_default();
    if sse {
        format!(
            "id: {}\nevent: {}\ndata: {json}\n\n",
            e.revision,
            kind_name(e.kind)
        )
        .into()
    } else {
        format!("{json}\n").into()
    }
}

fn kind_name(k: EventKind) -> String {
    serde_json::to_value(k)
        .ok()
        .and_then(|v| v.as_str().map(str::to_owned))
        .unwrap_or_default()
}

async fn events(
    State(a): State<Arc<Agent>>,
    headers: HeaderMap,
    q: Result<Query<EventsQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Response, ApiError> {
    let q = query(q)?;
    let sse = match q.format.as_deref() {
        Some("sse") => true,
        Some("ndjson") => false,
        Some(other) => {
            return Err(ApiError::invalid(format!(
                "format {other:?}: give sse or ndjson"
            )));
        }
        None => headers
            .get(header::ACCEPT)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.contains("text/event-stream")),
    };
    // An SSE client reconnecting sends the last id it saw.
    let since = q.since.or_else(|| {
        headers
            .get("last-event-id")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse().ok())
    });
    let since = since.unwrap_or_else(|| a.events().revision());
    let (backlog, rx) = a.events().subscribe(since);
    let shutdown = a.shutdown_signal();
    let head = futures_util::stream::iter(
        backlog
            .into_iter()
            .map(move |e| Ok::<_, std::convert::Infallible>(frame(&e, sse))),
    );
    struct Live {
        rx: tokio::sync::broadcast::Receiver<Event>,
        shutdown: tokio::sync::watch::Receiver<bool>,
        agent: Arc<Agent>,
        sse: bool,
    }
    let live = futures_util::stream::unfold(
        Live {
            rx,
            shutdown,
            agent: a,
            sse,
        },
        |mut s| async move {
            if *s.shutdown.borrow() {
                return None;
            }
            let keepalive = tokio::time::sleep(SSE_KEEPALIVE);
            tokio::select! {
                r = s.rx.recv() => match r {
                    Ok(e) => {
                        let f = frame(&e, s.sse);
                        Some((Ok(f), s))
                    }
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {
                        let e = Event {
                            revision: s.agent.events().revision(),
                            kind: EventKind::Resync,
                            data: serde_json::json!({ "reason": "the client fell behind" }),
                        };
                        let f = frame(&e, s.sse);
                        Some((Ok(f), s))
                    }
                    Err(tokio::sync::broadcast::error::RecvError::Closed) => None,
                },
                _ = s.shutdown.changed() => None,
                _ = keepalive, if s.sse => {
                    Some((Ok(axum::body::Bytes::from_static(b": keep-alive\n\n")), s))
                }
            }
        },
    );
    let mut r = Response::new(Body::from_stream(head.chain(live)));
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(if sse {
            "text/event-stream"
        } else {
            "application/x-ndjson"
        }),
    );
    r.headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    Ok(r)
}
