//! The agent as a daemon, started from the library: [`Daemon::open`] checks every option and
//! file and opens the host, [`Daemon::start`] builds what runs (the listeners, the kube client,
//! the agent itself, its watchers, the slice publisher and the kubelet plugin), and
//! [`Running::serve_until`] serves until told to stop, then stops the parts in order
//! ([`shutdown`]). `gpuslice agent` parses its flags into a [`DaemonConfig`] and calls
//! [`Daemon::run_blocking`]; a test builds the same daemon in-process.
//!
//! The order is the contract: nothing touches the host before every option, the token, the
//! root, the state directory and the layout file have been checked and the TCP addresses bound;
//! the uevent socket is opened before the first read of the host, so no device change is
//! missed; the API server is reached before reconcile; unix sockets are bound after it, so a
//! client that finds the socket finds the promises reconciled.

// A daemon fails at most once, at start: its error keeps each cause as it is (unboxed), so the
// chain a front-end walks finds the typed cause and its kind.
#![allow(clippy::result_large_err)]

pub mod config;
pub mod error;
mod kube;
pub mod shutdown;

use std::sync::Arc;

use gpu_sysfs::Host;

use crate::agent::{Agent, AgentConfig};
use crate::serve::{Access, Listen, Listener};
use crate::uevent::UeventSource;
use crate::watch::{WatchOptions, Watchers};

pub use config::{DEFAULT_SOCKET, DaemonConfig, DaemonDra, default_listen};
pub use error::DaemonError;
pub use shutdown::{Part, Running, Stop, Stopped};

/// The most a token file may hold.
const MAX_TOKEN_FILE: usize = 4096;

/// A daemon whose options and files were checked and whose host is open; nothing runs yet.
pub struct Daemon {
    config: DaemonConfig,
    listen: Vec<Listen>,
    token: Option<Arc<[u8]>>,
    host: Arc<dyn Host>,
    agent: AgentConfig,
    uevents: Option<Box<dyn UeventSource>>,
    gpu_events: Option<Box<dyn gpu_health::GpuEventSource>>,
}

impl std::fmt::Debug for Daemon {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Daemon")
            .field("config", &self.config)
            .field("listen", &self.listen)
            .field("uevents", &self.uevents.is_some())
            .field("gpu_events", &self.gpu_events.is_some())
            .finish_non_exhaustive()
    }
}

impl Daemon {
    /// Checks everything before anything touches the host: the node name, the driver name, the
    /// token file and its length, that TCP has a token or is read-only, the root, the state
    /// directory and its file, the layout file. Then opens the host (NVML on the live host only,
    /// unless turned off), the kernel's uevent socket and NVML's events. Blocking.
    ///
    /// # Errors
    /// The option or file that cannot be used, each a [`DaemonError`] variant naming it.
    pub fn open(config: DaemonConfig) -> Result<Self, DaemonError> {
        gpu_core::validate_name(&config.node).map_err(DaemonError::Node)?;
        let live = gpu_health::is_local_root(&config.root);
        if let Some(d) = &config.dra {
            if !gpu_integrations::dra::names::is_dns_subdomain(&d.plugin.driver) {
                return Err(DaemonError::Driver(d.plugin.driver.clone()));
            }
            if let Some(dir) = d.claims_dir.as_ref().filter(|p| !p.is_dir()) {
                return Err(DaemonError::ClaimsDir(dir.clone()));
            }
        }
        let listen = if config.listen.is_empty() {
            vec![default_listen(&config.root, live)]
        } else {
            config.listen.clone()
        };
        let token = config.token_file.as_deref().map(read_token).transpose()?;
        if token.is_none() && !config.insecure_read_only {
            if let Some(Listen::Tcp(addr)) = listen.iter().find(|l| matches!(l, Listen::Tcp(_))) {
                return Err(DaemonError::TcpWithoutToken(addr.clone()));
            }
        }
        if config.root.is_file() {
            return Err(DaemonError::RootIsFile(config.root.clone()));
        }
        let mut req = gpu_health::NodeRequest::new(config.node.clone());
        if !config.nvml {
            req.nvml = gpu_health::NvmlSource::Off;
        }
        let (host, mut agent) =
            crate::agent::config_for_root(&config.root, &req).map_err(|source| {
                DaemonError::Root {
                    path: config.root.clone(),
                    source,
                }
            })?;
        agent.state_dir = config.state_dir.clone();
        agent.lock_timeout = config.lock_timeout;
        Agent::check_state(&host, &agent).map_err(DaemonError::agent)?;
        if let Some(l) = &config.layout {
            check_layout(l, config.document_limit)?;
        }
        let uevents =
            crate::sources::open_uevents(config.uevents, live).map_err(DaemonError::Uevents)?;
        let gpu_events = crate::sources::open_gpu_events(live, !config.nvml, &mut agent.health);
        Ok(Daemon {
            config,
            listen,
            token,
            host,
            agent,
            uevents,
            gpu_events,
        })
    }

    /// Where it will listen (the default socket when none was named).
    pub fn listen(&self) -> &[Listen] {
        &self.listen
    }

    /// Starts every part on the current runtime, in the order the module describes, and
    /// returns them running; [`Running::serve_until`] serves.
    ///
    /// # Errors
    /// A unix path that cannot be served or a TCP address that cannot be bound (before the host
    /// is changed), an API server configuration that cannot be used, an agent that cannot open,
    /// a unix socket that cannot be bound, a layout whose directory cannot be watched, a
    /// publisher or plugin that cannot start.
    pub async fn start(self) -> Result<Running, DaemonError> {
        let Daemon {
            config,
            listen,
            token,
            host,
            agent,
            uevents,
            gpu_events,
        } = self;
        let group = config.socket_group.as_deref();
        // A unix path that cannot be served is refused here, and TCP addresses are bound now: a
        // bind that fails stops the agent before it changes anything.
        let mut tcp = Vec::new();
        for l in &listen {
            match l {
                Listen::Unix(p) => {
                    Listener::check_unix(p, group)?;
                }
                Listen::Tcp(addr) => tcp.push(Listener::bind_tcp(
                    addr,
                    Access {
                        token: token.clone(),
                        read_only: token.is_none() && config.insecure_read_only,
                    },
                )?),
            }
        }
        // The API server is reached before anything changes on the host.
        let client = match &config.dra {
            Some(dra) if dra.needs_api_server() => Some(kube::connect(dra).await?),
            _ => None,
        };
        let agent = Agent::open(host, agent).map_err(DaemonError::agent)?;
        if let Some(c) = &client {
            agent.stats().count_apiserver_refusals(c.refused_answers());
        }
        for r in agent.reconciled() {
            crate::log!(
                "gpuslice agent: promise {}: {}{}",
                r.promise.device.id(),
                r.outcome.as_str(),
                r.message.map(|m| format!(" ({m})")).unwrap_or_default()
            );
        }
        let listeners = bind_all(&listen, tcp, group)?;
        let watchers = start_watchers(&agent, &config, uevents, gpu_events)?;
        let (publisher, plugin) = match &config.dra {
            Some(dra) => {
                kube::start(
                    &agent,
                    dra,
                    config.layout.clone(),
                    client,
                    config.document_limit,
                )
                .await?
            }
            None => (None, None),
        };
        Ok(Running::new(agent, listeners, watchers, publisher, plugin))
    }

    /// [`Daemon::start`], then serves until SIGTERM or Ctrl-C and stops in order.
    ///
    /// # Errors
    /// As [`Daemon::start`]; the SIGTERM handler cannot be installed.
    pub async fn run_until_terminated(self) -> Result<Stopped, DaemonError> {
        let running = self.start().await?;
        let terminated = crate::on_terminate()?;
        running.serve_until(terminated).await
    }

    /// [`Daemon::run_until_terminated`] on the agent's own runtime ([`crate::runtime`]).
    ///
    /// # Errors
    /// As [`Daemon::run_until_terminated`]; the runtime cannot be started.
    pub fn run_blocking(self) -> Result<Stopped, DaemonError> {
        let rt = crate::runtime().map_err(DaemonError::Runtime)?;
        rt.block_on(self.run_until_terminated())
    }
}

/// The token in `path`: at most [`MAX_TOKEN_FILE`] bytes of UTF-8 text, trimmed, long enough.
fn read_token(path: &std::path::Path) -> Result<Arc<[u8]>, DaemonError> {
    let bytes = crate::sources::read_file(path, MAX_TOKEN_FILE).map_err(DaemonError::TokenRead)?;
    let text = String::from_utf8(bytes).map_err(|_| DaemonError::TokenText(path.to_owned()))?;
    crate::agent::parse_token(&text).map_err(|source| DaemonError::Token {
        path: path.to_owned(),
        source,
    })
}

/// A layout that cannot be read, does not parse or lacks the config named is refused before
/// anything starts.
fn check_layout(
    l: &crate::watch::WatchedLayout,
    limit: gpu_sysfs::DocumentLimit,
) -> Result<(), DaemonError> {
    let text = gpu_sysfs::read_document(&l.path, "--layout", limit).map_err(|source| {
        DaemonError::LayoutRead {
            path: l.path.clone(),
            source,
        }
    })?;
    let layout = |source| DaemonError::Layout {
        path: l.path.clone(),
        source,
    };
    let file = gpu_core::layout::LayoutFile::parse(&text).map_err(layout)?;
    file.select(l.config.as_deref()).map_err(layout)?;
    Ok(())
}

/// The listeners in the order named: the TCP ones already bound, the unix ones bound now.
fn bind_all(
    listen: &[Listen],
    tcp: Vec<Listener>,
    group: Option<&str>,
) -> Result<Vec<Listener>, DaemonError> {
    let mut tcp = tcp.into_iter();
    let mut listeners = Vec::new();
    for l in listen {
        let bound = match l {
            Listen::Unix(p) => Listener::bind_unix(p, group)?,
            Listen::Tcp(_) => tcp
                .next()
                .ok_or_else(|| std::io::Error::other("internal: a TCP listener went missing"))?,
        };
        crate::log!("gpuslice agent: serving on {}", bound.address());
        listeners.push(bound);
    }
    Ok(listeners)
}

fn start_watchers(
    agent: &Arc<Agent>,
    config: &DaemonConfig,
    uevents: Option<Box<dyn UeventSource>>,
    gpu_events: Option<Box<dyn gpu_health::GpuEventSource>>,
) -> Result<Watchers, DaemonError> {
    let watch = WatchOptions {
        resync: config.resync.filter(|d| !d.is_zero()),
        uevents,
        gpu_events,
        layout: config.layout.clone(),
        read_deadline: config
            .read_deadline
            .max(std::time::Duration::from_millis(1)),
        ..WatchOptions::default()
    };
    crate::watch::start(agent, watch, tokio::runtime::Handle::current())
        .map_err(DaemonError::LayoutWatch)
}
