//! NVSwitch partitions in DRA: the attributes that name each whole GPU's partition of every size
//! (so a claim's `matchAttribute` gets one partition's GPUs), and the check that a claim's whole
//! GPUs on an NVSwitch node are exactly one partition, made before anything is written.
//!
//! The attribute names are those of NVIDIA's DRA driver (kubernetes-sigs/dra-driver-nvidia-gpu,
//! gate `FabricManagerPartitioning`): `gpuModuleID` (the GPU's module ID, an int) and
//! `partition1`, `partition2`, `partition4`, `partition8` (the ID of the partition of that many
//! GPUs holding the GPU, an int), in the driver's own domain. A claim written for their driver
//! needs only its domain changed.

use std::collections::BTreeMap;

use gpu_core::fabric::SetRefusal;
use gpu_core::{Fabric, Gpu, NodeTopology, Partition, PciAddress};

use super::model::DeviceAttribute;
use crate::error::{Result, fail};

/// The attribute of a GPU's module ID.
pub const GPU_MODULE_ID: &str = "gpuModuleID";

/// The attribute naming the partition of `size` GPUs holding a GPU (`partition4`).
pub fn partition_attribute(size: usize) -> String {
    format!("partition{size}")
}

/// The node's fabric when Fabric Manager was reached and lists partitions.
fn listed(node: &NodeTopology) -> Option<&Fabric> {
    node.fabric
        .as_ref()
        .filter(|f| f.fabric_manager.is_reachable() && !f.partitions.is_empty())
}

/// `gpuModuleID` and `partitionN` of `gpu`, for every partition size the node's Fabric Manager
/// lists; none on a node without a fabric, or whose Fabric Manager could not be reached.
pub fn fabric_attributes(node: &NodeTopology, gpu: &Gpu) -> BTreeMap<String, DeviceAttribute> {
    let mut a = BTreeMap::new();
    let Some(f) = listed(node) else {
        return a;
    };
    let module = f.partitions.iter().find_map(|p| {
        let at = p.addresses.iter().position(|x| *x == gpu.address)?;
        p.module_ids.get(at).copied()
    });
    if let Some(m) = module {
        a.insert(GPU_MODULE_ID.to_owned(), DeviceAttribute::Int(i64::from(m)));
    }
    for size in f.sizes() {
        if let Some(p) = f.partition_of_size(&gpu.address, size) {
            a.insert(
                partition_attribute(size),
                DeviceAttribute::Int(i64::from(p.id)),
            );
        }
    }
    a
}

/// The partition a claim's whole GPUs (`gpus`, the addresses its plan binds) take on this node:
/// `None` when the node's fabric does not constrain them (no fabric, Fabric Manager in
/// bare-metal mode, no whole GPU in the claim, or one GPU while Fabric Manager cannot be
/// reached), else the healthy partition whose members are exactly those GPUs. Made before any
/// write: `prepare` activates the partition it returns.
///
/// # Errors
/// `Refused` when the GPUs are no healthy partition (naming the partitions of that size that
/// would do), or when several GPUs are asked for while Fabric Manager cannot be reached.
pub fn claim_partition<'n>(
    gpus: &[PciAddress],
    node: &'n NodeTopology,
) -> Result<Option<&'n Partition>> {
    let Some(f) = node.fabric.as_ref() else {
        return Ok(None);
    };
    let names = || {
        gpus.iter()
            .map(|a| {
                node.gpu_by_address(a)
                    .map_or_else(|| a.to_string(), |g| g.name.clone())
            })
            .collect::<Vec<_>>()
            .join(", ")
    };
    match f.partition_for_set(gpus) {
        Ok(p) => Ok(p),
        Err(SetRefusal::Unreachable { reason }) => fail!(
            Refused, names();
            "GPUs {} sit on an NVSwitch fabric whose Fabric Manager cannot be reached ({}): they \
             could not talk over NVLink; nothing was changed",
            names(),
            reason
        ),
        Err(r @ SetRefusal::Degraded { partition, .. }) => fail!(
            Refused, names();
            "{} is degraded ({}); would do: {}; nothing was changed",
            partition.describe(),
            partition.degraded.as_deref().unwrap_or(""),
            r.would_do()
        ),
        Err(r @ SetRefusal::NotAPartition { .. }) => fail!(
            Refused, names();
            "GPUs {} are no NVSwitch partition of this node (a VM's GPUs talk over NVLink only \
             as one activated partition); would do: {}; nothing was changed",
            names(),
            r.would_do()
        ),
    }
}

/// The annotation naming the NVSwitch partition a VM's whole GPUs are.
pub const PARTITION_ANNOTATION: &str = "gpuslice.dev/nvswitch-partition";
/// The annotation saying which NVIDIA driver the guest must run.
pub const GUEST_DRIVER_ANNOTATION: &str = "gpuslice.dev/guest-driver";

/// The attribute of a prepared claim's devices naming their NVSwitch partition (KubeVirt
/// device metadata).
pub const PARTITION_ATTRIBUTE: &str = "nvswitchPartition";
/// The attribute of a prepared claim's devices saying which NVIDIA driver the guest must run.
pub const GUEST_DRIVER_ATTRIBUTE: &str = "guestDriver";

/// What a VM's guest needs when its whole GPUs `gpus` sit on an NVSwitch fabric that activates
/// partitions: the partition they are (when they are one), and the NVIDIA driver the guest must
/// run (the version of the host's Fabric Manager; operators report `cuInit` error 802
/// otherwise). `None` elsewhere.
fn guest_needs(node: &NodeTopology, gpus: &[PciAddress]) -> Option<(Option<u32>, String)> {
    let f = node.fabric.as_ref().filter(|f| f.requires_partitions())?;
    if gpus.is_empty() {
        return None;
    }
    let version = f.fabric_manager.version.as_deref().map_or_else(
        || "the version of the host's Fabric Manager (not known here: `nv-fabricmanager --version` on the host)".to_owned(),
        |v| format!("{v}, the version of the host's Fabric Manager"),
    );
    Some((
        f.exact(gpus).map(|p| p.id),
        format!("NVIDIA driver {version}; without it CUDA fails in the guest (cuInit error 802)"),
    ))
}

/// [`guest_needs`] as `export vm` annotates a VirtualMachine: [`PARTITION_ANNOTATION`] and
/// [`GUEST_DRIVER_ANNOTATION`] for `allocation`'s whole GPUs. Empty elsewhere.
pub fn guest_annotations(
    node: &NodeTopology,
    allocation: &gpu_core::Allocation,
) -> BTreeMap<String, String> {
    let gpus: Vec<PciAddress> = allocation
        .devices
        .iter()
        .filter_map(|d| match d {
            gpu_core::AllocatedDevice::Gpu { address, .. } => Some(*address),
            gpu_core::AllocatedDevice::Vgpu { .. } => None,
        })
        .collect();
    let mut out = BTreeMap::new();
    if let Some((partition, driver)) = guest_needs(node, &gpus) {
        if let Some(id) = partition {
            out.insert(PARTITION_ANNOTATION.to_owned(), id.to_string());
        }
        out.insert(GUEST_DRIVER_ANNOTATION.to_owned(), driver);
    }
    out
}

/// [`guest_needs`] as the KubeVirt device metadata of a prepared claim carries it, on each
/// device ([`PARTITION_ATTRIBUTE`] an int, [`GUEST_DRIVER_ATTRIBUTE`] a string, in the
/// ResourceSlice form). Empty elsewhere.
pub fn guest_attributes(
    node: &NodeTopology,
    gpus: &[PciAddress],
) -> serde_json::Map<String, serde_json::Value> {
    let mut out = serde_json::Map::new();
    if let Some((partition, driver)) = guest_needs(node, gpus) {
        if let Some(id) = partition {
            out.insert(
                PARTITION_ATTRIBUTE.to_owned(),
                serde_json::json!({ "int": id }),
            );
        }
        out.insert(
            GUEST_DRIVER_ATTRIBUTE.to_owned(),
            serde_json::json!({ "string": driver }),
        );
    }
    out
}
