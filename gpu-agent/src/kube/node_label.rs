//! The layout config chosen by a label on the agent's Node (`--config-label
//! nvidia.com/vgpu.config`), as NVIDIA's vgpu-device-manager does in Kubernetes: the label's
//! value names a config of the layout file, and a new value (or a new layout file) is applied
//! again.
//!
//! The Node object is read with the agent's bounded client ([`KubeClient`]: every request has a
//! deadline) every [`ConfigLabel::poll`]; a read that fails changes nothing and is tried at the
//! next poll. A Node without the label, or a value the layout file has no config for, changes
//! nothing on the host: the agent publishes a `layoutRefused` event naming the label and the
//! value, and waits for the next change. A value is never used as a path.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use gpu_integrations::dra::names::is_dns_subdomain;

use super::{KubeClient, KubeError};
use crate::agent::Agent;

/// The label NVIDIA's vgpu-device-manager reads.
pub const NVIDIA_CONFIG_LABEL: &str = "nvidia.com/vgpu.config";

/// How often the Node is read, unless [`ConfigLabel::poll`] says otherwise.
pub const DEFAULT_POLL: Duration = Duration::from_secs(10);

/// Which label of the Node names the layout config, and how to reach the API server.
#[derive(Debug, Clone)]
pub struct ConfigLabel {
    /// The label's key (`nvidia.com/vgpu.config`).
    pub label: String,
    /// The kubeconfig to reach the API server with (`None`: the in-cluster service account).
    pub kubeconfig: Option<PathBuf>,
    /// How often the Node is read.
    pub poll: Duration,
}

impl ConfigLabel {
    /// `label`, read every [`DEFAULT_POLL`] with the in-cluster service account.
    pub fn new(label: impl Into<String>) -> Self {
        ConfigLabel {
            label: label.into(),
            kubeconfig: None,
            poll: DEFAULT_POLL,
        }
    }
}

/// Why a label key or value cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LabelError {
    /// Not a Kubernetes label key (`[prefix/]name`).
    #[error(
        "{0:?} is not a Kubernetes label key ([DNS-subdomain/]name, the name at most 63 of [A-Za-z0-9._-])"
    )]
    Key(String),
}

/// A label name or value: at most 63 characters of `[A-Za-z0-9._-]`, beginning and ending
/// alphanumeric (empty allowed for values only).
fn is_label_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
        && s.bytes().next().is_some_and(|b| b.is_ascii_alphanumeric())
        && s.bytes().last().is_some_and(|b| b.is_ascii_alphanumeric())
}

/// Checks a label key (`nvidia.com/vgpu.config`).
///
/// # Errors
/// [`LabelError::Key`] when it is not one.
pub fn check_key(key: &str) -> Result<(), LabelError> {
    let ok = match key.split_once('/') {
        Some((prefix, name)) => is_dns_subdomain(prefix) && is_label_name(name),
        None => is_label_name(key),
    };
    if ok {
        Ok(())
    } else {
        Err(LabelError::Key(key.to_owned()))
    }
}

/// The value of label `key` on Node `node` (`None` when the Node has no such label).
///
/// # Errors
/// The client's ([`KubeClient::get`]), and [`KubeError::Invalid`] for a node name that could not
/// be a Node's or an answer that is not a Node.
pub async fn read_label(
    client: &KubeClient,
    node: &str,
    key: &str,
) -> Result<Option<String>, KubeError> {
    if !is_dns_subdomain(node) {
        return Err(KubeError::Invalid(format!("{node:?} is not a Node name")));
    }
    let doc = client.get(&format!("/api/v1/nodes/{node}")).await?;
    if doc.get("kind").and_then(serde_json::Value::as_str) != Some("Node") {
        return Err(KubeError::Invalid(format!(
            "/api/v1/nodes/{node}: not a Node"
        )));
    }
    Ok(doc
        .pointer("/metadata/labels")
        .and_then(|l| l.get(key))
        .and_then(serde_json::Value::as_str)
        .map(str::to_owned))
}

/// What the watch last acted on: the label's value and the layout file's bytes.
type Seen = (Option<String>, Vec<u8>);

/// Starts the watch on the current runtime: the config the label names is applied from the
/// layout file at `layout` now, and again whenever the label or the file changes, until the
/// agent shuts down.
pub fn spawn(
    agent: Arc<Agent>,
    client: KubeClient,
    node: String,
    layout: PathBuf,
    label: ConfigLabel,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut down = agent.shutdown_signal();
        let mut last: Option<Seen> = None;
        while !*down.borrow() {
            if let Some(seen) = step(&agent, &client, &node, &layout, &label, last.as_ref()).await {
                last = seen;
            }
            tokio::select! {
                _ = down.changed() => {}
                () = tokio::time::sleep(label.poll.max(Duration::from_millis(10))) => {}
            }
        }
    })
}

/// One look at the label and the file. `Some(new)` records what was acted on (`Some(None)`
/// forgets it, so the same version is tried again); `None` leaves the record as it was.
async fn step(
    agent: &Arc<Agent>,
    client: &KubeClient,
    node: &str,
    layout: &std::path::Path,
    label: &ConfigLabel,
    last: Option<&Seen>,
) -> Option<Option<Seen>> {
    let key = &label.label;
    let value = match read_label(client, node, key).await {
        Ok(v) => v,
        Err(e) => {
            crate::log!("gpuslice agent: cannot read label {key} of node {node}: {e}");
            return None;
        }
    };
    let bytes = match crate::watch::read_layout_file(layout) {
        Ok(b) => b,
        Err(e) => {
            crate::log!("gpuslice agent: cannot read {}: {e}", layout.display());
            return None;
        }
    };
    let seen = (value.clone(), bytes);
    if last == Some(&seen) {
        return None;
    }
    let source = format!(
        "node label {key}={} ({})",
        value.as_deref().unwrap_or(""),
        layout.display()
    );
    let Some(name) = value else {
        crate::watch::refuse(
            agent,
            &source,
            format!("node {node} has no label {key}: no layout config is named"),
        );
        return Some(Some(seen));
    };
    let Ok(text) = String::from_utf8(seen.1.clone()) else {
        crate::watch::refuse(
            agent,
            &source,
            format!("{} is not UTF-8 text", layout.display()),
        );
        return Some(Some(seen));
    };
    let known = gpu_core::layout::LayoutFile::parse(&text)
        .map_err(|e| e.to_string())
        .and_then(|f| {
            if f.select(Some(&name)).is_ok() {
                Ok(())
            } else {
                Err(format!(
                    "label {key} names config {name:?}, which {} does not have",
                    layout.display()
                ))
            }
        });
    if let Err(why) = known {
        crate::watch::refuse(agent, &source, why);
        return Some(Some(seen));
    }
    let out = agent
        .apply_layout_from(text, Some(name), false, false, Some(source.clone()))
        .await;
    Some(crate::watch::settle(agent, &source, out).then_some(seen))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_keys_are_checked_as_kubernetes_checks_them() {
        assert_eq!(check_key(NVIDIA_CONFIG_LABEL), Ok(()));
        assert_eq!(check_key("vgpu-config"), Ok(()));
        for bad in [
            "",
            "/x",
            "nvidia.com/",
            "a/b/c",
            "nvidia.com/-x",
            "Nvidia_com/x",
        ] {
            assert!(check_key(bad).is_err(), "{bad}");
        }
    }
}
