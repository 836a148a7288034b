//! Plans: moving a Machine, draining a node, evacuating unhealthy GPUs.
//!
//! A plan changes nothing; it says where each device of a Machine would go, as the allocation the
//! Machine would get there. Devices keep their stable UUIDs (they derive from the Machine, the
//! request and the index), so a vGPU is re-created under the name the VM definition already uses.

use gpu_core::{AllocatedDevice, Allocation, HealthState};
use serde::{Deserialize, Serialize};

use crate::refusal::Refusal;

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
pub(crate) fn pair_moves(
    current: &[AllocatedDevice],
    target: &[AllocatedDevice],
) -> Vec<DeviceMove> {
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
