//! `gpuslice agent`: the node agent, serving this host's GPUs over a versioned HTTP API (the
//! `gpu-agent` crate) until SIGTERM. This module parses and checks the options, opens the agent,
//! starts the watchers (kernel uevents, the periodic resync, a watched layout file) and runs the
//! server.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use gpu_agent::{Access, Agent, Listen, Listener};

use crate::common::Global;

/// The socket a default agent listens on.
pub const DEFAULT_SOCKET: &str = "/run/gpuslice/agent.sock";

// Arguments of `gpuslice agent`.
#[derive(clap::Args, Debug)]
pub struct AgentArgs {
    /// Where to listen: `unix:PATH` or `tcp:ADDR:PORT` (repeatable). Default:
    /// `unix:/run/gpuslice/agent.sock` with `--root /`; under any other root the same path
    /// inside it (`ROOT/run/gpuslice/agent.sock`), never the real host's. TCP needs
    /// --token-file or --insecure-read-only.
    #[arg(long, value_name = "unix:PATH|tcp:ADDR:PORT")]
    pub listen: Vec<String>,
    /// A file holding the bearer token TCP clients must send (`Authorization: Bearer ...`): at
    /// least 16 characters, surrounding whitespace ignored.
    #[arg(long, value_name = "FILE")]
    pub token_file: Option<PathBuf>,
    /// Serve TCP without a token, GETs only (every write is refused with 403).
    #[arg(long)]
    pub insecure_read_only: bool,
    /// Give the unix socket to this group (name or number); it is created mode 0660.
    #[arg(long, value_name = "GROUP")]
    pub socket_group: Option<String>,
    /// Where the agent keeps its promises (default `<root>/var/lib/gpuslice/agent`).
    #[arg(long, value_name = "DIR")]
    pub state_dir: Option<PathBuf>,
    /// Read the whole host again every this many seconds (0: never).
    #[arg(long, default_value_t = 60, value_name = "SECONDS")]
    pub resync: u64,
    /// How long a write waits for another `gpuslice vgpu apply` before answering `busy`.
    #[arg(long, default_value_t = 30, value_name = "SECONDS")]
    pub lock_timeout: u64,
    /// Do not load NVML, even with `--root /`: grade health from sysfs signals only, and receive
    /// no XID or double-bit ECC events.
    #[arg(long)]
    pub no_nvml: bool,
    /// Keep this layout file applied: at start and whenever it changes (the file's directory
    /// is watched, so a mounted ConfigMap's symlink swap is seen). Same safety as `vgpu apply`:
    /// instances a VM holds are left alone and reported. With `--dra`, before Kubernetes 1.36.2
    /// it also picks the one size each GPU offers in the published slices.
    #[arg(long, value_name = "FILE")]
    pub layout: Option<PathBuf>,
    /// The config of --layout to apply (may be left out when the file has only one).
    #[arg(short = 'c', long = "config", value_name = "NAME", requires = "layout")]
    pub config: Option<String>,
    /// Listen to the kernel's uevents: `auto` (only with `--root /`), `on`, `off`.
    #[arg(long, value_enum, default_value_t = Uevents::Auto)]
    pub uevents: Uevents,
    /// A sysfs read taking longer than this many milliseconds is reported and its GPU is
    /// served as Unknown until a read answers.
    #[arg(long, default_value_t = 5000, value_name = "MS")]
    pub read_deadline: u64,
    #[command(flatten)]
    pub dra: DraArgs,
}

// The kubelet plugin's options (`--dra`).
#[derive(clap::Args, Debug)]
pub struct DraArgs {
    /// Also serve as a Kubernetes DRA driver: register with the kubelet and prepare the claims
    /// it names (reading them from the API server), with a CDI spec and KubeVirt's device
    /// metadata per claim, and stream device health.
    #[arg(long)]
    pub dra: bool,
    /// The DRA driver name the devices are published under.
    #[arg(long, default_value = gpu_agent::dra::DEFAULT_DRIVER, value_name = "NAME", requires = "dra")]
    pub dra_driver: String,
    /// The kubelet's directory on the host (taken as given, not under --root): the plugin
    /// registers in `plugins_registry/` and serves `plugins/<driver>/dra.sock`.
    #[arg(long, default_value = gpu_agent::dra::DEFAULT_KUBELET_DIR, value_name = "DIR", requires = "dra")]
    pub kubelet_dir: PathBuf,
    /// Where the CDI specs of prepared claims go (a host path, taken as given).
    #[arg(long, default_value = gpu_agent::dra::DEFAULT_CDI_DIR, value_name = "DIR", requires = "dra")]
    pub cdi_dir: PathBuf,
    /// The kubeconfig to reach the API server with (default: the in-cluster service account).
    #[arg(long, value_name = "FILE", requires = "dra")]
    pub kubeconfig: Option<PathBuf>,
    /// Before Kubernetes 1.36.2: the one vGPU size an unlocked GPU offers in the published
    /// slices (repeatable), as `export dra --size-for`; it wins over the size `--layout` gives.
    #[arg(long, value_name = "GPU=PROFILE", value_parser = crate::cmd::export::parse_size_for, requires = "dra")]
    pub size_for: Vec<(gpu_core::PciAddress, String)>,
    /// Do not publish this node's ResourceSlices (another process keeps them, e.g.
    /// `gpuslice dra publish`); the kubelet plugin still runs.
    #[arg(long, requires = "dra")]
    pub no_publish: bool,
}

/// `--uevents`.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum Uevents {
    /// Only on the live host (`--root /`).
    Auto,
    /// Always (fails to start without the netlink socket).
    On,
    /// Never: only the periodic resync.
    Off,
}

/// The most a token file may hold.
const MAX_TOKEN_FILE: usize = 4096;

fn read_token(path: &std::path::Path) -> anyhow::Result<Arc<[u8]>> {
    let bytes = gpu_agent::read_file(path, MAX_TOKEN_FILE).context("cannot read --token-file")?;
    let text = String::from_utf8(bytes)
        .map_err(|_| anyhow::anyhow!("--token-file {}: not UTF-8 text", path.display()))?;
    gpu_agent::parse_token(&text)
        .map_err(|e| anyhow::anyhow!("--token-file {}: {e}", path.display()))
}

/// Where the agent listens when `--listen` is not given: [`DEFAULT_SOCKET`] on the live host,
/// the same path inside the root for any other root (a tree or a sandbox is never served on
/// the real host's socket).
fn default_listen(root: &std::path::Path, live: bool) -> Listen {
    if live {
        Listen::Unix(PathBuf::from(DEFAULT_SOCKET))
    } else {
        Listen::Unix(root.join(DEFAULT_SOCKET.trim_start_matches('/')))
    }
}

/// Runs the agent until SIGTERM or Ctrl-C.
///
/// Every option and file is checked before anything touches the host: the node name, the
/// listen addresses (and that TCP has a token or `--insecure-read-only`; unix paths checked, TCP
/// bound), the token file and its length, the root, the state directory and its file, the layout
/// file. Only then does reconcile run; the unix sockets are bound after it.
///
/// # Errors
/// Invalid options, a host that cannot be opened, a malformed state file, a listener that cannot
/// be bound (or a TCP listener without a token).
pub fn run(g: &Global, a: AgentArgs) -> anyhow::Result<ExitCode> {
    let node = g.node_name();
    gpu_core::validate_name(&node).context("--node")?;
    let live = gpu_health::is_local_root(&g.root);
    if a.dra.dra && !gpu_integrations::dra::names::is_dns_subdomain(&a.dra.dra_driver) {
        bail!(
            "--dra-driver {:?}: not a DNS subdomain (lower-case letters, digits, '-' and '.')",
            a.dra.dra_driver
        );
    }
    let listens: Vec<Listen> = if a.listen.is_empty() {
        vec![default_listen(&g.root, live)]
    } else {
        a.listen
            .iter()
            .map(|s| s.parse::<Listen>().map_err(anyhow::Error::msg))
            .collect::<anyhow::Result<_>>()
            .context("--listen")?
    };
    let token = a.token_file.as_deref().map(read_token).transpose()?;
    if token.is_none() && !a.insecure_read_only {
        if let Some(Listen::Tcp(addr)) = listens.iter().find(|l| matches!(l, Listen::Tcp(_))) {
            bail!(
                "--listen tcp:{addr} needs --token-file (or --insecure-read-only to serve GETs only)"
            );
        }
    }
    if g.root.is_file() {
        bail!(
            "--root {}: the agent needs a directory tree it can change, not a recording",
            g.root.display()
        );
    }
    let mut req = gpu_health::NodeRequest::new(node.clone());
    if a.no_nvml {
        req.nvml = gpu_health::NvmlSource::Off;
    }
    let (host, mut config) = gpu_agent::config_for_root(&g.root, &req)
        .with_context(|| format!("--root {}", g.root.display()))?;
    config.state_dir = a.state_dir.clone();
    config.lock_timeout = Duration::from_secs(a.lock_timeout);
    Agent::check_state(&host, &config).map_err(|e| anyhow::anyhow!("{}", e.message))?;
    if let Some(l) = &a.layout {
        // A layout that does not parse is refused before anything starts.
        let text = crate::common::read_input(l, "--layout")?;
        let file = gpu_core::layout::LayoutFile::parse(&text)
            .with_context(|| format!("--layout {}", l.display()))?;
        file.select(a.config.as_deref())
            .with_context(|| format!("--layout {}", l.display()))?;
    }
    // The uevent socket is bound before the first read of the host and before the listeners:
    // every device change from then on is queued for the agent, even before its watchers run.
    let mode = match a.uevents {
        Uevents::Auto => gpu_agent::UeventMode::Auto,
        Uevents::On => gpu_agent::UeventMode::On,
        Uevents::Off => gpu_agent::UeventMode::Off,
    };
    let uevents = gpu_agent::open_uevents(mode, live)
        .context("--uevents on: cannot open the kernel's uevent socket")?;
    let gpu_events = gpu_agent::open_gpu_events(live, a.no_nvml, &mut config.health);
    let rt = gpu_agent::runtime().context("cannot start the agent's runtime")?;
    rt.block_on(async move {
        // Checked before reconcile: a unix path that cannot be served is refused here, and TCP
        // addresses are bound now (a bind that fails stops the agent before it changes
        // anything). Unix sockets are bound once the agent is open, so a client that finds the
        // socket finds the promises reconciled.
        let mut tcp = Vec::new();
        for l in &listens {
            match l {
                Listen::Unix(p) => {
                    Listener::check_unix(p, a.socket_group.as_deref())?;
                }
                Listen::Tcp(addr) => tcp.push(Listener::bind_tcp(
                    addr,
                    Access {
                        token: token.clone(),
                        read_only: token.is_none() && a.insecure_read_only,
                    },
                )?),
            }
        }
        // The API server is reached before anything changes on the host: a kubeconfig that
        // cannot be used stops the agent here.
        let claims: Option<gpu_agent::kube::KubeClient> = if a.dra.dra {
            let opts = gpu_agent::kube::ClientOptions {
                kubeconfig: a.dra.kubeconfig.clone(),
                ..gpu_agent::kube::ClientOptions::default()
            };
            let client = gpu_agent::kube::KubeClient::connect(&opts)
                .await
                .with_context(|| match &a.dra.kubeconfig {
                    Some(k) => format!("--kubeconfig {}", k.display()),
                    None => "--dra: the in-cluster configuration (or pass --kubeconfig)".to_owned(),
                })?;
            eprintln!(
                "gpuslice agent: reading ResourceClaims from {}",
                client.server()
            );
            Some(client)
        } else {
            None
        };
        let agent = Agent::open(host, config).map_err(|e| anyhow::anyhow!("{}", e.message))?;
        for r in agent.reconciled() {
            eprintln!(
                "gpuslice agent: promise {}: {}{}",
                r.promise.device.id(),
                r.outcome.as_str(),
                r.message.map(|m| format!(" ({m})")).unwrap_or_default()
            );
        }
        let mut tcp = tcp.into_iter();
        let mut listeners = Vec::new();
        for l in &listens {
            let bound = match l {
                Listen::Unix(p) => Listener::bind_unix(p, a.socket_group.as_deref())?,
                Listen::Tcp(_) => match tcp.next() {
                    Some(t) => t,
                    None => bail!("internal: a TCP listener went missing"),
                },
            };
            eprintln!("gpuslice agent: serving on {}", bound.address());
            listeners.push(bound);
        }
        let watch = gpu_agent::WatchOptions {
            resync: (a.resync > 0).then(|| Duration::from_secs(a.resync)),
            uevents,
            gpu_events,
            layout: a.layout.clone().map(|path| gpu_agent::WatchedLayout {
                path,
                config: a.config.clone(),
            }),
            read_deadline: Duration::from_millis(a.read_deadline.max(1)),
            ..gpu_agent::WatchOptions::default()
        };
        let watchers = gpu_agent::watch::start(&agent, watch, tokio::runtime::Handle::current())
            .context("--layout")?;
        let terminated = gpu_agent::on_terminate()?;
        // The publisher keeps this node's ResourceSlices true in the API server; its handle
        // lives until the agent stops (dropping it stops publishing).
        let publisher = match (&claims, a.dra.no_publish) {
            (Some(client), false) => {
                let store = match agent.host().root_dir() {
                    Some(root) => Some(Arc::new(
                        gpu_integrations::dra::ClaimStore::open(root, None)
                            .context("--dra: the claim store")?,
                    )),
                    None => None,
                };
                let opts = gpu_agent::kube::PublishOptions {
                    slices: gpu_agent::kube::SliceOptions {
                        driver: a.dra.dra_driver.clone(),
                        size_for: a.dra.size_for.iter().cloned().collect(),
                    },
                    claims: store,
                    // Before 1.36.2 each GPU offers the size the watched layout gives it.
                    layout: a.layout.clone().map(|path| gpu_agent::WatchedLayout {
                        path,
                        config: a.config.clone(),
                    }),
                    ..gpu_agent::kube::PublishOptions::default()
                };
                Some(
                    gpu_agent::kube::spawn_publisher(Arc::clone(&agent), client.clone(), opts)
                        .await
                        .context("--dra: publishing ResourceSlices")?,
                )
            }
            _ => None,
        };
        let plugin = match claims {
            Some(client) => {
                let claims: Arc<dyn gpu_agent::claims::ClaimSource> = Arc::new(client);
                let config = gpu_agent::dra::DraConfig {
                    driver: a.dra.dra_driver.clone(),
                    kubelet_dir: a.dra.kubelet_dir.clone(),
                    cdi_dir: a.dra.cdi_dir.clone(),
                };
                let plugin = gpu_agent::dra::DraPlugin::new(Arc::clone(&agent), claims, config)
                    .map_err(anyhow::Error::msg)?;
                // The plugin stops with the agent: its shutdown is the agent's.
                let bound = gpu_agent::dra::bind(plugin).context("--dra")?;
                let mut down = agent.shutdown_signal();
                Some(tokio::spawn(bound.run(async move {
                    let _ = down.wait_for(|v| *v).await;
                })))
            }
            None => None,
        };
        gpu_agent::serve(agent, listeners, async move {
            terminated.await;
            eprintln!("gpuslice agent: shutting down");
        })
        .await?;
        if let Some(p) = publisher {
            if tokio::time::timeout(Duration::from_secs(5), p.stop())
                .await
                .is_err()
            {
                eprintln!("gpuslice agent: slice publisher still stopping after 5 s");
            }
        }
        if let Some(p) = plugin {
            match tokio::time::timeout(Duration::from_secs(5), p).await {
                Ok(Ok(Ok(()))) => {}
                Ok(Ok(Err(e))) => eprintln!("gpuslice agent: DRA plugin: {e}"),
                Ok(Err(e)) => eprintln!("gpuslice agent: DRA plugin: {e}"),
                Err(_) => eprintln!("gpuslice agent: DRA plugin still stopping after 5 s"),
            }
        }
        watchers.join(Duration::from_secs(2));
        anyhow::Ok(())
    })?;
    Ok(ExitCode::SUCCESS)
}
