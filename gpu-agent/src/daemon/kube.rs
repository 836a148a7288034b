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
    let client = client_for(dra.kubeconfig.as_ref()).await?;
    crate::log!(
        "gpuslice agent: reading ResourceClaims from {}",
        client.server()
    );
    Ok(client)
}

/// A client for the API server the node label is read from (`--config-label`).
pub(super) async fn connect_for_label(
    c: &crate::kube::node_label::ConfigLabel,
) -> Result<KubeClient, DaemonError> {
    client_for(c.kubeconfig.as_ref()).await
}

/// A client for `kubeconfig`'s cluster (`None`: the in-cluster service account).
async fn client_for(kubeconfig: Option<&std::path::PathBuf>) -> Result<KubeClient, DaemonError> {
    let opts = ClientOptions {
        kubeconfig: kubeconfig.cloned(),
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
/// both stop with the agent.
pub(super) async fn start(
    agent: &Arc<Agent>,
    dra: &DaemonDra,
    layout: Option<WatchedLayout>,
    client: KubeClient,
) -> Result<(Option<PublisherHandle>, Option<PluginTask>), DaemonError> {
    let publisher = if dra.publish {
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
    let claims: Arc<dyn ClaimSource> = Arc::new(client);
    let plugin = DraPlugin::new(Arc::clone(agent), claims, dra.plugin.clone())?;
    // The plugin stops with the agent: its shutdown is the agent's.
    let bound = crate::dra::bind(plugin).map_err(DaemonError::PluginSockets)?;
    let mut down = agent.shutdown_signal();
    let task = tokio::spawn(bound.run(async move {
        let _ = down.wait_for(|v| *v).await;
    }));
    Ok((publisher, Some(task)))
}
