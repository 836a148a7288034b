//! The daemon's Kubernetes parts: the API server client, the slice publisher and the kubelet
//! plugin (`gpuslice agent --dra`).

use std::sync::Arc;

use super::{DaemonDra, DaemonError};
use crate::agent::Agent;
use crate::claims::ClaimSource;
use crate::dra::DraPlugin;
use crate::kube::{ClientOptions, KubeClient, PublishOptions, PublisherHandle, SliceOptions};
use crate::watch::WatchedLayout;

/// The plugin's task: it ends after the agent's shutdown.
pub(super) type PluginTask = tokio::task::JoinHandle<std::io::Result<()>>;

/// A client for the API server `dra` names; a kubeconfig that cannot be used stops the daemon
/// here, before anything changes on the host.
pub(super) async fn connect(dra: &DaemonDra) -> Result<KubeClient, DaemonError> {
    let client = client_for(dra.kubeconfig.as_ref(), dra.max_answer).await?;
    if dra.claims_dir.is_none() {
        crate::log!(
            "gpuslice agent: reading ResourceClaims from {}",
            client.server()
        );
    }
    Ok(client)
}

/// A client for the API server the node label is read from (`--config-label`).
pub(super) async fn connect_for_label(
    c: &crate::kube::node_label::ConfigLabel,
) -> Result<KubeClient, DaemonError> {
    client_for(c.kubeconfig.as_ref(), crate::kube::MAX_ANSWER).await
}

/// A client for `kubeconfig`'s cluster (`None`: the in-cluster service account) that reads no
/// answer past `max_answer` bytes.
async fn client_for(
    kubeconfig: Option<&std::path::PathBuf>,
    max_answer: u64,
) -> Result<KubeClient, DaemonError> {
    let opts = ClientOptions {
        kubeconfig: kubeconfig.cloned(),
        max_answer,
        ..ClientOptions::default()
    };
    KubeClient::connect(&opts)
        .await
        .map_err(|source| DaemonError::Kube {
            kubeconfig: kubeconfig.cloned(),
            source,
        })
}

/// Starts the publisher (unless turned off; it never stops the daemon) and the plugin, which
/// both stop with the agent. The plugin reads claims from `dra.claims_dir` when one is named,
/// else through `client`.
pub(super) async fn start(
    agent: &Arc<Agent>,
    dra: &DaemonDra,
    layout: Option<WatchedLayout>,
    client: Option<KubeClient>,
    limit: gpu_sysfs::DocumentLimit,
) -> Result<(Option<PublisherHandle>, Option<PluginTask>), DaemonError> {
    let publisher = if let (true, Some(client)) = (dra.publish, &client) {
        let store = match agent.host().root_dir() {
            Some(root) => Some(Arc::new(
                gpu_integrations::dra::ClaimStore::open(root, None)
                    .map_err(DaemonError::ClaimStore)?,
            )),
            None => None,
        };
        let opts = PublishOptions {
            slices: SliceOptions {
                driver: dra.plugin.driver.clone(),
                size_for: dra.size_for.clone(),
                ..SliceOptions::default()
            },
            claims: store,
            // Before 1.36.2 each GPU offers the size the watched layout gives it.
            layout,
            ..PublishOptions::default()
        };
        // Whatever the API server answers, the agent serves on: the publisher waits and asks
        // again, showing why in `/healthz`.
        Some(crate::kube::spawn_publisher_degrading(Arc::clone(agent), client.clone(), opts).await)
    } else {
        None
    };
    let claims: Arc<dyn ClaimSource> = match (&dra.claims_dir, client) {
        (Some(dir), _) => {
            crate::log!(
                "gpuslice agent: reading ResourceClaims from the files in {}",
                dir.display()
            );
            Arc::new(crate::claims::DirClaims::new(dir.clone(), limit))
        }
        (None, Some(client)) => Arc::new(client),
        (None, None) => return Err(DaemonError::NoClaimSource),
    };
    let plugin = DraPlugin::new(Arc::clone(agent), claims, dra.plugin.clone())?;
    // The plugin stops with the agent: its shutdown is the agent's. Sockets another process
    // holds are waited out; any other failure to bind them (a path too long, a directory that
    // cannot be made) stops the daemon here.
    let first = match crate::dra::bind(Arc::clone(&plugin)) {
        Ok(bound) => Ok(bound),
        Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => Err(e),
        Err(e) => return Err(DaemonError::PluginSockets(e)),
    };
    let task = tokio::spawn(serve_plugin(Arc::clone(agent), plugin, first));
    Ok((publisher, Some(task)))
}

/// The longest wait between two tries at the plugin's sockets.
const PLUGIN_BACKOFF_MAX: std::time::Duration = std::time::Duration::from_secs(60);

/// Binds the plugin's sockets and serves them until the agent stops. Sockets another process
/// holds (a second plugin, or a process that bound `dra.sock` and never accepts) do not stop
/// the agent: it says what it found once, shows it in `/healthz` (`draPlugin`) and
/// `gpuslice_agent_dra_plugin_blocked`, and tries again with back-off.
async fn serve_plugin(
    agent: Arc<Agent>,
    plugin: Arc<DraPlugin>,
    first: std::io::Result<crate::dra::Bound>,
) -> std::io::Result<()> {
    use crate::agent::stats::PublisherCondition;
    let mut down = agent.shutdown_signal();
    let mut wait = std::time::Duration::from_secs(1);
    let mut said: Option<String> = None;
    let mut next = Some(first);
    loop {
        let tried = match next.take() {
            Some(t) => t,
            None => crate::dra::bind(Arc::clone(&plugin)),
        };
        match tried {
            Ok(bound) => {
                if said.is_some() {
                    crate::log!("gpuslice agent: the kubelet plugin's sockets are free now");
                }
                agent.stats().set_plugin(PublisherCondition {
                    ready: true,
                    message: None,
                });
                return bound
                    .run(async move {
                        let _ = down.wait_for(|v| *v).await;
                    })
                    .await;
            }
            Err(e) => {
                let message = e.to_string();
                if said.as_deref() != Some(message.as_str()) {
                    crate::log!(
                        "gpuslice agent: the kubelet plugin is not served: {message}; the agent serves on and tries again with back-off"
                    );
                }
                agent.stats().set_plugin(PublisherCondition {
                    ready: false,
                    message: Some(message.clone()),
                });
                said = Some(message);
            }
        }
        tokio::select! {
            () = tokio::time::sleep(wait) => {}
            _ = down.wait_for(|v| *v) => return Ok(()),
        }
        wait = (wait * 2).min(PLUGIN_BACKOFF_MAX);
    }
}
