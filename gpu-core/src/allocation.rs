//! Where a Machine's devices went.

use serde::{Deserialize, Serialize};

use crate::address::PciAddress;
use crate::ids::{MdevUuid, ParentId, VgpuTypeId};
use crate::topology::VgpuFramework;

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
