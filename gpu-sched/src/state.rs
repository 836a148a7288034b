//! The fleet in indexed form, and placement over it.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::Arc;

use gpu_core::{
    AllocatedDevice, Allocation, AllocationStatus, DeviceRequest, Fleet, FleetNode, HealthState,
    HostShape, Machine, NodeTopology, SharedFleet,
};
use serde::{Deserialize, Serialize};

use crate::classes::Classes;
use crate::error::SchedError;
use crate::members::Members;
use crate::node::{Charge, NodeState, Pick, ProfileTables, vendor_ix};
use crate::policy::Policy;
use crate::refusal::{NodeRefusal, Refusal, RefusedGroup};
use crate::resolve::{Catalog, Kind, Req, Resolved, resolve};

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
    pub(crate) records: BTreeMap<String, Box<Record>>,
    pub(crate) on_node: HashMap<String, BTreeSet<String>>,
    pub(crate) templates: BTreeMap<String, DeviceRequest>,
    pub(crate) by_class: HashMap<u32, Tree>,
    /// Per class: `(free instances on GPUs already hosting vGPUs, node)`, for binpack.
    pub(crate) by_class_used: HashMap<u32, Tree>,
    pub(crate) whole_all: Tree,
    pub(crate) whole_vendor: [Tree; 6],
    /// Nodes grouped by what a fit sees, for refusals.
    pub(crate) classes: Classes,
}

fn slot_id(i: usize) -> u32 {
    u32::try_from(i).unwrap_or(u32::MAX)
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
            s.on_node
                .entry(a.node.clone())
                .or_default()
                .insert(a.machine.clone());
            s.records.insert(
                a.machine.clone(),
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

    /// Adds (or removes, with `insert == false`) a node's entries in the indexes.
    fn index(&mut self, i: usize, insert: bool) {
        let Some(n) = self.slots[i].as_ref() else {
            return;
        };
        let id = slot_id(i);
        for (&(c, f), &u) in n.free.iter().zip(&n.free_used) {
            for (map, f) in [(&mut self.by_class, f), (&mut self.by_class_used, u)] {
                if f == 0 {
                    continue;
                }
                let t = map.entry(c).or_default();
                if insert {
                    t.insert((f, id));
                } else {
                    t.remove(&(f, id));
                }
            }
        }
        let mut whole = vec![(&mut self.whole_all, n.whole_free)];
        for (t, f) in self.whole_vendor.iter_mut().zip(n.whole_free_vendor) {
            whole.push((t, f));
        }
        for (t, f) in whole {
            if f == 0 {
                continue;
            }
            if insert {
                t.insert((f, id));
            } else {
                t.remove(&(f, id));
            }
        }
    }

    /// Applies charges on a node and moves it in the indexes where its counts changed.
    pub(crate) fn charge(&mut self, i: usize, charges: &[Charge], sign: i64) {
        let Some(n) = self.slots[i].as_mut().map(Arc::make_mut) else {
            return;
        };
        let old_free = n.free.clone();
        let old_used = n.free_used.clone();
        let old_whole = n.whole_free;
        let old_vendor = n.whole_free_vendor;
        n.apply(charges, sign);
        self.classes.touch(i);
        let id = slot_id(i);
        let update = |t: &mut Tree, old: u32, new: u32| {
            if old == new {
                return;
            }
            if old > 0 {
                t.remove(&(old, id));
            }
            if new > 0 {
                t.insert((new, id));
            }
        };
        for (o, nw) in old_free.iter().zip(n.free.iter()) {
            if o.1 != nw.1 {
                let t = self.by_class.entry(o.0).or_default();
                update(t, o.1, nw.1);
            }
        }
        for ((o, nw), (c, _)) in old_used.iter().zip(&n.free_used).zip(&n.free) {
            if o != nw {
                let t = self.by_class_used.entry(*c).or_default();
                update(t, *o, *nw);
            }
        }
        update(&mut self.whole_all, old_whole, n.whole_free);
        for ((t, old), new) in self
            .whole_vendor
            .iter_mut()
            .zip(old_vendor)
            .zip(n.whole_free_vendor)
        {
            update(t, old, new);
        }
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
        let machines: Vec<String> = self
            .on_node
            .get(&name)
            .map(|s| s.iter().cloned().collect())
            .unwrap_or_default();
        for m in machines {
            if let Some(r) = self.records.get_mut(&m) {
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
                if let Some(r) = self.records.get_mut(m) {
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

    /// Number of nodes.
    pub fn node_count(&self) -> usize {
        self.slots.iter().flatten().count()
    }

    /// Places a Machine and records its allocation as `pending`. A Machine with a `targetNode`
    /// goes on that node or is refused with that node's reasons. A Machine placed already whose
    /// allocation still answers it (unchanged) gets that placement back, marked
    /// [`Placement::already_placed`], and nothing is charged again.
    ///
    /// # Errors
    /// [`SchedError::InvalidRequest`] for a malformed Machine, an unknown template or a Machine
    /// already placed whose requests changed (changing a placed Machine's devices is not
    /// supported: release it, or plan a migration); [`SchedError::UnknownNode`] for a `targetNode` not in the fleet;
    /// [`SchedError::Unsatisfiable`] when no node can hold it.
    pub fn place(&mut self, machine: &Machine, policy: Policy) -> Result<Allocation, SchedError> {
        self.place_detailed(machine, policy).map(|p| p.allocation)
    }

    /// Like [`FleetState::place`], and also says which devices landed on Degraded GPUs.
    ///
    /// # Errors
    /// As [`FleetState::place`].
    pub fn place_detailed(
        &mut self,
        machine: &Machine,
        policy: Policy,
    ) -> Result<Placement, SchedError> {
        if let Some(rec) = self.records.get(&machine.name) {
            return self.placed_again(rec, machine);
        }
        let (slot, picks, resolved) = self.solve(machine, policy)?;
        let placement = self.build(slot, &resolved, &picks);
        let charges = match self.slots[slot].as_ref() {
            Some(n) => n.charges_of(&picks),
            None => Vec::new(),
        };
        self.charge(slot, &charges, 1);
        let a = placement.allocation.clone();
        match self.on_node.get_mut(&a.node) {
            Some(set) => {
                set.insert(a.machine.clone());
            }
            None => {
                self.on_node
                    .insert(a.node.clone(), BTreeSet::from([a.machine.clone()]));
            }
        }
        self.records.insert(
            a.machine.clone(),
            Box::new(Record {
                alloc: a,
                slot: Some(slot),
                charges,
                missing: Vec::new(),
            }),
        );
        Ok(placement)
    }

    /// Where a Machine would go, without recording anything.
    ///
    /// # Errors
    /// As [`FleetState::place`].
    pub fn try_place(&self, machine: &Machine, policy: Policy) -> Result<Allocation, SchedError> {
        self.try_place_detailed(machine, policy)
            .map(|p| p.allocation)
    }

    /// Like [`FleetState::try_place`], with the Degraded marks.
    ///
    /// # Errors
    /// As [`FleetState::place`].
    pub fn try_place_detailed(
        &self,
        machine: &Machine,
        policy: Policy,
    ) -> Result<Placement, SchedError> {
        if let Some(rec) = self.records.get(&machine.name) {
            return self.placed_again(rec, machine);
        }
        let (slot, picks, resolved) = self.solve(machine, policy)?;
        Ok(self.build(slot, &resolved, &picks))
    }

    /// Placing a Machine that is placed already (`rec` is its record): its placement when the
    /// allocation still answers every request (same requests and counts, each device of the
    /// profile or GPU asked for, on the `targetNode` when one is given), so placing is
    /// idempotent and nothing is charged again; otherwise it is refused. The caller has looked
    /// the record up once: a Machine not yet placed costs no second look-up.
    ///
    /// # Errors
    /// [`SchedError::InvalidRequest`] for a malformed Machine, an unknown template, or a placed
    /// Machine whose requests changed.
    fn placed_again(&self, rec: &Record, machine: &Machine) -> Result<Placement, SchedError> {
        let resolved = resolve(machine, &self.templates, &self.catalog)?;
        if self.answers(rec, &resolved) {
            return Ok(Placement {
                allocation: rec.alloc.clone(),
                degraded: Vec::new(),
                already_placed: true,
            });
        }
        Err(SchedError::InvalidRequest {
            machine: resolved.name.clone(),
            why: format!(
                "a Machine of that name is already placed on node {:?}; its devices cannot be changed in place: release it and place it again, or plan a migration",
                rec.alloc.node
            ),
        })
    }

    /// Whether a placed Machine's allocation still answers its resolved requests.
    fn answers(&self, rec: &Record, resolved: &Resolved) -> bool {
        if resolved
            .target
            .as_ref()
            .is_some_and(|t| *t != rec.alloc.node)
            || !rec.missing.is_empty()
        {
            return false;
        }
        let Some(node) = rec
            .slot
            .and_then(|i| self.slots.get(i))
            .and_then(|n| n.as_ref())
        else {
            return false;
        };
        let wanted = resolved
            .reqs
            .iter()
            .fold(0usize, |a, r| a.saturating_add(r.wanted as usize));
        rec.alloc.devices.len() == wanted
            && resolved.reqs.iter().all(|r| {
                let devices: Vec<&AllocatedDevice> = rec
                    .alloc
                    .devices
                    .iter()
                    .filter(|d| d.request() == r.name)
                    .collect();
                node.fulfils(r, &devices, &self.catalog)
            })
    }

    /// Resolves and places a Machine that is not placed yet (the callers looked that up).
    fn solve(
        &self,
        machine: &Machine,
        policy: Policy,
    ) -> Result<(usize, Vec<Pick>, Resolved), SchedError> {
        let resolved = resolve(machine, &self.templates, &self.catalog)?;
        let only = match &resolved.target {
            Some(node) => Some(
                self.slot_of(node)
                    .ok_or_else(|| SchedError::UnknownNode { node: node.clone() })?,
            ),
            None => None,
        };
        let (slot, picks) =
            self.search(&resolved, policy, only, None)
                .map_err(|r| match &resolved.target {
                    Some(node) => SchedError::Unsatisfiable(r.targeted(node)),
                    None => SchedError::Unsatisfiable(r),
                })?;
        Ok((slot, picks, resolved))
    }

    pub(crate) fn build(&self, slot: usize, m: &Resolved, picks: &[Pick]) -> Placement {
        let Some(n) = self.slots[slot].as_ref() else {
            return Placement {
                allocation: Allocation {
                    machine: m.name.clone(),
                    node: String::new(),
                    status: AllocationStatus::Pending,
                    devices: Vec::new(),
                },
                degraded: Vec::new(),
                already_placed: false,
            };
        };
        let devices = n.devices_of(&m.name, m, picks);
        let mut degraded = Vec::new();
        for p in picks {
            if n.pick_state(p) != HealthState::Degraded {
                continue;
            }
            let (state, reasons, device) = n.pick_health(p);
            if state == HealthState::Degraded {
                let req = match *p {
                    Pick::Whole { req, .. } | Pick::Vgpu { req, .. } => req,
                };
                let d = DegradedDevice {
                    request: m.reqs[req].name.clone(),
                    device,
                    reasons,
                };
                if !degraded.contains(&d) {
                    degraded.push(d);
                }
            }
        }
        Placement {
            allocation: Allocation {
                machine: m.name.clone(),
                node: n.name().to_owned(),
                status: AllocationStatus::Pending,
                devices,
            },
            degraded,
            already_placed: false,
        }
    }

    /// Finds a node for a resolved Machine: only `only` when given, never `exclude`.
    pub(crate) fn search(
        &self,
        m: &Resolved,
        policy: Policy,
        only: Option<usize>,
        exclude: Option<usize>,
    ) -> Result<(usize, Vec<Pick>), Refusal> {
        if let Some(i) = only {
            if let Some(n) = self.slots[i].as_ref() {
                return n.fit(m, policy).map(|p| (i, p)).map_err(|reasons| {
                    Refusal::from_nodes(
                        m.name.clone(),
                        1,
                        vec![NodeRefusal {
                            node: n.name().to_owned(),
                            reasons,
                        }],
                    )
                });
            }
        }
        // The most selective request's index gives the candidate nodes, in policy order.
        let mut primary: Option<(&Tree, u32)> = None;
        // Binpack looks first among nodes whose GPUs already hosting vGPUs can take the most
        // selective vGPU request: best fit on the locked size, fresh cards kept whole.
        let mut used_first: Option<(&Tree, u32)> = None;
        let mut indexed = true;
        static EMPTY: Tree = BTreeSet::new();
        for r in &m.reqs {
            let tree: Option<&Tree> = match &r.kind {
                Kind::Vgpu { classes, .. } => match classes.as_slice() {
                    [] => Some(&EMPTY),
                    [c] => Some(self.by_class.get(c).unwrap_or(&EMPTY)),
                    _ => None,
                },
                Kind::Whole { families, .. } => {
                    let fam_vendor = match families.as_slice() {
                        [f] => gpu_core::Vendor::from_family(f),
                        _ => None,
                    };
                    match (r.vendor, fam_vendor) {
                        (Some((v, None)), _) | (None, Some(v)) => {
                            Some(&self.whole_vendor[vendor_ix(v)])
                        }
                        _ => Some(&self.whole_all),
                    }
                }
            };
            match tree {
                Some(t) => {
                    if primary.is_none_or(|(p, _)| t.len() < p.len()) {
                        primary = Some((t, r.wanted));
                        used_first = match &r.kind {
                            Kind::Vgpu { classes, .. } if classes.len() == 1 => {
                                self.by_class_used.get(&classes[0]).map(|u| (u, r.wanted))
                            }
                            _ => None,
                        };
                    }
                }
                None => indexed = false,
            }
        }
        // A node whose fit would use a Degraded GPU is kept as a fallback while the search looks
        // on for one that does not: Degraded GPUs are used last fleet-wide, not only per node.
        let mut found: Option<(usize, Vec<Pick>)> = None;
        let mut fallback: Option<(usize, Vec<Pick>)> = None;
        let mut visit = |i: usize| -> bool {
            if exclude == Some(i) {
                return false;
            }
            let Some(n) = self.slots.get(i).and_then(|s| s.as_deref()) else {
                return false;
            };
            let Ok(picks) = n.fit(m, policy) else {
                return false;
            };
            if picks
                .iter()
                .any(|p| n.pick_state(p) == HealthState::Degraded)
            {
                if fallback.is_none() {
                    fallback = Some((i, picks));
                }
                return false;
            }
            found = Some((i, picks));
            true
        };
        match primary {
            Some((tree, _)) if tree.is_empty() => {}
            Some(_) if policy == Policy::FirstFit => {
                // Node order, as the DRA allocator; the free counts skip nodes cheaply.
                for i in 0..self.slots.len() {
                    let may = self.slots[i].as_deref().is_some_and(|n| n.may_fit(m));
                    if may && visit(i) {
                        break;
                    }
                }
            }
            Some((tree, wanted)) if indexed => match policy {
                Policy::Binpack => {
                    let mut done = false;
                    if let Some((used, wanted)) = used_first {
                        for &(_, i) in used.range((wanted, 0)..) {
                            if visit(i as usize) {
                                done = true;
                                break;
                            }
                        }
                    }
                    if !done {
                        for &(_, i) in tree.range((wanted, 0)..) {
                            if visit(i as usize) {
                                break;
                            }
                        }
                    }
                }
                Policy::Spread => spread_order(tree, wanted, &mut visit),
                Policy::FirstFit => {}
            },
            _ => {
                for i in 0..self.slots.len() {
                    if visit(i) {
                        break;
                    }
                }
            }
        }
        if let Some(f) = found.or(fallback) {
            return Ok(f);
        }
        Err(self.refuse(m, policy, exclude))
    }

    /// Says why no node can take the Machine: one fit per group of nodes in the same state
    /// (see `classes.rs`), the same answer as asking every node. The refusal keeps snapshots of
    /// the groups' member sets and of the names (reference counts, see `members.rs`): its cost
    /// grows with the number of different node states, not with the fleet.
    fn refuse(&self, m: &Resolved, policy: Policy, exclude: Option<usize>) -> Refusal {
        let mut c = self.classes.lock();
        c.refresh(&self.slots);
        let ex = exclude.and_then(|e| u32::try_from(e).ok());
        let total = c.filed() - usize::from(ex.is_some_and(|e| c.is_filed(e)));
        let mut groups: Vec<RefusedGroup> = Vec::new();
        let answer = |members: &Members, groups: &mut Vec<RefusedGroup>| {
            let Some(n) = members
                .iter()
                .find(|&s| Some(s) != ex)
                .and_then(|s| self.slots.get(s as usize))
                .and_then(|s| s.as_deref())
            else {
                return;
            };
            if let Err(reasons) = n.fit(m, policy) {
                groups.push(RefusedGroup {
                    reasons,
                    members: members.clone(),
                });
            }
        };
        // A shape offering none of the requested vGPU profiles refuses whatever its usage.
        let mut answered: HashSet<u32> = HashSet::new();
        if m.reqs.iter().all(Req::is_vgpu) {
            for (&sid, members) in &c.shapes {
                let rep = members
                    .first()
                    .and_then(|s| self.slots.get(s as usize))
                    .and_then(|s| s.as_deref());
                let Some(n) = rep else { continue };
                let none = m.reqs.iter().all(|r| match &r.kind {
                    Kind::Vgpu { classes, .. } => !n.offers_any(classes),
                    Kind::Whole { .. } => false,
                });
                if none {
                    answer(members, &mut groups);
                    answered.insert(sid);
                }
            }
        }
        for (sig, members) in &c.classes {
            let shape = sig.first().and_then(|w| u32::try_from(*w).ok());
            if shape.is_some_and(|s| answered.contains(&s)) {
                continue;
            }
            answer(members, &mut groups);
        }
        Refusal::from_groups(m.name.clone(), total, groups, c.names.clone(), ex)
    }

    /// Asks every node why it cannot take the Machine (the reference for [`Self::refuse`]).
    #[cfg(any(test, feature = "testing"))]
    fn refuse_by_full_scan(&self, m: &Resolved, policy: Policy, exclude: Option<usize>) -> Refusal {
        let mut nodes = Vec::new();
        let mut total = 0;
        for (i, n) in self.slots.iter().enumerate() {
            let Some(n) = n else { continue };
            if exclude == Some(i) {
                continue;
            }
            total += 1;
            if let Err(reasons) = n.fit(m, policy) {
                nodes.push(NodeRefusal {
                    node: n.name().to_owned(),
                    reasons,
                });
            }
        }
        Refusal::from_nodes(m.name.clone(), total, nodes)
    }

    /// The refusal that asking every node gives, for tests comparing it with
    /// [`FleetState::try_place`]'s.
    ///
    /// # Errors
    /// As [`FleetState::place`] for an invalid Machine.
    #[cfg(feature = "testing")]
    #[doc(hidden)]
    pub fn refusal_by_full_scan(
        &self,
        machine: &Machine,
        policy: Policy,
    ) -> Result<Refusal, SchedError> {
        let resolved = resolve(machine, &self.templates, &self.catalog)?;
        Ok(self.refuse_by_full_scan(&resolved, policy, None))
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
            })?;
        if let Some(i) = r.slot {
            self.charge(i, &r.charges, -1);
        }
        if let Some(s) = self.on_node.get_mut(&r.alloc.node) {
            s.remove(machine);
        }
        Ok(r.alloc)
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

/// Visits nodes from the most free down to `wanted`; among equally free nodes, in node order.
/// Stops when `visit` returns true.
fn spread_order(tree: &Tree, wanted: u32, visit: &mut dyn FnMut(usize) -> bool) {
    let mut upper: Option<u32> = None;
    loop {
        let top = match upper {
            None => tree.range((wanted, 0)..).next_back(),
            Some(u) => tree.range((wanted, 0)..(u, 0)).next_back(),
        };
        let Some(&(free, _)) = top else {
            return;
        };
        for &(_, i) in tree.range((free, 0)..=(free, u32::MAX)) {
            if visit(i as usize) {
                return;
            }
        }
        upper = Some(free);
    }
}
