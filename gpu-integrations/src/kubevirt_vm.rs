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
use super::dra::claims::{profile_config, profile_selector};
use super::dra::model::{
    API_VERSION, DeviceClaim, DeviceRequest, DeviceSelector, ExactDeviceRequest, ResourceClaimSpec,
};
use super::dra::version::PCI_BUS_ID;
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
    /// `metadata.annotations`: what the guest needs on an NVSwitch host
    /// ([`super::dra::partition::guest_annotations`]).
    #[serde(skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub annotations: std::collections::BTreeMap<String, String>,
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
    /// The DRA claims the VM's devices come from (DRA form).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub resource_claims: Vec<PodResourceClaim>,
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

/// One `gpus` or `hostDevices` entry: a device-plugin resource (`deviceName`) or, in the DRA
/// form, a request of a claim (`claimName`, `requestName`: KubeVirt's inline `ClaimRequest`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DeviceRef {
    /// The device's name in the VM (a DNS label).
    pub name: String,
    /// The resource name the KubeVirt CR permits (device-plugin form).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub device_name: Option<String>,
    /// The entry of `spec.template.spec.resourceClaims` holding the device (DRA form).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub claim_name: Option<String>,
    /// The request of that claim the device answers (DRA form).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub request_name: Option<String>,
}

/// One `spec.template.spec.resourceClaims` entry (a Kubernetes `PodResourceClaim`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PodResourceClaim {
    /// The name `claimName` refers to.
    pub name: String,
    /// The ResourceClaimTemplate a claim is made from for the VM.
    pub resource_claim_template_name: String,
}

/// A `resource.k8s.io/v1` ResourceClaimTemplate.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ResourceClaimTemplate {
    /// `resource.k8s.io/v1`.
    pub api_version: String,
    /// `ResourceClaimTemplate`.
    pub kind: String,
    /// `metadata`.
    pub metadata: Metadata,
    /// `spec`: the claim made for each VM.
    pub spec: ClaimTemplateSpec,
}

/// `ResourceClaimTemplate.spec`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ClaimTemplateSpec {
    /// The claim's spec.
    pub spec: ResourceClaimSpec,
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

/// One device of an allocation as the VM names it.
enum Named<'a> {
    /// A whole GPU.
    Gpu(&'a gpu_core::Gpu),
    /// A vGPU: its parent's GPU (when known), framework, vendor and profile.
    Vgpu {
        gpu: Option<gpu_core::PciAddress>,
        framework: gpu_core::VgpuFramework,
        vendor: Vendor,
        profile: &'a str,
    },
}

/// The devices of `allocation` on `node`, each with its label in the VM (a DNS label, unique).
fn named_devices<'a>(
    allocation: &'a Allocation,
    node: &'a NodeTopology,
) -> Result<Vec<(String, Named<'a>)>> {
    let mut out = Vec::new();
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
                out.push((device_label(request, *i), Named::Gpu(gpu)));
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
                out.push((
                    device_label(request, *index),
                    Named::Vgpu {
                        gpu: p.gpu,
                        framework: *framework,
                        vendor,
                        profile: profile_name,
                    },
                ));
            }
        }
    }
    Ok(out)
}

/// The VirtualMachine around `gpus` and `host_devices`.
fn machine(
    name: String,
    allocation: &Allocation,
    node: &NodeTopology,
    devices: (Vec<DeviceRef>, Vec<DeviceRef>),
    resource_claims: Vec<PodResourceClaim>,
    licensing: Option<&CloudConfig>,
) -> Result<VirtualMachine> {
    let (gpus, host_devices) = devices;
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
        metadata: Metadata {
            name,
            annotations: super::dra::partition::guest_annotations(node, allocation),
        },
        spec: VmSpec {
            template: Template {
                spec: VmiSpec {
                    node_selector,
                    resource_claims,
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
    for (label, d) in named_devices(allocation, node)? {
        let (list, device_name) = match d {
            Named::Gpu(gpu) => (&mut host_devices, gpu_resource_name(gpu, prefix)),
            Named::Vgpu {
                framework,
                vendor,
                profile,
                ..
            } => (
                &mut gpus,
                vgpu_resource_name(framework, vendor, profile, prefix),
            ),
        };
        list.push(DeviceRef {
            name: label,
            device_name: Some(device_name),
            claim_name: None,
            request_name: None,
        });
    }
    machine(
        name,
        allocation,
        node,
        (gpus, host_devices),
        vec![],
        licensing,
    )
}

/// The name of the VM's claim in `spec.template.spec.resourceClaims` (DRA form).
pub const DRA_CLAIM: &str = "gpus";

/// The DRA form of the VM: its devices come from one claim made from a ResourceClaimTemplate
/// (`<name>-gpus`), one request per device, named as the device is in the VM. A whole GPU is a
/// request of DeviceClass `gpu` for that GPU (its `resource.kubernetes.io/pciBusID`); a vGPU a
/// request of DeviceClass `vgpu` offering its profile on its GPU (`gpuPciBusID`), with the
/// profile in the claim's opaque configuration for the driver (as `gpuslice dra prepare`
/// reads it). The VM names each device by `claimName` and `requestName` (KubeVirt 1.9,
/// feature gates `GPUsWithDRA` and `HostDevicesWithDRA`).
///
/// # Errors
/// As [`virtual_machine`].
pub fn dra_virtual_machine(
    allocation: &Allocation,
    node: &NodeTopology,
    name: Option<&str>,
    driver: &str,
    licensing: Option<&CloudConfig>,
) -> Result<(VirtualMachine, ResourceClaimTemplate)> {
    super::handoff::check_allocation(allocation, node)?;
    let name = object_name(name.unwrap_or(&allocation.machine))?;
    let template_name = object_name(&format!("{name}-gpus"))?;
    let mut gpus = Vec::new();
    let mut host_devices = Vec::new();
    let mut requests = Vec::new();
    let mut config = Vec::new();
    for (label, d) in named_devices(allocation, node)? {
        let (list, class, selectors) = match d {
            Named::Gpu(gpu) => {
                let (domain, attr) = PCI_BUS_ID.split_once('/').unwrap_or(("", PCI_BUS_ID));
                (
                    &mut host_devices,
                    "gpu",
                    vec![DeviceSelector::cel(format!(
                        "device.attributes[{domain:?}].{attr} == {:?}",
                        gpu.address.to_string()
                    ))],
                )
            }
            Named::Vgpu { gpu, profile, .. } => {
                let profile = gpu_core::nvidia::strip_prefix(profile);
                let mut selectors = vec![profile_selector(driver, profile)];
                if let Some(g) = gpu {
                    selectors.push(DeviceSelector::cel(format!(
                        "device.attributes[{driver:?}].gpuPciBusID == {:?}",
                        g.to_string()
                    )));
                }
                config.push(profile_config(driver, &[label.as_str()], profile));
                (&mut gpus, "vgpu", selectors)
            }
        };
        requests.push(DeviceRequest {
            name: label.clone(),
            exactly: Some(ExactDeviceRequest {
                device_class_name: class.to_owned(),
                selectors,
                allocation_mode: None,
                count: None,
            }),
            first_available: vec![],
        });
        list.push(DeviceRef {
            name: label.clone(),
            device_name: None,
            claim_name: Some(DRA_CLAIM.to_owned()),
            request_name: Some(label),
        });
    }
    if requests.is_empty() {
        fail!(Invalid, "allocation"; "Machine {} has no devices to claim", allocation.machine);
    }
    let claims = vec![PodResourceClaim {
        name: DRA_CLAIM.to_owned(),
        resource_claim_template_name: template_name.clone(),
    }];
    let vm = machine(
        name,
        allocation,
        node,
        (gpus, host_devices),
        claims,
        licensing,
    )?;
    let template = ResourceClaimTemplate {
        api_version: API_VERSION.to_owned(),
        kind: "ResourceClaimTemplate".to_owned(),
        metadata: Metadata {
            name: template_name,
            annotations: std::collections::BTreeMap::new(),
        },
        spec: ClaimTemplateSpec {
            spec: ResourceClaimSpec {
                devices: DeviceClaim {
                    requests,
                    constraints: vec![],
                    config,
                },
            },
        },
    };
    Ok((vm, template))
}

/// `export vm`'s document of `vm` for `allocation`: YAML under a comment saying what it is, or
/// with `json` the VM alone.
///
/// # Errors
/// When the VM cannot be represented.
pub fn vm_document(allocation: &Allocation, vm: &VirtualMachine, json: bool) -> Result<String> {
    if json {
        return crate::yaml::json(vm);
    }
    Ok(format!(
        "# KubeVirt VirtualMachine fragment for Machine {} on node {} (gpuslice export vm):\n\
         # merge it into your VirtualMachine; the resource names are those `gpuslice export\n\
         # kubevirt` permits.\n{}",
        allocation.machine,
        allocation.node,
        crate::yaml::to_string(vm)?
    ))
}

/// `export vm --dra`'s document: the claim template and the VM as a YAML stream under a comment
/// saying what they are, or with `json` a JSON `List` of them.
///
/// # Errors
/// When an object cannot be represented.
pub fn dra_document(
    allocation: &Allocation,
    vm: &VirtualMachine,
    template: &ResourceClaimTemplate,
    json: bool,
) -> Result<String> {
    if json {
        let render = |e| crate::IntegrationError::render("JSON", e);
        let template = serde_json::to_value(template).map_err(render)?;
        let vm = serde_json::to_value(vm).map_err(render)?;
        let list = serde_json::json!({"apiVersion": "v1", "kind": "List", "items": [template, vm]});
        return crate::yaml::json(&list);
    }
    Ok(format!(
        "# A ResourceClaimTemplate and a KubeVirt VirtualMachine for Machine {} on node {}\n\
         # (gpuslice export vm --dra): the VM takes its devices from DRA claims (KubeVirt 1.9,\n\
         # feature gates GPUsWithDRA and HostDevicesWithDRA); merge the VM into yours.\n\
         ---\n{}---\n{}",
        allocation.machine,
        allocation.node,
        crate::yaml::to_string(template)?,
        crate::yaml::to_string(vm)?
    ))
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
