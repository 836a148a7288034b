//! How the agent runs: its configuration, what it hands a VM, and the bearer token rule.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use gpu_core::NodeTopology;
use gpu_health::HealthOptions;
use gpu_sysfs::Host;
use gpu_sysfs::discover::DiscoverOptions;

/// Renders Prometheus text for a topology in place of gpuslice's own exposition (an embedder's
/// or a test's renderer): the body or a message.
pub type MetricsHook =
    Arc<dyn Fn(&NodeTopology) -> Result<String, crate::error::RenderError> + Send + Sync>;

/// What an embedder may put in place of the agent's own pieces.
#[derive(Clone, Default)]
pub struct Hooks {
    /// Renders `GET /metrics` instead of [`AgentConfig::metrics`].
    pub metrics: Option<MetricsHook>,
    /// The content type of that text (default: Prometheus text 0.0.4).
    pub metrics_content_type: Option<String>,
}

impl std::fmt::Debug for Hooks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Hooks")
            .field("metrics", &self.metrics.is_some())
            .finish()
    }
}

/// How the agent runs.
#[derive(Debug, Clone)]
pub struct AgentConfig {
    /// Discovery options (node name, resolver, parent filter).
    pub discover: DiscoverOptions,
    /// Health options (policy, telemetry).
    pub health: HealthOptions,
    /// Where promises are kept; `None`: `<root>/var/lib/gpuslice/agent`.
    pub state_dir: Option<PathBuf>,
    /// How long a write waits for the layout lock before answering `busy`.
    pub lock_timeout: Duration,
    /// Serve gpuslice's node metrics (`gpu_integrations::metrics`) at `GET /metrics`; without
    /// them (and without [`Hooks::metrics`]) the route answers `not-found`.
    pub metrics: bool,
    /// Pieces an embedder puts in place of the agent's own.
    pub hooks: Hooks,
    /// Where the node's Fabric Manager answers (NVSwitch partitions of `POST /v1/gpus/bind`).
    pub fabric: gpu_health::fabric::FabricSource,
    /// The node's NVML for MIG on request and mixed sizes (the local driver's, a sandbox's saved
    /// one): a MIG-backed type asked of `POST /v1/vgpus` gets its GPU instance made first, and a
    /// request's `mixedSizes` is checked and placed through it. `None`: no instance is made, a
    /// type no VF lists is refused as before, every GPU keeps one vGPU size, and a request
    /// asking for mixed sizes is refused.
    pub mig: Option<MigNvml>,
}

/// The NVML [`AgentConfig::mig`] makes GPU instances through.
#[derive(Clone)]
pub struct MigNvml(pub Arc<dyn gpu_nvml::NvmlDevices>);

impl std::fmt::Debug for MigNvml {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl AgentConfig {
    /// Node `node`, no telemetry, default state directory, 30 s lock timeout, no metrics, no
    /// hooks.
    pub fn new(node: impl Into<String>) -> Self {
        AgentConfig {
            discover: DiscoverOptions::new(node),
            health: HealthOptions::without_telemetry(gpu_health::Policy::default()),
            state_dir: None,
            lock_timeout: Duration::from_secs(30),
            metrics: false,
            hooks: Hooks::default(),
            fabric: gpu_health::fabric::FabricSource::None,
            mig: None,
        }
    }
}

/// Opens `root` through the one composition ([`gpu_health::open_node_host`]: NVML and the vGPU
/// type-name resolver on the local `/` only) and returns its host with a config holding the
/// options it decided (default state directory, lock timeout, gpuslice's node metrics served).
///
/// # Errors
/// A root that cannot be opened, or a named NVML library that does not open.
pub fn config_for_root(
    root: &std::path::Path,
    req: &gpu_health::NodeRequest,
) -> Result<(Arc<dyn Host>, AgentConfig), gpu_health::HealthError> {
    let opened = gpu_health::open_node_host(root, req)?;
    let mut config = AgentConfig::new(req.node.clone());
    config.discover = opened.discover;
    config.health = opened.health;
    config.metrics = true;
    config.fabric = gpu_health::fabric::FabricSource::of(&opened.host);
    config.mig = gpu_node::mig::open::open_nvml(&opened.host, &req.nvml)
        .ok()
        .map(|n| MigNvml(Arc::from(n)));
    let host: Arc<dyn Host> = Arc::new(opened.host);
    Ok((host, config))
}

/// The shortest bearer token accepted: a shorter one can be guessed.
pub const MIN_TOKEN_LEN: usize = 16;

/// Why a bearer token is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TokenError {
    /// Fewer than [`MIN_TOKEN_LEN`] characters.
    #[error("the token is shorter than {MIN_TOKEN_LEN} characters")]
    TooShort,
}

impl gpu_core::ClassifiedError for TokenError {
    fn kind(&self) -> gpu_core::ErrorKind {
        gpu_core::ErrorKind::InvalidArgument
    }
}

/// A bearer token as a token file holds it: the text without surrounding whitespace, at least
/// [`MIN_TOKEN_LEN`] characters.
///
/// # Errors
/// [`TokenError::TooShort`].
pub fn parse_token(text: &str) -> Result<Arc<[u8]>, TokenError> {
    let token = text.trim();
    if token.len() < MIN_TOKEN_LEN {
        return Err(TokenError::TooShort);
    }
    Ok(Arc::from(token.as_bytes()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_is_trimmed_and_a_short_one_refused() {
        assert_eq!(
            parse_token("  0123456789abcdef\n").ok().as_deref(),
            Some(&b"0123456789abcdef"[..])
        );
        assert_eq!(parse_token("short\n"), Err(TokenError::TooShort));
    }
}
