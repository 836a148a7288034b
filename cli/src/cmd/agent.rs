//! `gpuslice agent`: the node agent, serving this host's GPUs over a versioned HTTP API (the
//! `gpu-agent` crate) until SIGTERM. This module parses the options, fills the agent's hooks from
//! the CLI's integrations (metrics renderer, QEMU/libvirt hand-off), starts the watchers (kernel
//! uevents, the periodic resync, a watched layout file) and runs the server.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use gpu_agent::{Access, Agent, HandoffTarget, Hooks, Listen, Listener};

use crate::common::Global;
use gpu_integrations::{handoff, metrics};

/// The socket a default agent listens on.
pub const DEFAULT_SOCKET: &str = "/run/gpuslice/agent.sock";

/// Arguments of `gpuslice agent`.
#[derive(clap::Args, Debug)]
pub struct AgentArgs {
    /// Where to listen: `unix:PATH` or `tcp:ADDR:PORT` (repeatable; default
    /// `unix:/run/gpuslice/agent.sock`). TCP needs --token-file or --insecure-read-only.
    #[arg(long, value_name = "unix:PATH|tcp:ADDR:PORT")]
    pub listen: Vec<String>,
    /// A file holding the bearer token TCP clients must send (`Authorization: Bearer ...`).
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
    /// instances a VM holds are left alone and reported.
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

fn hooks() -> Hooks {
    Hooks {
        metrics: Some(Arc::new(|t: &gpu_core::NodeTopology| {
            metrics::render(std::slice::from_ref(t), &[]).map_err(|e| e.to_string())
        })),
        metrics_content_type: Some(metrics::CONTENT_TYPE.to_owned()),
        handoff: Some(Arc::new(
            |t: &gpu_core::NodeTopology, target: &HandoffTarget| {
                let devices = match target {
                    HandoffTarget::Mdev(uuid) => vec![handoff::VmDevice::Mdev { uuid: *uuid }],
                    HandoffTarget::Pci(a) => {
                        handoff::address_devices(t, a).map_err(|e| e.to_string())?
                    }
                };
                serde_json::to_value(handoff::VmHandoff::of(&devices)).map_err(|e| e.to_string())
            },
        )),
    }
}

fn read_token(path: &std::path::Path) -> anyhow::Result<Arc<[u8]>> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read --token-file {}", path.display()))?;
    gpu_agent::parse_token(&text)
        .map_err(|e| anyhow::anyhow!("--token-file {}: {e}", path.display()))
}

/// Runs the agent until SIGTERM or Ctrl-C.
///
/// # Errors
/// Invalid options, a host that cannot be opened, a malformed state file, a listener that cannot
/// be bound (or a TCP listener without a token).
pub fn run(g: &Global, a: AgentArgs) -> anyhow::Result<ExitCode> {
    let node = g.node_name();
    gpu_core::validate_name(&node).context("--node")?;
    let listens: Vec<Listen> = if a.listen.is_empty() {
        vec![Listen::Unix(PathBuf::from(DEFAULT_SOCKET))]
    } else {
        a.listen
            .iter()
            .map(|s| s.parse::<Listen>().map_err(anyhow::Error::msg))
            .collect::<anyhow::Result<_>>()
            .context("--listen")?
    };
    let token = a.token_file.as_deref().map(read_token).transpose()?;
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
    config.hooks = hooks();
    let live = gpu_health::is_local_root(&g.root);
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
    let agent = Agent::open(host, config).map_err(|e| anyhow::anyhow!("{}", e.message))?;
    for r in agent.reconciled() {
        eprintln!(
            "gpuslice agent: promise {}: {}{}",
            r.promise.device.id(),
            r.outcome.as_str(),
            r.message.map(|m| format!(" ({m})")).unwrap_or_default()
        );
    }
    let rt = gpu_agent::runtime().context("cannot start the agent's runtime")?;
    rt.block_on(async move {
        let mut listeners = Vec::new();
        for l in &listens {
            let bound = match l {
                Listen::Unix(p) => Listener::bind_unix(p, a.socket_group.as_deref())?,
                Listen::Tcp(addr) => Listener::bind_tcp(
                    addr,
                    Access {
                        token: token.clone(),
                        read_only: token.is_none() && a.insecure_read_only,
                    },
                )?,
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
        gpu_agent::serve(agent, listeners, async move {
            terminated.await;
            eprintln!("gpuslice agent: shutting down");
        })
        .await?;
        watchers.join(Duration::from_secs(2));
        anyhow::Ok(())
    })?;
    Ok(ExitCode::SUCCESS)
}
