//! Plans: moving a Machine, draining a node, evacuating unhealthy GPUs.
//!
//! A plan changes nothing; it says where each device of a Machine would go, as the allocation the
//! Machine would get there. Devices keep their stable UUIDs (they derive from the Machine, the
//! request and the index), so a vGPU is re-created under the name the VM definition already uses.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use gpu_core::{AllocatedDevice, Allocation, DeviceRequest, HealthState, Machine};
use serde::{Deserialize, Serialize};

use crate::error::SchedError;
use crate::node::{NodeState, Pick, ProfileTables};
use crate::policy::Policy;
use crate::refusal::Refusal;
use crate::resolve::{Resolved, resolve};
use crate::state::{FleetState, Record};

/// One device of a Machine before and after a move.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeviceMove {
    /// The device request.
    pub request: String,
    /// What the Machine holds now.
    pub from: AllocatedDevice,
    /// What it would hold.
    pub to: AllocatedDevice,
}

/// Where a Machine would go.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MigrationPlan {
    /// The Machine.
    pub machine: String,
    /// Its node now.
    pub from: String,
    /// The destination node.
    pub to: String,
    /// Device by device, in request order.
    pub moves: Vec<DeviceMove>,
    /// The allocation the Machine would have on the destination (status `pending`).
    pub allocation: Allocation,
}

/// A Machine that cannot move, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Stay {
    /// The Machine.
    pub machine: String,
    /// Why, in one line.
    pub reason: String,
    /// The structured refusal, when no node could take it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refusal: Option<Refusal>,
}

/// What draining a node would do: every Machine on it moved elsewhere, or kept with a reason.
/// Moves are planned one after the other, so two Machines never count on the same free device.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DrainPlan {
    /// The node to drain.
    pub node: String,
    /// Machines that can move, with their destination.
    pub moves: Vec<MigrationPlan>,
    /// Machines that must stay, with the reason.
    pub stay: Vec<Stay>,
}

impl DrainPlan {
    /// True when every Machine on the node can move.
    pub fn is_complete(&self) -> bool {
        self.stay.is_empty()
    }
}

/// A device of a Machine that is on bad hardware.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AffectedDevice {
    /// The device request.
    pub request: String,
    /// The GPU or parent (`nvidia1`, `nvidia0 via 0000:08:00.4`).
    pub device: String,
    /// `Unhealthy`, or `Unknown` when the device is gone from the node's inventory.
    pub health: HealthState,
    /// Why.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub reasons: Vec<String>,
}

/// One Machine to evacuate.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Evacuation {
    /// The Machine.
    pub machine: String,
    /// Its node.
    pub node: String,
    /// Its devices on Unhealthy (or vanished) hardware.
    pub affected: Vec<AffectedDevice>,
    /// Where it can go (possibly another GPU of the same node), when somewhere can take it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plan: Option<MigrationPlan>,
    /// Why it cannot go anywhere, otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refusal: Option<Refusal>,
}

/// Every Machine on Unhealthy GPUs, with a destination for each where one exists.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct EvacuationPlan {
    /// Machines in name order.
    pub machines: Vec<Evacuation>,
}

/// Pairs a Machine's current devices with the planned ones, request by request.
fn pair_moves(current: &[AllocatedDevice], target: &[AllocatedDevice]) -> Vec<DeviceMove> {
    let mut used = vec![false; target.len()];
    let mut out = Vec::new();
    for c in current {
        if let Some(i) = target
            .iter()
            .enumerate()
            .position(|(i, t)| !used[i] && t.request() == c.request())
        {
            used[i] = true;
            out.push(DeviceMove {
                request: c.request().to_owned(),
                from: c.clone(),
                to: target[i].clone(),
            });
        }
    }
    out
}

impl FleetState {
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
            ..Machine::default()
        };
        resolve(&machine, &BTreeMap::new(), &self.catalog, self.has_nodes())
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
                nearest: Vec::new(),
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
            .map_err(|r| SchedError::Unsatisfiable(r.targeted(to_node)))?;
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
        let machines: Vec<Arc<str>> = self
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
            let Some(r) = self.records.get(&*name) else {
                continue;
            };
            let m = match scratch.move_request(&r.alloc, &[]) {
                Ok(m) => m,
                Err(e) => {
                    plan.stay.push(Stay {
                        machine: name.to_string(),
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
                    machine: name.to_string(),
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
                machine: name.to_string(),
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
                    ev.refusal = Some(Refusal::from_nodes(format!("{name}: {e}"), 0, Vec::new()));
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
            tables: ProfileTables::default(),
            records: BTreeMap::new(),
            on_node: HashMap::new(),
            templates: BTreeMap::new(),
            by_class: self.by_class.clone(),
            by_class_used: self.by_class_used.clone(),
            whole_all: self.whole_all.clone(),
            whole_vendor: self.whole_vendor.clone(),
            by_partition: self.by_partition.clone(),
            classes: self.classes.clone(),
            slot_policy: self.slot_policy,
        }
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
