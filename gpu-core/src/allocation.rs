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
        /// The start slot of the GPU instance a MIG-backed vGPU takes, when the scheduler chose
        /// it (the node makes the instance there); `None`: the driver picks it.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        gpu_instance_start: Option<u8>,
        /// The placement ID of a vGPU on a GPU in mixed-size mode, when the scheduler chose it.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        placement_id: Option<u32>,
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

#[cfg(test)]
mod tests {
    use super::*;

    const MIG_VGPU: &str = r#"{"kind":"vgpu","request":"gpu","index":0,"parent":"0000:41:00.4",
        "gpu":"0000:41:00.0","framework":"vendor-vfio","profile":"1201","profileName":"NVIDIA H200X-3-71C",
        "framebufferMiB":72704,"migSlices":3,"uuid":"9a1c2f1e-6e4e-5b8c-9d4f-0a1b2c3d4e5f","gpuInstanceStart":4,"placementId":2}"#;

    /// A vGPU's `(gpuInstanceStart, placementId)`.
    fn slots_of(d: &AllocatedDevice) -> (Option<u8>, Option<u32>) {
        match d {
            AllocatedDevice::Vgpu {
                gpu_instance_start,
                placement_id,
                ..
            } => (*gpu_instance_start, *placement_id),
            AllocatedDevice::Gpu { .. } => panic!("a vgpu: {d:?}"),
        }
    }

    #[test]
    fn a_vgpu_keeps_its_gpu_instance_start_and_placement_id_through_json() {
        let d: AllocatedDevice = serde_json::from_str(MIG_VGPU).unwrap();
        assert_eq!(slots_of(&d), (Some(4), Some(2)));
        let text = serde_json::to_string(&d).unwrap();
        assert!(text.contains(r#""gpuInstanceStart":4"#), "{text}");
        assert!(text.contains(r#""placementId":2"#), "{text}");
        assert_eq!(serde_json::from_str::<AllocatedDevice>(&text).unwrap(), d);
    }

    #[test]
    fn a_vgpu_written_before_slots_reads_without_them_and_writes_none() {
        let (before, _) = MIG_VGPU.split_once(r#","gpuInstanceStart""#).unwrap();
        let old = format!("{before}}}");
        let d: AllocatedDevice = serde_json::from_str(&old).unwrap();
        assert_eq!(slots_of(&d), (None, None));
        let text = serde_json::to_string(&d).unwrap();
        assert!(!text.contains("gpuInstanceStart") && !text.contains("placementId"));
    }
}
