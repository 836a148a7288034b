//! A running daemon and the order it stops in: the server first (no new requests; answers in
//! flight and the write in progress finish; event streams end; the agent's shutdown is
//! signalled), then the slice publisher, then the kubelet plugin (its sockets removed, the
//! registration first), then the watchers' threads. A part that does not stop in time is named
//! and left behind, so the daemon always ends.

use std::future::Future;
use std::sync::Arc;

use super::config::{STOP_TIMEOUT, WATCHERS_TIMEOUT};
use super::kube::PluginTask;
use crate::agent::Agent;
use crate::kube::PublisherHandle;
use crate::serve::Listener;
use crate::watch::Watchers;

/// A part of the daemon, as the shutdown report names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Part {
    /// The HTTP server on every listener.
    Server,
    /// The slice publisher.
    Publisher,
    /// The kubelet plugin.
    Plugin,
    /// The watchers (uevents, resync, layout file, GPU events).
    Watchers,
}

/// How a part stopped.
#[derive(Debug)]
pub enum Stop {
    /// It stopped.
    Done,
    /// It was still stopping when the daemon stopped waiting.
    StillStopping,
    /// It stopped with an error.
    Failed(std::io::Error),
}

/// The parts in the order they stopped, and how.
#[derive(Debug, Default)]
pub struct Stopped {
    /// Each part the daemon ran, in stopping order.
    pub parts: Vec<(Part, Stop)>,
}

impl Stopped {
    /// The parts in stopping order.
    pub fn order(&self) -> Vec<Part> {
        self.parts.iter().map(|(p, _)| *p).collect()
    }
}

/// A started daemon: bound, reconciled, watching, publishing; [`Running::serve_until`] serves.
pub struct Running {
    agent: Arc<Agent>,
    listeners: Vec<Listener>,
    watchers: Watchers,
    publisher: Option<PublisherHandle>,
    plugin: Option<PluginTask>,
}

impl std::fmt::Debug for Running {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Running")
            .field("addresses", &self.addresses())
            .field("publisher", &self.publisher.is_some())
            .field("plugin", &self.plugin.is_some())
            .finish_non_exhaustive()
    }
}

impl Running {
    pub(super) fn new(
        agent: Arc<Agent>,
        listeners: Vec<Listener>,
        watchers: Watchers,
        publisher: Option<PublisherHandle>,
        plugin: Option<PluginTask>,
    ) -> Self {
        Running {
            agent,
            listeners,
            watchers,
            publisher,
            plugin,
        }
    }

    /// The agent.
    pub fn agent(&self) -> &Arc<Agent> {
        &self.agent
    }

    /// Where it listens, as `--listen` spells it (a TCP port 0 shows the port bound).
    pub fn addresses(&self) -> Vec<String> {
        self.listeners.iter().map(Listener::address).collect()
    }

    /// Serves until `shutdown` completes, then stops every part in order (the module's).
    ///
    /// # Errors
    /// The server failing.
    pub async fn serve_until(
        self,
        shutdown: impl Future<Output = ()>,
    ) -> Result<Stopped, super::DaemonError> {
        let Running {
            agent,
            listeners,
            watchers,
            publisher,
            plugin,
        } = self;
        let mut stopped = Stopped::default();
        crate::serve::serve(agent, listeners, async move {
            shutdown.await;
            crate::log!("gpuslice agent: shutting down");
        })
        .await?;
        stopped.parts.push((Part::Server, Stop::Done));
        if let Some(p) = publisher {
            let stop = match tokio::time::timeout(STOP_TIMEOUT, p.stop()).await {
                Ok(()) => Stop::Done,
                Err(_) => {
                    crate::log!(
                        "gpuslice agent: slice publisher still stopping after {} s",
                        STOP_TIMEOUT.as_secs()
                    );
                    Stop::StillStopping
                }
            };
            stopped.parts.push((Part::Publisher, stop));
        }
        if let Some(p) = plugin {
            let stop = match tokio::time::timeout(STOP_TIMEOUT, p).await {
                Ok(Ok(Ok(()))) => Stop::Done,
                Ok(Ok(Err(e))) => {
                    crate::log!("gpuslice agent: DRA plugin: {e}");
                    Stop::Failed(e)
                }
                Ok(Err(e)) => {
                    crate::log!("gpuslice agent: DRA plugin: {e}");
                    Stop::Failed(std::io::Error::other(e.to_string()))
                }
                Err(_) => {
                    crate::log!(
                        "gpuslice agent: DRA plugin still stopping after {} s",
                        STOP_TIMEOUT.as_secs()
                    );
                    Stop::StillStopping
                }
            };
            stopped.parts.push((Part::Plugin, stop));
        }
        // The watchers' threads end on the agent's shutdown; waiting for them blocks.
        let joined = tokio::task::spawn_blocking(move || watchers.join(WATCHERS_TIMEOUT)).await;
        stopped.parts.push((
            Part::Watchers,
            match joined {
                Ok(true) => Stop::Done,
                Ok(false) => {
                    crate::log!(
                        "gpuslice agent: a watcher still stopping after {} s (a read that does not answer)",
                        WATCHERS_TIMEOUT.as_secs()
                    );
                    Stop::StillStopping
                }
                Err(e) => Stop::Failed(std::io::Error::other(e.to_string())),
            },
        ));
        Ok(stopped)
    }
}
