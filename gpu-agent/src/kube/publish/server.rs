//! What the publisher asks the API server before it writes: which Kubernetes release it is
//! (the rules and encoding of the slices follow it) and which Node owns the pool.

use gpu_integrations::dra::Encoding;
use gpu_integrations::dra::K8sVersion;
use gpu_integrations::dra::names::is_dns_subdomain;
use serde_json::Value;

use crate::kube::{KubeClient, KubeError};

/// The oldest Kubernetes minor release with `resource.k8s.io/v1`.
pub const OLDEST_MINOR: u32 = 34;
/// The newest minor release whose rules are known; a newer server is published for as this one.
pub const NEWEST_MINOR: u32 = 37;

/// The API server as the publisher needs it.
#[derive(Debug, Clone)]
pub struct ServerInfo {
    /// `gitVersion` of `/version`, as the server said it.
    pub git_version: String,
    /// The release whose rules and encoding apply.
    pub version: K8sVersion,
}

impl ServerInfo {
    /// How time-sliced vGPUs are published for this server.
    pub fn encoding(&self) -> Encoding {
        self.version.encoding()
    }
}

/// The release of a `gitVersion` (`v1.35.3`, `v1.36.2-gke.100`, `v1.34.0+k3s1`); a minor newer
/// than [`NEWEST_MINOR`] is treated as that one.
///
/// # Errors
/// [`KubeError::Unsupported`] for a release older than 1.34 (no `resource.k8s.io/v1`);
/// [`KubeError::Invalid`] for text that is no version.
pub fn server_version(git_version: &str) -> Result<K8sVersion, KubeError> {
    let core = git_version
        .trim()
        .trim_start_matches('v')
        .split(['-', '+'])
        .next()
        .unwrap_or("");
    let mut parts = core.split('.');
    let num = |p: Option<&str>| p.and_then(|p| p.parse::<u32>().ok());
    let (Some(major), Some(minor)) = (num(parts.next()), num(parts.next())) else {
        return Err(KubeError::Invalid(format!(
            "/version gitVersion {git_version:?} is not a Kubernetes version"
        )));
    };
    let patch = num(parts.next()).unwrap_or(0);
    if major != 1 || minor < OLDEST_MINOR {
        return Err(KubeError::Unsupported(format!(
            "the API server is Kubernetes {git_version}; publishing ResourceSlices needs 1.34 or later (resource.k8s.io/v1)"
        )));
    }
    let text = if minor > NEWEST_MINOR {
        format!("1.{NEWEST_MINOR}")
    } else {
        format!("1.{minor}.{patch}")
    };
    text.parse::<K8sVersion>()
        .map_err(|e| KubeError::Invalid(format!("/version gitVersion {git_version:?}: {e}")))
}

/// Reads `/version` and checks that the server serves `resource.k8s.io/v1`.
///
/// # Errors
/// [`KubeError::Unsupported`] for a release older than 1.34 or a server without
/// `resource.k8s.io/v1`; what [`KubeClient::request`] returns when the server cannot be asked.
pub async fn server_info(client: &KubeClient) -> Result<ServerInfo, KubeError> {
    let v = client.get("/version").await?;
    let git_version = v
        .get("gitVersion")
        .and_then(Value::as_str)
        .ok_or_else(|| KubeError::Invalid("/version has no gitVersion".to_owned()))?
        .to_owned();
    let version = server_version(&git_version)?;
    let groups = client.get("/apis").await?;
    let served = groups
        .get("groups")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter(|g| g.get("name").and_then(Value::as_str) == Some("resource.k8s.io"))
        .flat_map(|g| {
            g.get("versions")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
        })
        .any(|v| v.get("version").and_then(Value::as_str) == Some("v1"));
    if !served {
        return Err(KubeError::Unsupported(format!(
            "the API server ({git_version}) does not serve resource.k8s.io/v1; enable the DRA API (it is on by default from 1.34)"
        )));
    }
    Ok(ServerInfo {
        git_version,
        version,
    })
}

/// The Node that owns a pool's slices.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeOwner {
    /// The node's name.
    pub name: String,
    /// Its `metadata.uid`.
    pub uid: String,
}

/// Reads the Node `name` for its UID.
///
/// # Errors
/// [`KubeError::Status`] 404 when the cluster has no such node; see [`KubeClient::request`].
pub async fn node_owner(client: &KubeClient, name: &str) -> Result<NodeOwner, KubeError> {
    if !is_dns_subdomain(name) {
        return Err(KubeError::Invalid(format!(
            "node name {name:?} is not a Kubernetes node name"
        )));
    }
    let node = client.get(&format!("/api/v1/nodes/{name}")).await?;
    let uid = node
        .pointer("/metadata/uid")
        .and_then(Value::as_str)
        .filter(|u| !u.is_empty())
        .ok_or_else(|| KubeError::Invalid(format!("node {name} has no metadata.uid")))?;
    Ok(NodeOwner {
        name: name.to_owned(),
        uid: uid.to_owned(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_versions_parse_with_vendor_suffixes() {
        assert_eq!(
            server_version("v1.36.2-gke.100").unwrap().to_string(),
            "1.36.2"
        );
        assert_eq!(
            server_version("v1.35.0+k3s1").unwrap().to_string(),
            "1.35.0"
        );
        assert_eq!(server_version("v1.40.1").unwrap().to_string(), "1.37");
        assert!(matches!(
            server_version("v1.33.5"),
            Err(KubeError::Unsupported(m)) if m.contains("1.34")
        ));
        assert!(matches!(
            server_version("nonsense"),
            Err(KubeError::Invalid(_))
        ));
    }
}
