//! The device nodes a VM's process must be allowed to open for the devices it takes, for a
//! device cgroup or a container's device list (`/dev/vfio/vfio`, `/dev/vfio/<group>`,
//! `/dev/iommu`, `/dev/vfio/devices/vfioN`). Read from the host the devices are on; the
//! actuation layer (`gpu_sysfs::actuate::handoff`) knows where each node comes from.

use gpu_sysfs::Host;
use gpu_sysfs::actuate::handoff;
use serde::Serialize;

use super::handoff::VmDevice;
use crate::error::{Result, error};

/// One device's nodes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DeviceNodes {
    /// The device (`0000:26:00.4` or an mdev UUID).
    pub device: String,
    /// Its nodes; empty when it has no IOMMU group on this host (no VM can take it then).
    pub device_nodes: Vec<String>,
}

/// The nodes of each device, looked up on `host`.
pub fn for_devices(host: &dyn Host, devices: &[VmDevice]) -> Vec<DeviceNodes> {
    devices
        .iter()
        .map(|d| match d {
            VmDevice::Mdev { uuid } => DeviceNodes {
                device: uuid.to_string(),
                device_nodes: handoff::mdev_device_nodes(host, uuid),
            },
            VmDevice::Pci { address } => DeviceNodes {
                device: address.to_string(),
                device_nodes: handoff::pci_device_nodes(host, address),
            },
        })
        .collect()
}

/// Every node once, in first-seen order (`/dev/vfio/vfio` first).
pub fn union(per_device: &[DeviceNodes]) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for n in per_device.iter().flat_map(|d| d.device_nodes.iter()) {
        if !out.contains(n) {
            out.push(n.clone());
        }
    }
    out
}

/// The nodes of each device, looked up on `host`, when every device has some.
///
/// # Errors
/// [`crate::IntegrationError::NotFound`] naming the devices without an IOMMU group on `host` (no VM
/// can open them).
pub fn require_for_devices(host: &dyn Host, devices: &[VmDevice]) -> Result<Vec<DeviceNodes>> {
    let per_device = for_devices(host, devices);
    let missing: Vec<&str> = per_device
        .iter()
        .filter(|d| d.device_nodes.is_empty())
        .map(|d| d.device.as_str())
        .collect();
    if missing.is_empty() {
        return Ok(per_device);
    }
    let one = missing.len() == 1;
    Err(error!(NotFound, missing.join(", ");
        "{} {} no IOMMU group on this host, so no VM can open {}; is it on this host, and is \
         the IOMMU on (gpuslice doctor)?",
        missing.join(", "),
        if one { "has" } else { "have" },
        if one { "it" } else { "them" }
    ))
}
