//! `gpuslice agent`: the node agent, serving this host's GPUs over a versioned HTTP API until
//! SIGTERM. The flags become a [`gpu_agent::DaemonConfig`]; [`gpu_agent::Daemon`] does the rest.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use gpu_agent::{DaemonConfig, DaemonDra, UeventMode, WatchedLayout};

use crate::common::Global;

// Arguments of `gpuslice agent`.
#[derive(clap::Args, Debug)]
#[command(group(clap::ArgGroup::new("kube_user").args(["dra", "config_label"]).multiple(true)))]
pub struct AgentArgs {
    /// Where to listen: `unix:PATH` or `tcp:ADDR:PORT` (repeatable). Default:
    /// `unix:/run/gpuslice/agent.sock` under --root (`ROOT/run/gpuslice/agent.sock`, never the
    /// real host's). TCP needs --token-file or --insecure-read-only.
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
    /// Do not load NVML, even with `--root /`: health from sysfs signals only, no XID or ECC events.
    #[arg(long)]
    pub no_nvml: bool,
    /// Keep this layout file applied: at start, when it changes (a ConfigMap's symlink swap too)
    /// and when the host lost what it made (each resync). Same safety as `vgpu apply`. With
    /// `--dra`, before Kubernetes 1.36.2 it picks the one size each GPU offers in the slices.
    #[arg(long, value_name = "FILE")]
    pub layout: Option<PathBuf>,
    /// The config of --layout to apply (may be left out when the file has only one).
    #[arg(short = 'c', long = "config", value_name = "NAME", requires = "layout")]
    pub config: Option<String>,
    /// Pick the config of --layout from this label of the node's Node object
    /// (`nvidia.com/vgpu.config`, as NVIDIA's vgpu-device-manager does) and apply again when it
    /// changes; a missing label or an unknown config is an event and changes nothing. Reads the
    /// API server with --kubeconfig (default: the in-cluster service account).
    #[arg(
        long,
        value_name = "LABEL",
        requires = "layout",
        conflicts_with = "config"
    )]
    pub config_label: Option<String>,
    /// Listen to the kernel's uevents: `auto` (only on the live host, `--root /`), `on` (always;
    /// fails to start without the netlink socket), `off` (only the periodic resync).
    #[arg(long, default_value = "auto", value_name = "auto|on|off")]
    pub uevents: UeventMode,
    /// A sysfs read slower than this (ms) is reported; its GPU is Unknown until a read answers.
    #[arg(long, default_value_t = 5000, value_name = "MS")]
    pub read_deadline: u64,
    #[command(flatten)]
    pub dra: DraArgs,
}

// The kubelet plugin's options (`--dra`).
#[derive(clap::Args, Debug)]
pub struct DraArgs {
    /// Also serve as a Kubernetes DRA driver: register with the kubelet, prepare the claims it
    /// names (with a CDI spec and KubeVirt's device metadata each), stream device health.
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
    #[arg(long, value_name = "FILE", requires = "kube_user")]
    pub kubeconfig: Option<PathBuf>,
    /// Before Kubernetes 1.36.2: the one vGPU size an unlocked GPU offers in the published
    /// slices (repeatable), as `export dra --size-for`; it wins over the size `--layout` gives.
    #[arg(long, value_name = "GPU=PROFILE", value_parser = crate::cmd::export::parse_size_for, requires = "dra")]
    pub size_for: Vec<(gpu_core::PciAddress, String)>,
    /// Do not publish this node's ResourceSlices (another process keeps them, e.g.
    /// `gpuslice dra publish`); the kubelet plugin still runs.
    #[arg(long, requires = "dra")]
    pub no_publish: bool,
    /// Read allocated ResourceClaims from the YAML/JSON files in DIR, not the API server.
    #[arg(long, value_name = "DIR", requires = "dra")]
    pub claims_dir: Option<PathBuf>,
    /// The largest API server answer read, in bytes; a larger one is refused (and counted).
    #[arg(long, default_value_t = gpu_agent::kube::MAX_ANSWER, value_name = "BYTES", requires = "dra")]
    pub max_apiserver_answer: u64,
}

/// Runs the agent until SIGTERM or Ctrl-C: the flags become a [`DaemonConfig`], checked by
/// [`gpu_agent::Daemon::open`] before anything touches the host.
pub fn run(g: &Global, a: AgentArgs) -> anyhow::Result<ExitCode> {
    let listen: Result<Vec<_>, _> = a.listen.iter().map(|s| s.parse()).collect();
    let mut config = DaemonConfig {
        listen: listen.context("--listen")?,
        token_file: a.token_file,
        insecure_read_only: a.insecure_read_only,
        socket_group: a.socket_group,
        state_dir: a.state_dir,
        resync: (a.resync > 0).then(|| Duration::from_secs(a.resync)),
        lock_timeout: Duration::from_secs(a.lock_timeout),
        nvml: !a.no_nvml,
        layout: (a.layout).map(|path| WatchedLayout {
            path,
            config: a.config,
        }),
        uevents: a.uevents,
        read_deadline: Duration::from_millis(a.read_deadline.max(1)),
        document_limit: crate::common::document_limit(),
        ..DaemonConfig::new(g.node_name(), g.root.clone())
    };
    if let Some(label) = a.config_label {
        let mut c = gpu_agent::kube::node_label::ConfigLabel::new(label);
        c.kubeconfig = a.dra.kubeconfig.clone();
        config.config_label = Some(c);
    }
    if a.dra.dra {
        let mut dra = DaemonDra::new(&a.dra.dra_driver);
        (dra.plugin.kubelet_dir, dra.plugin.cdi_dir) = (a.dra.kubelet_dir, a.dra.cdi_dir);
        (dra.kubeconfig, dra.publish) = (a.dra.kubeconfig, !a.dra.no_publish);
        (dra.claims_dir, dra.max_answer) = (a.dra.claims_dir, a.dra.max_apiserver_answer);
        dra.size_for = a.dra.size_for.into_iter().collect();
        config.dra = Some(dra);
    }
    gpu_agent::Daemon::open(config)?.run_blocking()?;
    Ok(ExitCode::SUCCESS)
}
