//! KubeVirt `permittedHostDevices` for the profiles and GPUs of one or more nodes.
//!
//! KubeVirt allows a host device to a VM only when the KubeVirt CR lists it:
//! - mdev vGPUs under `mediatedDevices`, matched by the type's `name` file (`mdevNameSelector`),
//! - PCI devices under `pciHostDevices`, matched by `VENDOR:DEVICE` (`pciVendorSelector`).
//!
//! NVIDIA vendor-VFIO VFs all carry the PF's device ID whatever vGPU type they hold, so a vendor
//! selector alone cannot tell an L40S-24Q VF from an L40S-48Q one. Each profile therefore gets its
//! own resource name with `externalResourceProvider: true`: a device plugin (NVIDIA's KubeVirt
//! plugin) advertises the VFs per type, and KubeVirt only checks the selector. GPUs that use a vGPU
//! framework are left out of whole-GPU passthrough, since their selector would match the VFs too.

use std::collections::BTreeMap;

use gpu_core::{GpuState, NodeTopology, Vendor, VgpuFramework};
use serde::Serialize;

/// The patch for the KubeVirt CR: `spec.configuration.permittedHostDevices`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct KubevirtPatch {
    /// `spec`.
    pub spec: KubevirtSpec,
}

/// `spec` of the KubeVirt CR.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct KubevirtSpec {
    /// `configuration`.
    pub configuration: KubevirtConfiguration,
}

/// `spec.configuration`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct KubevirtConfiguration {
    /// `permittedHostDevices`.
    pub permitted_host_devices: PermittedHostDevices,
}

/// The host devices KubeVirt may give to VMs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct PermittedHostDevices {
    /// PCI devices (whole GPUs, vendor-VFIO VFs).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub pci_host_devices: Vec<PciHostDevice>,
    /// mdev types.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub mediated_devices: Vec<MediatedHostDevice>,
}

/// One `pciHostDevices` entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PciHostDevice {
    /// `VENDOR:DEVICE` in upper-case hex (`10DE:26B9`).
    pub pci_vendor_selector: String,
    /// The resource name VMs request (`nvidia.com/NVIDIA_L40S-24Q`).
    pub resource_name: String,
    /// A device plugin other than KubeVirt's advertises the resource.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub external_resource_provider: bool,
}

/// One `mediatedDevices` entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct MediatedHostDevice {
    /// The mdev type's `name` (`NVIDIA A2-4Q`).
    pub mdev_name_selector: String,
    /// The resource name VMs request (`nvidia.com/NVIDIA_A2-4Q`).
    pub resource_name: String,
}

/// The resource-name domain for a vendor.
fn domain(vendor: Vendor) -> &'static str {
    match vendor {
        Vendor::Nvidia => "nvidia.com",
        Vendor::Amd => "amd.com",
        Vendor::Intel => "intel.com",
        _ => "gpuslice.dev",
    }
}

/// A resource name: `<domain>/<name>` with every character other than `[A-Za-z0-9._-]` turned
/// into `_` (KubeVirt's device plugins do the same with spaces).
pub fn resource_name(domain: &str, name: &str) -> String {
    let cleaned: String = name
        .trim()
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
                c
            } else {
                '_'
            }
        })
        .collect();
    format!("{domain}/{cleaned}")
}

/// Builds the patch for the GPUs and profiles of `nodes` (deduplicated across nodes).
pub fn permitted_host_devices(nodes: &[NodeTopology]) -> KubevirtPatch {
    let mut pci: BTreeMap<String, PciHostDevice> = BTreeMap::new();
    let mut mdev: BTreeMap<String, MediatedHostDevice> = BTreeMap::new();
    for node in nodes {
        for gpu in &node.gpus {
            if gpu.state == GpuState::Blocked || gpu.vgpu_framework.is_some() || gpu.boot_vga {
                continue;
            }
            let selector = format!(
                "{}:{}",
                gpu.vendor_id.to_string().to_uppercase(),
                gpu.device_id.to_string().to_uppercase()
            );
            let label = if gpu.model.trim().is_empty() {
                selector.replace(':', "_")
            } else {
                gpu.model.clone()
            };
            let name = resource_name(domain(gpu.vendor), &label);
            pci.entry(name.clone()).or_insert(PciHostDevice {
                pci_vendor_selector: selector,
                resource_name: name,
                external_resource_provider: false,
            });
        }
        for parent in &node.mediated_devices.parents {
            let gpu = parent.gpu.and_then(|a| node.gpu_by_address(&a));
            let vendor = gpu.map_or(Vendor::Other, |g| g.vendor);
            let profiles = parent
                .profiles
                .iter()
                .filter(|p| p.device_api == "vfio-pci");
            match parent.framework {
                VgpuFramework::Mdev => {
                    for p in profiles {
                        let name = resource_name(domain(vendor), &p.name);
                        mdev.entry(name.clone()).or_insert(MediatedHostDevice {
                            mdev_name_selector: p.name.trim().to_owned(),
                            resource_name: name,
                        });
                    }
                }
                VgpuFramework::VendorVfio => {
                    let Some(gpu) = gpu else { continue };
                    let selector = format!(
                        "{}:{}",
                        gpu.vendor_id.to_string().to_uppercase(),
                        gpu.device_id.to_string().to_uppercase()
                    );
                    // The VF's current type counts as well as the ones it can still take.
                    let current = parent
                        .instances
                        .iter()
                        .filter_map(|i| i.profile_name.clone());
                    let names: Vec<String> =
                        profiles.map(|p| p.name.clone()).chain(current).collect();
                    for n in names {
                        let name = resource_name(domain(vendor), &n);
                        pci.entry(name.clone()).or_insert(PciHostDevice {
                            pci_vendor_selector: selector.clone(),
                            resource_name: name,
                            external_resource_provider: true,
                        });
                    }
                }
            }
        }
    }
    KubevirtPatch {
        spec: KubevirtSpec {
            configuration: KubevirtConfiguration {
                permitted_host_devices: PermittedHostDevices {
                    pci_host_devices: pci.into_values().collect(),
                    mediated_devices: mdev.into_values().collect(),
                },
            },
        },
    }
}
