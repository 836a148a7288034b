//! KubeVirt `permittedHostDevices` for the profiles and GPUs of one or more nodes.
//!
//! KubeVirt allows a host device to a VM only when the KubeVirt CR lists it:
//! - mdev vGPUs under `mediatedDevices`, matched by the type's `name` file (`mdevNameSelector`),
//! - PCI devices under `pciHostDevices`, matched by `VENDOR:DEVICE` (`pciVendorSelector`).
//!
//! NVIDIA vendor-VFIO vGPUs are VFs bound to `nvidia`; KubeVirt's virt-handler serves those whose
//! `nvidia/current_vgpu_type` is set (it skips PFs), so each vGPU type configured on at least one
//! VF gets one `pciHostDevices` entry named as NVIDIA writes it (`nvidia.com/L40S-24Q`), selected
//! by the VFs' own vendor and device ID, without `externalResourceProvider` (virt-handler itself
//! is the provider). The selector cannot tell two types on VFs of one device ID apart: that is a
//! warning. GPUs that use a vGPU framework are left out of whole-GPU passthrough, since their
//! selector would match the VFs too.
//!
//! KubeVirt also creates and removes mdev instances itself when its `mediatedDevicesConfiguration`
//! is used, and virt-handler removes instances it did not create. On nodes gpuslice manages, turn
//! that off with the `DisableMDEVConfiguration` feature gate ([`MDEV_GATE_NOTE`]).

use std::collections::{BTreeMap, BTreeSet};

use gpu_core::{Gpu, GpuState, NodeTopology, PciId, Vendor, VgpuFramework};
use serde::Serialize;

/// The default resource-name prefix of NVIDIA devices.
pub const DEFAULT_PREFIX: &str = "nvidia.com";

/// The comment printed above the patch when it permits mdev types.
pub const MDEV_GATE_NOTE: &str = "gpuslice manages the mdev instances on these nodes: enable \
KubeVirt's DisableMDEVConfiguration feature gate (spec.configuration.developerConfiguration.\
featureGates) so virt-handler neither creates nor removes them";

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
    /// The resource name VMs request (`nvidia.com/L40S-24Q`).
    pub resource_name: String,
    /// A device plugin other than KubeVirt's advertises the resource (never set by gpuslice:
    /// virt-handler serves whole GPUs and vendor-VFIO VFs itself).
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

/// The resource-name domain for a vendor; NVIDIA's is `prefix`.
fn domain(vendor: Vendor, prefix: &str) -> &str {
    match vendor {
        Vendor::Nvidia => prefix,
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

/// The resource name of a vGPU type: an mdev type by its whole `name` (`nvidia.com/NVIDIA_A2-4Q`,
/// as NVIDIA's KubeVirt device plugin names it), a vendor-VFIO type by its board name without the
/// `NVIDIA `/`GRID ` prefix (`nvidia.com/L40S-24Q`, as virt-handler and NVIDIA's guide name it).
pub fn vgpu_resource_name(
    framework: VgpuFramework,
    vendor: Vendor,
    profile_name: &str,
    prefix: &str,
) -> String {
    match framework {
        VgpuFramework::Mdev => resource_name(domain(vendor, prefix), profile_name),
        VgpuFramework::VendorVfio => resource_name(
            domain(vendor, prefix),
            gpu_core::nvidia::strip_prefix(profile_name),
        ),
    }
}

/// `VENDOR:DEVICE` in upper-case hex.
fn selector(vendor: PciId, device: PciId) -> String {
    format!(
        "{}:{}",
        vendor.to_string().to_uppercase(),
        device.to_string().to_uppercase()
    )
}

/// The resource name of a whole GPU passed through: its model, or its IDs when the model is
/// unknown.
pub fn gpu_resource_name(gpu: &Gpu, prefix: &str) -> String {
    let label = if gpu.model.trim().is_empty() {
        selector(gpu.vendor_id, gpu.device_id).replace(':', "_")
    } else {
        gpu.model.clone()
    };
    resource_name(domain(gpu.vendor, prefix), &label)
}

/// What to permit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KubevirtOptions {
    /// The resource-name prefix of NVIDIA devices (`nvidia.com`).
    pub resource_prefix: String,
    /// Only types with at least one instance. `None`: on for vendor-VFIO (virt-handler serves
    /// only VFs with a type set), off for mdev (KubeVirt matches any instance of an offered type).
    pub configured_only: Option<bool>,
}

impl Default for KubevirtOptions {
    fn default() -> Self {
        KubevirtOptions {
            resource_prefix: DEFAULT_PREFIX.to_owned(),
            configured_only: None,
        }
    }
}

/// The patch and what the operator should know about it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KubevirtExport {
    /// The patch for the KubeVirt CR.
    pub patch: KubevirtPatch,
    /// Selectors that do not tell devices apart, VF IDs that differ from the PF's, ...
    pub warnings: Vec<String>,
}

impl KubevirtExport {
    /// True when the patch permits mdev types (the feature-gate note applies).
    pub fn has_mdev(&self) -> bool {
        !self
            .patch
            .spec
            .configuration
            .permitted_host_devices
            .mediated_devices
            .is_empty()
    }

    /// The YAML document, with the feature-gate note and the warnings as comments on top.
    ///
    /// # Errors
    /// A serialization error.
    pub fn to_yaml(&self) -> crate::error::Result<String> {
        let mut out = String::from(
            "# KubeVirt CR patch (gpuslice export kubevirt): spec.configuration.permittedHostDevices\n",
        );
        if self.has_mdev() {
            out.push_str(&format!("# NOTE: {MDEV_GATE_NOTE}.\n"));
        }
        for w in &self.warnings {
            out.push_str(&format!("# WARNING: {w}\n"));
        }
        out.push_str(&super::yaml::to_string(&self.patch)?);
        Ok(out)
    }
}

/// A configured vendor-VFIO type: where its VFs are and what they report.
struct VfType {
    selector: String,
    vfs: usize,
}

/// Builds the patch for the GPUs and profiles of `nodes` (deduplicated across nodes).
pub fn export(nodes: &[NodeTopology], opts: &KubevirtOptions) -> KubevirtExport {
    let prefix = opts.resource_prefix.as_str();
    let mut pci: BTreeMap<String, PciHostDevice> = BTreeMap::new();
    let mut mdev: BTreeMap<String, MediatedHostDevice> = BTreeMap::new();
    let mut vf_types: BTreeMap<String, VfType> = BTreeMap::new();
    let mut warnings: BTreeSet<String> = BTreeSet::new();
    let vfio_configured_only = opts.configured_only.unwrap_or(true);
    let mdev_configured_only = opts.configured_only.unwrap_or(false);
    for node in nodes {
        for gpu in &node.gpus {
            if gpu.state == GpuState::Blocked || gpu.vgpu_framework.is_some() || gpu.boot_vga {
                continue;
            }
            let name = gpu_resource_name(gpu, prefix);
            pci.entry(name.clone()).or_insert(PciHostDevice {
                pci_vendor_selector: selector(gpu.vendor_id, gpu.device_id),
                resource_name: name,
                external_resource_provider: false,
            });
        }
        for parent in &node.mediated_devices.parents {
            let gpu = parent.gpu.and_then(|a| node.gpu_by_address(&a));
            let vendor = gpu.map_or(Vendor::Other, |g| g.vendor);
            let offered = parent
                .profiles
                .iter()
                .filter(|p| p.device_api == "vfio-pci")
                .map(|p| p.name.clone());
            let current = parent
                .instances
                .iter()
                .filter_map(|i| i.profile_name.clone());
            match parent.framework {
                VgpuFramework::Mdev => {
                    let names: Vec<String> = if mdev_configured_only {
                        current.collect()
                    } else {
                        offered.collect()
                    };
                    for n in names {
                        let name = vgpu_resource_name(parent.framework, vendor, &n, prefix);
                        mdev.entry(name.clone()).or_insert(MediatedHostDevice {
                            mdev_name_selector: n.trim().to_owned(),
                            resource_name: name,
                        });
                    }
                }
                VgpuFramework::VendorVfio => {
                    let Some(gpu) = gpu else { continue };
                    let vf_device = match gpu.sriov.as_ref().and_then(|s| s.vf_device_id) {
                        Some(id) => {
                            if id != gpu.device_id {
                                warnings.insert(format!(
                                    "node {}: the VFs of GPU {} ({}) report device ID {id}, their PF \
                                     {}; the selector uses the VFs' ID",
                                    node.node, gpu.name, gpu.address, gpu.device_id
                                ));
                            }
                            id
                        }
                        None => {
                            warnings.insert(format!(
                                "node {}: the VF device ID of GPU {} ({}) is not recorded; the \
                                 selector assumes the PF's ({})",
                                node.node, gpu.name, gpu.address, gpu.device_id
                            ));
                            gpu.device_id
                        }
                    };
                    let sel = selector(gpu.vendor_id, vf_device);
                    let configured: Vec<String> = current.collect();
                    let names: Vec<String> = if vfio_configured_only {
                        configured.clone()
                    } else {
                        offered.chain(configured.iter().cloned()).collect()
                    };
                    for n in names {
                        let name = vgpu_resource_name(parent.framework, vendor, &n, prefix);
                        pci.entry(name.clone()).or_insert(PciHostDevice {
                            pci_vendor_selector: sel.clone(),
                            resource_name: name.clone(),
                            external_resource_provider: false,
                        });
                    }
                    for n in configured {
                        let name = vgpu_resource_name(parent.framework, vendor, &n, prefix);
                        vf_types
                            .entry(name)
                            .or_insert(VfType {
                                selector: sel.clone(),
                                vfs: 0,
                            })
                            .vfs += 1;
                    }
                }
            }
        }
    }
    let mut by_selector: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for (name, t) in &vf_types {
        by_selector.entry(&t.selector).or_default().push(name);
    }
    for (sel, names) in by_selector.iter().filter(|(_, n)| n.len() > 1) {
        warnings.insert(format!(
            "{} share the selector {sel}: virt-handler cannot tell their VFs apart, so a VM asking \
             for one may get another; keep one vGPU type per device ID on a node pool",
            names.join(", ")
        ));
    }
    if vf_types.is_empty()
        && vfio_configured_only
        && nodes.iter().any(|n| {
            n.mediated_devices
                .parents
                .iter()
                .any(|p| p.framework == VgpuFramework::VendorVfio)
        })
    {
        warnings.insert(
            "no VF has a vGPU type set, so no vendor-VFIO vGPU is permitted; create the vGPUs \
             first (gpuslice vgpu create or vgpu apply), or pass --configured-only=false"
                .to_owned(),
        );
    }
    KubevirtExport {
        patch: KubevirtPatch {
            spec: KubevirtSpec {
                configuration: KubevirtConfiguration {
                    permitted_host_devices: PermittedHostDevices {
                        pci_host_devices: pci.into_values().collect(),
                        mediated_devices: mdev.into_values().collect(),
                    },
                },
            },
        },
        warnings: warnings.into_iter().collect(),
    }
}
