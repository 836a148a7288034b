//! A Kubernetes API server stand-in on the guest's loopback (plain HTTP/1.1, one thread per
//! connection): `/version`, `/apis` discovery, the node, ResourceClaims (read) and ResourceSlices
//! (list, get, create, replace, delete), with a bearer token. Every request is recorded.

use std::collections::BTreeMap;
use std::io::{BufRead as _, BufReader, Read as _, Write as _};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value, json};

/// The token the stand-in accepts.
pub const TOKEN: &str = "lab-stand-in-token";

/// What the stand-in holds.
#[derive(Debug, Default)]
pub struct State {
    /// Claims by (namespace, name).
    pub claims: BTreeMap<(String, String), Value>,
    /// Slices by name.
    pub slices: BTreeMap<String, Value>,
    /// The resourceVersion counter.
    pub rv: u64,
    /// `METHOD path?query status` per request.
    pub requests: Vec<String>,
    /// The minor release and patch `/version` answers (Kubernetes 1.<minor>.<patch>).
    pub release: (u32, u32),
}

/// A running stand-in; it stops serving new connections when dropped (the guest powers off
/// soon after anyway).
pub struct ApiServer {
    /// `http://127.0.0.1:<port>`.
    pub url: String,
    /// Its state.
    pub state: Arc<Mutex<State>>,
}

impl ApiServer {
    /// Binds 127.0.0.1 on a free port and serves in a thread, as Kubernetes 1.34.0.
    pub fn start() -> Result<Self, String> {
        Self::start_as(34, 0)
    }

    /// As [`ApiServer::start`], answering `/version` as Kubernetes 1.`minor`.`patch` (the
    /// release picks the encoding the agent publishes).
    pub fn start_as(minor: u32, patch: u32) -> Result<Self, String> {
        let listener =
            TcpListener::bind("127.0.0.1:0").map_err(|e| format!("bind 127.0.0.1:0: {e}"))?;
        let addr = listener.local_addr().map_err(|e| e.to_string())?;
        let state = Arc::new(Mutex::new(State {
            rv: 100,
            release: (minor, patch),
            ..State::default()
        }));
        let st = Arc::clone(&state);
        std::thread::spawn(move || {
            for conn in listener.incoming().flatten() {
                let st = Arc::clone(&st);
                std::thread::spawn(move || serve(conn, &st));
            }
        });
        Ok(Self {
            url: format!("http://{addr}"),
            state,
        })
    }

    /// Adds (or replaces) a claim.
    pub fn put_claim(&self, namespace: &str, name: &str, doc: Value) {
        if let Ok(mut s) = self.state.lock() {
            s.claims
                .insert((namespace.to_owned(), name.to_owned()), doc);
        }
    }

    /// The slices as stored.
    pub fn slices(&self) -> BTreeMap<String, Value> {
        self.state
            .lock()
            .map(|s| s.slices.clone())
            .unwrap_or_default()
    }

    /// The requests so far, one line each.
    pub fn requests(&self) -> Vec<String> {
        self.state
            .lock()
            .map(|s| s.requests.clone())
            .unwrap_or_default()
    }

    /// A kubeconfig naming the stand-in and its token.
    pub fn kubeconfig(&self) -> String {
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: lab\n  cluster:\n    server: {}\nusers:\n- name: lab\n  user:\n    token: {TOKEN}\ncontexts:\n- name: lab\n  context:\n    cluster: lab\n    user: lab\ncurrent-context: lab\n",
            self.url
        )
    }
}

fn serve(conn: TcpStream, state: &Arc<Mutex<State>>) {
    let _ = conn.set_read_timeout(Some(Duration::from_secs(120)));
    let Ok(mut out) = conn.try_clone() else {
        return;
    };
    let mut r = BufReader::new(conn);
    loop {
        let mut line = String::new();
        match r.read_line(&mut line) {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
        let mut words = line.split_whitespace();
        let (Some(method), Some(target)) = (words.next(), words.next()) else {
            return;
        };
        let (method, target) = (method.to_owned(), target.to_owned());
        let mut length = 0usize;
        let mut auth = String::new();
        let mut close = false;
        loop {
            let mut h = String::new();
            match r.read_line(&mut h) {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
            let h = h.trim_end();
            if h.is_empty() {
                break;
            }
            let Some((k, v)) = h.split_once(':') else {
                return;
            };
            let (k, v) = (k.trim().to_ascii_lowercase(), v.trim());
            match k.as_str() {
                "content-length" => length = v.parse().unwrap_or(0),
                "authorization" => auth = v.to_owned(),
                "connection" => close = v.eq_ignore_ascii_case("close"),
                "transfer-encoding" => {
                    let _ = write_answer(
                        &mut out,
                        400,
                        &status(400, "BadRequest", "chunked bodies are not served"),
                    );
                    return;
                }
                _ => {}
            }
        }
        let mut body = vec![0u8; length.min(1 << 20)];
        if r.read_exact(&mut body).is_err() {
            return;
        }
        let (code, answer) = match state.lock() {
            Ok(mut s) => {
                let (code, answer) = if auth != format!("Bearer {TOKEN}") {
                    (401, status(401, "Unauthorized", "Unauthorized"))
                } else {
                    route(&mut s, &method, &target, &body)
                };
                s.requests.push(format!("{method} {target} {code}"));
                (code, answer)
            }
            Err(_) => (500, status(500, "InternalError", "state poisoned")),
        };
        if write_answer(&mut out, code, &answer).is_err() || close {
            return;
        }
    }
}

fn write_answer(out: &mut TcpStream, code: u16, body: &Value) -> std::io::Result<()> {
    let data = body.to_string();
    write!(
        out,
        "HTTP/1.1 {code} {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{data}",
        reason(code),
        data.len()
    )?;
    out.flush()
}

fn reason(code: u16) -> &'static str {
    match code {
        200 => "OK",
        201 => "Created",
        400 => "Bad Request",
        401 => "Unauthorized",
        404 => "Not Found",
        405 => "Method Not Allowed",
        409 => "Conflict",
        422 => "Unprocessable Entity",
        _ => "Internal Server Error",
    }
}

fn status(code: u16, reason: &str, message: &str) -> Value {
    json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
           "message": message, "reason": reason, "code": code})
}

fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' && i + 2 < b.len() {
            if let Ok(v) = u8::from_str_radix(s.get(i + 1..i + 3).unwrap_or(""), 16) {
                out.push(v);
                i += 3;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// `fieldSelector` terms `key=value` the slice list honours.
fn selected(slice: &Value, selector: &str) -> bool {
    selector.split(',').filter(|t| !t.is_empty()).all(|term| {
        let Some((k, v)) = term.split_once('=') else {
            return false;
        };
        let got = match k.trim_end_matches('=') {
            "spec.driver" => slice.pointer("/spec/driver"),
            "spec.nodeName" => slice.pointer("/spec/nodeName"),
            "spec.pool.name" => slice.pointer("/spec/pool/name"),
            "metadata.name" => slice.pointer("/metadata/name"),
            _ => None,
        };
        got.and_then(Value::as_str) == Some(v.trim_start_matches('='))
    })
}

fn route(s: &mut State, method: &str, target: &str, body: &[u8]) -> (u16, Value) {
    let (path, query) = target.split_once('?').unwrap_or((target, ""));
    let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
    let body: Option<Value> = if body.is_empty() {
        None
    } else {
        match serde_json::from_slice(body) {
            Ok(v) => Some(v),
            Err(e) => return (400, status(400, "BadRequest", &format!("not JSON: {e}"))),
        }
    };
    match (method, parts.as_slice()) {
        ("GET", ["version"]) => (
            200,
            json!({"major": "1", "minor": s.release.0.to_string(),
                   "gitVersion": format!("v1.{}.{}", s.release.0, s.release.1), "gitCommit": "0",
                   "gitTreeState": "clean", "buildDate": "2026-01-01T00:00:00Z",
                   "goVersion": "go1.24", "compiler": "gc", "platform": "linux/amd64"}),
        ),
        ("GET", ["apis"]) => {
            let v1 = json!({"groupVersion": "resource.k8s.io/v1", "version": "v1"});
            (
                200,
                json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": [
                    {"name": "resource.k8s.io", "versions": [v1.clone()], "preferredVersion": v1}]}),
            )
        }
        ("GET", ["apis", "resource.k8s.io", "v1"]) => (
            200,
            json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": "resource.k8s.io/v1",
                   "resources": [
                       {"name": "resourceslices", "singularName": "resourceslice", "namespaced": false,
                        "kind": "ResourceSlice", "verbs": ["create","delete","get","list","update","watch"]},
                       {"name": "resourceclaims", "singularName": "resourceclaim", "namespaced": true,
                        "kind": "ResourceClaim", "verbs": ["get","list","watch"]}]}),
        ),
        ("GET", ["api", "v1", "nodes", name]) => (
            200,
            json!({"apiVersion": "v1", "kind": "Node",
                   "metadata": {"name": name, "uid": format!("node-uid-{name}"), "resourceVersion": "1"}}),
        ),
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
        ) => match s.claims.get(&((*ns).to_owned(), (*name).to_owned())) {
            Some(c) => (200, c.clone()),
            None => (
                404,
                status(
                    404,
                    "NotFound",
                    &format!("resourceclaims.resource.k8s.io \"{name}\" not found"),
                ),
            ),
        },
        (_, ["apis", "resource.k8s.io", "v1", "resourceslices", rest @ ..]) => {
            slices(s, method, rest.first().copied(), query, body)
        }
        _ => (
            404,
            status(
                404,
                "NotFound",
                &format!("the server could not find {path}"),
            ),
        ),
    }
}

fn slices(
    s: &mut State,
    method: &str,
    name: Option<&str>,
    query: &str,
    body: Option<Value>,
) -> (u16, Value) {
    let not_found = |n: &str| {
        (
            404,
            status(
                404,
                "NotFound",
                &format!("resourceslices.resource.k8s.io \"{n}\" not found"),
            ),
        )
    };
    match (method, name, body) {
        ("GET", None, _) => {
            let selector = query
                .split('&')
                .find_map(|kv| kv.strip_prefix("fieldSelector="))
                .map(percent_decode)
                .unwrap_or_default();
            let items: Vec<Value> = s
                .slices
                .values()
                .filter(|v| selected(v, &selector))
                .cloned()
                .collect();
            (
                200,
                json!({"kind": "ResourceSliceList", "apiVersion": "resource.k8s.io/v1",
                       "metadata": {"resourceVersion": s.rv.to_string()}, "items": items}),
            )
        }
        ("GET", Some(n), _) => match s.slices.get(n) {
            Some(v) => (200, v.clone()),
            None => not_found(n),
        },
        ("POST", None, Some(mut obj)) => {
            let Some(n) = obj
                .pointer("/metadata/name")
                .and_then(Value::as_str)
                .map(str::to_owned)
            else {
                return (422, status(422, "Invalid", "metadata.name: Required value"));
            };
            if s.slices.contains_key(&n) {
                return (
                    409,
                    status(
                        409,
                        "AlreadyExists",
                        &format!("resourceslices \"{n}\" already exists"),
                    ),
                );
            }
            s.rv += 1;
            obj["metadata"]["resourceVersion"] = json!(s.rv.to_string());
            obj["metadata"]["uid"] = json!(format!("slice-uid-{}", s.rv));
            s.slices.insert(n, obj.clone());
            (201, obj)
        }
        ("PUT", Some(n), Some(mut obj)) => {
            let Some(current) = s.slices.get(n) else {
                return not_found(n);
            };
            if obj.pointer("/metadata/resourceVersion")
                != current.pointer("/metadata/resourceVersion")
            {
                return (
                    409,
                    status(
                        409,
                        "Conflict",
                        &format!("resourceslices \"{n}\": the object has been modified"),
                    ),
                );
            }
            let uid = current["metadata"]["uid"].clone();
            s.rv += 1;
            obj["metadata"]["resourceVersion"] = json!(s.rv.to_string());
            obj["metadata"]["uid"] = uid;
            s.slices.insert(n.to_owned(), obj.clone());
            (200, obj)
        }
        ("DELETE", Some(n), _) => match s.slices.remove(n) {
            Some(v) => {
                s.rv += 1;
                (200, v)
            }
            None => not_found(n),
        },
        _ => (405, status(405, "MethodNotAllowed", "method not allowed")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_field_selector_filters_slices() {
        let s = json!({"metadata": {"name": "a"}, "spec": {"driver": "d", "nodeName": "lab"}});
        assert!(selected(
            &s,
            &percent_decode("spec.driver%3Dd%2Cspec.nodeName%3Dlab")
        ));
        assert!(!selected(&s, "spec.nodeName=other"));
        assert!(selected(&s, ""));
    }
}
