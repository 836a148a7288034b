//! The fleet in indexed form, and placement over it.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use gpu_core::{
    AllocatedDevice, Allocation, AllocationStatus, DeviceRequest, Fleet, HealthState, Machine,
    NodeTopology,
};
use serde::{Deserialize, Serialize};

use crate::error::SchedError;
use crate::node::{Charge, NodeState, Pick, vendor_ix};
use crate::plan::{
    AffectedDevice, DrainPlan, Evacuation, EvacuationPlan, MigrationPlan, Stay, pair_moves,
};
use crate::policy::Policy;
use crate::refusal::{NodeRefusal, Refusal};
use crate::resolve::{Catalog, Kind, Resolved, resolve};

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
}

#[derive(Debug, Clone)]
struct Record {
    alloc: Allocation,
    slot: Option<usize>,
    charges: Vec<Charge>,
    missing: Vec<String>,
}

type Tree = BTreeSet<(u32, u32)>;

/// The fleet held in indexed form for fast placement.
///
/// Nodes keep the topology they were given; allocations are charged on top of it (see the
/// accounting notes in the crate docs). Per profile class and per vendor, a sorted index of
/// `(free count, node)` finds the best-fitting node (binpack) or the emptiest one (spread) in
/// logarithmic time, so a placement does not scan the fleet; only a refusal visits every node,
/// to say why each one said no.
#[derive(Debug, Clone, Default)]
pub struct FleetState {
    slots: Vec<Option<Arc<NodeState>>>,
    by_name: HashMap<String, usize>,
    catalog: Catalog,
    records: BTreeMap<String, Record>,
    on_node: HashMap<String, BTreeSet<String>>,
    templates: BTreeMap<String, DeviceRequest>,
    by_class: HashMap<u32, Tree>,
    whole_all: Tree,
    whole_vendor: [Tree; 6],
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
        let mut s = FleetState {
            templates: fleet.templates,
            ..FleetState::default()
        };
        let mut nodes = fleet.nodes;
        nodes.sort_by(|a, b| a.node.cmp(&b.node));
        for topo in nodes {
            gpu_core::validate_name(&topo.node)
                .map_err(|e| SchedError::InvalidFleet { why: e.to_string() })?;
            let i = s.slots.len();
            s.by_name.insert(topo.node.clone(), i);
            let n = NodeState::new(topo, &mut s.catalog);
            s.slots.push(Some(Arc::new(n)));
        }
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
                Record {
                    alloc: a,
                    slot,
                    charges,
                    missing,
                },
            );
        }
        for i in 0..s.slots.len() {
            s.index(i, true);
        }
        Ok(s)
    }

    fn slot_of(&self, node: &str) -> Option<usize> {
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
        for &(c, f) in &n.free {
            if f == 0 {
                continue;
            }
            let t = self.by_class.entry(c).or_default();
            if insert {
                t.insert((f, id));
            } else {
                t.remove(&(f, id));
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
    fn charge(&mut self, i: usize, charges: &[Charge], sign: i64) {
        let Some(n) = self.slots[i].as_mut().map(Arc::make_mut) else {
            return;
        };
        let old_free = n.free.clone();
        let old_whole = n.whole_free;
        let old_vendor = n.whole_free_vendor;
        n.apply(charges, sign);
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
        let mut n = NodeState::new(topo, &mut self.catalog);
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
        self.slots[i] = Some(Arc::new(n));
        self.index(i, true);
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
        if let Some(ms) = self.on_node.get(node) {
            for m in ms {
                if let Some(r) = self.records.get_mut(m) {
                    r.slot = None;
                    r.charges.clear();
                }
            }
        }
        Ok(Arc::try_unwrap(n).map_or_else(|a| a.topo.clone(), |n| n.topo))
    }

    /// The node topologies, in node order.
    pub fn nodes(&self) -> impl Iterator<Item = &NodeTopology> {
        self.slots.iter().flatten().map(|n| &n.topo)
    }

    /// Number of nodes.
    pub fn node_count(&self) -> usize {
        self.slots.iter().flatten().count()
    }

    /// Places a Machine and records its allocation as `pending`.
    ///
    /// # Errors
    /// [`SchedError::InvalidRequest`] for a malformed Machine, an unknown template or a Machine
    /// already placed (changing a placed Machine's devices is not supported: release it, or plan
    /// a migration); [`SchedError::Unsatisfiable`] when no node can hold it.
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
            Record {
                alloc: a,
                slot: Some(slot),
                charges,
                missing: Vec::new(),
            },
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
        let (slot, picks, resolved) = self.solve(machine, policy)?;
        Ok(self.build(slot, &resolved, &picks))
    }

    fn solve(
        &self,
        machine: &Machine,
        policy: Policy,
    ) -> Result<(usize, Vec<Pick>, Resolved), SchedError> {
        let resolved = resolve(machine, &self.templates, &self.catalog)?;
        if let Some(r) = self.records.get(&resolved.name) {
            return Err(SchedError::InvalidRequest {
                machine: resolved.name.clone(),
                why: format!(
                    "a Machine of that name is already placed on node {:?}; its devices cannot be changed in place: release it and place it again, or plan a migration",
                    r.alloc.node
                ),
            });
        }
        let (slot, picks) = self
            .search(&resolved, policy, None, None)
            .map_err(SchedError::Unsatisfiable)?;
        Ok((slot, picks, resolved))
    }

    fn build(&self, slot: usize, m: &Resolved, picks: &[Pick]) -> Placement {
        let Some(n) = self.slots[slot].as_ref() else {
            return Placement {
                allocation: Allocation {
                    machine: m.name.clone(),
                    node: String::new(),
                    status: AllocationStatus::Pending,
                    devices: Vec::new(),
                },
                degraded: Vec::new(),
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
                node: n.topo.node.clone(),
                status: AllocationStatus::Pending,
                devices,
            },
            degraded,
        }
    }

    /// Finds a node for a resolved Machine: only `only` when given, never `exclude`.
    fn search(
        &self,
        m: &Resolved,
        policy: Policy,
        only: Option<usize>,
        exclude: Option<usize>,
    ) -> Result<(usize, Vec<Pick>), Refusal> {
        if let Some(i) = only {
            if let Some(n) = self.slots[i].as_ref() {
                return n.fit(m, policy).map(|p| (i, p)).map_err(|reasons| Refusal {
                    machine: m.name.clone(),
                    nodes_total: 1,
                    nodes: vec![NodeRefusal {
                        node: n.topo.node.clone(),
                        reasons,
                    }],
                });
            }
        }
        // The most selective request's index gives the candidate nodes, in policy order.
        let mut primary: Option<(&Tree, u32)> = None;
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
            Some((tree, wanted)) if indexed || tree.is_empty() => match policy {
                Policy::Binpack => {
                    for &(_, i) in tree.range((wanted, 0)..) {
                        if visit(i as usize) {
                            break;
                        }
                    }
                }
                Policy::Spread => spread_order(tree, wanted, &mut visit),
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

    /// Asks every node why it cannot take the Machine.
    fn refuse(&self, m: &Resolved, policy: Policy, exclude: Option<usize>) -> Refusal {
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
                    node: n.topo.node.clone(),
                    reasons,
                });
            }
        }
        Refusal {
            machine: m.name.clone(),
            nodes_total: total,
            nodes,
        }
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
            nodes: self.nodes().cloned().collect(),
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
                    n.topo.node.clone(),
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
            .map(|n| (n.topo.node.clone(), n.whole_free))
            .collect()
    }

    // ------------------------------------------------------------------ plans

    /// The Machine a move of an allocation asks for: the same family (or the named GPU) for
    /// each whole GPU, at least as much memory; the same profile for each vGPU.
    fn move_request(&self, a: &Allocation, gpus: &[String]) -> Result<Resolved, SchedError> {
        let mut names = gpus.iter();
        let mut devices: Vec<DeviceRequest> = Vec::new();
        for d in &a.devices {
            let req = d.request();
            let i = match devices.iter().position(|r| r.name == req) {
                Some(i) => i,
                None => {
                    devices.push(DeviceRequest {
                        name: req.to_owned(),
                        count: Some(0),
                        ..DeviceRequest::default()
                    });
                    devices.len() - 1
                }
            };
            let r = &mut devices[i];
            r.count = Some(r.count.unwrap_or(0) + 1);
            match d {
                AllocatedDevice::Gpu {
                    name, memory_mib, ..
                } => {
                    let pick = names.next().cloned().unwrap_or_else(|| {
                        name.trim_end_matches(|c: char| c.is_ascii_digit())
                            .to_owned()
                    });
                    r.gpus.push(pick);
                    if let Some(mem) = memory_mib {
                        r.min_memory = Some(
                            r.min_memory
                                .map_or(gpu_core::MiB(*mem), |m| m.min(gpu_core::MiB(*mem))),
                        );
                    }
                }
                AllocatedDevice::Vgpu {
                    profile,
                    profile_name,
                    ..
                } => {
                    r.profile = Some(if profile_name.is_empty() {
                        profile.to_string()
                    } else {
                        profile_name.clone()
                    });
                }
            }
        }
        if names.next().is_some() {
            return Err(SchedError::InvalidRequest {
                machine: a.machine.clone(),
                why: format!(
                    "{} GPU name(s) given but the Machine holds {} whole GPU(s)",
                    gpus.len(),
                    a.devices
                        .iter()
                        .filter(|d| matches!(d, AllocatedDevice::Gpu { .. }))
                        .count()
                ),
            });
        }
        for r in &mut devices {
            if !r.gpus.is_empty() {
                r.count = None;
            }
        }
        let machine = Machine {
            name: a.machine.clone(),
            devices,
        };
        resolve(&machine, &BTreeMap::new(), &self.catalog)
    }

    fn plan_for(&self, a: &Allocation, slot: usize, m: &Resolved, picks: &[Pick]) -> MigrationPlan {
        let target = self.build(slot, m, picks).allocation;
        MigrationPlan {
            machine: a.machine.clone(),
            from: a.node.clone(),
            to: target.node.clone(),
            moves: pair_moves(&a.devices, &target.devices),
            allocation: target,
        }
    }

    /// Plans moving a Machine to another node: for each whole GPU it holds, a free GPU of the
    /// same family with at least as much memory (or the GPU named in `gpus`, in the order the
    /// Machine holds its GPUs); for each vGPU, the same profile.
    ///
    /// # Errors
    /// [`SchedError::UnknownMachine`], [`SchedError::UnknownNode`],
    /// [`SchedError::InvalidRequest`] (already on that node, too many GPU names, bad names), and
    /// [`SchedError::Unsatisfiable`] with the destination's reasons.
    pub fn plan_migration(
        &self,
        machine: &str,
        to_node: &str,
        gpus: &[String],
    ) -> Result<MigrationPlan, SchedError> {
        let r = self
            .records
            .get(machine)
            .ok_or_else(|| SchedError::UnknownMachine {
                machine: machine.to_owned(),
            })?;
        let slot = self
            .slot_of(to_node)
            .ok_or_else(|| SchedError::UnknownNode {
                node: to_node.to_owned(),
            })?;
        if r.alloc.node == to_node {
            return Err(SchedError::InvalidRequest {
                machine: machine.to_owned(),
                why: format!("the Machine is already on node {to_node:?}"),
            });
        }
        let m = self.move_request(&r.alloc, gpus)?;
        let (slot, picks) = self
            .search(&m, Policy::Binpack, Some(slot), None)
            .map_err(SchedError::Unsatisfiable)?;
        Ok(self.plan_for(&r.alloc, slot, &m, &picks))
    }

    /// Plans draining a node: every Machine on it placed elsewhere (one after the other, so no
    /// two count on the same device), or kept with the reason.
    ///
    /// # Errors
    /// [`SchedError::UnknownNode`].
    pub fn plan_drain(&self, node: &str) -> Result<DrainPlan, SchedError> {
        let slot = self.slot_of(node).ok_or_else(|| SchedError::UnknownNode {
            node: node.to_owned(),
        })?;
        let mut scratch = self.clone_for_planning();
        let machines: Vec<String> = self
            .on_node
            .get(node)
            .map(|s| s.iter().cloned().collect())
            .unwrap_or_default();
        let mut plan = DrainPlan {
            node: node.to_owned(),
            moves: Vec::new(),
            stay: Vec::new(),
        };
        for name in machines {
            let Some(r) = self.records.get(&name) else {
                continue;
            };
            let m = match scratch.move_request(&r.alloc, &[]) {
                Ok(m) => m,
                Err(e) => {
                    plan.stay.push(Stay {
                        machine: name.clone(),
                        reason: e.to_string(),
                        refusal: None,
                    });
                    continue;
                }
            };
            match scratch.search(&m, Policy::Binpack, None, Some(slot)) {
                Ok((to, picks)) => {
                    plan.moves.push(scratch.plan_for(&r.alloc, to, &m, &picks));
                    let charges = scratch.slots[to]
                        .as_ref()
                        .map(|n| n.charges_of(&picks))
                        .unwrap_or_default();
                    scratch.charge(to, &charges, 1);
                }
                Err(refusal) => plan.stay.push(Stay {
                    machine: name.clone(),
                    reason: refusal.render(),
                    refusal: Some(refusal),
                }),
            }
        }
        Ok(plan)
    }

    /// Plans evacuating every Machine that holds a device on an Unhealthy GPU (or one that is
    /// gone from its node's inventory): a destination for each, possibly a healthy GPU of the
    /// same node, planned one after the other.
    pub fn plan_evacuation(&self) -> EvacuationPlan {
        let mut scratch = self.clone_for_planning();
        let mut plan = EvacuationPlan::default();
        for (name, r) in &self.records {
            let Some(slot) = r.slot else { continue };
            let Some(n) = self.slots[slot].as_ref() else {
                continue;
            };
            let affected = affected_devices(n, r);
            if affected.is_empty() {
                continue;
            }
            let mut ev = Evacuation {
                machine: name.clone(),
                node: r.alloc.node.clone(),
                affected,
                plan: None,
                refusal: None,
            };
            match scratch.move_request(&r.alloc, &[]) {
                Ok(m) => {
                    // Its own devices are free for the plan: it leaves them.
                    scratch.charge(slot, &r.charges, -1);
                    match scratch.search(&m, Policy::Binpack, None, None) {
                        Ok((to, picks)) => {
                            ev.plan = Some(scratch.plan_for(&r.alloc, to, &m, &picks));
                            let charges = scratch.slots[to]
                                .as_ref()
                                .map(|n| n.charges_of(&picks))
                                .unwrap_or_default();
                            scratch.charge(to, &charges, 1);
                        }
                        Err(refusal) => {
                            scratch.charge(slot, &r.charges, 1);
                            ev.refusal = Some(refusal);
                        }
                    }
                }
                Err(e) => {
                    ev.refusal = Some(Refusal {
                        machine: format!("{name}: {e}"),
                        nodes_total: 0,
                        nodes: Vec::new(),
                    });
                }
            }
            plan.machines.push(ev);
        }
        plan
    }

    /// A copy to plan on. Plans are rare and must not disturb the live state.
    /// Nodes are shared and copied only when a plan charges them; allocation records are not
    /// needed to search.
    fn clone_for_planning(&self) -> FleetState {
        FleetState {
            slots: self.slots.clone(),
            by_name: HashMap::new(),
            catalog: self.catalog.clone(),
            records: BTreeMap::new(),
            on_node: HashMap::new(),
            templates: BTreeMap::new(),
            by_class: self.by_class.clone(),
            whole_all: self.whole_all.clone(),
            whole_vendor: self.whole_vendor.clone(),
        }
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

fn affected_devices(n: &NodeState, r: &Record) -> Vec<AffectedDevice> {
    let mut out = Vec::new();
    for d in &r.alloc.devices {
        match d {
            AllocatedDevice::Gpu {
                request, address, ..
            } => {
                if let Some(g) = n.topo.gpu_by_address(address) {
                    if g.health.state == HealthState::Unhealthy {
                        out.push(AffectedDevice {
                            request: request.clone(),
                            device: g.name.clone(),
                            health: HealthState::Unhealthy,
                            reasons: g.health.reasons.clone(),
                        });
                    }
                }
            }
            AllocatedDevice::Vgpu {
                request,
                parent,
                gpu,
                ..
            } => {
                let p = n.topo.parent(parent);
                let g = gpu.and_then(|a| n.topo.gpu_by_address(&a));
                let mut state = p.map_or(HealthState::Healthy, |p| p.health.state);
                let mut reasons = p.map(|p| p.health.reasons.clone()).unwrap_or_default();
                if let Some(g) = g {
                    state = state.worst(g.health.state);
                    for x in &g.health.reasons {
                        if !reasons.contains(x) {
                            reasons.push(x.clone());
                        }
                    }
                }
                if p.is_some() && state == HealthState::Unhealthy {
                    out.push(AffectedDevice {
                        request: request.clone(),
                        device: match g {
                            Some(g) => format!("{} via {parent}", g.name),
                            None => parent.to_string(),
                        },
                        health: HealthState::Unhealthy,
                        reasons,
                    });
                }
            }
        }
    }
    for m in &r.missing {
        out.push(AffectedDevice {
            request: String::new(),
            device: m.clone(),
            health: HealthState::Unknown,
            reasons: vec!["not in the node's inventory".to_owned()],
        });
    }
    out
}
