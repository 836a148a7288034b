//! The fleet document as it is read: whole node topologies or `shapes` referenced by name,
//! allocated devices in the full shape or the platform guide's short one.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use serde::Deserialize;

use super::{Fleet, FleetNode, HostShape, SharedFleet};
use crate::allocation::{AllocatedDevice, Allocation, AllocationStatus};
use crate::error::CoreError;
use crate::fabric::Fabric;
use crate::ids::{MdevUuid, ParentId};
use crate::nvidia::strip_prefix;
use crate::request::DeviceRequest;
use crate::topology::{Gpu, MediatedDevices, NodeTopology};

/// An allocated vGPU in the platform guide's short shape, as an orchestrator writes it: the
/// rest is derived from the node's topology when the fleet is read.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ShortVgpu {
    /// The device request this fulfils (default `gpu`).
    #[serde(default)]
    pub request: Option<String>,
    /// Parent (mdev parent or vendor-VFIO VF) on the allocation's node.
    pub parent: ParentId,
    /// Profile (type) ID, as the parent lists it (`1155`, `nvidia-746`); an exact type name is
    /// accepted too.
    pub profile: String,
    /// Framebuffer in MiB; when given it must be the profile's.
    #[serde(default, rename = "framebufferMiB")]
    pub framebuffer_mib: Option<u64>,
    /// Stable UUID.
    pub uuid: MdevUuid,
    /// The GPU-instance start of a MIG-backed vGPU, where one was chosen.
    #[serde(default)]
    pub gpu_instance_start: Option<u8>,
    /// The placement ID on a GPU in mixed-size mode, where one was chosen.
    #[serde(default)]
    pub placement_id: Option<u32>,
}

/// An allocated device as a fleet document may give it: the full shape (with `kind`) or the
/// short one.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum DeviceDoc {
    Full(AllocatedDevice),
    Short(ShortVgpu),
}

impl<'de> Deserialize<'de> for DeviceDoc {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde::de::Error;
        let v = serde_json::Value::deserialize(d)?;
        if v.get("kind").is_some() {
            serde_json::from_value(v)
                .map(DeviceDoc::Full)
                .map_err(D::Error::custom)
        } else {
            serde_json::from_value(v)
                .map(DeviceDoc::Short)
                .map_err(|e| {
                    D::Error::custom(format!(
                        "{e} (a device without `kind` is read in the short shape \
                         {{parent, profile, framebufferMiB, uuid}})"
                    ))
                })
        }
    }
}

/// An allocation as a fleet document gives it (unknown keys are ignored, as in [`Allocation`]).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct AllocationDoc {
    machine: String,
    node: String,
    #[serde(default)]
    status: AllocationStatus,
    devices: Vec<DeviceDoc>,
}

/// A node as a fleet document gives it: a whole topology, or a name and the `shape` (a key of
/// the document's `shapes`) whose topology it has.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct NodeDoc {
    node: String,
    #[serde(default)]
    shape: Option<String>,
    #[serde(default)]
    gpus: Option<Vec<Gpu>>,
    #[serde(default)]
    mediated_devices: Option<MediatedDevices>,
    #[serde(default)]
    warnings: Option<Vec<String>>,
    #[serde(default)]
    fabric: Option<Box<Fabric>>,
}

/// A fleet document before shapes are expanded and short-shape devices completed from the
/// topology.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct FleetDoc {
    #[serde(default)]
    shapes: BTreeMap<String, HostShape>,
    #[serde(default)]
    nodes: NodesDoc,
    #[serde(default)]
    allocations: Vec<AllocationDoc>,
    #[serde(default)]
    templates: BTreeMap<String, DeviceRequest>,
}

/// A node as it is read: written with `shape` (resolved once the document's `shapes` are
/// known), or in full, its topology already shared with an equal one written before it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum NodeEntry {
    Named(NodeDoc),
    Whole { node: String, shape: Arc<HostShape> },
}

/// The document's nodes, read one by one so that a fleet written in full costs the memory of
/// its distinct topologies, not of every node's: a node whose topology equals one of the last
/// [`RECENT`] distinct ones read shares that one's copy (as if the document had named a shape),
/// so a 10,000-node fleet of one host shape written in full is held, and indexed, once.
#[derive(Debug, Clone, PartialEq, Default)]
pub(crate) struct NodesDoc(Vec<NodeEntry>);

/// How many distinct topologies a node written in full is compared with. Generated fleets
/// repeat a few host shapes; the comparison stops at the first difference, so a fleet of all
/// different nodes pays little.
const RECENT: usize = 8;

impl<'de> Deserialize<'de> for NodesDoc {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Nodes;
        impl<'de> serde::de::Visitor<'de> for Nodes {
            type Value = NodesDoc;

            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a sequence of nodes")
            }

            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> Result<NodesDoc, A::Error> {
                let mut nodes = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(1 << 12));
                let mut recent: Vec<Arc<HostShape>> = Vec::with_capacity(RECENT);
                while let Some(n) = seq.next_element::<NodeDoc>()? {
                    nodes.push(share(n, &mut recent));
                }
                Ok(NodesDoc(nodes))
            }
        }
        d.deserialize_seq(Nodes)
    }
}

/// A node written with `shape` as it is; one written in full with its topology shared with an
/// equal one among `recent` (most recently met last), or made the newest of them.
fn share(n: NodeDoc, recent: &mut Vec<Arc<HostShape>>) -> NodeEntry {
    if n.shape.is_some() {
        return NodeEntry::Named(n);
    }
    let shape = HostShape {
        gpus: n.gpus.unwrap_or_default(),
        mediated_devices: n.mediated_devices.unwrap_or_default(),
        warnings: n.warnings.unwrap_or_default(),
        fabric: n.fabric.map(|f| *f),
    };
    let shape = match recent.iter().rposition(|s| **s == shape) {
        Some(i) => recent.remove(i),
        None => {
            if recent.len() == RECENT {
                recent.remove(0);
            }
            Arc::new(shape)
        }
    };
    recent.push(Arc::clone(&shape));
    NodeEntry::Whole {
        node: n.node,
        shape,
    }
}

/// Expands one node of the document: its own topology (shared with the equal ones written
/// before or after it, if any), or its shape's under its name.
fn expand(
    i: usize,
    n: NodeEntry,
    shapes: &BTreeMap<String, Arc<HostShape>>,
) -> Result<FleetNode, CoreError> {
    let n = match n {
        NodeEntry::Whole { node, shape } => {
            // Alone in its topology: the node's own, as written.
            return Ok(match Arc::try_unwrap(shape) {
                Ok(own) => FleetNode::Full(own.named(node)),
                Err(shape) => FleetNode::Shaped { node, shape },
            });
        }
        NodeEntry::Named(n) => n,
    };
    let Some(key) = n.shape else {
        return Ok(FleetNode::Full(NodeTopology {
            node: n.node,
            gpus: n.gpus.unwrap_or_default(),
            mediated_devices: n.mediated_devices.unwrap_or_default(),
            warnings: n.warnings.unwrap_or_default(),
            fabric: n.fabric.map(|f| *f),
        }));
    };
    let bad = |why: String| CoreError::FleetNode {
        index: i,
        node: n.node.clone(),
        why,
    };
    if n.gpus.is_some()
        || n.mediated_devices.is_some()
        || n.warnings.is_some()
        || n.fabric.is_some()
    {
        return Err(bad(
            "a node with `shape` gives no gpus, mediatedDevices, warnings or fabric of its own (write a \
             node that differs from its shape in full)"
                .to_owned(),
        ));
    }
    let shape = shapes
        .get(&key)
        .ok_or_else(|| bad(format!("no shape {key:?} in the fleet's `shapes`")))?;
    Ok(FleetNode::Shaped {
        node: n.node,
        shape: Arc::clone(shape),
    })
}

impl TryFrom<FleetDoc> for Fleet {
    type Error = CoreError;

    fn try_from(doc: FleetDoc) -> Result<Self, CoreError> {
        SharedFleet::try_from(doc).map(SharedFleet::into_fleet)
    }
}

impl TryFrom<FleetDoc> for SharedFleet {
    type Error = CoreError;

    fn try_from(doc: FleetDoc) -> Result<Self, CoreError> {
        let shapes: BTreeMap<String, Arc<HostShape>> = doc
            .shapes
            .into_iter()
            .map(|(k, v)| (k, Arc::new(v)))
            .collect();
        let nodes = doc
            .nodes
            .0
            .into_iter()
            .enumerate()
            .map(|(i, n)| expand(i, n, &shapes))
            .collect::<Result<Vec<_>, _>>()?;
        let by_name: HashMap<&str, &MediatedDevices> = nodes
            .iter()
            .map(|n| (n.name(), n.mediated_devices()))
            .collect();
        let mut allocations = Vec::with_capacity(doc.allocations.len());
        for a in doc.allocations {
            let mut devices: Vec<AllocatedDevice> = Vec::with_capacity(a.devices.len());
            for (i, d) in a.devices.into_iter().enumerate() {
                let device = match d {
                    DeviceDoc::Full(full) => full,
                    DeviceDoc::Short(short) => {
                        let node = by_name.get(a.node.as_str()).copied();
                        complete(&a.machine, &a.node, node, i, &short, &devices)?
                    }
                };
                devices.push(device);
            }
            allocations.push(Allocation {
                machine: a.machine,
                node: a.node,
                status: a.status,
                devices,
            });
        }
        Ok(SharedFleet {
            nodes,
            allocations,
            templates: doc.templates,
        })
    }
}

/// Completes a short-shape device from its node's topology.
fn complete(
    machine: &str,
    node_name: &str,
    node: Option<&MediatedDevices>,
    i: usize,
    d: &ShortVgpu,
    before: &[AllocatedDevice],
) -> Result<AllocatedDevice, CoreError> {
    let fail = |why: String| CoreError::ShortDevice {
        machine: machine.to_owned(),
        index: i,
        device: format!("parent {}, profile {:?}", d.parent, d.profile),
        why,
    };
    let node = node.ok_or_else(|| {
        fail(format!(
            "node {node_name:?} is not in the fleet's nodes, so the device cannot be completed \
             (give it in the full shape with `kind`)"
        ))
    })?;
    let parents = &node.parents;
    let parent = parents.iter().find(|p| p.id == d.parent).ok_or_else(|| {
        fail(format!(
            "node {node_name:?} has no vGPU parent {} in its topology",
            d.parent
        ))
    })?;
    let wanted = d.profile.trim();
    let by_name = |name: &str| strip_prefix(name).eq_ignore_ascii_case(strip_prefix(wanted));
    // The parent's own list first; a VF holding its type lists nothing, so then its instances,
    // then the lists of the other parents on the same GPU.
    let siblings = parents
        .iter()
        .filter(|p| p.id != parent.id && p.gpu.is_some() && p.gpu == parent.gpu);
    let listed = std::iter::once(parent)
        .chain(siblings)
        .flat_map(|p| p.profiles.iter());
    let found = listed
        .clone()
        .find(|p| p.id.as_str() == wanted)
        .or_else(|| listed.clone().find(|p| by_name(&p.name)));
    let (id, name, fb, mig) = match found {
        Some(p) => (
            p.id.clone(),
            p.name.clone(),
            p.framebuffer_mib,
            p.mig_slices,
        ),
        None => {
            let inst = parent
                .instances
                .iter()
                .find(|x| x.profile.as_str() == wanted)
                .ok_or_else(|| {
                    fail(format!(
                        "vGPU parent {} on node {node_name:?} neither lists nor holds profile \
                         {wanted:?}",
                        d.parent
                    ))
                })?;
            let name = inst.profile_name.clone().ok_or_else(|| {
                fail(format!(
                    "vGPU parent {} holds profile {wanted:?}, but no source names that type",
                    d.parent
                ))
            })?;
            let mig = crate::nvidia::VgpuTypeName::parse(&name)
                .ok()
                .and_then(|n| n.mig_slices);
            (inst.profile.clone(), name, inst.framebuffer_mib, mig)
        }
    };
    let framebuffer_mib = match (d.framebuffer_mib, fb) {
        (Some(given), Some(known)) if given != known => {
            return Err(fail(format!(
                "framebufferMiB {given} does not match profile {name:?} ({known} MiB)"
            )));
        }
        (given, known) => given.or(known),
    };
    let request = d.request.clone().unwrap_or_else(|| "gpu".to_owned());
    let index = before.iter().filter(|x| x.request() == request).count();
    Ok(AllocatedDevice::Vgpu {
        request,
        index: u32::try_from(index).unwrap_or(u32::MAX),
        parent: parent.id.clone(),
        gpu: parent.gpu,
        framework: parent.framework,
        profile: id,
        profile_name: name,
        framebuffer_mib,
        mig_slices: mig,
        uuid: d.uuid,
        gpu_instance_start: d.gpu_instance_start,
        placement_id: d.placement_id,
    })
}
