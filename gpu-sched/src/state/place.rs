//! Placing a Machine: resolving it, finding a node through the indexes in the policy's order,
//! and building (and, for `place`, recording) its allocation; a Machine placed already gets its
//! placement back when it is unchanged.

use std::collections::BTreeSet;
use std::sync::Arc;

use gpu_core::{AllocatedDevice, Allocation, AllocationStatus, HealthState, Machine};

use super::{DegradedDevice, FleetState, Placement, Record, Tree};
use crate::error::SchedError;
use crate::node::{Pick, vendor_ix};
use crate::policy::Policy;
use crate::refusal::{NodeRefusal, Refusal};
use crate::resolve::{Kind, Resolved, resolve};

impl FleetState {
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
        if let Some(rec) = self.records.get(machine.name.as_str()) {
            return self.placed_again(rec, machine);
        }
        let (slot, picks, mut resolved) = self.solve(machine, policy)?;
        // The resolved name is not needed again: the allocation takes it.
        let name = std::mem::take(&mut resolved.name);
        let placement = self.build_as(name, slot, &resolved, &picks);
        let charges = match self.slots[slot].as_ref() {
            Some(n) => n.charges_of(&picks),
            None => Vec::new(),
        };
        self.charge(slot, &charges, 1);
        let a = placement.allocation.clone();
        // One copy of the name keys the record and the node's list of Machines.
        let key: Arc<str> = Arc::from(a.machine.as_str());
        match self.on_node.get_mut(&a.node) {
            Some(set) => {
                set.insert(Arc::clone(&key));
            }
            None => {
                self.on_node
                    .insert(a.node.clone(), BTreeSet::from([Arc::clone(&key)]));
            }
        }
        self.records.insert(
            key,
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
        if let Some(rec) = self.records.get(machine.name.as_str()) {
            return self.placed_again(rec, machine);
        }
        let (slot, picks, mut resolved) = self.solve(machine, policy)?;
        let name = std::mem::take(&mut resolved.name);
        Ok(self.build_as(name, slot, &resolved, &picks))
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
        let resolved = resolve(machine, &self.templates, &self.catalog, self.has_nodes())?;
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
        let resolved = resolve(machine, &self.templates, &self.catalog, self.has_nodes())?;
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
        self.build_as(m.name.clone(), slot, m, picks)
    }

    /// As [`Self::build`], the allocation named `machine` (the caller's `m.name`, handed over).
    fn build_as(&self, machine: String, slot: usize, m: &Resolved, picks: &[Pick]) -> Placement {
        let Some(n) = self.slots[slot].as_ref() else {
            return Placement {
                allocation: Allocation {
                    machine,
                    node: String::new(),
                    status: AllocationStatus::Pending,
                    devices: Vec::new(),
                },
                degraded: Vec::new(),
                already_placed: false,
            };
        };
        let devices = n.devices_of(&machine, m, picks);
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
                machine,
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
                return n
                    .fit(m, policy, self.slot_policy)
                    .map(|p| (i, p))
                    .map_err(|reasons| {
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
            if !n.fabric_may_fit(m) {
                return false;
            }
            let Ok(picks) = n.fit(m, policy, self.slot_policy) else {
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
        let partitioned = policy == Policy::Binpack && self.partition_order(m, &mut visit);
        match primary {
            _ if partitioned => {}
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
}

impl FleetState {
    /// Binpack's partition-aware order for a Machine of whole GPUs only (none named): the nodes
    /// that hand out NVSwitch partitions and have a free one of the Machine's size, those whose
    /// cheapest such partition breaks no larger whole partition first (then those breaking only
    /// smaller ones), each cost by fewest free GPUs. True when `visit` took a node. Nodes without
    /// partitions come after, in the plain order (the caller's).
    fn partition_order(&self, m: &Resolved, visit: &mut dyn FnMut(usize) -> bool) -> bool {
        if self.by_partition.is_empty() {
            return false;
        }
        let mut size = 0u32;
        for r in &m.reqs {
            match &r.kind {
                Kind::Whole { exact, .. } if exact.is_empty() => {
                    size = size.saturating_add(r.wanted);
                }
                _ => return false,
            }
        }
        // The map is ordered by `(size, cost)`: the trees of this size come cheapest first.
        self.by_partition
            .range((size, 0)..=(size, u32::MAX))
            .any(|(_, t)| t.iter().any(|&(_, i)| visit(i as usize)))
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
