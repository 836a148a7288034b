//! The fleet views: one node of a fleet file as its allocations leave it, the one answer behind
//! `topology --inventory` (and what the bindings may show of a fleet's node).
//!
//! A Machine placed with `place --save` is recorded as a *pending* allocation: its vGPUs are not
//! on the host yet, so the node's snapshot still counts their room as free. Placement charges
//! them ([`FleetState`]); a view that did not would offer the same room twice. [`node_view`]
//! charges them the same way and lists every vGPU an allocation holds — made (the snapshot shows
//! it) or not yet — with the Machine it belongs to.

use gpu_core::usage::{allocated_instance, unmade_vgpus};
use gpu_core::{
    AllocatedDevice, Allocation, AllocationStatus, Fleet, MdevUuid, NodeTopology, ParentId,
    PciAddress, VgpuFramework, VgpuTypeId,
};
use serde::Serialize;

use crate::{FleetState, SchedError};

/// A node of a fleet as its allocations leave it.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeView {
    /// The node's topology with every allocated vGPU the snapshot does not show yet charged on
    /// its parent and pool (`availableInstances`, `usedMiB`, the size lock, MIG slices), as
    /// placement counts them, and each free GPU an allocation holds (whole, or a vGPU on it)
    /// shown in use, naming the Machine ([`gpu_core::usage::allocated_view`]).
    #[serde(flatten)]
    pub topology: NodeTopology,
    /// Every vGPU instance an allocation on this node holds, made or not, with its Machine.
    pub allocated_instances: Vec<AllocatedInstance>,
}

/// One vGPU an allocation holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct AllocatedInstance {
    /// The Machine whose allocation holds it.
    pub machine: String,
    /// The allocation's status (`pending`: not made on the host yet).
    pub status: AllocationStatus,
    /// Whether the node's snapshot shows the instance.
    pub made: bool,
    /// Its parent.
    pub parent: ParentId,
    /// Its mdev UUID (mdev instances).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub uuid: Option<MdevUuid>,
    /// Its VF (vendor-VFIO instances are the VF itself).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub address: Option<PciAddress>,
    /// Its type.
    pub profile: VgpuTypeId,
    /// Its type's name.
    pub profile_name: String,
    /// Its framebuffer in MiB, when known.
    #[serde(rename = "framebufferMiB", skip_serializing_if = "Option::is_none")]
    pub framebuffer_mib: Option<u64>,
}

impl AllocatedInstance {
    /// The instance as people name it: its UUID, else its VF's address.
    pub fn label(&self) -> String {
        match (self.uuid, self.address) {
            (Some(u), _) => u.to_string(),
            (None, Some(a)) => a.to_string(),
            (None, None) => self.parent.to_string(),
        }
    }
}

fn allocated(a: &Allocation, d: &AllocatedDevice, made: bool) -> Option<AllocatedInstance> {
    let AllocatedDevice::Vgpu {
        parent,
        framework,
        profile,
        profile_name,
        framebuffer_mib,
        uuid,
        ..
    } = d
    else {
        return None;
    };
    let vendor = *framework == VgpuFramework::VendorVfio;
    Some(AllocatedInstance {
        machine: a.machine.clone(),
        status: a.status,
        made,
        parent: parent.clone(),
        uuid: (!vendor).then_some(*uuid),
        address: if vendor { parent.pci() } else { None },
        profile: profile.clone(),
        profile_name: profile_name.clone(),
        framebuffer_mib: *framebuffer_mib,
    })
}

/// `node` (a fleet's node snapshot) as `allocations` leave it: charged as placement charges
/// ([`FleetState::charged_node`]), with every allocated vGPU on it named with its Machine (the
/// made ones in the snapshot's order, then those not made yet in allocation order).
///
/// # Errors
/// [`SchedError::InvalidFleet`] for a malformed node name or two allocations of one Machine.
pub fn node_view(node: &NodeTopology, allocations: &[Allocation]) -> Result<NodeView, SchedError> {
    let on_node: Vec<Allocation> = allocations
        .iter()
        .filter(|a| a.node == node.node)
        .cloned()
        .collect();
    let mut made = Vec::new();
    for p in &node.mediated_devices.parents {
        for i in &p.instances {
            if let Some(a) = allocated_instance(node, &on_node, p, i) {
                let d = a
                    .devices
                    .iter()
                    .find(|d| gpu_core::usage::is_instance(d, p, i));
                made.extend(d.and_then(|d| allocated(a, d, true)));
            }
        }
    }
    let unmade: Vec<AllocatedInstance> = unmade_vgpus(node, &on_node)
        .into_iter()
        .filter_map(|(a, d)| allocated(a, d, false))
        .collect();
    let state = FleetState::new(Fleet {
        nodes: vec![node.clone()],
        allocations: on_node,
        templates: Default::default(),
    })?;
    let topology = state
        .charged_node(&node.node)
        .unwrap_or_else(|| node.clone());
    made.extend(unmade);
    let mut topology = topology;
    for gpu in &mut topology.gpus {
        *gpu = gpu_core::usage::allocated_view(&node.node, allocations, gpu).0;
    }
    Ok(NodeView {
        topology,
        allocated_instances: made,
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::Policy;
    use crate::testing::a2_node;

    fn free(t: &NodeTopology, name: &str) -> u32 {
        let pool = t.mediated_devices.pools.first();
        let parents: Vec<&gpu_core::Parent> = t.mediated_devices.parents.iter().collect();
        gpu_core::pool::profile_offers(&parents, pool)
            .into_iter()
            .find(|o| o.name == name)
            .unwrap()
            .free
    }

    #[test]
    fn a_pending_vgpu_is_charged_and_named_with_its_machine() {
        let node = a2_node("n", 1, 4);
        let mut s = FleetState::new(Fleet {
            nodes: vec![node.clone()],
            ..Fleet::default()
        })
        .unwrap();
        let m = gpu_core::Machine::from_text(
            "name: vm-1\ndevices: [{name: gpu, profile: \"A2-4Q\", count: 1}]",
        )
        .unwrap();
        s.place(&m, Policy::Binpack).unwrap();
        let allocations = s.allocations();
        let before = free(&node, "NVIDIA A2-4Q");
        let view = node_view(&node, &allocations).unwrap();
        assert_eq!(free(&view.topology, "NVIDIA A2-4Q"), before - 1);
        assert_eq!(free(&view.topology, "NVIDIA A2-2Q"), 0, "the size lock");
        assert_eq!(view.allocated_instances.len(), 1);
        let i = &view.allocated_instances[0];
        assert_eq!((i.machine.as_str(), i.made), ("vm-1", false));
        assert_eq!(i.status, AllocationStatus::Pending);
        // The fleet's own view of its node is the same view.
        let from_state = s.node_view("n").unwrap();
        assert_eq!(from_state.allocated_instances, view.allocated_instances);
        assert_eq!(from_state.topology, view.topology);
        assert!(matches!(
            s.node_view("nope"),
            Err(SchedError::UnknownNode { .. })
        ));
        // Without allocations the view is the snapshot.
        let bare = node_view(&node, &[]).unwrap();
        assert_eq!(bare.topology, node);
        assert!(bare.allocated_instances.is_empty());
    }
}
