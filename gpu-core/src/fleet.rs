//! A fleet: node topologies plus existing allocations.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::allocation::Allocation;
use crate::error::CoreError;
use crate::request::DeviceRequest;
use crate::topology::NodeTopology;

/// The scheduler's input and state, as exchanged between nodes and a scheduler.
/// JSON/YAML: `{nodes: [NodeTopology...], allocations: [...], templates: {...}}`.
///
/// An allocated vGPU may be given in the platform guide's short shape,
/// `{parent, profile, framebufferMiB, uuid}` (plus an optional `request`, default `gpu`): its
/// `kind`, `index`, `framework`, `gpu`, `profileName` and `migSlices` are then taken from the
/// node's topology in the same document ([`crate::allocation::ShortVgpu`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase", try_from = "crate::allocation::FleetDoc")]
pub struct Fleet {
    /// Node topologies.
    #[serde(default)]
    pub nodes: Vec<NodeTopology>,
    /// Existing allocations.
    #[serde(default)]
    pub allocations: Vec<Allocation>,
    /// Reusable named device requests, referenced by `use:` in a device request.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub templates: BTreeMap<String, DeviceRequest>,
}

impl Fleet {
    /// Parses a fleet from JSON or YAML.
    ///
    /// # Errors
    /// [`CoreError::Decode`] for malformed text; [`CoreError::InvalidName`] for duplicate nodes.
    pub fn from_text(text: &str) -> Result<Self, CoreError> {
        let f: Fleet = crate::decode_text("fleet", text)?;
        f.validate()?;
        Ok(f)
    }

    /// The fleet as text for a file: pretty JSON (with a final newline) or YAML.
    ///
    /// # Errors
    /// [`CoreError::Decode`] when a value cannot be rendered (not expected for a valid fleet).
    pub fn to_text(&self, json: bool) -> Result<String, CoreError> {
        let rendered = if json {
            serde_json::to_string_pretty(self)
                .map(|t| t + "\n")
                .map_err(|e| e.to_string())
        } else {
            serde_yaml_ng::to_string(self).map_err(|e| e.to_string())
        };
        rendered.map_err(|message| CoreError::Decode {
            what: "fleet".to_owned(),
            message,
        })
    }

    /// Checks that node and machine names are valid names ([`crate::validate_name`]) and unique.
    ///
    /// # Errors
    /// [`CoreError::InvalidName`] naming the duplicate.
    pub fn validate(&self) -> Result<(), CoreError> {
        let mut nodes = std::collections::BTreeSet::new();
        for n in &self.nodes {
            crate::validate_name(&n.node)?;
            if !nodes.insert(n.node.as_str()) {
                return Err(CoreError::InvalidName {
                    input: n.node.clone(),
                    why: "node appears twice in the fleet",
                });
            }
        }
        let mut machines = std::collections::BTreeSet::new();
        for a in &self.allocations {
            crate::validate_name(&a.machine)?;
            crate::validate_name(&a.node)?;
            if !machines.insert(a.machine.as_str()) {
                return Err(CoreError::InvalidName {
                    input: a.machine.clone(),
                    why: "machine has two allocations",
                });
            }
        }
        Ok(())
    }
}
