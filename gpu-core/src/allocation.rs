//! Where a Machine's devices went.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::address::PciAddress;
use crate::fleet::Fleet;
use crate::ids::{MdevUuid, ParentId, VgpuTypeId};
use crate::nvidia::strip_prefix;
use crate::request::DeviceRequest;
use crate::topology::{NodeTopology, VgpuFramework};

/// Whether the devices of an allocation exist on the host yet. JSON: `pending`, `created`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum AllocationStatus {
    /// Placed, not created yet: its capacity is reserved on top of what the driver reports.
    #[default]
    Pending,
    /// Created on the host: the driver's counts already reflect it.
    Created,
}

impl AllocationStatus {
    /// The status as the JSON spells it (`pending`, `created`).
    pub fn as_str(self) -> &'static str {
        match self {
            AllocationStatus::Pending => "pending",
            AllocationStatus::Created => "created",
        }
    }
}

/// One allocated device.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum AllocatedDevice {
    /// A whole GPU (passthrough), with its companion functions.
    #[serde(rename_all = "camelCase")]
    Gpu {
        /// The device request this fulfils.
        request: String,
        /// Per-node GPU name.
        name: String,
        /// GPU address.
        address: PciAddress,
        /// Companion functions that go with it.
        #[serde(default)]
        functions: Vec<PciAddress>,
        /// Memory in MiB, when known.
        #[serde(default, rename = "memoryMiB", skip_serializing_if = "Option::is_none")]
        memory_mib: Option<u64>,
    },
    /// A vGPU instance.
    #[serde(rename_all = "camelCase")]
    Vgpu {
        /// The device request this fulfils.
        request: String,
        /// Index within the request.
        index: u32,
        /// Parent (mdev parent or vendor-VFIO VF).
        parent: ParentId,
        /// The physical GPU, when the parent is on one.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        gpu: Option<PciAddress>,
        /// Framework.
        framework: VgpuFramework,
        /// Profile (type) ID.
        profile: VgpuTypeId,
        /// Profile name.
        profile_name: String,
        /// Framebuffer in MiB, when known.
        #[serde(
            default,
            rename = "framebufferMiB",
            skip_serializing_if = "Option::is_none"
        )]
        framebuffer_mib: Option<u64>,
        /// MIG slices of a MIG-backed profile.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        mig_slices: Option<u8>,
        /// Stable UUID (mdev instances use it as their name).
        uuid: MdevUuid,
    },
}

impl AllocatedDevice {
    /// The device request this fulfils.
    pub fn request(&self) -> &str {
        match self {
            AllocatedDevice::Gpu { request, .. } | AllocatedDevice::Vgpu { request, .. } => request,
        }
    }
}

/// A Machine's allocation on one node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Allocation {
    /// Machine name.
    pub machine: String,
    /// Node the Machine's devices are on (all of them).
    pub node: String,
    /// Pending or created.
    #[serde(default)]
    pub status: AllocationStatus,
    /// Devices, in request order.
    pub devices: Vec<AllocatedDevice>,
}

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

/// A fleet document before short-shape devices are completed from the topology.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct FleetDoc {
    #[serde(default)]
    nodes: Vec<NodeTopology>,
    #[serde(default)]
    allocations: Vec<AllocationDoc>,
    #[serde(default)]
    templates: BTreeMap<String, DeviceRequest>,
}

impl TryFrom<FleetDoc> for Fleet {
    type Error = String;

    fn try_from(doc: FleetDoc) -> Result<Self, String> {
        let mut allocations = Vec::with_capacity(doc.allocations.len());
        for a in doc.allocations {
            let mut devices: Vec<AllocatedDevice> = Vec::with_capacity(a.devices.len());
            for (i, d) in a.devices.into_iter().enumerate() {
                let device = match d {
                    DeviceDoc::Full(full) => full,
                    DeviceDoc::Short(short) => {
                        let node = doc.nodes.iter().find(|n| n.node == a.node);
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
        Ok(Fleet {
            nodes: doc.nodes,
            allocations,
            templates: doc.templates,
        })
    }
}

/// Completes a short-shape device from its node's topology.
fn complete(
    machine: &str,
    node_name: &str,
    node: Option<&NodeTopology>,
    i: usize,
    d: &ShortVgpu,
    before: &[AllocatedDevice],
) -> Result<AllocatedDevice, String> {
    let fail = |why: String| {
        format!(
            "allocations: Machine {machine:?}: device {i} (parent {}, profile {:?}): {why}",
            d.parent, d.profile
        )
    };
    let node = node.ok_or_else(|| {
        fail(format!(
            "node {node_name:?} is not in the fleet's nodes, so the device cannot be completed \
             (give it in the full shape with `kind`)"
        ))
    })?;
    let parents = &node.mediated_devices.parents;
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
    })
}
