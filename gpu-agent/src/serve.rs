//! Listening and serving: unix sockets (mode 0660, a chosen group, the peer's uid and pid from
//! `SO_PEERCRED`) and TCP (bearer token compared in constant time, or GET-only), one task per
//! connection with a deadline for the request head, and a graceful shutdown that lets writes
//! finish and removes the socket.

use gpu_core::ErrorKind;
use std::convert::Infallible;
use std::future::Future;
use std::os::unix::fs::{FileTypeExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::{Method, Request, header};
use axum::response::IntoResponse as _;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use subtle::ConstantTimeEq as _;
use tower::ServiceExt as _;

use crate::agent::Agent;
use crate::error::ApiError;

/// How long a client may take to send a request's head (request line and headers), and how long
/// an idle keep-alive connection is kept.
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// How long shutdown waits for answers in flight.
pub const DRAIN_TIMEOUT: Duration = Duration::from_secs(30);
/// The mode of the unix socket.
pub const SOCKET_MODE: u32 = 0o660;

/// Where to listen: `unix:/run/gpuslice/agent.sock` or `tcp:127.0.0.1:9836`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Listen {
    /// A unix socket path.
    Unix(PathBuf),
    /// A TCP address (`ADDR:PORT`).
    Tcp(String),
}

/// Why a `--listen` address does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ListenError {
    /// `unix:` with no path.
    #[error("unix: needs a socket path (unix:/run/gpuslice/agent.sock)")]
    NoPath,
    /// `tcp:` without `ADDR:PORT`.
    #[error("tcp:{0}: give ADDR:PORT (tcp:127.0.0.1:9836)")]
    NoPort(String),
    /// Neither `unix:` nor `tcp:`.
    #[error("{0:?}: give unix:PATH or tcp:ADDR:PORT (unix:/run/gpuslice/agent.sock)")]
    Scheme(String),
}

impl gpu_core::ClassifiedError for ListenError {
    fn kind(&self) -> ErrorKind {
        ErrorKind::InvalidArgument
    }
}

impl FromStr for Listen {
    type Err = ListenError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if let Some(p) = s.strip_prefix("unix:") {
            if p.is_empty() {
                return Err(ListenError::NoPath);
            }
            return Ok(Listen::Unix(PathBuf::from(p)));
        }
        if let Some(a) = s.strip_prefix("tcp:") {
            if a.rsplit_once(':').is_none() {
                return Err(ListenError::NoPort(a.to_owned()));
            }
            return Ok(Listen::Tcp(a.to_owned()));
        }
        Err(ListenError::Scheme(s.to_owned()))
    }
}

/// Who may do what on a listener.
#[derive(Clone, Default)]
pub struct Access {
    /// The bearer token every request must carry (`Authorization: Bearer <token>`).
    pub token: Option<Arc<[u8]>>,
    /// Serve only GET and HEAD.
    pub read_only: bool,
}

impl std::fmt::Debug for Access {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Access")
            .field("token", &self.token.as_ref().map(|_| "<set>"))
            .field("read_only", &self.read_only)
            .finish()
    }
}

impl Access {
    /// Refuses a request this listener does not allow.
    fn check<B>(&self, req: &Request<B>) -> Result<(), ApiError> {
        if let Some(token) = &self.token {
            let given = req
                .headers()
                .get(header::AUTHORIZATION)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.strip_prefix("Bearer "))
                .map(str::trim)
                .unwrap_or("");
            if !bool::from(given.as_bytes().ct_eq(token)) {
                return Err(ApiError::new(
                    ErrorKind::Unauthorized,
                    "this listener needs Authorization: Bearer <token> (the agent's --token-file)",
                ));
            }
        }
        if self.read_only && !matches!(*req.method(), Method::GET | Method::HEAD) {
            return Err(ApiError::new(
                ErrorKind::ReadOnly,
                format!(
                    "{} is refused: this listener is read-only (--insecure-read-only)",
                    req.method()
                ),
            ));
        }
        Ok(())
    }
}

/// Who is on the other end of a connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Peer {
    /// A unix socket peer, from `SO_PEERCRED`.
    Unix {
        /// Its user.
        uid: u32,
        /// Its process, when the kernel reports one.
        pid: Option<i32>,
    },
    /// A TCP peer.
    Tcp(std::net::SocketAddr),
}

impl std::fmt::Display for Peer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Peer::Unix { uid, pid: Some(p) } => write!(f, "uid {uid} pid {p}"),
            Peer::Unix { uid, pid: None } => write!(f, "uid {uid}"),
            Peer::Tcp(a) => write!(f, "{a}"),
        }
    }
}

#[derive(Debug)]
enum Bound {
    Unix(tokio::net::UnixListener, PathBuf),
    Tcp(tokio::net::TcpListener),
}

/// A bound listening socket and what it allows.
#[derive(Debug)]
pub struct Listener {
    bound: Bound,
    access: Access,
}

fn io_err(what: String) -> impl FnOnce(std::io::Error) -> std::io::Error {
    move |e| std::io::Error::new(e.kind(), format!("{what}: {e}"))
}

impl Listener {
    /// Checks, changing nothing, that a unix socket can be served at `path` for `group`: what
    /// [`Listener::bind_unix`] refuses (a file that is not a socket, a socket another process
    /// still answers on, an unknown group) is refused here, so a front-end can check it before
    /// anything else starts. Returns the group's number.
    ///
    /// # Errors
    /// The path in use, an unknown group.
    pub fn check_unix(path: &Path, group: Option<&str>) -> std::io::Result<Option<u32>> {
        let shown = path.display().to_string();
        if let Ok(meta) = std::fs::symlink_metadata(path) {
            if !meta.file_type().is_socket() {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::AlreadyExists,
                    format!("{shown} exists and is not a socket; not replacing it"),
                ));
            }
            let found = crate::liveness::probe(path, crate::liveness::PROBE_TIMEOUT)
                .map_err(io_err(format!("cannot probe {shown}")))?;
            if found.is_held() {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::AddrInUse,
                    format!("{shown}: {} (another agent?)", found.describe()),
                ));
            }
        }
        group.map(resolve_group).transpose()
    }

    /// Binds a unix socket at `path`, mode 0660, owned by `group` (a name or a number) when
    /// given. A stale socket left by a killed agent is replaced; a socket another process still
    /// answers on, or a file that is not a socket, is refused ([`Listener::check_unix`]). Needs
    /// a Tokio runtime.
    ///
    /// # Errors
    /// The path in use, an unknown group, a failing bind, chmod or chown.
    pub fn bind_unix(path: &Path, group: Option<&str>) -> std::io::Result<Self> {
        let shown = path.display().to_string();
        let gid = Self::check_unix(path, group)?;
        if std::fs::symlink_metadata(path).is_ok() {
            // A stale socket (checked above: no one answers on it).
            std::fs::remove_file(path).map_err(io_err(format!("cannot remove stale {shown}")))?;
        }
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir)
                .map_err(io_err(format!("cannot create {}", dir.display())))?;
        }
        let l = tokio::net::UnixListener::bind(path)
            .map_err(io_err(format!("cannot listen on {shown}")))?;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(SOCKET_MODE))
            .map_err(io_err(format!("cannot chmod {shown}")))?;
        if let Some(gid) = gid {
            std::os::unix::fs::chown(path, None, Some(gid))
                .map_err(io_err(format!("cannot give {shown} to group {gid}")))?;
        }
        Ok(Listener {
            bound: Bound::Unix(l, path.to_path_buf()),
            access: Access::default(),
        })
    }

    /// Binds a TCP address. Refuses to serve writes without a token: `access` needs a token or
    /// `read_only`. Needs a Tokio runtime.
    ///
    /// # Errors
    /// No token and not read-only; a failing bind.
    pub fn bind_tcp(addr: &str, access: Access) -> std::io::Result<Self> {
        if access.token.is_none() && !access.read_only {
            return Err(std::io::Error::new(
                std::io::ErrorKind::PermissionDenied,
                format!(
                    "tcp:{addr} needs --token-file (or --insecure-read-only to serve GETs only)"
                ),
            ));
        }
        let std_l = std::net::TcpListener::bind(addr)
            .map_err(io_err(format!("cannot listen on {addr}")))?;
        std_l.set_nonblocking(true)?;
        let l = tokio::net::TcpListener::from_std(std_l)?;
        Ok(Listener {
            bound: Bound::Tcp(l),
            access,
        })
    }

    /// Binds a TCP address for a router without write routes (`GET /metrics` only): no token,
    /// every method reaches the router (which answers 405 for anything but GET). Needs a Tokio
    /// runtime.
    ///
    /// # Errors
    /// A failing bind.
    pub fn bind_tcp_read_routes(addr: &str) -> std::io::Result<Self> {
        let std_l = std::net::TcpListener::bind(addr)
            .map_err(io_err(format!("cannot listen on {addr}")))?;
        std_l.set_nonblocking(true)?;
        Ok(Listener {
            bound: Bound::Tcp(tokio::net::TcpListener::from_std(std_l)?),
            access: Access::default(),
        })
    }

    /// Where it listens, as `--listen` spells it (`unix:/path`, `tcp:127.0.0.1:9836`).
    pub fn address(&self) -> String {
        match &self.bound {
            Bound::Unix(_, p) => format!("unix:{}", p.display()),
            Bound::Tcp(l) => l
                .local_addr()
                .map(|a| format!("tcp:{a}"))
                .unwrap_or_else(|_| "tcp:?".to_owned()),
        }
    }
}

fn resolve_group(g: &str) -> std::io::Result<u32> {
    if let Ok(n) = g.parse::<u32>() {
        return Ok(n);
    }
    match nix::unistd::Group::from_name(g) {
        Ok(Some(grp)) => Ok(grp.gid.as_raw()),
        Ok(None) => Err(std::io::Error::new(
            std::io::ErrorKind::NotFound,
            format!("--socket-group {g}: no such group"),
        )),
        Err(e) => Err(std::io::Error::other(format!(
            "--socket-group {g}: cannot look it up: {e}"
        ))),
    }
}

enum Conn {
    Unix(tokio::net::UnixStream),
    Tcp(tokio::net::TcpStream),
}

async fn accept(bound: &Bound) -> std::io::Result<(Conn, Peer)> {
    match bound {
        Bound::Unix(l, _) => {
            let (s, _) = l.accept().await?;
            let cred = s.peer_cred()?;
            Ok((
                Conn::Unix(s),
                Peer::Unix {
                    uid: cred.uid(),
                    pid: cred.pid(),
                },
            ))
        }
        Bound::Tcp(l) => {
            let (s, a) = l.accept().await?;
            // Answers go out as soon as they are written: without this, Nagle's algorithm holds
            // the last short segment of a large body until the client acknowledges the rest.
            if let Err(e) = s.set_nodelay(true) {
                crate::log!("gpuslice agent: TCP_NODELAY on the connection from {a}: {e}");
            }
            Ok((Conn::Tcp(s), Peer::Tcp(a)))
        }
    }
}

/// Serves the API of `agent` on `listeners` until `shutdown` completes, then stops accepting,
/// ends event streams, waits (up to [`DRAIN_TIMEOUT`]) for answers in flight and for the write
/// in progress, and removes the unix sockets.
///
/// # Errors
/// None after binding; accept errors are reported and the listener goes on.
pub async fn serve(
    agent: Arc<Agent>,
    listeners: Vec<Listener>,
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<()> {
    let router = crate::http::router(Arc::clone(&agent));
    serve_with(
        router,
        listeners,
        shutdown,
        Some(agent),
        ServeOptions::default(),
    )
    .await
}

/// How [`serve_router`] serves.
#[derive(Debug, Clone, Copy)]
pub struct ServeOptions {
    /// Keep connections open between requests (off: every answer closes its connection).
    pub keep_alive: bool,
    /// Shut down after answering this many requests.
    pub max_requests: Option<u64>,
}

impl Default for ServeOptions {
    fn default() -> Self {
        ServeOptions {
            keep_alive: true,
            max_requests: None,
        }
    }
}

/// Serves any router (`gpuslice metrics --listen` serves [`crate::http::metrics_router`]) with
/// the agent's connection handling: per-connection tasks, head deadlines, graceful shutdown.
///
/// # Errors
/// None after binding.
pub async fn serve_router(
    router: axum::Router,
    listeners: Vec<Listener>,
    shutdown: impl Future<Output = ()>,
    opts: ServeOptions,
) -> std::io::Result<()> {
    serve_with(router, listeners, shutdown, None, opts).await
}

async fn serve_with(
    router: axum::Router,
    listeners: Vec<Listener>,
    shutdown: impl Future<Output = ()>,
    agent: Option<Arc<Agent>>,
    opts: ServeOptions,
) -> std::io::Result<()> {
    let answered = Arc::new(Answered {
        count: std::sync::atomic::AtomicU64::new(0),
        limit: opts.max_requests,
        done: tokio::sync::Notify::new(),
    });
    let (tx, mut rx) = tokio::sync::mpsc::channel::<(Conn, Peer, Access)>(64);
    let mut sockets = Vec::new();
    let mut accepting = Vec::new();
    for l in listeners {
        if let Bound::Unix(_, p) = &l.bound {
            sockets.push(p.clone());
        }
        let tx = tx.clone();
        accepting.push(tokio::spawn(async move {
            loop {
                match accept(&l.bound).await {
                    Ok((c, p)) => {
                        if tx.send((c, p, l.access.clone())).await.is_err() {
                            return;
                        }
                    }
                    Err(e) => {
                        crate::log!("gpuslice agent: accept on {}: {e}", l.address());
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                }
            }
        }));
    }
    drop(tx);
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    tokio::pin!(shutdown);
    if opts.max_requests == Some(0) {
        answered.done.notify_one();
    }
    loop {
        tokio::select! {
            () = &mut shutdown => break,
            () = answered.done.notified() => break,
            c = rx.recv() => {
                let Some((conn, peer, access)) = c else { break };
                let svc = service(router.clone(), peer, access, Arc::clone(&answered));
                let builder = {
                    let mut b = hyper::server::conn::http1::Builder::new();
                    b.timer(TokioTimer::new())
                        .header_read_timeout(HEADER_TIMEOUT)
                        .keep_alive(opts.keep_alive)
                        .title_case_headers(true);
                    b
                };
                match conn {
                    Conn::Unix(s) => {
                        let c = graceful.watch(builder.serve_connection(TokioIo::new(s), svc));
                        tokio::spawn(async move { let _ = c.await; });
                    }
                    Conn::Tcp(s) => {
                        let c = graceful.watch(builder.serve_connection(TokioIo::new(s), svc));
                        tokio::spawn(async move { let _ = c.await; });
                    }
                }
            }
        }
    }
    for a in &accepting {
        a.abort();
    }
    if let Some(a) = &agent {
        a.begin_shutdown();
    }
    if tokio::time::timeout(DRAIN_TIMEOUT, graceful.shutdown())
        .await
        .is_err()
    {
        crate::log!("gpuslice agent: connections still open after {DRAIN_TIMEOUT:?}; closing");
    }
    let _quiet = match &agent {
        Some(a) => Some(a.quiesce().await),
        None => None,
    };
    for s in sockets {
        let _ = std::fs::remove_file(&s);
    }
    Ok(())
}

type Svc = hyper_util::service::TowerToHyperService<
    tower::util::BoxCloneSyncService<Request<Incoming>, axum::response::Response, Infallible>,
>;

/// Counts answers for [`ServeOptions::max_requests`].
#[derive(Debug)]
struct Answered {
    count: std::sync::atomic::AtomicU64,
    limit: Option<u64>,
    done: tokio::sync::Notify,
}

fn service(router: axum::Router, peer: Peer, access: Access, answered: Arc<Answered>) -> Svc {
    let peer = Arc::new(peer);
    let svc = tower::service_fn(move |req: Request<Incoming>| {
        let router = router.clone();
        let peer = Arc::clone(&peer);
        let access = access.clone();
        let answered = Arc::clone(&answered);
        async move {
            let method = req.method().clone();
            let path = req.uri().path().to_owned();
            let resp = match access.check(&req) {
                Err(e) => e.into_response(),
                Ok(()) => match router.oneshot(req.map(Body::new)).await {
                    Ok(r) => r,
                    Err(never) => match never {},
                },
            };
            if !matches!(method, Method::GET | Method::HEAD) {
                crate::log!(
                    "gpuslice agent: {method} {path} from {peer}: {}",
                    resp.status().as_u16()
                );
            }
            if let Some(limit) = answered.limit {
                let n = answered
                    .count
                    .fetch_add(1, std::sync::atomic::Ordering::SeqCst)
                    + 1;
                if n == limit {
                    answered.done.notify_one();
                }
            }
            Ok::<_, Infallible>(resp)
        }
    });
    hyper_util::service::TowerToHyperService::new(tower::util::BoxCloneSyncService::new(svc))
}

/// Reads the host again every `period` until the agent shuts down, on the runtime's blocking
/// pool. [`crate::watch::start`] is the fuller form (one refresh at a time on its own thread,
/// kernel uevents, a watched layout, the read watchdog); `gpuslice agent` uses that.
pub async fn resync_every(agent: Arc<Agent>, period: Duration) {
    let mut stop = agent.shutdown_signal();
    loop {
        tokio::select! {
            () = tokio::time::sleep(period) => {}
            _ = stop.changed() => return,
        }
        let a = Arc::clone(&agent);
        match tokio::task::spawn_blocking(move || a.refresh()).await {
            Ok(Err(e)) => crate::log!("gpuslice agent: resync: {e}"),
            Err(e) => crate::log!("gpuslice agent: resync: {e}"),
            Ok(Ok(_)) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_listen_address_parses_or_says_which_form_it_lacks() {
        assert_eq!(
            "unix:/run/a.sock".parse::<Listen>(),
            Ok(Listen::Unix(PathBuf::from("/run/a.sock")))
        );
        assert_eq!(
            "tcp:127.0.0.1:9836".parse::<Listen>(),
            Ok(Listen::Tcp("127.0.0.1:9836".to_owned()))
        );
        assert_eq!("unix:".parse::<Listen>(), Err(ListenError::NoPath));
        assert_eq!(
            "tcp:localhost".parse::<Listen>(),
            Err(ListenError::NoPort("localhost".to_owned()))
        );
        let e = "http://x".parse::<Listen>().unwrap_err();
        assert!(
            e.to_string().contains("give unix:PATH or tcp:ADDR:PORT"),
            "{e}"
        );
        assert_eq!(
            gpu_core::ClassifiedError::kind(&e),
            ErrorKind::InvalidArgument
        );
    }
}
