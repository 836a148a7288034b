//! A Kubernetes API server stand-in on loopback: `/version`, `/apis` discovery, nodes,
//! ResourceClaims (read) and ResourceSlices (create, read, list with field and label selectors,
//! replace with resourceVersion checks, delete). It records every request, can answer the next
//! matching requests with an injected status (409, 403, 503, …), can be taken down (connections
//! refused) and brought back on the same port, and writes a kubeconfig that points at it.
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

/// A change made to the stored slices (and the resourceVersion counter) under a writer.
pub type Tamper = Box<dyn FnOnce(&mut BTreeMap<String, Value>, &mut u64) + Send>;

#[derive(Default)]
pub struct State {
    pub git_version: String,
    pub has_resource_v1: bool,
    pub nodes: BTreeMap<String, Value>,
    pub slices: BTreeMap<String, Value>,
    /// Slice names by `spec.nodeName`, for lists that select a node (entries may name slices
    /// removed behind the server's back; the list checks).
    pub by_node: BTreeMap<String, std::collections::BTreeSet<String>>,
    pub claims: BTreeMap<(String, String), Value>,
    pub rv: u64,
    pub requests: Vec<Recorded>,
    pub faults: VecDeque<Fault>,
    /// Called (once) before a PUT is applied: lets a test change the object under the writer.
    pub before_put: Option<Tamper>,
    /// Time spent routing (under the state's lock), all requests together.
    pub busy: std::time::Duration,
}

pub struct ApiServer {
    pub addr: SocketAddr,
    pub state: Arc<Mutex<State>>,
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
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(run(std_listener, addr, st, up_rx, stop_rx));
        });
        let dir = tempfile::tempdir().unwrap();
        Self {
            addr,
            state,
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
        self.state.lock().unwrap().slices.clone()
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
                    let st = state.clone();
                    conns.spawn(async move {
                        let svc = hyper::service::service_fn(move |req| {
                            let st = st.clone();
                            async move { Ok::<_, Infallible>(handle(&st, req).await) }
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

fn answer(code: u16, body: &Value) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(body.to_string())));
    *r.status_mut() = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    r.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/json"),
    );
    r
}

fn status(code: u16, reason: &str, message: &str) -> Response<Full<Bytes>> {
    answer(
        code,
        &json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
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

fn index(s: &mut State, name: &str, obj: &Value) {
    if let Some(n) = obj["spec"]["nodeName"].as_str() {
        s.by_node
            .entry(n.to_owned())
            .or_default()
            .insert(name.to_owned());
    }
}

fn slice_field(s: &Value, key: &str) -> Option<String> {
    let v = match key {
        "spec.driver" => &s["spec"]["driver"],
        "spec.nodeName" => &s["spec"]["nodeName"],
        "spec.pool.name" => &s["spec"]["pool"]["name"],
        "metadata.name" => &s["metadata"]["name"],
        _ => return None,
    };
    v.as_str().map(str::to_owned)
}

async fn handle(state: &Arc<Mutex<State>>, req: Request<Incoming>) -> Response<Full<Bytes>> {
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
    let body: Option<Value> = if bytes.is_empty() {
        None
    } else {
        match serde_json::from_slice(&bytes) {
            Ok(v) => Some(v),
            Err(e) => return status(400, "BadRequest", &format!("body is not JSON: {e}")),
        }
    };
    let mut s = state.lock().unwrap();
    s.requests.push(Recorded {
        method: method.clone(),
        path: path.clone(),
        query: query.clone(),
        body_len: bytes.len(),
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

fn route(
    s: &mut State,
    method: &str,
    path: &str,
    query: &str,
    body: Option<Value>,
) -> Response<Full<Bytes>> {
    let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
    match (method, parts.as_slice()) {
        ("GET", ["version"]) => {
            let v = s.git_version.trim_start_matches('v').to_owned();
            let mut it = v.split('.');
            let major = it.next().unwrap_or("1").to_owned();
            let minor = it.next().unwrap_or("0").to_owned();
            answer(
                200,
                &json!({"major": major, "minor": minor, "gitVersion": s.git_version,
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
            answer(
                200,
                &json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": [
                    {"name": "resource.k8s.io", "versions": versions,
                     "preferredVersion": versions[0].clone()}]}),
            )
        }
        ("GET", ["apis", "resource.k8s.io", "v1"]) if s.has_resource_v1 => answer(
            200,
            &json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": "resource.k8s.io/v1",
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

fn slices(
    s: &mut State,
    method: &str,
    name: Option<&str>,
    query: &str,
    body: Option<Value>,
) -> Response<Full<Bytes>> {
    match (method, name) {
        ("GET", None) => {
            let fields = query_param(query, "fieldSelector");
            let labels = query_param(query, "labelSelector");
            let node = fields.as_deref().and_then(|f| {
                f.split(',')
                    .find_map(|t| t.strip_prefix("spec.nodeName="))
                    .map(str::to_owned)
            });
            let candidates: Vec<&Value> = match &node {
                Some(n) => s
                    .by_node
                    .get(n)
                    .into_iter()
                    .flatten()
                    .filter_map(|name| s.slices.get(name))
                    .collect(),
                None => s.slices.values().collect(),
            };
            let items: Vec<Value> = candidates
                .into_iter()
                .filter(|v| selected(fields.as_deref(), |k| slice_field(v, k)))
                .filter(|v| {
                    selected(labels.as_deref(), |k| {
                        v["metadata"]["labels"][k].as_str().map(str::to_owned)
                    })
                })
                .cloned()
                .collect();
            answer(
                200,
                &json!({"kind": "ResourceSliceList", "apiVersion": "resource.k8s.io/v1",
                        "metadata": {"resourceVersion": s.rv.to_string()}, "items": items}),
            )
        }
        ("GET", Some(n)) => match s.slices.get(n) {
            Some(v) => answer(200, v),
            None => status(
                404,
                "NotFound",
                &format!("resourceslices \"{n}\" not found"),
            ),
        },
        ("POST", None) => {
            let Some(mut obj) = body else {
                return status(400, "BadRequest", "no body");
            };
            let Some(n) = obj["metadata"]["name"].as_str().map(str::to_owned) else {
                return status(422, "Invalid", "metadata.name: Required value");
            };
            if s.slices.contains_key(&n) {
                return status(
                    409,
                    "AlreadyExists",
                    &format!("resourceslices \"{n}\" already exists"),
                );
            }
            if obj["metadata"]
                .get("resourceVersion")
                .is_some_and(|v| !v.is_null())
            {
                return status(
                    422,
                    "Invalid",
                    "metadata.resourceVersion: must be empty on create",
                );
            }
            s.rv += 1;
            obj["metadata"]["resourceVersion"] = json!(s.rv.to_string());
            obj["metadata"]["uid"] = json!(format!("slice-uid-{}", s.rv));
            index(s, &n, &obj);
            s.slices.insert(n, obj.clone());
            answer(201, &obj)
        }
        ("PUT", Some(n)) => {
            let Some(mut obj) = body else {
                return status(400, "BadRequest", "no body");
            };
            if let Some(f) = s.before_put.take() {
                let State { slices, rv, .. } = s;
                f(slices, rv);
            }
            let Some(current) = s.slices.get(n) else {
                return status(
                    404,
                    "NotFound",
                    &format!("resourceslices \"{n}\" not found"),
                );
            };
            let sent = obj["metadata"]["resourceVersion"].as_str().unwrap_or("");
            if sent
                != current["metadata"]["resourceVersion"]
                    .as_str()
                    .unwrap_or("-")
            {
                return status(
                    409,
                    "Conflict",
                    &format!(
                        "Operation cannot be fulfilled on resourceslices.resource.k8s.io \"{n}\": the object has been modified; please apply your changes to the latest version and try again"
                    ),
                );
            }
            let uid = current["metadata"]["uid"].clone();
            s.rv += 1;
            obj["metadata"]["resourceVersion"] = json!(s.rv.to_string());
            obj["metadata"]["uid"] = uid;
            index(s, n, &obj);
            s.slices.insert(n.to_owned(), obj.clone());
            answer(200, &obj)
        }
        ("DELETE", Some(n)) => match s.slices.remove(n) {
            Some(v) => {
                s.rv += 1;
                answer(200, &v)
            }
            None => status(
                404,
                "NotFound",
                &format!("resourceslices \"{n}\" not found"),
            ),
        },
        _ => status(405, "MethodNotAllowed", "method not allowed"),
    }
}
