//! A Kubernetes API server stand-in on loopback: `/version`, `/apis` discovery, nodes,
//! ResourceClaims (read) and ResourceSlices (create, read, list with field and label selectors,
//! replace with resourceVersion checks, delete). It records every request, can answer the next
//! matching requests with an injected status (409, 403, 503, …), can be taken down (connections
//! refused) and brought back on the same port, and writes a kubeconfig that points at it.
//!
//! It is cheap enough to stand in for a cluster of a thousand nodes. A ResourceSlice is kept as
//! the JSON it will be served as, next to the fields its selectors and the tests read (name,
//! node, driver, pool, generation, labels, resourceVersion): a write is checked as JSON in one
//! pass that builds only its metadata, the stored text is the body with the server's metadata
//! put in, and a read or list copies stored text. The lock is held only to look up and change
//! the maps; bodies are read before and answers written after it, on the server's two threads.
//! Shared by the gpu-agent and CLI tests and the `publish` bench (`#[path]`).
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::{BTreeMap, VecDeque};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use http_body_util::{BodyExt as _, Full};
use hyper::body::{Bytes, Incoming};
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};

pub const TOKEN: &str = "stand-in-token";
pub const SLICES: &str = "/apis/resource.k8s.io/v1/resourceslices";

/// One request as the server saw it.
#[derive(Debug, Clone)]
pub struct Recorded {
    pub method: String,
    pub path: String,
    pub query: String,
    /// The body's size in bytes.
    pub body_len: usize,
}

impl Recorded {
    pub fn is_write(&self) -> bool {
        matches!(self.method.as_str(), "POST" | "PUT" | "DELETE" | "PATCH")
    }
}

/// An answer to give instead of the real one.
#[derive(Debug, Clone)]
pub struct Fault {
    pub method: &'static str,
    pub path_prefix: String,
    pub code: u16,
    pub times: usize,
}

/// A change made to the stored objects under a writer (see [`State::edit_slices`]).
pub type Tamper = Box<dyn FnOnce(&mut State) + Send>;

/// A stored ResourceSlice: the JSON it is served as, and the fields selectors and tests read.
#[derive(Debug, Clone)]
pub struct Stored {
    /// The object as the server holds it.
    pub json: Bytes,
    pub name: String,
    pub node: Option<String>,
    pub driver: Option<String>,
    pub pool: Option<String>,
    pub generation: Option<i64>,
    pub labels: BTreeMap<String, String>,
    pub resource_version: String,
    pub uid: String,
}

impl Stored {
    /// The object as a JSON value.
    pub fn value(&self) -> Value {
        serde_json::from_slice(&self.json).unwrap()
    }

    fn field(&self, key: &str) -> Option<String> {
        match key {
            "spec.driver" => self.driver.clone(),
            "spec.nodeName" => self.node.clone(),
            "spec.pool.name" => self.pool.clone(),
            "metadata.name" => Some(self.name.clone()),
            _ => None,
        }
    }
}

/// What a write's body says, read in one pass that skips the devices and counters.
#[derive(serde::Deserialize)]
struct Head {
    #[serde(default)]
    metadata: Option<serde_json::Map<String, Value>>,
    #[serde(default)]
    spec: Option<SpecKeys>,
}

#[derive(serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct SpecKeys {
    driver: Option<String>,
    node_name: Option<String>,
    pool: Option<PoolKeys>,
}

#[derive(serde::Deserialize)]
struct PoolKeys {
    name: Option<String>,
    generation: Option<i64>,
}

/// A write's body: checked as JSON, its metadata parsed, the rest kept as text.
pub struct Body {
    bytes: Bytes,
    head: Head,
}

impl Body {
    fn parse(bytes: Bytes) -> Result<Self, String> {
        let head: Head = serde_json::from_slice(&bytes).map_err(|e| e.to_string())?;
        Ok(Body { bytes, head })
    }

    fn name(&self) -> Option<String> {
        self.meta_str("name")
    }

    fn meta_str(&self, key: &str) -> Option<String> {
        self.head
            .metadata
            .as_ref()?
            .get(key)?
            .as_str()
            .map(str::to_owned)
    }

    fn has_resource_version(&self) -> bool {
        self.head
            .metadata
            .as_ref()
            .and_then(|m| m.get("resourceVersion"))
            .is_some_and(|v| !v.is_null())
    }

    /// The object to store: the body with the server's `resourceVersion` and `uid` in its
    /// metadata.
    fn into_stored(self, resource_version: String, uid: String) -> Stored {
        let mut meta = self.head.metadata.unwrap_or_default();
        meta.insert(
            "resourceVersion".into(),
            Value::String(resource_version.clone()),
        );
        meta.insert("uid".into(), Value::String(uid.clone()));
        let labels = meta
            .get("labels")
            .and_then(Value::as_object)
            .map(|l| {
                l.iter()
                    .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_owned())))
                    .collect()
            })
            .unwrap_or_default();
        let mut json = Vec::with_capacity(self.bytes.len() + 96);
        json.push(b'{');
        let mut first = true;
        let mut put = |json: &mut Vec<u8>, key: &[u8], value: &[u8]| {
            if !first {
                json.push(b',');
            }
            first = false;
            json.extend_from_slice(key);
            json.push(b':');
            json.extend_from_slice(value);
        };
        let mut had_meta = false;
        for m in members(&self.bytes) {
            if m.key == "metadata" {
                had_meta = true;
                put(&mut json, m.raw_key, &serde_json::to_vec(&meta).unwrap());
            } else {
                put(&mut json, m.raw_key, m.value);
            }
        }
        if !had_meta {
            put(
                &mut json,
                b"\"metadata\"",
                &serde_json::to_vec(&meta).unwrap(),
            );
        }
        json.push(b'}');
        let spec = self.head.spec;
        let pool = spec.as_ref().and_then(|s| s.pool.as_ref());
        Stored {
            name: meta
                .get("name")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_owned(),
            node: spec.as_ref().and_then(|s| s.node_name.clone()),
            driver: spec.as_ref().and_then(|s| s.driver.clone()),
            pool: pool.and_then(|p| p.name.clone()),
            generation: pool.and_then(|p| p.generation),
            labels,
            resource_version,
            uid,
            json: Bytes::from(json),
        }
    }
}

/// One member of a JSON object, as text.
struct Member<'a> {
    /// The key as written (quoted, maybe escaped).
    raw_key: &'a [u8],
    /// The key.
    key: String,
    /// The value as written.
    value: &'a [u8],
}

/// The members of the JSON object `b` (already checked as JSON).
fn members(b: &[u8]) -> Vec<Member<'_>> {
    let mut out = Vec::new();
    let mut i = skip_ws(b, 0);
    if b.get(i) != Some(&b'{') {
        return out;
    }
    i += 1;
    loop {
        i = skip_ws(b, i);
        match b.get(i) {
            None | Some(b'}') => break,
            Some(b',') => {
                i += 1;
                continue;
            }
            _ => {}
        }
        let key_end = value_end(b, i);
        let raw_key = &b[i..key_end];
        let key: String = serde_json::from_slice(raw_key).unwrap_or_default();
        i = skip_ws(b, key_end) + 1; // the ':'
        i = skip_ws(b, i);
        let start = i;
        i = value_end(b, i);
        out.push(Member {
            raw_key,
            key,
            value: &b[start..i],
        });
    }
    out
}

fn skip_ws(b: &[u8], mut i: usize) -> usize {
    while b.get(i).is_some_and(u8::is_ascii_whitespace) {
        i += 1;
    }
    i
}

/// The index just past the JSON value that starts at `i`.
fn value_end(b: &[u8], i: usize) -> usize {
    let string_end = |mut j: usize| {
        j += 1;
        while j < b.len() {
            match b[j] {
                b'\\' => j += 2,
                b'"' => return j + 1,
                _ => j += 1,
            }
        }
        b.len()
    };
    match b.get(i) {
        Some(b'"') => string_end(i),
        Some(b'{' | b'[') => {
            let mut depth = 0usize;
            let mut j = i;
            while j < b.len() {
                match b[j] {
                    b'"' => {
                        j = string_end(j);
                        continue;
                    }
                    b'{' | b'[' => depth += 1,
                    b'}' | b']' => {
                        depth -= 1;
                        if depth == 0 {
                            return j + 1;
                        }
                    }
                    _ => {}
                }
                j += 1;
            }
            b.len()
        }
        _ => {
            let mut j = i;
            while j < b.len() && !matches!(b[j], b',' | b'}' | b']') && !b[j].is_ascii_whitespace()
            {
                j += 1;
            }
            j
        }
    }
}

#[derive(Default)]
pub struct State {
    pub git_version: String,
    pub has_resource_v1: bool,
    pub nodes: BTreeMap<String, Value>,
    pub slices: BTreeMap<String, Stored>,
    /// Slice names by `spec.nodeName`, for lists that select a node (entries may name slices
    /// removed behind the server's back; the list checks).
    pub by_node: BTreeMap<String, std::collections::BTreeSet<String>>,
    pub claims: BTreeMap<(String, String), Value>,
    pub rv: u64,
    pub requests: Vec<Recorded>,
    pub faults: VecDeque<Fault>,
    /// Called (once) before a PUT is applied: lets a test change the objects under the writer.
    pub before_put: Option<Tamper>,
    /// Time spent routing (under the state's lock), all requests together.
    pub busy: std::time::Duration,
    /// Answers generated as they are sent instead of the real ones (see [`ApiServer::hostile`]).
    pub hostile: Vec<Hostile>,
    /// How long a ResourceClaim read waits before it is answered.
    pub claim_delay: std::time::Duration,
}

/// A huge answer, generated as it is sent (never held whole): a ResourceSliceList whose items
/// never end, or a ResourceClaim with an annotation as long as asked.
#[derive(Debug, Clone)]
pub struct Hostile {
    pub method: &'static str,
    pub path_prefix: String,
    /// The answer's size.
    pub bytes: u64,
    /// Announce the size in `Content-Length` (else the answer is chunked).
    pub announce: bool,
    /// A list of slices (`true`) or one claim.
    pub list: bool,
    /// Bytes sent so far, all answers together.
    pub sent: Arc<std::sync::atomic::AtomicU64>,
}

impl State {
    /// Changes every stored slice with `f`, as another writer would: each gets a new
    /// `resourceVersion`.
    pub fn edit_slices(&mut self, mut f: impl FnMut(&mut Value)) {
        let names: Vec<String> = self.slices.keys().cloned().collect();
        for name in names {
            let Some(old) = self.slices.get(&name) else {
                continue;
            };
            let uid = old.uid.clone();
            let mut v = old.value();
            f(&mut v);
            self.rv += 1;
            let body = Body::parse(Bytes::from(serde_json::to_vec(&v).unwrap())).unwrap();
            let stored = body.into_stored(self.rv.to_string(), uid);
            self.slices.insert(name, stored);
        }
    }
}

/// Requests being answered now, and the most at once.
#[derive(Default)]
pub struct InFlight {
    now: std::sync::atomic::AtomicUsize,
    peak: std::sync::atomic::AtomicUsize,
}

impl InFlight {
    fn enter(&self) {
        use std::sync::atomic::Ordering::SeqCst;
        let n = self.now.fetch_add(1, SeqCst) + 1;
        self.peak.fetch_max(n, SeqCst);
    }
    fn leave(&self) {
        self.now.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
    }
}

pub struct ApiServer {
    pub addr: SocketAddr,
    pub state: Arc<Mutex<State>>,
    in_flight: Arc<InFlight>,
    up: tokio::sync::watch::Sender<bool>,
    thread: Option<std::thread::JoinHandle<()>>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    dir: tempfile::TempDir,
}

impl ApiServer {
    /// A server reporting `git_version` (`v1.35.0`), with `resource.k8s.io/v1`.
    pub fn start(git_version: &str) -> Self {
        Self::start_with(git_version, true)
    }

    pub fn start_with(git_version: &str, has_resource_v1: bool) -> Self {
        let state = Arc::new(Mutex::new(State {
            git_version: git_version.to_owned(),
            has_resource_v1,
            rv: 100,
            ..State::default()
        }));
        let std_listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = std_listener.local_addr().unwrap();
        std_listener.set_nonblocking(true).unwrap();
        let (up, up_rx) = tokio::sync::watch::channel(true);
        let (stop, stop_rx) = tokio::sync::oneshot::channel();
        let st = state.clone();
        let in_flight = Arc::new(InFlight::default());
        let counting = Arc::clone(&in_flight);
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(run(std_listener, addr, st, counting, up_rx, stop_rx));
        });
        let dir = tempfile::tempdir().unwrap();
        Self {
            addr,
            state,
            in_flight,
            up,
            thread: Some(thread),
            stop: Some(stop),
            dir,
        }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// A kubeconfig naming this server and the bearer token it accepts.
    pub fn kubeconfig(&self) -> PathBuf {
        self.kubeconfig_with_token(TOKEN)
    }

    pub fn kubeconfig_with_token(&self, token: &str) -> PathBuf {
        let path = self.dir.path().join(format!("kubeconfig-{token}"));
        write_kubeconfig(&path, &self.url(), token);
        path
    }

    pub fn add_node(&self, name: &str, uid: &str) {
        let mut s = self.state.lock().unwrap();
        s.rv += 1;
        let rv = s.rv.to_string();
        s.nodes.insert(
            name.to_owned(),
            json!({"apiVersion": "v1", "kind": "Node",
                   "metadata": {"name": name, "uid": uid, "resourceVersion": rv}}),
        );
    }

    pub fn add_claim(&self, namespace: &str, name: &str, doc: Value) {
        self.state
            .lock()
            .unwrap()
            .claims
            .insert((namespace.to_owned(), name.to_owned()), doc);
    }

    pub fn fail(&self, method: &'static str, path_prefix: &str, code: u16, times: usize) {
        self.state.lock().unwrap().faults.push_back(Fault {
            method,
            path_prefix: path_prefix.to_owned(),
            code,
            times,
        });
    }

    /// Refuse connections (and drop the open ones) until [`ApiServer::bring_up`].
    pub fn take_down(&self) {
        let _ = self.up.send(false);
    }

    pub fn bring_up(&self) {
        let _ = self.up.send(true);
    }

    /// Answers the requests matching `method` and `path_prefix` with a huge document of
    /// `bytes`, generated as it is sent; returns the count of bytes sent.
    pub fn hostile(
        &self,
        method: &'static str,
        path_prefix: &str,
        bytes: u64,
        announce: bool,
        list: bool,
    ) -> Arc<std::sync::atomic::AtomicU64> {
        let sent = Arc::new(std::sync::atomic::AtomicU64::new(0));
        self.state.lock().unwrap().hostile.push(Hostile {
            method,
            path_prefix: path_prefix.to_owned(),
            bytes,
            announce,
            list,
            sent: Arc::clone(&sent),
        });
        sent
    }

    /// Makes every ResourceClaim read wait `delay` before it is answered.
    pub fn delay_claims(&self, delay: std::time::Duration) {
        self.state.lock().unwrap().claim_delay = delay;
    }

    /// How many ResourceClaim reads were asked for.
    pub fn claim_reads(&self) -> usize {
        self.requests()
            .iter()
            .filter(|r| r.method == "GET" && r.path.contains("/resourceclaims/"))
            .count()
    }

    pub fn requests(&self) -> Vec<Recorded> {
        self.state.lock().unwrap().requests.clone()
    }

    pub fn writes(&self) -> Vec<Recorded> {
        self.requests()
            .into_iter()
            .filter(Recorded::is_write)
            .collect()
    }

    pub fn clear_requests(&self) {
        self.state.lock().unwrap().requests.clear();
    }

    /// The stored slices, by name.
    pub fn slices(&self) -> BTreeMap<String, Value> {
        let stored: Vec<(String, Bytes)> = self
            .state
            .lock()
            .unwrap()
            .slices
            .iter()
            .map(|(n, s)| (n.clone(), s.json.clone()))
            .collect();
        stored
            .into_iter()
            .map(|(n, j)| (n, serde_json::from_slice(&j).unwrap()))
            .collect()
    }

    /// How many slices are stored.
    pub fn slice_count(&self) -> usize {
        self.state.lock().unwrap().slices.len()
    }

    /// The pools (`spec.pool.name`) the stored slices belong to, with each pool's generations.
    pub fn pools(&self) -> BTreeMap<String, std::collections::BTreeSet<i64>> {
        let s = self.state.lock().unwrap();
        let mut out: BTreeMap<String, std::collections::BTreeSet<i64>> = BTreeMap::new();
        for v in s.slices.values() {
            let pool = v.pool.clone().unwrap_or_default();
            out.entry(pool)
                .or_default()
                .insert(v.generation.unwrap_or(-1));
        }
        out
    }

    /// The most requests the server was answering at once.
    pub fn peak_in_flight(&self) -> usize {
        self.in_flight
            .peak
            .load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Time the server spent under its lock, all requests together.
    pub fn busy(&self) -> std::time::Duration {
        self.state.lock().unwrap().busy
    }
}

impl Drop for ApiServer {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

pub fn write_kubeconfig(path: &Path, server: &str, token: &str) {
    let text = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: stand-in\n  cluster:\n    server: {server}\n\
         users:\n- name: agent\n  user:\n    token: {token}\ncontexts:\n- name: stand-in\n  context:\n    \
         cluster: stand-in\n    user: agent\ncurrent-context: stand-in\n"
    );
    std::fs::write(path, text).unwrap();
}

async fn run(
    first: std::net::TcpListener,
    addr: SocketAddr,
    state: Arc<Mutex<State>>,
    in_flight: Arc<InFlight>,
    mut up: tokio::sync::watch::Receiver<bool>,
    mut stop: tokio::sync::oneshot::Receiver<()>,
) {
    let mut listener = Some(tokio::net::TcpListener::from_std(first).unwrap());
    let mut conns = tokio::task::JoinSet::new();
    loop {
        if *up.borrow() && listener.is_none() {
            // The port was ours a moment ago; bind it again (retry while the kernel lets go).
            for _ in 0..200 {
                match tokio::net::TcpListener::bind(addr).await {
                    Ok(l) => {
                        listener = Some(l);
                        break;
                    }
                    Err(_) => tokio::time::sleep(std::time::Duration::from_millis(10)).await,
                }
            }
        }
        let accept = async {
            match &listener {
                Some(l) => l.accept().await.ok(),
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = &mut stop => break,
            changed = up.changed() => {
                if changed.is_err() { break; }
                if !*up.borrow() {
                    listener = None;
                    conns.abort_all();
                }
            }
            got = accept => {
                if let Some((stream, _)) = got {
                    // As an API server: answers are not held back waiting for an ACK.
                    let _ = stream.set_nodelay(true);
                    let st = state.clone();
                    let counting = Arc::clone(&in_flight);
                    conns.spawn(async move {
                        let svc = hyper::service::service_fn(move |req| {
                            let st = st.clone();
                            let counting = Arc::clone(&counting);
                            async move {
                                counting.enter();
                                let r = handle(&st, req).await;
                                counting.leave();
                                Ok::<_, Infallible>(r)
                            }
                        });
                        let _ = hyper::server::conn::http1::Builder::new()
                            .serve_connection(TokioIo::new(stream), svc)
                            .await;
                    });
                }
            }
        }
        while conns.try_join_next().is_some() {}
    }
    conns.abort_all();
}

/// An answer, serialized once the lock is let go.
pub enum Reply {
    /// A document built for this answer.
    Doc(u16, Value),
    /// A stored object's JSON.
    Stored(u16, Bytes),
    /// A list of stored objects.
    List {
        kind: &'static str,
        api_version: &'static str,
        resource_version: String,
        items: Vec<Bytes>,
    },
}

impl Reply {
    fn into_response(self) -> Response<Full<Bytes>> {
        let (code, bytes) = match self {
            Reply::Doc(code, v) => (code, serde_json::to_vec(&v).unwrap()),
            Reply::Stored(code, v) => (code, v.to_vec()),
            Reply::List {
                kind,
                api_version,
                resource_version,
                items,
            } => {
                let mut out = serde_json::to_vec(&json!({
                    "kind": kind, "apiVersion": api_version,
                    "metadata": {"resourceVersion": resource_version}}))
                .unwrap();
                // The head without its closing brace, then the items one by one.
                out.pop();
                out.extend_from_slice(b",\"items\":[");
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        out.push(b',');
                    }
                    out.extend_from_slice(item);
                }
                out.extend_from_slice(b"]}");
                (200, out)
            }
        };
        let mut r = Response::new(Full::new(Bytes::from(bytes)));
        *r.status_mut() = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        r.headers_mut().insert(
            hyper::header::CONTENT_TYPE,
            hyper::header::HeaderValue::from_static("application/json"),
        );
        r
    }
}

fn answer(code: u16, body: &Value) -> Reply {
    Reply::Doc(code, body.clone())
}

fn status(code: u16, reason: &str, message: &str) -> Reply {
    Reply::Doc(
        code,
        json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                "message": message, "reason": reason, "code": code}),
    )
}

fn reason_of(code: u16) -> &'static str {
    match code {
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "NotFound",
        409 => "Conflict",
        429 => "TooManyRequests",
        500 => "InternalError",
        _ => "ServiceUnavailable",
    }
}

fn query_param(query: &str, key: &str) -> Option<String> {
    query.split('&').find_map(|kv| {
        let (k, v) = kv.split_once('=')?;
        (k == key).then(|| percent_decode(v))
    })
}

fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' && i + 2 < b.len() {
            if let Ok(v) = u8::from_str_radix(&s[i + 1..i + 3], 16) {
                out.push(v);
                i += 3;
                continue;
            }
        }
        out.push(if b[i] == b'+' { b' ' } else { b[i] });
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// `a=b,c=d` selectors over a field getter.
fn selected(selector: Option<&str>, get: impl Fn(&str) -> Option<String>) -> bool {
    let Some(sel) = selector else { return true };
    sel.split(',').filter(|t| !t.is_empty()).all(|term| {
        let (k, v) = term
            .split_once("==")
            .or_else(|| term.split_once('='))
            .unwrap_or((term, ""));
        get(k).as_deref() == Some(v)
    })
}

fn index(s: &mut State, stored: &Stored) {
    if let Some(n) = &stored.node {
        s.by_node
            .entry(n.clone())
            .or_default()
            .insert(stored.name.clone());
    }
}

async fn handle(state: &Arc<Mutex<State>>, req: Request<Incoming>) -> Response<Answer> {
    let (method, path) = (
        req.method().as_str().to_owned(),
        req.uri().path().to_owned(),
    );
    let (hostile, delay) = {
        let s = state.lock().unwrap();
        let h = s
            .hostile
            .iter()
            .find(|h| h.method == method && path.starts_with(&h.path_prefix))
            .cloned();
        let d = if path.contains("/resourceclaims/") {
            s.claim_delay
        } else {
            std::time::Duration::ZERO
        };
        (h, d)
    };
    if !delay.is_zero() {
        tokio::time::sleep(delay).await;
    }
    if let Some(h) = hostile {
        state.lock().unwrap().requests.push(Recorded {
            method,
            path,
            query: req.uri().query().unwrap_or("").to_owned(),
            body_len: 0,
        });
        return Generated::response(h);
    }
    reply(state, req).await.into_response().map(Answer::Full)
}

/// An answer's body: built whole, or generated as it is sent.
pub enum Answer {
    Full(Full<Bytes>),
    Generated(Generated),
}

impl hyper::body::Body for Answer {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<Bytes>, Infallible>>> {
        match self.get_mut() {
            Answer::Full(f) => std::pin::Pin::new(f).poll_frame(cx),
            Answer::Generated(g) => {
                std::task::Poll::Ready(g.next_chunk().map(|b| Ok(hyper::body::Frame::data(b))))
            }
        }
    }
}

/// A huge JSON document produced 64 KiB at a time.
pub struct Generated {
    head: Option<Bytes>,
    left: u64,
    tail: Option<Bytes>,
    chunk: Bytes,
    sent: Arc<std::sync::atomic::AtomicU64>,
}

impl Generated {
    const CHUNK: usize = 64 * 1024;

    fn response(h: Hostile) -> Response<Answer> {
        let (head, item, tail): (&[u8], &[u8], &[u8]) = if h.list {
            (
                br#"{"kind":"ResourceSliceList","apiVersion":"resource.k8s.io/v1","metadata":{"resourceVersion":"1"},"items":[{"metadata":{"name":"s"}}"#,
                br#",{"metadata":{"name":"s"}}"#,
                b"]}",
            )
        } else {
            (
                br#"{"apiVersion":"resource.k8s.io/v1","kind":"ResourceClaim","metadata":{"name":"huge","namespace":"default","uid":"u","annotations":{"pad":""#,
                b"xxxxxxxxxxxxxxxxxxxxxxxxx",
                br#""}}}"#,
            )
        };
        let mut chunk = Vec::with_capacity(Self::CHUNK);
        while chunk.len() + item.len() <= Self::CHUNK {
            chunk.extend_from_slice(item);
        }
        let fixed = (head.len() + tail.len()) as u64;
        let chunks = h.bytes.saturating_sub(fixed) / chunk.len() as u64;
        let total = fixed + chunks * chunk.len() as u64;
        let mut r = Response::new(Answer::Generated(Generated {
            head: Some(Bytes::from_static(head)),
            left: chunks,
            tail: Some(Bytes::from_static(tail)),
            chunk: Bytes::from(chunk),
            sent: h.sent,
        }));
        r.headers_mut().insert(
            hyper::header::CONTENT_TYPE,
            hyper::header::HeaderValue::from_static("application/json"),
        );
        if h.announce {
            r.headers_mut().insert(
                hyper::header::CONTENT_LENGTH,
                hyper::header::HeaderValue::from(total),
            );
        }
        r
    }

    fn next_chunk(&mut self) -> Option<Bytes> {
        let b = if let Some(h) = self.head.take() {
            h
        } else if self.left > 0 {
            self.left -= 1;
            self.chunk.clone()
        } else {
            self.tail.take()?
        };
        self.sent
            .fetch_add(b.len() as u64, std::sync::atomic::Ordering::Relaxed);
        Some(b)
    }
}

async fn reply(state: &Arc<Mutex<State>>, req: Request<Incoming>) -> Reply {
    let method = req.method().as_str().to_owned();
    let path = req.uri().path().to_owned();
    let query = req.uri().query().unwrap_or("").to_owned();
    let authorized = req
        .headers()
        .get(hyper::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        == Some(&format!("Bearer {TOKEN}"));
    let bytes = match req.into_body().collect().await {
        Ok(b) => b.to_bytes(),
        Err(_) => return status(400, "BadRequest", "body"),
    };
    // Checked and read before the lock is taken.
    let body_len = bytes.len();
    let body = if bytes.is_empty() {
        None
    } else {
        match Body::parse(bytes) {
            Ok(b) => Some(b),
            Err(e) => return status(400, "BadRequest", &format!("body is not JSON: {e}")),
        }
    };
    let mut s = state.lock().unwrap();
    s.requests.push(Recorded {
        method: method.clone(),
        path: path.clone(),
        query: query.clone(),
        body_len,
    });
    if !authorized {
        return status(401, "Unauthorized", "Unauthorized");
    }
    let fault = s
        .faults
        .iter()
        .position(|f| f.method == method && path.starts_with(&f.path_prefix));
    if let Some(i) = fault {
        let f = &mut s.faults[i];
        let code = f.code;
        f.times -= 1;
        if f.times == 0 {
            s.faults.remove(i);
        }
        return status(code, reason_of(code), "injected by the stand-in");
    }
    let routed = std::time::Instant::now();
    let r = route(&mut s, &method, &path, &query, body);
    s.busy += routed.elapsed();
    r
}

fn route(s: &mut State, method: &str, path: &str, query: &str, body: Option<Body>) -> Reply {
    let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
    match (method, parts.as_slice()) {
        ("GET", ["version"]) => {
            let v = s.git_version.trim_start_matches('v').to_owned();
            let mut it = v.split('.');
            let major = it.next().unwrap_or("1").to_owned();
            let minor = it.next().unwrap_or("0").to_owned();
            Reply::Doc(
                200,
                json!({"major": major, "minor": minor, "gitVersion": s.git_version,
                        "gitCommit": "0", "gitTreeState": "clean", "buildDate": "2026-01-01T00:00:00Z",
                        "goVersion": "go1.25", "compiler": "gc", "platform": "linux/amd64"}),
            )
        }
        ("GET", ["apis"]) => {
            let mut versions =
                vec![json!({"groupVersion": "resource.k8s.io/v1beta2", "version": "v1beta2"})];
            if s.has_resource_v1 {
                versions.insert(
                    0,
                    json!({"groupVersion": "resource.k8s.io/v1", "version": "v1"}),
                );
            }
            let preferred = versions[0].clone();
            Reply::Doc(
                200,
                json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": [
                    {"name": "resource.k8s.io", "versions": versions,
                     "preferredVersion": preferred}]}),
            )
        }
        ("GET", ["apis", "resource.k8s.io", "v1"]) if s.has_resource_v1 => Reply::Doc(
            200,
            json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": "resource.k8s.io/v1",
                    "resources": [
                        {"name": "resourceslices", "singularName": "resourceslice", "namespaced": false,
                         "kind": "ResourceSlice", "verbs": ["create","delete","get","list","update","watch"]},
                        {"name": "resourceclaims", "singularName": "resourceclaim", "namespaced": true,
                         "kind": "ResourceClaim", "verbs": ["get","list","watch"]}]}),
        ),
        ("GET", ["api", "v1", "nodes", name]) => match s.nodes.get(*name) {
            Some(n) => answer(200, n),
            None => status(404, "NotFound", &format!("nodes \"{name}\" not found")),
        },
        (
            "GET",
            [
                "apis",
                "resource.k8s.io",
                "v1",
                "namespaces",
                ns,
                "resourceclaims",
                name,
            ],
        ) if s.has_resource_v1 => match s.claims.get(&((*ns).to_owned(), (*name).to_owned())) {
            Some(c) => answer(200, c),
            None => status(
                404,
                "NotFound",
                &format!("resourceclaims \"{name}\" not found"),
            ),
        },
        (_, ["apis", "resource.k8s.io", "v1", "resourceslices", rest @ ..])
            if s.has_resource_v1 =>
        {
            slices(s, method, rest.first().copied(), query, body)
        }
        _ => status(
            404,
            "NotFound",
            &format!("the server could not find {path}"),
        ),
    }
}

fn not_found(n: &str) -> Reply {
    status(
        404,
        "NotFound",
        &format!("resourceslices.resource.k8s.io \"{n}\" not found"),
    )
}

fn slices(
    s: &mut State,
    method: &str,
    name: Option<&str>,
    query: &str,
    body: Option<Body>,
) -> Reply {
    match (method, name) {
        ("GET", None) => {
            let fields = query_param(query, "fieldSelector");
            let labels = query_param(query, "labelSelector");
            let node = fields.as_deref().and_then(|f| {
                f.split(',')
                    .find_map(|t| t.strip_prefix("spec.nodeName="))
                    .map(str::to_owned)
            });
            let candidates: Vec<&Stored> = match &node {
                Some(n) => s
                    .by_node
                    .get(n)
                    .into_iter()
                    .flatten()
                    .filter_map(|name| s.slices.get(name))
                    .collect(),
                None => s.slices.values().collect(),
            };
            let items: Vec<Bytes> = candidates
                .into_iter()
                .filter(|v| selected(fields.as_deref(), |k| v.field(k)))
                .filter(|v| selected(labels.as_deref(), |k| v.labels.get(k).cloned()))
                .map(|v| v.json.clone())
                .collect();
            Reply::List {
                kind: "ResourceSliceList",
                api_version: "resource.k8s.io/v1",
                resource_version: s.rv.to_string(),
                items,
            }
        }
        ("GET", Some(n)) => match s.slices.get(n) {
            Some(v) => Reply::Stored(200, v.json.clone()),
            None => not_found(n),
        },
        ("POST", None) => {
            let Some(body) = body else {
                return status(400, "BadRequest", "no body");
            };
            let Some(n) = body.name() else {
                return status(422, "Invalid", "metadata.name: Required value");
            };
            if s.slices.contains_key(&n) {
                return status(
                    409,
                    "AlreadyExists",
                    &format!("resourceslices.resource.k8s.io \"{n}\" already exists"),
                );
            }
            if body.has_resource_version() {
                return status(
                    422,
                    "Invalid",
                    "metadata.resourceVersion: must be empty on create",
                );
            }
            s.rv += 1;
            let stored = body.into_stored(s.rv.to_string(), format!("slice-uid-{}", s.rv));
            index(s, &stored);
            let json = stored.json.clone();
            s.slices.insert(n, stored);
            Reply::Stored(201, json)
        }
        ("PUT", Some(n)) => {
            let Some(body) = body else {
                return status(400, "BadRequest", "no body");
            };
            if let Some(f) = s.before_put.take() {
                f(s);
            }
            let Some(current) = s.slices.get(n) else {
                return not_found(n);
            };
            if body.meta_str("resourceVersion").as_deref()
                != Some(current.resource_version.as_str())
            {
                return status(
                    409,
                    "Conflict",
                    &format!(
                        "Operation cannot be fulfilled on resourceslices.resource.k8s.io \"{n}\": the object has been modified; please apply your changes to the latest version and try again"
                    ),
                );
            }
            let uid = current.uid.clone();
            s.rv += 1;
            let stored = body.into_stored(s.rv.to_string(), uid);
            index(s, &stored);
            let json = stored.json.clone();
            s.slices.insert(n.to_owned(), stored);
            Reply::Stored(200, json)
        }
        ("DELETE", Some(n)) => match s.slices.remove(n) {
            Some(v) => {
                s.rv += 1;
                Reply::Stored(200, v.json)
            }
            None => not_found(n),
        },
        _ => status(405, "MethodNotAllowed", "method not allowed"),
    }
}
