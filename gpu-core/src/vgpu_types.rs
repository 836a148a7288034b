//! Each vGPU parent's (or vendor-VFIO VF's) types with the instances still free, as
//! `mdevctl types` lists them: what `gpuslice vgpu types` prints.

use serde::Serialize;

pub use crate::mig_types::{MigBackedType, MigBackedTypes};

use crate::address::PciAddress;
use crate::ids::{ParentId, VgpuTypeId};
use crate::topology::{NodeTopology, VgpuFramework};

/// One parent and its types.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ParentTypes {
    /// The parent: an mdev parent, or a vendor-VFIO VF.
    pub parent: ParentId,
    /// Its physical GPU, by per-node name (`nvidia0`) when the node names it, else address.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gpu: Option<String>,
    /// Its framework.
    pub framework: VgpuFramework,
    /// Its types, in the order the parent lists them.
    pub types: Vec<TypeInfo>,
}

/// One type of a parent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TypeInfo {
    /// Type ID (`nvidia-746`, `1155`).
    pub id: VgpuTypeId,
    /// Name (`NVIDIA A2-4Q`).
    pub name: String,
    /// Instances that can truly still be created here: the driver's count, capped by the GPU's
    /// pool.
    pub available_instances: u32,
    /// What the driver itself reports, when it differs from `availableInstances` (every free
    /// VF of an SR-IOV GPU may say 1 while the pool holds fewer).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub driver_reports: Option<u32>,
    /// `device_api` (`vfio-pci`).
    pub device_api: String,
    /// Framebuffer per instance, in MiB, when known.
    #[serde(rename = "framebufferMiB", skip_serializing_if = "Option::is_none")]
    pub framebuffer_mib: Option<u64>,
    /// The driver's description, when it gives one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// A MIG-backed type the VF does not list yet: its GPU instance is made on request.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub needs_gpu_instance: bool,
}

/// The types of every parent of `topo` (only `parent` when given), in the topology's order.
pub fn vgpu_types(topo: &NodeTopology, parent: Option<&ParentId>) -> Vec<ParentTypes> {
    let gpu_name = |a: PciAddress| {
        topo.gpus
            .iter()
            .find(|g| g.address == a)
            .map_or_else(|| a.to_string(), |g| g.name.clone())
    };
    topo.mediated_devices
        .parents
        .iter()
        .filter(|p| parent.is_none_or(|want| *want == p.id))
        .map(|p| ParentTypes {
            parent: p.id.clone(),
            gpu: p.gpu.map(gpu_name),
            framework: p.framework,
            types: p
                .profiles
                .iter()
                .map(|t| TypeInfo {
                    id: t.id.clone(),
                    name: t.name.clone(),
                    available_instances: t.available_instances,
                    driver_reports: t.reported_instances.filter(|r| *r != t.available_instances),
                    device_api: t.device_api.clone(),
                    framebuffer_mib: t.framebuffer_mib,
                    description: t.description.clone(),
                    needs_gpu_instance: false,
                })
                .chain(needing_instance(topo, p))
                .collect(),
        })
        .collect()
}

/// For a free vendor-VFIO VF: the MIG-backed types its GPU supports that it does not list now
/// (their GPU instance does not exist yet), with no instance available until it is made.
fn needing_instance<'t>(
    topo: &'t NodeTopology,
    p: &'t crate::topology::Parent,
) -> impl Iterator<Item = TypeInfo> + 't {
    let free = p.framework == VgpuFramework::VendorVfio && p.instances.is_empty();
    let gpu = p
        .gpu
        .filter(|_| free)
        .and_then(|a| topo.gpus.iter().find(|g| g.address == a));
    gpu.and_then(|g| g.mig_backed_types.as_ref())
        .into_iter()
        .flat_map(|m| m.types.iter())
        .filter(move |t| !p.profiles.iter().any(|x| x.name == t.name))
        .map(|t| TypeInfo {
            id: t.id.clone(),
            name: t.name.clone(),
            available_instances: 0,
            driver_reports: None,
            device_api: "vfio-pci".to_owned(),
            framebuffer_mib: t.framebuffer_mib,
            description: None,
            needs_gpu_instance: true,
        })
}
