//! The gpuslice node agent: the host's GPUs and vGPUs served to an orchestrator over a versioned
//! HTTP API on a unix socket (or TCP with a bearer token), with promises kept across restarts.
//!
//! [`Daemon`] is the agent as `gpuslice agent` runs it, built from a [`DaemonConfig`]: the
//! listeners, the uevent socket, the Kubernetes client, the slice publisher, the kubelet
//! plugin and the order they stop in. Its parts can also be used one by one:
//! [`Agent::open`] reads the promises in the state directory, re-creates the recorded devices
//! that are missing and reads the topology; [`serve::serve`] answers the API on its listeners
//! until shutdown; [`watch::start`] keeps the served picture current (kernel uevents, a periodic
//! resync, health verdicts, a watched layout file). The agent can run in-process on any [`gpu_sysfs::Host`] (a fake kernel in
//! tests). Writes are serialized and share the layout lock of `gpuslice vgpu apply`; reads are
//! served from a cached snapshot and never wait for a write.

/// Writes one line to standard error, ignoring failures: a closed stderr (a supervisor that went
/// away) must not take an answer down with it, as `eprintln!` would by panicking.
#[macro_export]
#[doc(hidden)]
macro_rules! log {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), $($arg)*);
    }};
}

pub mod agent;
pub mod claims;
pub mod daemon;
pub mod doc;
pub mod dra;
pub mod error;
pub mod events;
pub mod http;
pub mod kube;
pub mod liveness;
pub mod serve;
pub mod shown;
pub mod sources;
pub mod state;
pub mod uevent;
pub mod watch;

pub use agent::{
    Agent, AgentConfig, CreateRequest, HandoffTarget, Hooks, MIN_TOKEN_LEN, MetricsHook, MigNvml,
    Outcome, Reconciled, Snapshot, TokenError, compose_topology, config_for_root, parse_token,
};
pub use daemon::{Daemon, DaemonConfig, DaemonDra, DaemonError};

/// The Rust blocks of the daemon's guide (`docs/agent.md`) are compiled as doctests, so the
/// guide cannot drift from the library.
#[cfg(doctest)]
#[doc = include_str!("../../docs/agent.md")]
pub struct AgentGuide;
pub use error::{ApiError, RenderError};
pub use events::{Event, EventBus, EventKind};
pub use serve::{Access, Listen, ListenError, Listener, ServeOptions, serve, serve_router};
pub use sources::{UeventMode, open_gpu_events, open_uevents, read_file};
pub use state::{Device, Owner, Phase, Promise, StateFile, StateStore};
pub use uevent::{ChannelSource, NetlinkSource, Uevent, UeventSource};
pub use watch::{WatchOptions, WatchedLayout, Watchers};

/// The runtime the agent and the metrics server run on: I/O and timers on
/// [`worker_threads`] threads; host reads and writes go to its blocking pool.
///
/// # Errors
/// The runtime cannot be started.
pub fn runtime() -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(worker_threads(
            std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get),
        ))
        .enable_all()
        .build()
}

/// How many threads serve requests on a machine of `cores` cores: two, except on two cores or
/// fewer, where one does. Every answer is a cached document or a hand-off to the blocking pool,
/// so one thread keeps up; a second one on a 2-core node only competes with the refresh worker,
/// the blocking pool and the clients for the cores, which shows as tail latency (the agent
/// bench's `304` p99 over 10,000 reads from 32 clients: 0.55-0.90 ms with one, 0.90-1.01 ms with
/// two).
pub fn worker_threads(cores: usize) -> usize {
    if cores <= 2 { 1 } else { 2 }
}

/// A future that ends on SIGTERM or Ctrl-C, to pass as a server's shutdown signal. Call it on
/// the runtime: the SIGTERM handler is installed before it returns.
///
/// # Errors
/// The SIGTERM handler cannot be installed.
pub fn on_terminate() -> std::io::Result<impl std::future::Future<Output = ()> + Send> {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    Ok(async move {
        tokio::select! {
            _ = term.recv() => {}
            _ = tokio::signal::ctrl_c() => {}
        }
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn small_machines_serve_on_one_thread_and_larger_ones_on_two() {
        assert_eq!(super::worker_threads(1), 1);
        assert_eq!(super::worker_threads(2), 1);
        assert_eq!(super::worker_threads(4), 2);
        assert_eq!(super::worker_threads(64), 2);
    }
}
