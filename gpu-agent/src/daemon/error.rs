//! Why a daemon did not start or did not stop cleanly. The messages name the option of
//! `gpuslice agent` the failure concerns, and the cause is kept as the `source`: a front-end
//! renders the chain and classifies its first typed error ([`crate::error::as_classified`]).

use std::path::PathBuf;

use crate::error::{ApiCause, ApiError};
use crate::kube::KubeError;

/// Why a daemon did not start, or stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    /// The node name cannot be a node's.
    #[error("--node")]
    Node(#[source] gpu_core::CoreError),
    /// The DRA driver name is not a DNS subdomain.
    #[error("--dra-driver {0:?}: not a DNS subdomain (lower-case letters, digits, '-' and '.')")]
    Driver(String),
    /// The token file cannot be read.
    #[error("cannot read --token-file")]
    TokenRead(#[source] std::io::Error),
    /// The token file is not text.
    #[error("--token-file {0}: not UTF-8 text")]
    TokenText(PathBuf),
    /// The token is not one the agent takes.
    #[error("--token-file {path}")]
    Token {
        /// The token file.
        path: PathBuf,
        /// Why the token is refused.
        #[source]
        source: crate::agent::config::TokenError,
    },
    /// A TCP listener without a token, and writes not turned off.
    #[error("--listen tcp:{0} needs --token-file (or --insecure-read-only to serve GETs only)")]
    TcpWithoutToken(String),
    /// The root is a recording, which cannot be changed.
    #[error("--root {0}: the agent needs a directory tree it can change, not a recording")]
    RootIsFile(PathBuf),
    /// The root cannot be opened.
    #[error("--root {path}")]
    Root {
        /// The root.
        path: PathBuf,
        /// Why it cannot be opened.
        #[source]
        source: gpu_health::HealthError,
    },
    /// The agent refused to open (its state directory or file, the host).
    #[error("{}", .0.0.message)]
    Agent(#[source] ApiCause),
    /// The layout file cannot be read.
    #[error("cannot read --layout file {path}")]
    LayoutRead {
        /// The file.
        path: PathBuf,
        /// Why it cannot be read.
        #[source]
        source: std::io::Error,
    },
    /// The layout file does not parse, or lacks the config named.
    #[error("--layout {path}")]
    Layout {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        #[source]
        source: gpu_core::layout::LayoutError,
    },
    /// The watched layout's directory cannot be watched.
    #[error("--layout")]
    LayoutWatch(#[source] std::io::Error),
    /// `--uevents on` and the kernel's uevent socket cannot be opened.
    #[error("--uevents on: cannot open the kernel's uevent socket")]
    Uevents(#[source] std::io::Error),
    /// The runtime cannot be started.
    #[error("cannot start the agent's runtime")]
    Runtime(#[source] std::io::Error),
    /// A listener cannot be served, a signal handler installed, or the server failed.
    #[error(transparent)]
    Io(#[from] std::io::Error),
    /// The API server cannot be reached with the configuration given.
    #[error("{}", kube_context(kubeconfig.as_deref()))]
    Kube {
        /// The kubeconfig, when one was named.
        kubeconfig: Option<PathBuf>,
        /// Why the client cannot be built.
        #[source]
        source: KubeError,
    },
    /// The node's DRA claim store cannot be opened.
    #[error("--dra: the claim store")]
    ClaimStore(#[source] gpu_integrations::IntegrationError),
    /// The kubelet plugin cannot be built.
    #[error(transparent)]
    Plugin(#[from] crate::dra::DraError),
    /// The kubelet plugin's sockets cannot be bound (sockets another process holds are not
    /// this: they are reported in `/healthz` and tried again with back-off).
    #[error("--dra")]
    PluginSockets(#[source] std::io::Error),
    /// `--claims-dir` names no directory.
    #[error("--claims-dir {0}: not a directory")]
    ClaimsDir(PathBuf),
    /// Neither an API server nor a claims directory to read claims from (internal).
    #[error("--dra: no API server and no --claims-dir to read ResourceClaims from")]
    NoClaimSource,
}

impl DaemonError {
    /// The agent's refusal to open.
    pub fn agent(e: ApiError) -> Self {
        DaemonError::Agent(ApiCause(e))
    }
}

/// What a client configuration that cannot be used is said to be.
fn kube_context(kubeconfig: Option<&std::path::Path>) -> String {
    match kubeconfig {
        Some(k) => format!("--kubeconfig {}", k.display()),
        None => "--dra: the in-cluster configuration (or pass --kubeconfig)".to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpu_core::ErrorKind;

    #[test]
    fn an_agent_refusal_is_said_once_and_classified_by_the_agents_kind() {
        let e = DaemonError::agent(ApiError::new(
            ErrorKind::HostError,
            "state directory /x: a link",
        ));
        let c = gpu_core::Classified::of_chain(&e, crate::error::as_classified);
        assert_eq!(c.kind, ErrorKind::HostError);
        assert_eq!(c.message, "state directory /x: a link");
    }

    #[test]
    fn a_cause_is_kept_after_the_option_it_concerns() {
        let e = DaemonError::Token {
            path: PathBuf::from("/etc/token"),
            source: crate::agent::config::TokenError::TooShort,
        };
        assert_eq!(
            gpu_core::error_chain(&e),
            "--token-file /etc/token: the token is shorter than 16 characters"
        );
        let e = DaemonError::Kube {
            kubeconfig: None,
            source: KubeError::Config("no cluster".to_owned()),
        };
        assert_eq!(
            gpu_core::error_chain(&e),
            "--dra: the in-cluster configuration (or pass --kubeconfig): kubernetes client configuration: no cluster"
        );
    }
}
