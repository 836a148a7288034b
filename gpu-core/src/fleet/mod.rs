//! A fleet: node topologies plus existing allocations.
//!
//! A fleet document may state a host shape once and name it from many nodes: `shapes` maps a
//! key to a topology without a node name (`gpus`, `mediatedDevices`, `warnings`), and a node
//! written `{node: NAME, shape: KEY}` has that topology under its own name. A node that differs
//! from every shape (its health, its instances) is written in full. [`Fleet::to_text`] writes
//! this compact form: every topology that two or more nodes share becomes a shape. Reading
//! either form gives the same [`Fleet`]. [`SharedFleet`] reads the document without expanding
//! its shapes (each node of a shape holds the one shared copy), which is what a scheduler
//! indexing thousands of nodes of one host shape wants ([`SharedFleet::into_fleet`] gives the
//! same [`Fleet`]). Nodes written in full whose topologies are equal share one copy too when read
//! (compared with the last few distinct topologies as each node is decoded), so the full form
//! of a fleet of one host shape costs what the compact form does. [`Fleet::from_reader_max`] and
//! [`SharedFleet::from_reader_max`] decode JSON as it is read ([`crate::decode_reader_max`]).
//! The document form lives in [`wire`].

mod wire;

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::allocation::Allocation;
use crate::error::CoreError;
use crate::fabric::Fabric;
use crate::request::DeviceRequest;
use crate::topology::{Gpu, MediatedDevices, NodeTopology};

pub use wire::ShortVgpu;

/// The scheduler's input and state, as exchanged between nodes and a scheduler.
/// JSON/YAML: `{nodes: [NodeTopology...], allocations: [...], templates: {...}}`.
///
/// An allocated vGPU may be given in the platform guide's short shape,
/// `{parent, profile, framebufferMiB, uuid}` (plus an optional `request`, default `gpu`): its
/// `kind`, `index`, `framework`, `gpu`, `profileName` and `migSlices` are then taken from the
/// node's topology in the same document ([`ShortVgpu`]). Nodes may name a shared `shapes`
/// entry (see the module docs).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase", try_from = "wire::FleetDoc")]
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
        Self::from_text_max(text, crate::limits::MAX_DOCUMENT_BYTES)
    }

    /// [`Fleet::from_text`] with a document cap of `max_bytes` (raised by the operator).
    ///
    /// # Errors
    /// As [`Fleet::from_text`].
    pub fn from_text_max(text: &str, max_bytes: usize) -> Result<Self, CoreError> {
        let f: Fleet = crate::decode_text_max("fleet", text, max_bytes)?;
        f.validate()?;
        Ok(f)
    }

    /// Reads a fleet from `reader` (JSON decoded as it is read, YAML read whole first:
    /// [`crate::decode_reader_max`]) with a document cap of `max_bytes`, and says which syntax
    /// it was in.
    ///
    /// # Errors
    /// As [`Fleet::from_text`], plus the reader's errors as [`CoreError::Decode`].
    pub fn from_reader_max(
        reader: impl std::io::Read,
        max_bytes: usize,
    ) -> Result<(Self, crate::Syntax), CoreError> {
        let (f, syntax): (Fleet, _) = crate::decode_reader_max("fleet", reader, max_bytes)?;
        f.validate()?;
        Ok((f, syntax))
    }

    /// The fleet as text for a file, in the compact form (a topology two or more nodes share is
    /// written once under `shapes`): pretty JSON (with a final newline) or YAML.
    ///
    /// # Errors
    /// [`CoreError::Decode`] when a value cannot be rendered (not expected for a valid fleet).
    pub fn to_text(&self, json: bool) -> Result<String, CoreError> {
        self.render(json, &self.compact()?)
    }

    /// The fleet as text with every node's topology written in full.
    ///
    /// # Errors
    /// As [`Fleet::to_text`].
    pub fn to_text_full(&self, json: bool) -> Result<String, CoreError> {
        self.render(json, self)
    }

    /// The compact document: shapes named `shape-1`, `shape-2`, ... in order of first use.
    fn compact(&self) -> Result<CompactFleet<'_>, CoreError> {
        let fail = |e: serde_json::Error| CoreError::Decode {
            what: "fleet".to_owned(),
            message: e.to_string(),
        };
        // Nodes are grouped by their topology's rendering without the name: equal text, equal
        // topology.
        let mut keys: Vec<String> = Vec::with_capacity(self.nodes.len());
        let mut uses: HashMap<&str, usize> = HashMap::new();
        for n in &self.nodes {
            keys.push(serde_json::to_string(&ShapeRef::of(n)).map_err(fail)?);
        }
        for k in &keys {
            *uses.entry(k.as_str()).or_default() += 1;
        }
        let mut names: HashMap<&str, String> = HashMap::new();
        let mut shapes: BTreeMap<String, ShapeRef<'_>> = BTreeMap::new();
        let mut nodes = Vec::with_capacity(self.nodes.len());
        for (n, k) in self.nodes.iter().zip(&keys) {
            if !worth_sharing(k.len(), uses.get(k.as_str()).copied().unwrap_or(0)) {
                nodes.push(CompactNode::Full(n));
                continue;
            }
            let next = names.len() + 1;
            let name = names.entry(k.as_str()).or_insert_with(|| {
                let name = format!("shape-{next}");
                shapes.insert(name.clone(), ShapeRef::of(n));
                name
            });
            nodes.push(CompactNode::Shaped {
                node: &n.node,
                shape: name.clone(),
            });
        }
        Ok(CompactFleet {
            shapes,
            nodes,
            allocations: &self.allocations,
            templates: &self.templates,
        })
    }

    fn render<T: Serialize>(&self, json: bool, doc: &T) -> Result<String, CoreError> {
        let rendered = if json {
            serde_json::to_string_pretty(doc)
                .map(|t| t + "\n")
                .map_err(|e| e.to_string())
        } else {
            serde_yaml_ng::to_string(doc).map_err(|e| e.to_string())
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
        validate_names(
            self.nodes.iter().map(|n| n.node.as_str()),
            &self.allocations,
        )
    }
}

/// Node names and Machine names valid and unique.
fn validate_names<'a>(
    nodes: impl Iterator<Item = &'a str>,
    allocations: &[Allocation],
) -> Result<(), CoreError> {
    let mut seen = std::collections::HashSet::new();
    for n in nodes {
        crate::validate_name(n)?;
        if !seen.insert(n) {
            return Err(CoreError::InvalidName {
                input: n.to_owned(),
                why: "node appears twice in the fleet",
            });
        }
    }
    let mut machines = std::collections::HashSet::new();
    for a in allocations {
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

/// A host shape: a node topology without its name, as a fleet document's `shapes` gives it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct HostShape {
    /// Physical GPUs in address order.
    #[serde(default)]
    pub gpus: Vec<Gpu>,
    /// vGPU parents and pools.
    #[serde(default)]
    pub mediated_devices: MediatedDevices,
    /// Node-level problems met during discovery.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
    /// The NVSwitch fabric, on a host with NVSwitches.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fabric: Option<Fabric>,
}

impl HostShape {
    /// The shape of `topology` (its name dropped).
    pub fn of(topology: &NodeTopology) -> Self {
        HostShape {
            gpus: topology.gpus.clone(),
            mediated_devices: topology.mediated_devices.clone(),
            warnings: topology.warnings.clone(),
            fabric: topology.fabric.clone(),
        }
    }

    /// The topology of node `node` of this shape.
    pub fn named(self, node: impl Into<String>) -> NodeTopology {
        NodeTopology {
            node: node.into(),
            gpus: self.gpus,
            mediated_devices: self.mediated_devices,
            warnings: self.warnings,
            fabric: self.fabric,
        }
    }
}

/// A node of a [`SharedFleet`]: a topology of its own, or a name and the shared shape whose
/// topology it has.
#[derive(Debug, Clone, PartialEq)]
pub enum FleetNode {
    /// A node written in full.
    Full(NodeTopology),
    /// A node of a `shapes` entry: the one copy every node of that shape holds.
    Shaped {
        /// The node's name.
        node: String,
        /// Its topology without the name.
        shape: Arc<HostShape>,
    },
}

impl FleetNode {
    /// The node's name.
    pub fn name(&self) -> &str {
        match self {
            FleetNode::Full(t) => &t.node,
            FleetNode::Shaped { node, .. } => node,
        }
    }

    /// Its GPUs.
    pub fn gpus(&self) -> &[Gpu] {
        match self {
            FleetNode::Full(t) => &t.gpus,
            FleetNode::Shaped { shape, .. } => &shape.gpus,
        }
    }

    /// Its vGPU parents and pools.
    pub fn mediated_devices(&self) -> &MediatedDevices {
        match self {
            FleetNode::Full(t) => &t.mediated_devices,
            FleetNode::Shaped { shape, .. } => &shape.mediated_devices,
        }
    }

    /// A copy of the node's whole topology (a shaped node's is its shape's, under its name).
    pub fn to_topology(&self) -> NodeTopology {
        match self {
            FleetNode::Full(t) => t.clone(),
            FleetNode::Shaped { node, shape } => HostShape::clone(shape).named(node.clone()),
        }
    }

    /// The node's whole topology (a shaped node's is its shape's, under its name).
    pub fn into_topology(self) -> NodeTopology {
        match self {
            FleetNode::Full(t) => t,
            FleetNode::Shaped { node, shape } => Arc::try_unwrap(shape)
                .unwrap_or_else(|s| HostShape::clone(&s))
                .named(node),
        }
    }
}

/// A fleet as its document gives it, shapes not expanded: nodes of one `shapes` entry share one
/// [`HostShape`]. Reading a document as a `SharedFleet` and expanding it
/// ([`SharedFleet::into_fleet`]) gives the same [`Fleet`] as reading it as a `Fleet`; short-shape
/// devices are completed from their node's topology in both.
#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
#[serde(try_from = "wire::FleetDoc")]
pub struct SharedFleet {
    /// The nodes, in document order.
    pub nodes: Vec<FleetNode>,
    /// Existing allocations.
    pub allocations: Vec<Allocation>,
    /// Reusable named device requests.
    pub templates: BTreeMap<String, DeviceRequest>,
}

impl SharedFleet {
    /// The node named `name`.
    #[must_use]
    pub fn node_named(&self, name: &str) -> Option<&FleetNode> {
        self.nodes.iter().find(|t| t.name() == name)
    }

    /// The nodes' names, comma-separated, or `none`: what a message naming them lists.
    #[must_use]
    pub fn names_listed(&self) -> String {
        let names: Vec<&str> = self.nodes.iter().map(FleetNode::name).collect();
        if names.is_empty() {
            "none".to_owned()
        } else {
            names.join(", ")
        }
    }

    /// Parses a fleet document, shapes kept shared, with a document cap of `max_bytes`.
    ///
    /// # Errors
    /// As [`Fleet::from_text_max`].
    pub fn from_text_max(text: &str, max_bytes: usize) -> Result<Self, CoreError> {
        let f: SharedFleet = crate::decode_text_max("fleet", text, max_bytes)?;
        f.validate()?;
        Ok(f)
    }

    /// [`Fleet::from_reader_max`], shapes kept shared.
    ///
    /// # Errors
    /// As [`Fleet::from_reader_max`].
    pub fn from_reader_max(
        reader: impl std::io::Read,
        max_bytes: usize,
    ) -> Result<(Self, crate::Syntax), CoreError> {
        let (f, syntax): (SharedFleet, _) = crate::decode_reader_max("fleet", reader, max_bytes)?;
        f.validate()?;
        Ok((f, syntax))
    }

    /// As [`Fleet::validate`].
    ///
    /// # Errors
    /// As [`Fleet::validate`].
    pub fn validate(&self) -> Result<(), CoreError> {
        validate_names(self.nodes.iter().map(FleetNode::name), &self.allocations)
    }

    /// The fleet with every node's topology in full.
    pub fn into_fleet(self) -> Fleet {
        Fleet {
            nodes: self
                .nodes
                .into_iter()
                .map(FleetNode::into_topology)
                .collect(),
            allocations: self.allocations,
            templates: self.templates,
        }
    }
}

impl From<Fleet> for SharedFleet {
    fn from(f: Fleet) -> Self {
        SharedFleet {
            nodes: f.nodes.into_iter().map(FleetNode::Full).collect(),
            allocations: f.allocations,
            templates: f.templates,
        }
    }
}

/// A shape borrowed from a topology, for writing.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct ShapeRef<'a> {
    gpus: &'a [Gpu],
    mediated_devices: &'a MediatedDevices,
    #[serde(skip_serializing_if = "<[String]>::is_empty")]
    warnings: &'a [String],
    #[serde(skip_serializing_if = "Option::is_none")]
    fabric: &'a Option<Fabric>,
}

impl<'a> ShapeRef<'a> {
    fn of(n: &'a NodeTopology) -> Self {
        ShapeRef {
            gpus: &n.gpus,
            mediated_devices: &n.mediated_devices,
            warnings: &n.warnings,
            fabric: &n.fabric,
        }
    }
}

#[derive(Serialize)]
#[serde(untagged)]
enum CompactNode<'a> {
    Full(&'a NodeTopology),
    Shaped { node: &'a str, shape: String },
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct CompactFleet<'a> {
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    shapes: BTreeMap<String, ShapeRef<'a>>,
    nodes: Vec<CompactNode<'a>>,
    allocations: &'a [Allocation],
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    templates: &'a BTreeMap<String, DeviceRequest>,
}

/// Whether a topology of `len` bytes (as text) written once in `shapes` and referenced by `uses`
/// nodes makes the document shorter than writing it `uses` times: a reference and a shape's
/// name cost about 32 bytes each, so small topologies (a node without GPUs) are written in
/// full.
fn worth_sharing(len: usize, uses: usize) -> bool {
    uses >= 2 && (uses - 1) * len > uses * 32 + 32
}
