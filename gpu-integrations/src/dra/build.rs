//! From a node's inventory to ResourceSlices.
//!
//! Each physical GPU becomes one counter set (`framebuffer`, and `memory-slice-<i>` on MIG-capable
//! GPUs). Its devices:
//! - the whole GPU, consuming every counter of the set in full, so it excludes any vGPU on the
//!   card and any vGPU excludes it;
//! - one multi-allocatable device per time-sliced framebuffer size, with an `instances` capacity
//!   taken one at a time, consuming the whole `framebuffer` counter: the first vGPU locks the card
//!   to its size, as the NVIDIA driver does (plain counters cannot say "one size per card": two
//!   sizes that each fit twice would always co-fit);
//! - on a GPU in mixed-size mode, one multi-allocatable device whose `framebuffer` capacity is
//!   consumed per vGPU instead;
//! - one device per MIG placement (slice count, memory size, start slot) of MIG-backed profiles,
//!   consuming its memory slices and its framebuffer;
//! - on a GPU in mixed-size mode whose driver's placements are known
//!   ([`DraOptions::mixed_placements`]), a `placement-slot-<i>` counter per slot and one device per
//!   free placement of each size, consuming its framebuffer and its slots (`slots`), in every
//!   version.
//!
//! An mdev parent that is not a function of a PCI GPU (a *virtual parent*: the kernel's sample
//! display driver `mbochs`, or any other driver whose parent sits under `/sys/devices/virtual`)
//! becomes its own counter set, `mdev-<label>` with its pool's `framebuffer` (names in
//! [`super::device_name`]), when it offers display types: `vfio-pci` types whose description
//! states their video memory (`N MB video memory`, as mbochs writes it, or NVIDIA's
//! `framebuffer=`). Only those qualify, for two reasons: a type that states no memory cannot be
//! counted against the pool, so the scheduler could hand out more than the parent holds (mdpy's
//! displays state a resolution only); and a type that is not a display is not a GPU for a VM
//! (mtty's serial ports also answer `device_api` `vfio-pci`, so that alone does not tell). The
//! parent's devices carry `virtualParent: true` and `mdevParent` (its name), so a selector can
//! keep them apart from vGPUs of real GPUs. Such a parent mixes sizes freely (no same-size rule):
//! under 1.36.2 and later it gets one multi-allocatable `vgpu-mdev-<label>-mixed` device whose
//! `framebuffer` capacity is consumed per vGPU; before, one device per vGPU of its largest type
//! (`vgpu-mdev-<label>-<MiB>mi-<n>`, each consuming its size), since those schedulers count plain
//! devices only and gpuslice's rules keep one size per counter set there.
//!
//! A profile is chosen at prepare time from the claim's opaque configuration, among the profiles
//! of the allocated device (its `profile_<NAME>` attributes).
//!
//! Capacity already taken outside Kubernetes (vGPUs or a passed-through GPU that the DRA node side
//! did not create) is left out; what `gpuslice dra prepare` created is not, because the scheduler
//! already counts it through its claims.
//!
//! The pieces: `parts` (resolved profiles, attributes, counters), `mig` (MIG start slots),
//! `gpu` (one physical GPU), `vgpu` (its vGPU devices per encoding), `virtual_parent` (a
//! virtual mdev parent) and `pack` (the slices under the version's limits).

mod gpu;
mod mig;
mod pack;
mod parts;
mod slots;
#[cfg(test)]
mod slots_tests;
#[cfg(test)]
mod tests;
mod vgpu;
mod virtual_parent;

pub use mig::{mig_memory_slices, mig_placements, mig_spans};
pub use slots::{GpuPlacements, SLOT_COUNTER, TypePlacements};

use std::collections::{BTreeMap, BTreeSet};

use crate::error::{IntegrationError, Result, fail};
use gpu_core::{Gpu, NodeTopology, Parent, ParentId, PciAddress};
use serde::{Deserialize, Serialize};

use super::model::*;
use super::names::is_dns_subdomain;
use super::version::*;
use parts::GpuPlan;

/// What `gpuslice dra prepare` created on a node, which the export must not subtract.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Prepared {
    /// mdev UUIDs and vendor-VFIO VF addresses of prepared vGPUs.
    #[serde(default)]
    pub instances: BTreeSet<String>,
    /// Whole GPUs handed out by prepare.
    #[serde(default)]
    pub gpus: BTreeSet<PciAddress>,
}

/// Options of an export.
#[derive(Debug, Clone)]
pub struct DraOptions {
    /// The driver name (a DNS subdomain).
    pub driver: String,
    /// The Kubernetes version the objects are for.
    pub version: K8sVersion,
    /// `pool.generation`.
    pub generation: i64,
    /// What prepare created, per node name.
    pub prepared: BTreeMap<String, Prepared>,
    /// The vGPU profile the operator chose per GPU (`--size-for GPU=PROFILE`): under the
    /// one-size-per-instance encoding (before Kubernetes 1.36.2) an unlocked GPU offers that
    /// profile's size only (a MIG-backed profile: MIG placements only).
    pub size_for: BTreeMap<PciAddress, String>,
    /// The mixed-size placements of the GPUs in mixed-size mode, as their driver lists them
    /// (read by the node from NVML: `gpu_node::mixed_slots::placements`): such a GPU is
    /// published with a counter per placement slot and a device per free placement
    /// ([`TypePlacements`]). A GPU not named keeps the framebuffer encodings.
    pub mixed_placements: BTreeMap<PciAddress, GpuPlacements>,
}

impl Default for DraOptions {
    fn default() -> Self {
        DraOptions {
            driver: DEFAULT_DRIVER.to_owned(),
            version: K8sVersion::default(),
            generation: 1,
            prepared: BTreeMap::new(),
            size_for: BTreeMap::new(),
            mixed_placements: BTreeMap::new(),
        }
    }
}

/// One node's slices and what was left out, with why.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeSlices {
    /// The slices of the node's pool.
    pub slices: Vec<ResourceSlice>,
    /// Devices or profiles not published, with the reason.
    pub warnings: Vec<String>,
}

struct Ctx<'a> {
    node: &'a NodeTopology,
    opts: &'a DraOptions,
    prepared: Prepared,
    warnings: Vec<String>,
}

/// The slices of one node.
///
/// # Errors
/// When the node name is not a DNS subdomain, or one GPU's devices cannot fit one slice under
/// Kubernetes 1.34's rules (its devices must sit with its counter set).
pub fn node_slices(node: &NodeTopology, opts: &DraOptions) -> Result<NodeSlices> {
    if !is_dns_subdomain(&node.node) {
        fail!(
            Invalid, node.node;
            "node name {:?} is not a Kubernetes node name (a lowercase DNS subdomain)",
            node.node
        );
    }
    if !is_dns_subdomain(&opts.driver) {
        fail!(
            Invalid, opts.driver;
            "driver name {:?} is not a lowercase DNS subdomain such as gpu.example.com",
            opts.driver
        );
    }
    let mut ctx = Ctx {
        node,
        opts,
        prepared: opts.prepared.get(&node.node).cloned().unwrap_or_default(),
        warnings: vec![],
    };
    let mut gpus: Vec<&Gpu> = node.gpus.iter().collect();
    gpus.sort_by_key(|g| g.address);
    let mut plans: Vec<(String, GpuPlan)> = gpus
        .iter()
        .map(|g| (format!("{} ({})", g.name, g.address), ctx.plan_gpu(g)))
        .collect();
    let mut virtual_parents: Vec<(&str, &Parent)> = node
        .mediated_devices
        .parents
        .iter()
        .filter(|p| p.gpu.is_none())
        .filter_map(|p| match &p.id {
            ParentId::Named(n) => Some((n.as_str(), p)),
            ParentId::Pci(_) => None,
        })
        .collect();
    virtual_parents.sort_by_key(|(n, _)| *n);
    plans.extend(
        virtual_parents
            .into_iter()
            .filter_map(|(n, p)| Some((format!("mdev parent {n}"), ctx.plan_virtual(n, p)?))),
    );

    let drafts = pack::pack(plans, opts.version)?;
    let count = i64::try_from(drafts.len()).map_err(|_| IntegrationError::Refused {
        what: ("slices").to_string(),
        why: "too many slices".to_owned(),
    })?;
    let slices = drafts
        .into_iter()
        .enumerate()
        .map(|(i, d)| ResourceSlice {
            api_version: API_VERSION.into(),
            kind: "ResourceSlice".into(),
            metadata: ObjectMeta {
                name: format!("{}-{}-{i}", node.node, opts.driver),
                labels: BTreeMap::new(),
            },
            spec: ResourceSliceSpec {
                driver: opts.driver.clone(),
                pool: ResourcePool {
                    name: node.node.clone(),
                    generation: opts.generation,
                    resource_slice_count: count,
                },
                node_name: Some(node.node.clone()),
                shared_counters: d.sets,
                devices: d.devices,
            },
        })
        .collect::<Vec<_>>();
    for s in &slices {
        if !is_dns_subdomain(&s.metadata.name) {
            fail!(
                Invalid, s.metadata.name;
                "slice name {:?} is longer than 253 characters; use a shorter driver name",
                s.metadata.name
            );
        }
    }
    Ok(NodeSlices {
        slices,
        warnings: ctx.warnings,
    })
}

/// The DeviceClasses `gpu` (whole GPUs) and `vgpu` (vGPUs of every kind) of `driver`.
pub fn device_classes(driver: &str) -> Vec<DeviceClass> {
    ["gpu", "vgpu"]
        .into_iter()
        .map(|kind| DeviceClass {
            api_version: API_VERSION.into(),
            kind: "DeviceClass".into(),
            metadata: ObjectMeta {
                name: kind.into(),
                labels: BTreeMap::new(),
            },
            spec: DeviceClassSpec {
                selectors: vec![DeviceSelector::cel(format!(
                    "device.driver == {driver:?} && device.attributes[{driver:?}].type == {kind:?}"
                ))],
            },
        })
        .collect()
}

/// Everything an export prints: the classes, then each node's slices.
#[derive(Debug, Clone, PartialEq)]
pub struct Export {
    /// DeviceClasses and ResourceSlices, in output order.
    pub objects: Vec<Object>,
    /// What was left out, `node: reason`.
    pub warnings: Vec<String>,
    /// How time-sliced vGPUs were published for the version.
    pub encoding: Encoding,
}

/// Exports `nodes` (in the given order).
///
/// # Errors
/// As [`node_slices`].
pub fn export(nodes: &[NodeTopology], opts: &DraOptions) -> Result<Export> {
    let mut objects: Vec<Object> = device_classes(&opts.driver)
        .into_iter()
        .map(Object::Class)
        .collect();
    let mut warnings = vec![];
    for n in nodes {
        let s = node_slices(n, opts).map_err(|e| e.context(format!("node {}", n.node)))?;
        objects.extend(s.slices.into_iter().map(Object::Slice));
        warnings.extend(s.warnings.into_iter().map(|w| format!("{}: {w}", n.node)));
    }
    let slices: Vec<ResourceSlice> = objects
        .iter()
        .filter_map(|o| match o {
            Object::Slice(s) => Some(s.clone()),
            _ => None,
        })
        .collect();
    let violations = super::rules::check(&slices, opts.version);
    if !violations.is_empty() {
        return Err(IntegrationError::RulesBroken {
            what: "slices",
            version: opts.version.to_string(),
            violations,
        });
    }
    Ok(Export {
        objects,
        warnings,
        encoding: opts.version.encoding(),
    })
}
