//! The fleet in indexed form, and placement over it.
//!
//! This file holds the state and its nodes; the free-count indexes are kept in `index`, a
//! placement is found and recorded in `place`, and a refusal is explained in `refuse`.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use gpu_core::{
    Allocation, AllocationStatus, DeviceRequest, Fleet, FleetNode, HostShape, NodeTopology,
    SharedFleet,
};
use serde::{Deserialize, Serialize};

use crate::classes::Classes;
use crate::error::SchedError;
use crate::node::{Charge, NodeState, ProfileTables};
use crate::resolve::Catalog;

mod index;
mod place;
mod refuse;
mod slots;

/// A device placed on a Degraded GPU: usable, ranked last, and worth knowing about.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DegradedDevice {
    /// The device request.
    pub request: String,
    /// The GPU (`nvidia2`) or the GPU and parent (`nvidia0 via 0000:08:00.4`).
    pub device: String,
    /// Why the GPU is Degraded.
    #[serde(default)]
    pub reasons: Vec<String>,
}

/// An allocation together with what the caller should know about it.
/// JSON: the allocation's keys plus `degraded` when any device is on a Degraded GPU.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Placement {
    /// The allocation.
    #[serde(flatten)]
    pub allocation: Allocation,
    /// Devices placed on Degraded GPUs (used only when nothing healthier fitted).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub degraded: Vec<DegradedDevice>,
    /// True when the Machine was placed already, unchanged, and this is that placement (nothing
    /// new was charged): what an orchestrator retrying after a timeout gets back.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub already_placed: bool,
}

/// What [`FleetState::unplace`] released: the allocation, and whether its devices were made on
/// the host already. JSON: the allocation's keys plus `onHost`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Unplaced {
    /// The allocation released.
    #[serde(flatten)]
    pub allocation: Allocation,
    /// True when the allocation was `created`: its devices are still on the host until they are
    /// removed there (`gpuslice vgpu remove`, `gpu release`), and the node's next snapshot gives
    /// their capacity back; a `pending` allocation's capacity is free at once.
    pub on_host: bool,
}

/// One placed Machine: its allocation, its node's slot, what it charges there, and the devices it
/// names that its node's inventory lacks.
#[derive(Debug, Clone)]
pub(crate) struct Record {
    pub alloc: Allocation,
    pub slot: Option<usize>,
    pub charges: Vec<Charge>,
    pub missing: Vec<String>,
}

pub(crate) type Tree = BTreeSet<(u32, u32)>;

/// The fleet held in indexed form for fast placement.
///
/// Nodes keep the topology they were given; allocations are charged on top of it (see the
/// accounting notes in the crate docs). Per profile class and per vendor, a sorted index of
/// `(free count, node)` finds the best-fitting node (binpack) or the emptiest one (spread) in
/// logarithmic time, so a placement does not scan the fleet; a refusal says why each node said
/// no by fitting one node per group of nodes in the same state.
#[derive(Debug, Clone, Default)]
pub struct FleetState {
    pub(crate) slots: Vec<Option<Arc<NodeState>>>,
    pub(crate) by_name: HashMap<String, usize>,
    pub(crate) catalog: Catalog,
    pub(crate) tables: ProfileTables,
    // Boxed: a B-tree node of inline records is several KiB, which the allocator serves slowly.
    // Keyed by the Machine's name, shared with `on_node`: one name per placed Machine.
    pub(crate) records: BTreeMap<Arc<str>, Box<Record>>,
    pub(crate) on_node: HashMap<String, BTreeSet<Arc<str>>>,
    pub(crate) templates: BTreeMap<String, DeviceRequest>,
    pub(crate) by_class: HashMap<u32, Tree>,
    /// Per class: `(free instances on GPUs already hosting vGPUs, node)`, for binpack.
    pub(crate) by_class_used: HashMap<u32, Tree>,
    pub(crate) whole_all: Tree,
    pub(crate) whole_vendor: [Tree; 6],
    /// Nodes that hand out whole GPUs as NVSwitch partitions, per `(partition size, what its
    /// cheapest free partition of that size breaks)`: `(free whole GPUs, node)`. Binpack visits
    /// them cheapest first, so a Machine goes where it breaks no larger partition (ordered: the
    /// entries of one size come cheapest first, without sorting on every placement).
    pub(crate) by_partition: BTreeMap<(u32, u32), Tree>,
    /// Nodes grouped by what a fit sees, for refusals.
    pub(crate) classes: Classes,
    /// How GPU-instance starts are chosen (`slots.rs`).
    pub(crate) slot_policy: crate::slots::SlotPolicy,
}

impl FleetState {
    /// Indexes a fleet: its nodes, its allocations (charged on their nodes) and its templates.
    ///
    /// # Errors
    /// [`SchedError::InvalidFleet`] for duplicate node or Machine names or a malformed node name.
    pub fn new(fleet: Fleet) -> Result<Self, SchedError> {
        fleet
            .validate()
            .map_err(|e| SchedError::InvalidFleet { why: e.to_string() })?;
        Self::assemble(SharedFleet::from(fleet))
    }

    /// Indexes a fleet read with its shapes shared ([`SharedFleet`]): each shape is indexed
    /// once and its nodes get copies of that index under their names, so a fleet of many nodes
    /// of one host shape costs neither the expanded topologies nor an index built per node.
    /// The same state as [`FleetState::new`] of the expanded fleet.
    ///
    /// # Errors
    /// As [`FleetState::new`].
    pub fn from_shared(fleet: SharedFleet) -> Result<Self, SchedError> {
        fleet
            .validate()
            .map_err(|e| SchedError::InvalidFleet { why: e.to_string() })?;
        Self::assemble(fleet)
    }

    fn assemble(fleet: SharedFleet) -> Result<Self, SchedError> {
        let mut s = FleetState {
            templates: fleet.templates,
            ..FleetState::default()
        };
        // A shape's index, built on its first node; the `Arc` keeps the key's address alive.
        let mut shaped: HashMap<usize, (Arc<HostShape>, NodeState)> = HashMap::new();
        // The fleet's own node order is kept: it is what `firstfit` (and every tie) goes by,
        // and what `to_fleet` writes back.
        for node in fleet.nodes {
            gpu_core::validate_name(node.name())
                .map_err(|e| SchedError::InvalidFleet { why: e.to_string() })?;
            let i = s.slots.len();
            s.by_name.insert(node.name().to_owned(), i);
            let n = match node {
                FleetNode::Full(topo) => NodeState::new(topo, &mut s.catalog, &mut s.tables),
                FleetNode::Shaped { node, shape } => {
                    let key = Arc::as_ptr(&shape) as usize;
                    let (_, proto) = shaped.entry(key).or_insert_with(|| {
                        let topo = HostShape::clone(&shape).named(String::new());
                        let n = NodeState::new(topo, &mut s.catalog, &mut s.tables);
                        (shape, n)
                    });
                    proto.renamed(&node)
                }
            };
            s.slots.push(Some(Arc::new(n)));
        }
        drop(shaped);
        for a in fleet.allocations {
            let slot = s.slot_of(&a.node);
            let (charges, missing) = match slot.and_then(|i| s.slots[i].as_ref()) {
                Some(n) => n.charges_for(&a),
                None => (Vec::new(), Vec::new()),
            };
            if let (Some(i), false) = (slot, charges.is_empty()) {
                if let Some(n) = s.slots[i].as_mut() {
                    Arc::make_mut(n).apply(&charges, 1);
                }
            }
            let key: Arc<str> = Arc::from(a.machine.as_str());
            s.on_node
                .entry(a.node.clone())
                .or_default()
                .insert(Arc::clone(&key));
            s.records.insert(
                key,
                Box::new(Record {
                    alloc: a,
                    slot,
                    charges,
                    missing,
                }),
            );
        }
        for i in 0..s.slots.len() {
            s.index(i, true);
            s.classes.insert(i, &s.slots);
        }
        Ok(s)
    }

    pub(crate) fn slot_of(&self, node: &str) -> Option<usize> {
        self.by_name
            .get(node)
            .copied()
            .filter(|&i| self.slots[i].is_some())
    }

    /// Adds a node, or replaces its topology when it is already in the fleet (a new discovery).
    /// Allocations on the node are charged again against the new snapshot.
    ///
    /// # Errors
    /// [`SchedError::InvalidFleet`] when the node name is malformed.
    pub fn add_node(&mut self, topo: NodeTopology) -> Result<(), SchedError> {
        gpu_core::validate_name(&topo.node)
            .map_err(|e| SchedError::InvalidFleet { why: e.to_string() })?;
        let name = topo.node.clone();
        let i = match self.by_name.get(&name) {
            Some(&i) => {
                self.index(i, false);
                i
            }
            None => {
                self.slots.push(None);
                let i = self.slots.len() - 1;
                self.by_name.insert(name.clone(), i);
                i
            }
        };
        let mut n = NodeState::new(topo, &mut self.catalog, &mut self.tables);
        let machines: Vec<Arc<str>> = self
            .on_node
            .get(&name)
            .map(|s| s.iter().cloned().collect())
            .unwrap_or_default();
        for m in machines {
            if let Some(r) = self.records.get_mut(&*m) {
                let (charges, missing) = n.charges_for(&r.alloc);
                n.apply(&charges, 1);
                r.charges = charges;
                r.missing = missing;
                r.slot = Some(i);
            }
        }
        if self.slots[i].replace(Arc::new(n)).is_some() {
            // The old snapshot is gone: what only it held can go from the shared tables.
            self.tables.topo.node_removed();
        }
        self.index(i, true);
        self.classes.insert(i, &self.slots);
        Ok(())
    }

    /// Removes a node and returns its topology. Allocations on it stay listed (they are no
    /// longer charged anywhere) until they are released or the node comes back.
    ///
    /// # Errors
    /// [`SchedError::UnknownNode`].
    pub fn remove_node(&mut self, node: &str) -> Result<NodeTopology, SchedError> {
        let i = self.slot_of(node).ok_or_else(|| SchedError::UnknownNode {
            node: node.to_owned(),
        })?;
        self.index(i, false);
        let n = self.slots[i]
            .take()
            .ok_or_else(|| SchedError::UnknownNode {
                node: node.to_owned(),
            })?;
        self.classes.remove(i);
        if let Some(ms) = self.on_node.get(node) {
            for m in ms {
                if let Some(r) = self.records.get_mut(&**m) {
                    r.slot = None;
                    r.charges.clear();
                }
            }
        }
        let topo = n.topology();
        drop(n);
        self.tables.topo.node_removed();
        Ok(topo)
    }

    /// The node topologies, in node order (rebuilt from the compact state on each call).
    pub fn nodes(&self) -> impl Iterator<Item = NodeTopology> + '_ {
        self.slots.iter().flatten().map(|n| n.topology())
    }

    /// The topology of one node.
    pub fn node(&self, name: &str) -> Option<NodeTopology> {
        self.slot_of(name)
            .and_then(|i| self.slots[i].as_ref())
            .map(|n| n.topology())
    }

    /// Whether the fleet has (or had) any node: only then can a profile be told unknown.
    pub(crate) fn has_nodes(&self) -> bool {
        !self.slots.is_empty()
    }

    /// One node as the fleet's allocations leave it, what `topology --inventory FLEET --node`
    /// shows ([`crate::node_view`]).
    ///
    /// # Errors
    /// [`SchedError::UnknownNode`] for a node the fleet has not; as [`crate::node_view`].
    pub fn node_view(&self, name: &str) -> Result<crate::NodeView, SchedError> {
        let node = self.node(name).ok_or_else(|| SchedError::UnknownNode {
            node: name.to_owned(),
        })?;
        crate::node_view(&node, &self.allocations())
    }

    /// The topology of one node as the fleet's allocations leave it (the fleet views' node):
    /// parents and pools charged with every allocated vGPU the node's snapshot does not show
    /// yet, pending or created, as placement counts them. [`FleetState::node`] gives the
    /// snapshot as it was given.
    pub fn charged_node(&self, name: &str) -> Option<NodeTopology> {
        self.slot_of(name)
            .and_then(|i| self.slots[i].as_ref())
            .map(|n| n.charged_topology())
    }

    /// Number of nodes.
    pub fn node_count(&self) -> usize {
        self.slots.iter().flatten().count()
    }

    /// Releases a Machine's allocation and returns its capacity.
    ///
    /// Capacity held by instances that the node's snapshot already shows comes back with the
    /// next snapshot of that node ([`FleetState::add_node`]), once the instances are gone.
    ///
    /// # Errors
    /// [`SchedError::UnknownMachine`].
    pub fn release(&mut self, machine: &str) -> Result<Allocation, SchedError> {
        let r = self
            .records
            .remove(machine)
            .ok_or_else(|| SchedError::UnknownMachine {
                machine: machine.to_owned(),
                nearest: Vec::new(),
            })?;
        if let Some(i) = r.slot {
            self.charge(i, &r.charges, -1);
        }
        if let Some(s) = self.on_node.get_mut(&r.alloc.node) {
            s.remove(machine);
        }
        Ok(r.alloc)
    }

    /// The inverse of a placement: releases a Machine's allocation ([`FleetState::release`])
    /// and says whether its devices were made on the host already ([`Unplaced::on_host`]).
    ///
    /// # Errors
    /// [`SchedError::UnknownMachine`], naming the placed Machines nearest to the name given.
    pub fn unplace(&mut self, machine: &str) -> Result<Unplaced, SchedError> {
        if !self.records.contains_key(machine) {
            let placed: BTreeSet<String> = self.records.keys().map(|k| k.to_string()).collect();
            return Err(SchedError::UnknownMachine {
                machine: machine.to_owned(),
                nearest: crate::suggest::nearest(machine, &placed)
                    .into_iter()
                    .map(str::to_owned)
                    .collect(),
            });
        }
        let allocation = self.release(machine)?;
        Ok(Unplaced {
            on_host: allocation.status == AllocationStatus::Created,
            allocation,
        })
    }

    /// Marks a Machine's devices as created on the host. Its capacity stays charged until a
    /// snapshot of the node shows the instances.
    ///
    /// # Errors
    /// [`SchedError::UnknownMachine`].
    pub fn mark_created(&mut self, machine: &str) -> Result<(), SchedError> {
        let r = self
            .records
            .get_mut(machine)
            .ok_or_else(|| SchedError::UnknownMachine {
                machine: machine.to_owned(),
                nearest: Vec::new(),
            })?;
        r.alloc.status = AllocationStatus::Created;
        Ok(())
    }

    /// The allocation of one Machine.
    pub fn allocation(&self, machine: &str) -> Option<&Allocation> {
        self.records.get(machine).map(|r| &r.alloc)
    }

    /// All allocations, in Machine name order.
    pub fn allocations(&self) -> Vec<Allocation> {
        self.records.values().map(|r| r.alloc.clone()).collect()
    }

    /// The reusable device requests that `use:` refers to.
    pub fn templates(&self) -> &BTreeMap<String, DeviceRequest> {
        &self.templates
    }

    /// Adds or replaces a template.
    ///
    /// # Errors
    /// [`SchedError::InvalidRequest`] when the name is malformed or the template itself uses a
    /// template.
    pub fn set_template(&mut self, name: &str, request: DeviceRequest) -> Result<(), SchedError> {
        gpu_core::validate_name(name).map_err(|e| SchedError::InvalidRequest {
            machine: name.to_owned(),
            why: e.to_string(),
        })?;
        if request.template.is_some() {
            return Err(SchedError::InvalidRequest {
                machine: name.to_owned(),
                why: "a template cannot use another template".to_owned(),
            });
        }
        self.templates.insert(name.to_owned(), request);
        Ok(())
    }

    /// The fleet as data again: nodes, allocations and templates.
    pub fn to_fleet(&self) -> Fleet {
        Fleet {
            nodes: self.nodes().collect(),
            allocations: self.allocations(),
            templates: self.templates.clone(),
        }
    }

    /// Free instances of a vGPU profile (ID or name) per node, for reports; nodes without it are
    /// left out.
    pub fn free_instances(&self, profile: &str) -> Vec<(String, u32)> {
        let classes = self.catalog.resolve(profile);
        self.slots
            .iter()
            .flatten()
            .filter(|n| n.offers_any(&classes))
            .map(|n| {
                (
                    n.name().to_owned(),
                    classes
                        .iter()
                        .fold(0u32, |a, c| a.saturating_add(n.free_of(*c))),
                )
            })
            .collect()
    }

    /// Free whole GPUs per node (passable, healthy enough, not allocated).
    pub fn free_gpus(&self) -> Vec<(String, u32)> {
        self.slots
            .iter()
            .flatten()
            .map(|n| (n.name().to_owned(), n.whole_free))
            .collect()
    }
}
