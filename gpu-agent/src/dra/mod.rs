//! The kubelet's side of DRA inside the agent: gpuslice as a Dynamic Resource Allocation driver.
//!
//! The kubelet finds a plugin by a registration socket in its `plugins_registry` directory
//! ([`registration`]); it then calls the plugin's own socket, `plugins/<driver>/dra.sock`, for
//! `NodePrepareResources` / `NodeUnprepareResources` (services `v1.DRAPlugin` and
//! `v1beta1.DRAPlugin`, [`service`]) and watches its devices' health (`DRAResourceHealth`,
//! [`health`]). A prepare reads each claim from the API server through a [`ClaimSource`],
//! checks it ([`prepare`]), and makes its devices with the library's one call
//! (`gpu_node::dra::prepare`) as one of the agent's writes: after the agent's
//! writer lock and the host's layout lock, one claim at a time. Each prepared claim gets a CDI
//! spec and KubeVirt's device metadata (`gpu_integrations::dra::cdi`); an unprepare takes both
//! away again.
//!
//! The plugin owns nothing the agent does not: its state is the node's DRA claim store (the
//! one `gpuslice dra prepare` keeps) and the files it writes in the kubelet's and CDI's
//! directories, which are host paths taken as given.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// The plugin's counters live with the agent's figures ([`crate::agent::stats`]), which the
/// plugin's code imports and which import nothing of it.
pub use crate::agent::stats::DraStats;

use gpu_integrations::dra::ClaimStore;
use gpu_integrations::dra::cdi::CdiLayout;

use crate::agent::Agent;
use crate::claims::ClaimSource;

pub mod authority;
pub mod health;
pub mod prepare;
pub mod proto;
pub mod registration;
pub mod service;
pub mod socket;

/// The default driver name.
pub const DEFAULT_DRIVER: &str = gpu_integrations::dra::DEFAULT_DRIVER;
/// The kubelet's default directory.
pub const DEFAULT_KUBELET_DIR: &str = "/var/lib/kubelet";
/// The default CDI spec directory (transient specs: gone after a reboot, as prepared devices).
pub const DEFAULT_CDI_DIR: &str = "/var/run/cdi";
/// The plugin type a DRA plugin registers as.
pub const PLUGIN_TYPE: &str = "DRAPlugin";
/// The services this plugin serves, as `GetInfo` names them.
pub const SUPPORTED_VERSIONS: [&str; 3] = [
    "v1.DRAPlugin",
    "v1beta1.DRAPlugin",
    "v1alpha1.DRAResourceHealth",
];

/// Where and as what the plugin serves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DraConfig {
    /// The driver name (a DNS subdomain).
    pub driver: String,
    /// The kubelet's directory (`/var/lib/kubelet`).
    pub kubelet_dir: PathBuf,
    /// The CDI spec directory (`/var/run/cdi`).
    pub cdi_dir: PathBuf,
}

impl DraConfig {
    /// The kubelet's defaults for `driver`.
    pub fn new(driver: &str) -> Self {
        DraConfig {
            driver: driver.to_owned(),
            kubelet_dir: PathBuf::from(DEFAULT_KUBELET_DIR),
            cdi_dir: PathBuf::from(DEFAULT_CDI_DIR),
        }
    }

    /// The registration socket: `<kubelet-dir>/plugins_registry/<driver>-reg.sock`.
    pub fn registration_socket(&self) -> PathBuf {
        self.kubelet_dir
            .join("plugins_registry")
            .join(format!("{}-reg.sock", self.driver))
    }

    /// The plugin's own directory: `<kubelet-dir>/plugins/<driver>`.
    pub fn plugin_dir(&self) -> PathBuf {
        self.kubelet_dir.join("plugins").join(&self.driver)
    }

    /// The DRA socket: `<kubelet-dir>/plugins/<driver>/dra.sock`.
    pub fn endpoint(&self) -> PathBuf {
        self.plugin_dir().join("dra.sock")
    }
}

/// Why the plugin cannot start, or cannot answer for a claim or for device health.
#[derive(Debug, thiserror::Error)]
pub enum DraError {
    /// The driver name cannot name CDI devices.
    #[error("--dra-driver")]
    Driver(#[source] gpu_integrations::IntegrationError),
    /// The agent's host has no root directory to keep the claim store in.
    #[error("the host has no root directory")]
    NoRoot,
    /// The claim store cannot be opened or read, or the slices cannot be built.
    #[error(transparent)]
    Integration(#[from] gpu_integrations::IntegrationError),
    /// A claim that was not prepared or unprepared: the reason, as the kubelet is told it.
    #[error("{0}")]
    Claim(String),
}

impl DraError {
    /// A claim's failure, whatever form the prepare step gives it.
    pub fn claim(e: impl std::fmt::Display) -> Self {
        DraError::Claim(e.to_string())
    }
}

impl gpu_core::ClassifiedError for DraError {
    fn kind(&self) -> gpu_core::ErrorKind {
        match self {
            DraError::Driver(e) | DraError::Integration(e) => gpu_core::ClassifiedError::kind(e),
            DraError::NoRoot => gpu_core::ErrorKind::HostError,
            DraError::Claim(_) => gpu_core::ErrorKind::Other,
        }
    }
}

/// The plugin: the agent it writes through, where claims are read, and where its files go.
pub struct DraPlugin {
    agent: Arc<Agent>,
    claims: Arc<dyn ClaimSource>,
    config: DraConfig,
    cdi: CdiLayout,
    /// The node's claim store (the one `gpuslice dra prepare` keeps), opened once.
    store: ClaimStore,
}

impl std::fmt::Debug for DraPlugin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DraPlugin")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl DraPlugin {
    /// The plugin of `agent`, reading claims from `claims`.
    ///
    /// # Errors
    /// A driver name that is not a DNS subdomain; an agent whose host has no root directory.
    pub fn new(
        agent: Arc<Agent>,
        claims: Arc<dyn ClaimSource>,
        config: DraConfig,
    ) -> Result<Arc<Self>, DraError> {
        let cdi =
            CdiLayout::under_kubelet(config.cdi_dir.clone(), &config.kubelet_dir, &config.driver)
                .map_err(DraError::Driver)?;
        let store = prepare::store_of(&agent).map_err(DraError::claim)?;
        // Its counters are the agent's: served on `/metrics` from now on.
        agent
            .stats()
            .dra_on
            .store(true, std::sync::atomic::Ordering::Relaxed);
        Ok(Arc::new(DraPlugin {
            agent,
            claims,
            config,
            cdi,
            store,
        }))
    }

    /// Where and as what it serves.
    pub fn config(&self) -> &DraConfig {
        &self.config
    }

    /// Its counters (kept in the agent's figures, so `/metrics` serves them).
    pub fn stats(&self) -> &DraStats {
        &self.agent.stats().dra
    }

    /// The agent it writes through.
    pub fn agent(&self) -> &Arc<Agent> {
        &self.agent
    }

    /// The node's name (and its pool's).
    pub fn node(&self) -> String {
        self.agent.snapshot().topology.node.clone()
    }

    pub(crate) fn count(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }
}

/// The plugin's two sockets, bound: [`Bound::run`] serves them.
#[derive(Debug)]
pub struct Bound {
    plugin: Arc<DraPlugin>,
    dra: socket::Bound,
    registration: socket::Bound,
}

/// Binds the plugin's two sockets, the DRA endpoint first, so that the kubelet never finds a
/// registration whose endpoint is not there yet. Call on the runtime.
///
/// # Errors
/// A socket that cannot be bound (see [`socket::bind`]).
pub fn bind(plugin: Arc<DraPlugin>) -> std::io::Result<Bound> {
    let dra = socket::bind(&plugin.config.endpoint())?;
    let registration = socket::bind(&plugin.config.registration_socket())?;
    Ok(Bound {
        plugin,
        dra,
        registration,
    })
}

impl Bound {
    /// Serves until `shutdown`; then both socket files are removed (the registration first, so
    /// the kubelet stops calling before the endpoint goes).
    ///
    /// # Errors
    /// A server that fails.
    pub async fn run(
        mut self,
        shutdown: impl std::future::Future<Output = ()> + Send + 'static,
    ) -> std::io::Result<()> {
        use tokio_stream::StreamExt as _;
        use tokio_stream::wrappers::UnixListenerStream;
        use tonic::transport::Server;

        // Every connection through the authority filter: any `:authority` is accepted.
        let incoming = |l: tokio::net::UnixListener| {
            UnixListenerStream::new(l).map(|s| s.map(authority::filter))
        };

        let plugin = Arc::clone(&self.plugin);
        let (stop, stopped) = tokio::sync::watch::channel(false);
        let wait = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
            let _ = rx.wait_for(|v| *v).await;
        };
        let dra_server = Server::builder()
            .add_service(service::v1_server(Arc::clone(&plugin)))
            .add_service(service::v1beta1_server(Arc::clone(&plugin)))
            .add_service(health::v1alpha1_server(Arc::clone(&plugin)))
            .add_service(health::v1_server(Arc::clone(&plugin)))
            .serve_with_incoming_shutdown(
                incoming(self.dra.listener.take().ok_or_else(taken)?),
                wait(stopped.clone()),
            );
        let reg_server = Server::builder()
            .add_service(registration::server(Arc::clone(&plugin)))
            .serve_with_incoming_shutdown(
                incoming(self.registration.listener.take().ok_or_else(taken)?),
                wait(stopped),
            );
        crate::log!(
            "gpuslice agent: DRA driver {}: registration at {}, serving {}",
            plugin.config.driver,
            plugin.config.registration_socket().display(),
            plugin.config.endpoint().display()
        );
        let stopper = tokio::spawn(async move {
            shutdown.await;
            stop.send_replace(true);
        });
        let (a, b) = tokio::join!(dra_server, reg_server);
        stopper.abort();
        drop(self.registration);
        drop(self.dra);
        a.and(b).map_err(std::io::Error::other)
    }
}

/// [`bind`], then [`Bound::run`].
///
/// # Errors
/// A socket that cannot be bound; a server that fails.
pub async fn serve(
    plugin: Arc<DraPlugin>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    bind(plugin)?.run(shutdown).await
}

fn taken() -> std::io::Error {
    std::io::Error::other("internal: the listener was taken twice")
}
