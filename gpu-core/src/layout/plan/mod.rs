//! The planner: a pure diff from a [`NodeTopology`] to what a layout config wants.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::address::PciAddress;
use crate::ids::{MdevUuid, ParentId, VgpuTypeId};
use crate::mig::{MigGeometry, MigOccupancy, MigProfile};
use crate::nvidia::{VgpuTypeName, names_match, strip_prefix, vgpu_board};
use crate::topology::{Gpu, Instance, NodeTopology, Parent, Pool, Profile, VgpuFramework};
use crate::vendor::Vendor;

use super::LayoutError;
use super::config::{LayoutConfig, Selector, TypeCount, TypeRef, Want, nvidia_indices};

mod diff;
mod place;
mod resolve;
mod select;
mod types;

use diff::*;
use place::*;
use resolve::*;
use select::*;
pub use types::{
    Assertion, GpuLayoutPlan, Mode, Plan, PlanOptions, PlannedInstance, Step, TypeDiff,
};

/// The vGPU type names `config` asks of each physical GPU of `topology` it selects, in file
/// order, as the driver or the file names them (a pin by type ID is named from what the GPU's
/// VFs list): what each GPU holds once the layout is applied. Used where one size per GPU must
/// be chosen ahead (the DRA slices before Kubernetes 1.36.2). Virtual parents are left out.
///
/// # Errors
/// The selection errors of [`plan_layout`] (a GPU, VF or parent the host does not have).
pub fn wanted_types(
    config: &LayoutConfig,
    topology: &NodeTopology,
) -> Result<BTreeMap<PciAddress, Vec<String>>, LayoutError> {
    Ok(wanted_counts(config, topology)?
        .into_iter()
        .map(|(gpu, v)| (gpu, v.into_iter().map(|(n, _)| n).collect()))
        .collect())
}

/// The physical GPUs of `topology` that an entry with `mixed-sizes: true` selects: those a
/// layout may give vGPUs of different sizes (mixed-size mode, turned on by the node's writer).
///
/// # Errors
/// As [`wanted_types`].
pub fn mixed_sizes_asked(
    config: &LayoutConfig,
    topology: &NodeTopology,
) -> Result<BTreeSet<PciAddress>, LayoutError> {
    let mut out = BTreeSet::new();
    for e in config.entries.iter().filter(|e| e.mixed_sizes) {
        let one = LayoutConfig {
            name: config.name.clone(),
            entries: vec![e.clone()],
        };
        out.extend(wanted_counts(&one, topology)?.into_keys());
    }
    Ok(out)
}

/// [`wanted_types`] with how many vGPUs of each type a GPU holds once the layout is applied
/// (a pinned VF counts one): what the GPU instances of MIG-backed types are derived from
/// before the types can be resolved (a GPU in MIG mode lists a MIG-backed type only once an
/// instance for it exists).
///
/// # Errors
/// As [`wanted_types`].
pub fn wanted_counts(
    config: &LayoutConfig,
    topology: &NodeTopology,
) -> Result<BTreeMap<PciAddress, Vec<(String, u32)>>, LayoutError> {
    let mut warnings = Vec::new();
    let selected = select(
        config,
        topology,
        Mode::Apply,
        &TypeNames::new(),
        &mut warnings,
    )?;
    let mut out: BTreeMap<PciAddress, Vec<(String, u32)>> = BTreeMap::new();
    for s in selected {
        let Subject::Gpu(gpu) = s.subject else {
            continue;
        };
        let names = out.entry(gpu.address).or_default();
        let mut add = |n: String, count: u32| match names
            .iter_mut()
            .find(|(have, _)| names_match(have, &n))
        {
            Some((_, c)) => *c += count,
            None => names.push((n, count)),
        };
        match s.target {
            Target::Counts(types) => types.into_iter().for_each(|t| add(t.name, t.count)),
            Target::Pins(pins) => {
                for (_, t) in pins {
                    match t {
                        Some(TypeRef::Name(n)) => add(n, 1),
                        Some(TypeRef::Id(id)) => {
                            let named = topology
                                .mediated_devices
                                .parents
                                .iter()
                                .filter(|p| p.gpu == Some(gpu.address))
                                .flat_map(|p| p.profiles.iter())
                                .find(|p| p.id.as_str() == id)
                                .map(|p| p.name.clone());
                            if let Some(n) = named {
                                add(n, 1);
                            }
                        }
                        None => {}
                    }
                }
            }
        }
    }
    out.retain(|_, v| !v.is_empty());
    Ok(out)
}

/// Checks whether the host holds what `config` wants, comparing normalized type names, on the
/// selected GPUs only. Capacity and in-use state are not considered.
///
/// # Errors
/// The same resolution errors as [`plan_layout`] (unknown types, ambiguous entries, ...).
pub fn assert_layout(
    config: &LayoutConfig,
    topology: &NodeTopology,
) -> Result<Assertion, LayoutError> {
    assert_layout_named(config, topology, &TypeNames::new())
}

/// [`assert_layout`] with the vendor-VFIO type names other sources know (the remembered names,
/// NVML): a requested name one of them knows exactly is never matched by its base type.
///
/// # Errors
/// As [`assert_layout`].
pub fn assert_layout_named(
    config: &LayoutConfig,
    topology: &NodeTopology,
    names: &TypeNames,
) -> Result<Assertion, LayoutError> {
    let plan = build(config, topology, PlanOptions::default(), false, names)?;
    let mut diff = Vec::new();
    for g in &plan.gpus {
        if let Some(why) = &g.refused {
            diff.push(format!("{}: {why}", g.label()));
        }
        if g.enable_sriov {
            diff.push(format!("{}: SR-IOV is not enabled", g.label()));
        }
        for t in g.types.iter().filter(|t| t.have != t.want) {
            diff.push(format!(
                "{}: {}: have {}, want {}",
                g.label(),
                strip_prefix(&t.name),
                t.have,
                t.want
            ));
        }
    }
    Ok(Assertion {
        node: plan.node,
        config: plan.config,
        applied: diff.is_empty(),
        gpus: plan.gpus,
        diff,
    })
}

/// Plans `config` against `topology`: keeps instances that already match, removes the surplus,
/// creates the rest largest framebuffer first while simulating each GPU's pool, and refuses (with
/// the pool's numbers) a layout that cannot fit. GPUs where a wanted removal hits an instance in
/// use are left unchanged and reported (`refused`) unless `force`.
///
/// # Errors
/// [`LayoutError::UnknownType`], [`LayoutError::DuplicateType`], [`LayoutError::AmbiguousEntries`],
/// [`LayoutError::NotVgpuCapable`], [`LayoutError::UnknownDevice`], [`LayoutError::Conflict`],
/// [`LayoutError::DoesNotFit`].
pub fn plan_layout(
    config: &LayoutConfig,
    topology: &NodeTopology,
    options: &PlanOptions,
) -> Result<Plan, LayoutError> {
    plan_layout_named(config, topology, options, &TypeNames::new())
}

/// Vendor-VFIO type number → name, as sources other than the topology know them (the names
/// gpuslice remembered, NVML). They rank after the GPU's own listings and instances and before
/// any name with its MIG suffix stripped.
pub type TypeNames = BTreeMap<u32, String>;

/// [`plan_layout`] with the vendor-VFIO type names other sources know: the exact name first
/// across every source (the GPU's listings and instances, then `names`), and a MIG suffix
/// stripped only when no source knows the exact name (`DC-1-24QGFX` is not `DC-1-24Q`).
///
/// # Errors
/// As [`plan_layout`].
pub fn plan_layout_named(
    config: &LayoutConfig,
    topology: &NodeTopology,
    options: &PlanOptions,
    names: &TypeNames,
) -> Result<Plan, LayoutError> {
    build(config, topology, *options, true, names)
}
