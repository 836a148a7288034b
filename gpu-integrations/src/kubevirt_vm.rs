//! A KubeVirt `VirtualMachine` fragment for one allocation.
//!
//! KubeVirt gives a VM a host device when its domain asks for a resource the KubeVirt CR permits:
//! vGPUs under `spec.template.spec.domain.devices.gpus`, whole GPUs under `hostDevices`, each as
//! `{name, deviceName}` where `deviceName` is the resource name. The names here are the ones
//! [`super::kubevirt::export`] permits, so the two outputs fit together. The guest's NVIDIA vGPU
//! licence comes from a client configuration token written by cloud-init
//! ([`super::cloud_init`]), attached as a `cloudInitNoCloud` volume with its disk.
//!
//! The allocation must be for the node it is checked against, and each device must still be what
//! the allocation says (same GPU, same parent in the same framework): an allocation made for
//! another node or read against the wrong inventory is an error, never a guess. That check is
//! [`super::handoff::check_allocation`], the one every export shares.

use crate::error::{Result, fail};
use gpu_core::{AllocatedDevice, Allocation, NodeTopology, Vendor};
use serde::Serialize;

use super::cloud_init::CloudConfig;
use super::kubevirt::{gpu_resource_name, vgpu_resource_name};

/// The name of the cloud-init volume and its disk.
pub const LICENSING_VOLUME: &str = "gpuslice-licensing";

/// `kind: VirtualMachine`, only the fields gpuslice fills.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct VirtualMachine {
    /// `kubevirt.io/v1`.
    pub api_version: String,
    /// `VirtualMachine`.
    pub kind: String,
    /// `metadata`.
    pub metadata: Metadata,
    /// `spec`.
    pub spec: VmSpec,
}

/// `metadata`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Metadata {
    /// `metadata.name`.
    pub name: String,
}

/// `spec`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct VmSpec {
    /// `spec.template`.
    pub template: Template,
}

/// `spec.template`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Template {
    /// `spec.template.spec`.
    pub spec: VmiSpec,
}

/// `spec.template.spec` (a VirtualMachineInstanceSpec).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct VmiSpec {
    /// Keeps the VM on the node the devices were allocated on.
    pub node_selector: std::collections::BTreeMap<String, String>,
    /// `domain`.
    pub domain: Domain,
    /// `volumes` (the licensing cloud-init, when a token is given).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub volumes: Vec<Volume>,
}

/// `spec.template.spec.domain`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Domain {
    /// `domain.devices`.
    pub devices: Devices,
}

/// `spec.template.spec.domain.devices`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Devices {
    /// vGPUs (mdev and vendor-VFIO).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub gpus: Vec<DeviceRef>,
    /// Whole GPUs passed through.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub host_devices: Vec<DeviceRef>,
    /// The licensing disk, when a token is given.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub disks: Vec<Disk>,
}

/// One `gpus` or `hostDevices` entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DeviceRef {
    /// The device's name in the VM (a DNS label).
    pub name: String,
    /// The resource name the KubeVirt CR permits.
    pub device_name: String,
}

/// One `disks` entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Disk {
    /// Matches a volume's name.
    pub name: String,
    /// `disk: {bus: virtio}`.
    pub disk: DiskTarget,
}

/// `disks[].disk`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DiskTarget {
    /// The bus (`virtio`).
    pub bus: String,
}

/// One `volumes` entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Volume {
    /// Matches a disk's name.
    pub name: String,
    /// The cloud-init NoCloud source.
    pub cloud_init_no_cloud: CloudInitNoCloud,
}

/// `volumes[].cloudInitNoCloud`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CloudInitNoCloud {
    /// The `#cloud-config` document.
    pub user_data: String,
}

/// A DNS label from a request name and index: lower-case `[a-z0-9-]`, at most 63 characters.
fn device_label(request: &str, index: u32) -> String {
    let mut s: String = request
        .trim()
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '-'
            }
        })
        .collect();
    s = s.trim_matches('-').to_owned();
    if s.is_empty() {
        s = "gpu".to_owned();
    }
    let suffix = format!("-{index}");
    s.truncate(63 - suffix.len());
    format!("{}{suffix}", s.trim_end_matches('-'))
}

/// A Kubernetes object name (RFC 1123 subdomain) for the VM.
fn object_name(name: &str) -> Result<String> {
    let ok = !name.is_empty()
        && name.len() <= 253
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'-' | b'.'))
        && name
            .bytes()
            .next()
            .is_some_and(|b| b.is_ascii_alphanumeric())
        && name
            .bytes()
            .last()
            .is_some_and(|b| b.is_ascii_alphanumeric());
    if !ok {
        fail!(
            Invalid, name;
            "{name:?} is not a Kubernetes object name (lower-case letters, digits, '-' and '.'; \
             pass --name)"
        );
    }
    Ok(name.to_owned())
}

/// Builds the VirtualMachine fragment of `allocation` on `node`.
///
/// # Errors
/// When the allocation is for another node, names a GPU or parent `node` does not have, or a
/// parent in another framework than `node` uses; when the name is not a Kubernetes object name.
pub fn virtual_machine(
    allocation: &Allocation,
    node: &NodeTopology,
    name: Option<&str>,
    prefix: &str,
    licensing: Option<&CloudConfig>,
) -> Result<VirtualMachine> {
    // The one hand-off check every export shares.
    super::handoff::check_allocation(allocation, node)?;
    let name = object_name(name.unwrap_or(&allocation.machine))?;
    let mut gpus = Vec::new();
    let mut host_devices = Vec::new();
    let mut whole_index: std::collections::BTreeMap<&str, u32> = Default::default();
    for d in &allocation.devices {
        match d {
            AllocatedDevice::Gpu {
                request, address, ..
            } => {
                let gpu = node.gpu_by_address(address).ok_or_else(|| {
                    crate::error::error!(NotFound, format!("request {request}");
                        "request {request}: GPU {address} is not on node {}",
                        node.node
                    )
                })?;
                let i = whole_index.entry(request.as_str()).or_insert(0);
                host_devices.push(DeviceRef {
                    name: device_label(request, *i),
                    device_name: gpu_resource_name(gpu, prefix),
                });
                *i += 1;
            }
            AllocatedDevice::Vgpu {
                request,
                index,
                parent,
                framework,
                profile_name,
                ..
            } => {
                let p = node
                    .mediated_devices
                    .parents
                    .iter()
                    .find(|p| &p.id == parent)
                    .ok_or_else(|| {
                        crate::error::error!(NotFound, format!("request {request}");
                            "request {request}: vGPU parent {parent} is not on node {}",
                            node.node
                        )
                    })?;
                let vendor = p
                    .gpu
                    .and_then(|g| node.gpu_by_address(&g))
                    .map_or(Vendor::Other, |g| g.vendor);
                gpus.push(DeviceRef {
                    name: device_label(request, *index),
                    device_name: vgpu_resource_name(*framework, vendor, profile_name, prefix),
                });
            }
        }
    }
    let (disks, volumes) = match licensing {
        Some(config) => (
            vec![Disk {
                name: LICENSING_VOLUME.to_owned(),
                disk: DiskTarget {
                    bus: "virtio".to_owned(),
                },
            }],
            vec![Volume {
                name: LICENSING_VOLUME.to_owned(),
                cloud_init_no_cloud: CloudInitNoCloud {
                    user_data: super::cloud_init::to_yaml(config)?,
                },
            }],
        ),
        None => (vec![], vec![]),
    };
    let mut node_selector = std::collections::BTreeMap::new();
    node_selector.insert("kubernetes.io/hostname".to_owned(), node.node.clone());
    Ok(VirtualMachine {
        api_version: "kubevirt.io/v1".to_owned(),
        kind: "VirtualMachine".to_owned(),
        metadata: Metadata { name },
        spec: VmSpec {
            template: Template {
                spec: VmiSpec {
                    node_selector,
                    domain: Domain {
                        devices: Devices {
                            gpus,
                            host_devices,
                            disks,
                        },
                    },
                    volumes,
                },
            },
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_labels_are_dns_labels() {
        assert_eq!(device_label("Compute GPU", 0), "compute-gpu-0");
        assert_eq!(device_label("__", 2), "gpu-2");
        assert!(device_label(&"x".repeat(100), 7).len() <= 63);
    }

    #[test]
    fn object_names_are_checked() {
        assert!(object_name("vm-1").is_ok());
        assert!(object_name("VM_1").is_err());
        assert!(object_name("").is_err());
    }
}
