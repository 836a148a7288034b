//! What a [`super::Daemon`] is built from: every choice `gpuslice agent`'s flags make, as values.
//! The front-end parses its command line into a [`DaemonConfig`]; the checks and the assembly
//! are the library's.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use gpu_core::PciAddress;

use crate::dra::DraConfig;
use crate::serve::Listen;
use crate::sources::UeventMode;
use crate::watch::WatchedLayout;

/// The socket a default agent listens on (on the live host).
pub const DEFAULT_SOCKET: &str = "/run/gpuslice/agent.sock";

/// How long a stopping part (the slice publisher, the kubelet plugin) is waited for.
pub const STOP_TIMEOUT: Duration = Duration::from_secs(5);

/// How long the watchers' threads are waited for at the end.
pub const WATCHERS_TIMEOUT: Duration = Duration::from_secs(2);

/// Everything a daemon runs with.
#[derive(Debug, Clone)]
pub struct DaemonConfig {
    /// The node's name (written into the topology, and the pool of its ResourceSlices).
    pub node: String,
    /// The host's root: `/`, a directory tree, or a sandbox (`sandbox:DIR`).
    pub root: PathBuf,
    /// Where to listen; empty: [`default_listen`] for the root.
    pub listen: Vec<Listen>,
    /// A file holding the bearer token TCP clients must send.
    pub token_file: Option<PathBuf>,
    /// Serve TCP without a token, GETs only.
    pub insecure_read_only: bool,
    /// The group the unix sockets are given to (a name or a number).
    pub socket_group: Option<String>,
    /// Where the promises are kept (`None`: `<root>/var/lib/gpuslice/agent`).
    pub state_dir: Option<PathBuf>,
    /// Read the whole host again this often (`None`: never).
    pub resync: Option<Duration>,
    /// How long a write waits for the host's layout lock before answering `busy`.
    pub lock_timeout: Duration,
    /// Load NVML on the live host (health telemetry, XID and ECC events).
    pub nvml: bool,
    /// A layout file kept applied (and, with DRA before 1.36.2, the sizes it gives).
    pub layout: Option<WatchedLayout>,
    /// Whether to listen to the kernel's uevents.
    pub uevents: UeventMode,
    /// A host read slower than this is reported and its GPU served as Unknown.
    pub read_deadline: Duration,
    /// The cap on documents the daemon reads at start (the layout file).
    pub document_limit: gpu_sysfs::DocumentLimit,
    /// Serve as a Kubernetes DRA driver too.
    pub dra: Option<DaemonDra>,
}

impl DaemonConfig {
    /// A daemon for `node` on `root` with `gpuslice agent`'s defaults: the default socket, a
    /// resync every 60 s, a 30 s lock timeout, NVML where the root is the live host, uevents
    /// `auto`, a 5 s read deadline, the default document cap, no layout, no DRA.
    pub fn new(node: impl Into<String>, root: impl Into<PathBuf>) -> Self {
        DaemonConfig {
            node: node.into(),
            root: root.into(),
            listen: vec![],
            token_file: None,
            insecure_read_only: false,
            socket_group: None,
            state_dir: None,
            resync: Some(Duration::from_secs(60)),
            lock_timeout: Duration::from_secs(30),
            nvml: true,
            layout: None,
            uevents: UeventMode::Auto,
            read_deadline: Duration::from_secs(5),
            document_limit: gpu_sysfs::DocumentLimit::default(),
            dra: None,
        }
    }
}

/// The kubelet plugin's and the slice publisher's part of a daemon.
#[derive(Debug, Clone)]
pub struct DaemonDra {
    /// The driver name and the kubelet's and CDI's directories.
    pub plugin: DraConfig,
    /// The kubeconfig to reach the API server with (`None`: the in-cluster service account).
    pub kubeconfig: Option<PathBuf>,
    /// Before Kubernetes 1.36.2: the one vGPU size an unlocked GPU offers in the slices.
    pub size_for: BTreeMap<PciAddress, String>,
    /// Publish this node's ResourceSlices (off: another process keeps them).
    pub publish: bool,
    /// Read allocated ResourceClaims from the files in this directory instead of the API
    /// server (with `publish` off, no API server is needed at all).
    pub claims_dir: Option<PathBuf>,
    /// The largest API server answer read, in bytes ([`crate::kube::MAX_ANSWER`] by default).
    pub max_answer: u64,
}

impl DaemonDra {
    /// Whether the daemon needs the API server: to publish, or to read claims from.
    pub fn needs_api_server(&self) -> bool {
        self.publish || self.claims_dir.is_none()
    }
}

impl DaemonDra {
    /// The kubelet's defaults for `driver`, the in-cluster service account, publishing on.
    pub fn new(driver: &str) -> Self {
        DaemonDra {
            plugin: DraConfig::new(driver),
            kubeconfig: None,
            size_for: BTreeMap::new(),
            publish: true,
            claims_dir: None,
            max_answer: crate::kube::MAX_ANSWER,
        }
    }
}

/// Where the agent listens when nothing is named: [`DEFAULT_SOCKET`] on the live host, the same
/// path inside the root for any other root (a tree or a sandbox is never served on the real
/// host's socket).
pub fn default_listen(root: &Path, live: bool) -> Listen {
    if live {
        Listen::Unix(PathBuf::from(DEFAULT_SOCKET))
    } else {
        Listen::Unix(root.join(DEFAULT_SOCKET.trim_start_matches('/')))
    }
}
