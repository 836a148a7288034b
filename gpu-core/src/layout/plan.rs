//! The planner: a pure diff from a [`NodeTopology`] to what a layout config wants.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::address::PciAddress;
use crate::ids::{MdevUuid, ParentId, VgpuTypeId};
use crate::nvidia::{VgpuTypeName, names_match, strip_prefix};
use crate::topology::{Gpu, Instance, NodeTopology, Parent, Pool, Profile, VgpuFramework};

use super::LayoutError;
use super::config::{LayoutConfig, Selector, TypeCount, TypeRef, Want, nvidia_indices};

/// What the plan is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum Mode {
    /// Make the selected GPUs hold what the config says.
    #[default]
    Apply,
    /// Remove every vGPU of the selected GPUs (or pinned VFs).
    Clear,
}

/// Planner options.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PlanOptions {
    /// Apply or clear.
    pub mode: Mode,
    /// Plan the removal of instances that a VM has open.
    pub force: bool,
}

/// One instance the plan keeps, removes or creates.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PlannedInstance {
    /// The framework that holds it.
    pub framework: VgpuFramework,
    /// Its parent (the VF itself for vendor-VFIO).
    pub parent: ParentId,
    /// Its mdev UUID.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uuid: Option<MdevUuid>,
    /// Its type, when known. A vendor-VFIO type the driver does not list while the GPU is full is
    /// resolved by name right before the write.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub type_id: Option<VgpuTypeId>,
    /// Its type's name (as the driver spells it, or as requested when the driver does not list it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub type_name: Option<String>,
    /// Framebuffer in MiB, when known.
    #[serde(
        default,
        rename = "framebufferMiB",
        skip_serializing_if = "Option::is_none"
    )]
    pub framebuffer_mib: Option<u64>,
    /// A VM has it open (when known).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub in_use: Option<bool>,
}

impl PlannedInstance {
    /// The VF address of a vendor-VFIO instance, or the parent VF of an mdev on SR-IOV.
    pub fn parent_address(&self) -> Option<PciAddress> {
        self.parent.pci()
    }

    /// How people name it: the UUID for an mdev, the VF address for vendor-VFIO.
    pub fn label(&self) -> String {
        match &self.uuid {
            Some(u) => u.to_string(),
            None => self.parent.to_string(),
        }
    }

    /// The type as people name it.
    pub fn type_label(&self) -> String {
        match (&self.type_name, &self.type_id) {
            (Some(n), Some(id)) if strip_prefix(n) == id.as_str() => n.clone(),
            (Some(n), Some(id)) => format!("{} ({id})", strip_prefix(n)),
            (Some(n), None) => strip_prefix(n).to_owned(),
            (None, Some(id)) => id.to_string(),
            (None, None) => "?".to_owned(),
        }
    }
}

/// Have and want of one type on one GPU.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TypeDiff {
    /// The type as requested (or as the driver names an unwanted one).
    pub name: String,
    /// The type ID, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub type_id: Option<VgpuTypeId>,
    /// Instances there are.
    pub have: u32,
    /// Instances wanted.
    pub want: u32,
}

/// The plan for one GPU.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GpuPlan {
    /// The GPU's address, or a virtual mdev parent's name (`mbochs`).
    pub gpu: ParentId,
    /// Its per-node name (`nvidia0`; a virtual parent's own name).
    pub name: String,
    /// Its index in NVIDIA's numbering.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub index: Option<u32>,
    /// The config entry that selected it (`vgpu-configs.A2-4Q[0]`).
    pub entry: String,
    /// Its framework, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub framework: Option<VgpuFramework>,
    /// Have and want per type.
    pub types: Vec<TypeDiff>,
    /// Instances left as they are.
    pub keep: Vec<PlannedInstance>,
    /// Instances to remove.
    pub remove: Vec<PlannedInstance>,
    /// Instances to create, in order.
    pub create: Vec<PlannedInstance>,
    /// SR-IOV must be enabled first; the types are resolved once the VFs exist.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub enable_sriov: bool,
    /// Why this GPU is left unchanged (instances in use), when it is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refused: Option<String>,
}

impl GpuPlan {
    /// `nvidia0 (0000:08:00.0)`, or a virtual parent's name (`mbochs`).
    pub fn label(&self) -> String {
        match &self.gpu {
            ParentId::Named(n) if *n == self.name => n.clone(),
            g => format!("{} ({g})", self.name),
        }
    }

    /// Whether the GPU already holds what is wanted.
    pub fn is_applied(&self) -> bool {
        !self.enable_sriov && self.types.iter().all(|t| t.have == t.want)
    }
}

/// One write, in execution order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "kebab-case", rename_all_fields = "camelCase")]
pub enum Step {
    /// Remove an instance (mdev) or clear a VF's type (vendor-VFIO).
    Remove {
        /// The physical GPU, or the virtual mdev parent.
        gpu: ParentId,
        /// The instance.
        instance: PlannedInstance,
    },
    /// Enable SR-IOV on a GPU (its types become known only afterwards: plan again).
    EnableSriov {
        /// The physical GPU.
        gpu: PciAddress,
    },
    /// Create an instance (mdev) or set a VF's type (vendor-VFIO).
    Create {
        /// The physical GPU, or the virtual mdev parent.
        gpu: ParentId,
        /// The instance.
        instance: PlannedInstance,
    },
}

/// A plan: per-GPU diffs and the ordered writes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Plan {
    /// Node name.
    pub node: String,
    /// The config planned.
    pub config: String,
    /// Apply or clear.
    pub mode: Mode,
    /// Per selected GPU, in address order.
    pub gpus: Vec<GpuPlan>,
    /// Writes in order: removals, SR-IOV enables, then creations (largest framebuffer first).
    pub steps: Vec<Step>,
    /// Things worth saying that did not stop the plan.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
}

impl Plan {
    /// Nothing to write.
    pub fn is_noop(&self) -> bool {
        self.steps.is_empty()
    }

    /// SR-IOV must be enabled on some GPU before the rest can be planned.
    pub fn needs_sriov(&self) -> bool {
        self.steps
            .iter()
            .any(|s| matches!(s, Step::EnableSriov { .. }))
    }

    /// GPUs left unchanged because instances on them are in use.
    pub fn refused(&self) -> impl Iterator<Item = &GpuPlan> {
        self.gpus.iter().filter(|g| g.refused.is_some())
    }
}

/// The result of `assert`: whether every selected GPU holds what the config wants.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Assertion {
    /// Node name.
    pub node: String,
    /// The config checked.
    pub config: String,
    /// True when every selected GPU matches.
    pub applied: bool,
    /// Per selected GPU.
    pub gpus: Vec<GpuPlan>,
    /// Human-readable differences, one per GPU and type.
    pub diff: Vec<String>,
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
    let plan = build(config, topology, PlanOptions::default(), false)?;
    let mut diff = Vec::new();
    for g in &plan.gpus {
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
    build(config, topology, *options, true)
}

/// A type a GPU knows: listed by a parent, or held by an instance.
#[derive(Debug, Clone)]
struct Known {
    id: VgpuTypeId,
    name: String,
    profile: Profile,
}

/// A requested type resolved on one GPU.
#[derive(Debug, Clone)]
struct Resolved {
    requested: String,
    count: u32,
    id: Option<VgpuTypeId>,
    name: String,
    profile: Profile,
}

/// One GPU (or one virtual mdev parent) with its parents, instances and known types.
struct View<'a> {
    /// The physical GPU; `None` for a virtual parent such as `mbochs`.
    gpu: Option<&'a Gpu>,
    /// The pool key: the GPU's address or the virtual parent's name.
    key: ParentId,
    /// The GPU's per-node name, or the virtual parent's name.
    name: String,
    label: String,
    parents: Vec<&'a Parent>,
    known: Vec<Known>,
}

impl<'a> View<'a> {
    fn new(topology: &'a NodeTopology, gpu: &'a Gpu) -> Self {
        let parents: Vec<&Parent> = topology
            .mediated_devices
            .parents
            .iter()
            .filter(|p| p.gpu == Some(gpu.address))
            .collect();
        Self::with_parents(
            Some(gpu),
            ParentId::Pci(gpu.address),
            gpu.name.clone(),
            format!("{} ({})", gpu.name, gpu.address),
            parents,
        )
    }

    /// A virtual mdev parent: its own pool, its driver's own type names.
    fn named(parent: &'a Parent) -> Self {
        let name = parent.id.to_string();
        Self::with_parents(None, parent.id.clone(), name.clone(), name, vec![parent])
    }

    fn with_parents(
        gpu: Option<&'a Gpu>,
        key: ParentId,
        name: String,
        label: String,
        mut parents: Vec<&'a Parent>,
    ) -> Self {
        parents.sort_by(|a, b| a.id.cmp(&b.id));
        let mut known: Vec<Known> = Vec::new();
        for p in &parents {
            for pr in &p.profiles {
                if !known.iter().any(|k| k.id == pr.id) {
                    known.push(Known {
                        id: pr.id.clone(),
                        name: pr.name.clone(),
                        profile: complete(pr.clone()),
                    });
                }
            }
        }
        for p in &parents {
            for i in &p.instances {
                if known.iter().any(|k| k.id == i.profile) {
                    continue;
                }
                if let Some(name) = &i.profile_name {
                    known.push(Known {
                        id: i.profile.clone(),
                        name: name.clone(),
                        profile: synth_profile(&i.profile, name, i.framebuffer_mib),
                    });
                }
            }
        }
        View {
            gpu,
            key,
            name,
            label,
            parents,
            known,
        }
    }

    fn framework(&self) -> Option<VgpuFramework> {
        self.gpu
            .and_then(|g| g.vgpu_framework)
            .or_else(|| self.parents.first().map(|p| p.framework))
    }

    fn instances(&self) -> impl Iterator<Item = (&'a Parent, &'a Instance)> + '_ {
        self.parents
            .iter()
            .flat_map(|p| p.instances.iter().map(move |i| (*p, i)))
    }

    fn needs_sriov(&self) -> bool {
        self.parents.is_empty()
            && self
                .gpu
                .and_then(|g| g.sriov.as_ref())
                .is_some_and(|s| s.total_vfs > 0 && s.num_vfs == 0)
    }

    fn offered(&self) -> String {
        if self.known.is_empty() {
            return "nothing".to_owned();
        }
        if self.gpu.is_none() {
            let names: Vec<String> = self
                .known
                .iter()
                .map(|k| {
                    if k.name == k.id.as_str() {
                        k.name.clone()
                    } else {
                        format!("{} ({})", k.name, k.id)
                    }
                })
                .collect();
            return names.join(", ");
        }
        let mut names: Vec<&str> = self.known.iter().map(|k| strip_prefix(&k.name)).collect();
        names.sort_unstable();
        names.dedup();
        names.join(", ")
    }

    /// Resolves a requested name: the exact name first, then the base name without a MIG suffix
    /// (drivers that list only the base type). A vendor-VFIO GPU whose instances fill it lists no
    /// creatable types at all; a name for the same board is then accepted and resolved to an ID
    /// by the executor right before the write.
    fn resolve(&self, requested: &str, count: u32) -> Result<Resolved, LayoutError> {
        if self.gpu.is_none() {
            return self.resolve_driver_name(requested, count);
        }
        let found = self
            .known
            .iter()
            .find(|k| names_match(&k.name, requested))
            .or_else(|| {
                let base = VgpuTypeName::parse(requested).ok()?.base().to_string();
                self.known.iter().find(|k| names_match(&k.name, &base))
            });
        if let Some(k) = found {
            return Ok(Resolved {
                requested: requested.to_owned(),
                count,
                id: Some(k.id.clone()),
                name: k.name.clone(),
                profile: k.profile.clone(),
            });
        }
        let unknown = || LayoutError::UnknownType {
            gpu: self.label.clone(),
            name: requested.to_owned(),
            offered: self.offered(),
        };
        let listing_incomplete = self.framework() == Some(VgpuFramework::VendorVfio)
            && self.instances().next().is_some();
        if !listing_incomplete {
            return Err(unknown());
        }
        let parsed = VgpuTypeName::parse(requested).map_err(|_| unknown())?;
        let same_board = self.known.iter().all(|k| {
            VgpuTypeName::parse(&k.name).is_ok_and(|n| n.board.eq_ignore_ascii_case(&parsed.board))
        });
        if !same_board {
            return Err(unknown());
        }
        let mut profile = synth_profile(
            &VgpuTypeId::from_str_unchecked("0"),
            requested,
            Some(parsed.framebuffer_mib()),
        );
        profile.mig_slices = parsed.mig_slices;
        Ok(Resolved {
            requested: requested.to_owned(),
            count,
            id: None,
            name: requested.to_owned(),
            profile,
        })
    }

    /// A virtual parent's type: its driver's `name` or its type ID, exactly as the driver spells
    /// them (mtty's `mtty-1` is named `Single port serial`).
    fn resolve_driver_name(&self, requested: &str, count: u32) -> Result<Resolved, LayoutError> {
        let t = requested.trim();
        self.known
            .iter()
            .find(|k| k.name == t)
            .or_else(|| self.known.iter().find(|k| k.id.as_str() == t))
            .map(|k| Resolved {
                requested: requested.to_owned(),
                count,
                id: Some(k.id.clone()),
                name: k.name.clone(),
                profile: k.profile.clone(),
            })
            .ok_or_else(|| LayoutError::UnknownType {
                gpu: self.label.clone(),
                name: requested.to_owned(),
                offered: self.offered(),
            })
    }

    fn resolve_all(&self, types: &[TypeCount]) -> Result<Vec<Resolved>, LayoutError> {
        let mut out: Vec<Resolved> = Vec::with_capacity(types.len());
        for t in types {
            let r = self.resolve(&t.name, t.count)?;
            if let Some(prev) = out
                .iter()
                .find(|p| p.id.is_some() && p.id == r.id || names_match(&p.name, &r.name))
            {
                return Err(LayoutError::DuplicateType {
                    at: self.label.clone(),
                    first: prev.requested.clone(),
                    second: r.requested,
                    resolved: strip_prefix(&prev.name).to_owned(),
                });
            }
            out.push(r);
        }
        Ok(out)
    }

    fn resolve_ref(&self, r: &TypeRef) -> Result<Resolved, LayoutError> {
        match r {
            TypeRef::Name(n) => self.resolve(n, 1),
            TypeRef::Id(id) => self
                .known
                .iter()
                .find(|k| k.id.as_str() == id)
                .map(|k| Resolved {
                    requested: id.clone(),
                    count: 1,
                    id: Some(k.id.clone()),
                    name: k.name.clone(),
                    profile: k.profile.clone(),
                })
                .ok_or_else(|| LayoutError::UnknownType {
                    gpu: self.label.clone(),
                    name: id.clone(),
                    offered: self
                        .known
                        .iter()
                        .map(|k| format!("{} = {}", k.id, strip_prefix(&k.name)))
                        .collect::<Vec<_>>()
                        .join(", "),
                }),
        }
    }

    fn profile_of(&self, i: &Instance) -> Profile {
        self.known
            .iter()
            .find(|k| k.id == i.profile)
            .map(|k| k.profile.clone())
            .unwrap_or_else(|| {
                synth_profile(
                    &i.profile,
                    i.profile_name.as_deref().unwrap_or(""),
                    i.framebuffer_mib,
                )
            })
    }

    fn name_of(&self, i: &Instance) -> Option<String> {
        i.profile_name.clone().or_else(|| {
            self.known
                .iter()
                .find(|k| k.id == i.profile)
                .map(|k| k.name.clone())
        })
    }

    fn planned(&self, p: &Parent, i: &Instance) -> PlannedInstance {
        PlannedInstance {
            framework: p.framework,
            parent: p.id.clone(),
            uuid: i.uuid,
            type_id: Some(i.profile.clone()),
            type_name: self.name_of(i),
            framebuffer_mib: i
                .framebuffer_mib
                .or_else(|| self.profile_of(i).framebuffer_mib),
            in_use: i.in_use,
        }
    }
}

/// Fills a profile's framebuffer and MIG slices from its NVIDIA name when the driver gave none.
fn complete(mut p: Profile) -> Profile {
    if let Ok(n) = VgpuTypeName::parse(&p.name) {
        if p.framebuffer_mib.is_none() {
            p.framebuffer_mib = Some(n.framebuffer_mib());
        }
        if p.mig_slices.is_none() {
            p.mig_slices = n.mig_slices;
        }
    }
    p
}

fn synth_profile(id: &VgpuTypeId, name: &str, fb: Option<u64>) -> Profile {
    complete(Profile {
        id: id.clone(),
        name: name.to_owned(),
        framebuffer_mib: fb,
        max_instances: None,
        available_instances: 0,
        reported_instances: None,
        device_api: "vfio-pci".to_owned(),
        mig_slices: None,
        mig_memory_gib: None,
        description: None,
    })
}

/// NVIDIA's SR-IOV VFs hold at most one vGPU each; PF and virtual mdev parents hold many.
fn single_instance(p: &Parent) -> bool {
    match (p.framework, p.id.pci(), p.gpu) {
        (VgpuFramework::VendorVfio, _, _) => true,
        (VgpuFramework::Mdev, Some(a), Some(g)) => a != g,
        _ => false,
    }
}

/// What one selected GPU should hold.
enum Target {
    Counts(Vec<TypeCount>),
    Pins(Vec<(PciAddress, Option<TypeRef>)>),
}

/// What an entry selected: a physical GPU, or a virtual mdev parent.
#[derive(Clone, Copy)]
enum Subject<'a> {
    Gpu(&'a Gpu),
    Named(&'a Parent),
}

struct Selected<'a> {
    subject: Subject<'a>,
    index: Option<u32>,
    entry: String,
    target: Target,
}

fn select<'a>(
    config: &LayoutConfig,
    topology: &'a NodeTopology,
    mode: Mode,
    warnings: &mut Vec<String>,
) -> Result<Vec<Selected<'a>>, LayoutError> {
    let indices = nvidia_indices(&topology.gpus);
    let at = |i: usize| format!("vgpu-configs.{}[{i}]", config.name);
    let mut by_gpu: BTreeMap<PciAddress, Vec<(usize, &Want)>> = BTreeMap::new();
    let mut pins: BTreeMap<PciAddress, Vec<(PciAddress, Option<TypeRef>)>> = BTreeMap::new();
    let mut direct: BTreeMap<PciAddress, Vec<TypeCount>> = BTreeMap::new();
    let mut named: BTreeMap<ParentId, (&'a Parent, Vec<TypeCount>)> = BTreeMap::new();
    for (n, e) in config.entries.iter().enumerate() {
        match &e.selector {
            Selector::Parent { parent } => {
                let here = format!("vgpu-configs.{}.{parent}", config.name);
                let Some(p) = topology.parent(parent) else {
                    let mut there: Vec<String> = topology
                        .mediated_devices
                        .parents
                        .iter()
                        .filter(|p| p.gpu.is_none())
                        .map(|p| p.id.to_string())
                        .collect();
                    there.sort();
                    let there = if there.is_empty() {
                        "none".to_owned()
                    } else {
                        there.join(", ")
                    };
                    return Err(LayoutError::UnknownDevice {
                        at: here,
                        address: parent.to_string(),
                        why: format!(
                            "is not an mdev parent of this host (is its driver loaded?); \
                             virtual parents here: {there}"
                        ),
                    });
                };
                let Want::Counts { types } = &e.want else {
                    continue;
                };
                named.insert(parent.clone(), (p, types.clone()));
            }
            Selector::Indexed { devices, filters } => {
                for (addr, i) in &indices {
                    let Some(gpu) = topology.gpu_by_address(addr) else {
                        continue;
                    };
                    if devices.contains(*i)
                        && (filters.is_empty() || filters.iter().any(|f| f.matches(gpu)))
                    {
                        by_gpu.entry(*addr).or_default().push((n, &e.want));
                    }
                }
                if let super::config::Devices::Indices(list) = devices {
                    for i in list.iter().filter(|i| **i as usize >= indices.len()) {
                        warnings.push(format!(
                            "{}: GPU index {i} does not exist (the node has {} NVIDIA GPUs); \
                             ignored, as NVIDIA's tool does",
                            at(n),
                            indices.len()
                        ));
                    }
                }
            }
            Selector::Gpu { address } => {
                let here = format!("vgpu-configs.{}.{address}", config.name);
                if topology.gpu_by_address(address).is_none() {
                    let why = if topology.parent(&ParentId::Pci(*address)).is_some() {
                        "is a VF, not a GPU: give it a type ID or name instead of vgpu-devices"
                    } else {
                        "is not a GPU of this host"
                    };
                    return Err(LayoutError::UnknownDevice {
                        at: here,
                        address: address.to_string(),
                        why: why.to_owned(),
                    });
                }
                let Want::Counts { types } = &e.want else {
                    continue;
                };
                direct.insert(*address, types.clone());
            }
            Selector::Vf { address } => {
                let here = format!("vgpu-configs.{}.{address}", config.name);
                let Some(gpu) = topology
                    .parent(&ParentId::Pci(*address))
                    .filter(|p| single_instance(p))
                    .and_then(|p| p.gpu)
                else {
                    let why = if topology.gpu_by_address(address).is_some() {
                        "is a GPU, not a VF: give it vgpu-devices (type name → count)"
                    } else {
                        "is not a vGPU virtual function of this host (is SR-IOV enabled?)"
                    };
                    return Err(LayoutError::UnknownDevice {
                        at: here,
                        address: address.to_string(),
                        why: why.to_owned(),
                    });
                };
                let Want::VfType { ty } = &e.want else {
                    continue;
                };
                pins.entry(gpu).or_default().push((*address, ty.clone()));
            }
        }
    }
    let mut out = Vec::new();
    let mut gpus: Vec<&Gpu> = topology.gpus.iter().collect();
    gpus.sort_by_key(|g| g.address);
    for gpu in gpus {
        let index = indices.get(&gpu.address).copied();
        let view_label = || format!("{} ({})", gpu.name, gpu.address);
        if let Some(types) = direct.remove(&gpu.address) {
            if pins.contains_key(&gpu.address) {
                return Err(LayoutError::Conflict {
                    gpu: view_label(),
                    why: "both vgpu-devices for the GPU and types for some of its VFs are given"
                        .to_owned(),
                });
            }
            out.push(Selected {
                subject: Subject::Gpu(gpu),
                index,
                entry: format!("vgpu-configs.{}.{}", config.name, gpu.address),
                target: Target::Counts(if mode == Mode::Clear { vec![] } else { types }),
            });
            continue;
        }
        if let Some(list) = pins.remove(&gpu.address) {
            let entry = format!("vgpu-configs.{}", config.name);
            let target = list
                .into_iter()
                .map(|(vf, ty)| (vf, if mode == Mode::Clear { None } else { ty }))
                .collect();
            out.push(Selected {
                subject: Subject::Gpu(gpu),
                index,
                entry,
                target: Target::Pins(target),
            });
            continue;
        }
        let Some(cands) = by_gpu.remove(&gpu.address) else {
            continue;
        };
        let (n, types) = choose_entry(topology, gpu, &cands, &at)?;
        out.push(Selected {
            subject: Subject::Gpu(gpu),
            index,
            entry: at(n),
            target: Target::Counts(if mode == Mode::Clear { vec![] } else { types }),
        });
    }
    for (id, (parent, types)) in named {
        out.push(Selected {
            subject: Subject::Named(parent),
            index: None,
            entry: format!("vgpu-configs.{}.{id}", config.name),
            target: Target::Counts(if mode == Mode::Clear { vec![] } else { types }),
        });
    }
    Ok(out)
}

/// NVIDIA's tool applies every matching entry in turn, so with two entries for one PCI ID (RTX
/// 8000 and RTX 6000 share 0x1E78) the last one wins and fails on the other board. Here the entry
/// whose types the GPU offers is chosen; two that both fit it are an error.
fn choose_entry(
    topology: &NodeTopology,
    gpu: &Gpu,
    cands: &[(usize, &Want)],
    at: &dyn Fn(usize) -> String,
) -> Result<(usize, Vec<TypeCount>), LayoutError> {
    let types_of = |w: &Want| match w {
        Want::Counts { types } => types.clone(),
        Want::VfType { .. } => vec![],
    };
    if let [(n, w)] = cands {
        return Ok((*n, types_of(w)));
    }
    let view = View::new(topology, gpu);
    let mut fitting: Vec<(usize, Vec<TypeCount>)> = Vec::new();
    let mut first_err = None;
    for (n, w) in cands {
        let types = types_of(w);
        match view.resolve_all(&types) {
            Ok(_) => {
                if let Some((m, t)) = fitting.first() {
                    if *t != types {
                        return Err(LayoutError::AmbiguousEntries {
                            gpu: view.label.clone(),
                            first: at(*m),
                            second: at(*n),
                        });
                    }
                } else {
                    fitting.push((*n, types));
                }
            }
            Err(e) => {
                first_err.get_or_insert(e);
            }
        }
    }
    match (fitting.into_iter().next(), first_err) {
        (Some(found), _) => Ok(found),
        (None, Some(e)) => Err(e),
        (None, None) => Ok((cands[0].0, vec![])),
    }
}

fn build(
    config: &LayoutConfig,
    topology: &NodeTopology,
    options: PlanOptions,
    check_capacity: bool,
) -> Result<Plan, LayoutError> {
    let mut warnings = Vec::new();
    let selected = select(config, topology, options.mode, &mut warnings)?;
    // UUIDs of instances anywhere on the host: a new layout slot never takes one of these, except
    // those this plan removes first.
    let mut taken: BTreeSet<MdevUuid> = topology
        .mediated_devices
        .parents
        .iter()
        .flat_map(|p| p.instances.iter().filter_map(|i| i.uuid))
        .collect();
    let mut gpus = Vec::with_capacity(selected.len());
    for s in selected {
        let view = match s.subject {
            Subject::Gpu(gpu) => View::new(topology, gpu),
            Subject::Named(parent) => View::named(parent),
        };
        let mut gp = match &s.target {
            Target::Counts(types) => plan_counts(&view, types, options)?,
            Target::Pins(pins) => plan_pins(&view, pins, options)?,
        };
        gp.index = s.index;
        gp.entry = s.entry;
        if gp.refused.is_none() && !gp.enable_sriov {
            for r in &gp.remove {
                if let Some(u) = r.uuid {
                    taken.remove(&u);
                }
            }
            if check_capacity {
                let pool = topology.pool(&view.key);
                if view.gpu.is_none() && pool.is_none() {
                    if let Some(w) = place_by_driver_counts(&view, &mut gp)? {
                        warnings.push(w);
                    }
                } else {
                    place(&view, &mut gp, pool)?;
                }
            }
            let mut slot = 0u32;
            for c in gp
                .create
                .iter_mut()
                .filter(|c| c.framework == VgpuFramework::Mdev)
            {
                let uuid = loop {
                    let u = match &view.key {
                        ParentId::Pci(a) => MdevUuid::for_layout_slot(&topology.node, a, slot),
                        ParentId::Named(n) => {
                            MdevUuid::for_named_parent_slot(&topology.node, n, slot)
                        }
                    };
                    slot += 1;
                    if !taken.contains(&u) {
                        break u;
                    }
                };
                taken.insert(uuid);
                c.uuid = Some(uuid);
            }
        }
        gpus.push(gp);
    }
    let mut steps = Vec::new();
    for g in gpus.iter().filter(|g| g.refused.is_none()) {
        for r in &g.remove {
            steps.push(Step::Remove {
                gpu: g.gpu.clone(),
                instance: r.clone(),
            });
        }
    }
    for g in gpus.iter().filter(|g| g.enable_sriov) {
        if let Some(gpu) = g.gpu.pci() {
            steps.push(Step::EnableSriov { gpu });
        }
    }
    for g in gpus.iter().filter(|g| g.refused.is_none()) {
        for c in &g.create {
            steps.push(Step::Create {
                gpu: g.gpu.clone(),
                instance: c.clone(),
            });
        }
    }
    for g in gpus.iter().filter(|g| g.refused.is_some()) {
        if let Some(why) = &g.refused {
            warnings.push(format!("{}: left unchanged: {why}", g.label()));
        }
    }
    Ok(Plan {
        node: topology.node.clone(),
        config: config.name.clone(),
        mode: options.mode,
        gpus,
        steps,
        warnings,
    })
}

fn empty_plan(view: &View<'_>) -> GpuPlan {
    GpuPlan {
        gpu: view.key.clone(),
        name: view.name.clone(),
        index: None,
        entry: String::new(),
        framework: view.framework(),
        types: vec![],
        keep: vec![],
        remove: vec![],
        create: vec![],
        enable_sriov: false,
        refused: None,
    }
}

/// Orders instances for keeping: in use first (never disturb a VM), then gpuslice's own layout
/// slots, then by parent and UUID so the choice is deterministic.
fn keep_order(a: &(&Parent, &Instance), b: &(&Parent, &Instance)) -> std::cmp::Ordering {
    let rank = |x: &(&Parent, &Instance)| (x.1.in_use != Some(true), x.0.id.clone(), x.1.uuid);
    rank(a).cmp(&rank(b))
}

fn plan_counts(
    view: &View<'_>,
    types: &[TypeCount],
    options: PlanOptions,
) -> Result<GpuPlan, LayoutError> {
    let mut gp = empty_plan(view);
    let instances: Vec<(&Parent, &Instance)> = view.instances().collect();
    if view.needs_sriov() {
        if !types.is_empty() {
            gp.enable_sriov = true;
            gp.types = types
                .iter()
                .map(|t| TypeDiff {
                    name: t.name.clone(),
                    type_id: None,
                    have: 0,
                    want: t.count,
                })
                .collect();
        }
        return Ok(gp);
    }
    if view.parents.is_empty() && !types.is_empty() {
        let why = match view.gpu.and_then(|g| g.driver.as_deref()) {
            Some("nvidia") | None => {
                "it has no vGPU parents (is the NVIDIA vGPU host driver loaded?)".to_owned()
            }
            Some(d) => format!("it is bound to {d}, not to the NVIDIA vGPU host driver"),
        };
        return Err(LayoutError::NotVgpuCapable {
            gpu: view.label.clone(),
            why,
        });
    }
    let wanted = view.resolve_all(types)?;
    let mut used = vec![false; instances.len()];
    for w in &wanted {
        let mut matching: Vec<(usize, &(&Parent, &Instance))> = instances
            .iter()
            .enumerate()
            .filter(|(_, (_, i))| match &w.id {
                Some(id) => i.profile == *id,
                None => view.name_of(i).is_some_and(|n| names_match(&n, &w.name)),
            })
            .collect();
        matching.sort_by(|a, b| keep_order(a.1, b.1));
        let have = u32::try_from(matching.len()).unwrap_or(u32::MAX);
        for (k, (p, i)) in matching.iter().take(w.count as usize) {
            used[*k] = true;
            gp.keep.push(view.planned(p, i));
        }
        gp.types.push(TypeDiff {
            name: w.requested.clone(),
            type_id: w.id.clone(),
            have,
            want: w.count,
        });
        for _ in have..w.count {
            gp.create.push(PlannedInstance {
                framework: view.framework().unwrap_or(VgpuFramework::Mdev),
                parent: view.key.clone(),
                uuid: None,
                type_id: w.id.clone(),
                type_name: Some(w.name.clone()),
                framebuffer_mib: w.profile.framebuffer_mib,
                in_use: None,
            });
        }
    }
    let mut unwanted: BTreeMap<VgpuTypeId, (String, u32)> = BTreeMap::new();
    for (k, (p, i)) in instances.iter().enumerate() {
        if used[k] {
            continue;
        }
        gp.remove.push(view.planned(p, i));
        let matched = wanted.iter().any(|w| w.id.as_ref() == Some(&i.profile));
        if !matched {
            let e = unwanted
                .entry(i.profile.clone())
                .or_insert_with(|| (view.name_of(i).unwrap_or_else(|| i.profile.to_string()), 0));
            e.1 += 1;
        }
    }
    for (id, (name, have)) in unwanted {
        gp.types.push(TypeDiff {
            name: strip_prefix(&name).to_owned(),
            type_id: Some(id),
            have,
            want: 0,
        });
    }
    refuse_in_use(&mut gp, options);
    Ok(gp)
}

fn plan_pins(
    view: &View<'_>,
    pins: &[(PciAddress, Option<TypeRef>)],
    options: PlanOptions,
) -> Result<GpuPlan, LayoutError> {
    let mut gp = empty_plan(view);
    let mut tally: BTreeMap<String, (Option<VgpuTypeId>, u32, u32)> = BTreeMap::new();
    for (vf, want) in pins {
        let Some(parent) = view.parents.iter().find(|p| p.id == ParentId::Pci(*vf)) else {
            continue;
        };
        let want = want.as_ref().map(|r| view.resolve_ref(r)).transpose()?;
        let current = parent.instances.first();
        if let Some(i) = current {
            let name = view.name_of(i).unwrap_or_else(|| i.profile.to_string());
            let e = tally.entry(strip_prefix(&name).to_owned()).or_insert((
                Some(i.profile.clone()),
                0,
                0,
            ));
            e.1 += 1;
        }
        if let Some(w) = &want {
            let e = tally
                .entry(strip_prefix(&w.name).to_owned())
                .or_insert((w.id.clone(), 0, 0));
            e.2 += 1;
        }
        let same = match (current, &want) {
            (Some(i), Some(w)) => w.id.as_ref() == Some(&i.profile),
            (None, None) => true,
            _ => false,
        };
        if same {
            if let Some(i) = current {
                gp.keep.push(view.planned(parent, i));
            }
            continue;
        }
        if let Some(i) = current {
            gp.remove.push(view.planned(parent, i));
        }
        if let Some(w) = want {
            gp.create.push(PlannedInstance {
                framework: parent.framework,
                parent: parent.id.clone(),
                uuid: None,
                type_id: w.id,
                type_name: Some(w.name),
                framebuffer_mib: w.profile.framebuffer_mib,
                in_use: None,
            });
        }
    }
    gp.types = tally
        .into_iter()
        .map(|(name, (type_id, have, want))| TypeDiff {
            name,
            type_id,
            have,
            want,
        })
        .collect();
    refuse_in_use(&mut gp, options);
    Ok(gp)
}

fn refuse_in_use(gp: &mut GpuPlan, options: PlanOptions) {
    if options.force {
        return;
    }
    let busy: Vec<String> = gp
        .remove
        .iter()
        .filter(|r| r.in_use == Some(true))
        .map(|r| format!("{} {}", r.type_label(), r.label()))
        .collect();
    if !busy.is_empty() {
        gp.refused = Some(format!(
            "in use by a VM, not removed without --force: {}",
            busy.join(", ")
        ));
    }
}

/// Simulates the GPU's pool (removals first, then creations largest framebuffer first) and picks a
/// parent for each creation that has no fixed one.
fn place(view: &View<'_>, gp: &mut GpuPlan, pool: Option<&Pool>) -> Result<(), LayoutError> {
    let mut pool = pool.cloned();
    let mut occupied: BTreeSet<ParentId> = BTreeSet::new();
    let removed: BTreeSet<(ParentId, Option<MdevUuid>)> = gp
        .remove
        .iter()
        .map(|r| (r.parent.clone(), r.uuid))
        .collect();
    for (p, i) in view.instances() {
        if !removed.contains(&(p.id.clone(), i.uuid)) {
            occupied.insert(p.id.clone());
        }
    }
    for r in &gp.remove {
        if let (Some(pool), Some(id)) = (pool.as_mut(), &r.type_id) {
            let inst = Instance {
                uuid: r.uuid,
                address: None,
                profile: id.clone(),
                profile_name: r.type_name.clone(),
                framebuffer_mib: r.framebuffer_mib,
                in_use: None,
            };
            pool.release(&view.profile_of(&inst));
        }
    }
    // Pinned creations have their VF already; count it as taken before placing the others.
    for c in &gp.create {
        if c.parent != view.key {
            occupied.insert(c.parent.clone());
        }
    }
    let profile_for = |c: &PlannedInstance| -> Profile {
        match &c.type_id {
            Some(id) => view
                .known
                .iter()
                .find(|k| k.id == *id)
                .map(|k| k.profile.clone())
                .unwrap_or_else(|| {
                    synth_profile(id, c.type_name.as_deref().unwrap_or(""), c.framebuffer_mib)
                }),
            None => {
                let mut p = synth_profile(
                    &VgpuTypeId::from_str_unchecked("0"),
                    c.type_name.as_deref().unwrap_or(""),
                    c.framebuffer_mib,
                );
                p.mig_slices = c
                    .type_name
                    .as_deref()
                    .and_then(|n| VgpuTypeName::parse(n).ok())
                    .and_then(|n| n.mig_slices);
                p
            }
        }
    };
    let size = |c: &PlannedInstance| {
        let p = profile_for(c);
        (p.mig_slices.unwrap_or(0), p.framebuffer_mib.unwrap_or(0))
    };
    gp.create.sort_by_key(|c| std::cmp::Reverse(size(c)));
    // Per (parent, type): what a multi-instance parent may still take when no pool is known.
    let mut spare: BTreeMap<(ParentId, VgpuTypeId), u32> = BTreeMap::new();
    let mut placed_of: BTreeMap<String, u32> = BTreeMap::new();
    let creates = std::mem::take(&mut gp.create);
    let mut out = Vec::with_capacity(creates.len());
    let mut totals: BTreeMap<String, u32> = BTreeMap::new();
    for c in &creates {
        *totals
            .entry(c.type_name.clone().unwrap_or_default())
            .or_default() += 1;
    }
    let total_of = |name: &str| totals.get(name).copied().unwrap_or(0);
    for mut c in creates {
        let profile = profile_for(&c);
        let type_name = strip_prefix(c.type_name.as_deref().unwrap_or("?")).to_owned();
        let misfit = |why: String, placed: &BTreeMap<String, u32>| LayoutError::DoesNotFit {
            gpu: view.label.clone(),
            type_name: type_name.clone(),
            want: total_of(c.type_name.as_deref().unwrap_or_default()),
            fit: placed.get(&type_name).copied().unwrap_or(0),
            why,
        };
        if let Some(pool) = pool.as_mut() {
            if let Err(m) = pool.check(&profile) {
                return Err(misfit(
                    format!("{m} ({} MiB total)", pool.total_mib),
                    &placed_of,
                ));
            }
            pool.charge(&profile);
        }
        if c.parent == view.key {
            let offers = |p: &Parent| match &c.type_id {
                Some(id) => p.profiles.iter().any(|pr| pr.id == *id),
                None => p.framework == VgpuFramework::VendorVfio,
            };
            let mut chosen = None;
            for p in &view.parents {
                if single_instance(p) {
                    if occupied.contains(&p.id)
                        || !(offers(p) || p.framework == VgpuFramework::VendorVfio)
                    {
                        continue;
                    }
                    occupied.insert(p.id.clone());
                    chosen = Some(*p);
                    break;
                }
                if !offers(p) {
                    continue;
                }
                if pool.is_none() {
                    let Some(id) = &c.type_id else { continue };
                    let left = spare.entry((p.id.clone(), id.clone())).or_insert_with(|| {
                        let freed = gp
                            .remove
                            .iter()
                            .filter(|r| r.parent == p.id && r.type_id.as_ref() == Some(id))
                            .count();
                        let avail = p
                            .profiles
                            .iter()
                            .find(|pr| pr.id == *id)
                            .map_or(0, |pr| pr.available_instances);
                        avail.saturating_add(u32::try_from(freed).unwrap_or(u32::MAX))
                    });
                    if *left == 0 {
                        continue;
                    }
                    *left -= 1;
                }
                chosen = Some(*p);
                break;
            }
            let Some(p) = chosen else {
                let free = view
                    .parents
                    .iter()
                    .filter(|p| single_instance(p) && !occupied.contains(&p.id))
                    .count();
                return Err(misfit(
                    format!("no free vGPU parent offers it ({free} free VFs)"),
                    &placed_of,
                ));
            };
            c.parent = p.id.clone();
            c.framework = p.framework;
        }
        *placed_of.entry(type_name).or_default() += 1;
        out.push(c);
    }
    gp.create = out;
    Ok(())
}

/// A common multiple of `values` (zeros skipped), or `None` past 2^64, where the sums of counts
/// times costs could no longer be added up exactly.
fn common_multiple(values: impl Iterator<Item = u32>) -> Option<u128> {
    let mut l: u128 = 1;
    for v in values.filter(|v| *v > 0) {
        let v = u128::from(v);
        let (mut a, mut b) = (l, v);
        while b != 0 {
            (a, b) = (b, a % b);
        }
        l = (l / a)
            .checked_mul(v)
            .filter(|x| *x <= u128::from(u64::MAX))?;
    }
    Some(l)
}

/// Checks the creations on a virtual mdev parent whose types have no known size (the kernel's
/// sample drivers): the driver's `availableInstances` are the only truth, and its types share
/// one pool (mbochs: 64 small, 16 medium or 4 large; 63/15/3 after one small).
///
/// With the free capacity taken as `L` units (a common multiple of every count `a` and `a + 1`),
/// one more instance of a type offered `a` times costs more than `L / (a + 1)` and at most
/// `L / a` units, and removing one frees as much (an unknown amount when `a` is 0). On a parent
/// with no instances the cost is read as exactly `L / a`: the types' sizes divide the empty
/// pool, as they do for every sample driver, and the scheduler reads the counts the same way.
///
/// A layout that fits at the upper bounds is accepted; one that cannot fit even at the lower
/// bounds (the exact reading on an empty parent) is refused with the driver's numbers, nothing
/// written. In between, it is accepted with a warning: the executor re-reads the counts before
/// each create and rolls back on a misfit.
fn place_by_driver_counts(
    view: &View<'_>,
    gp: &mut GpuPlan,
) -> Result<Option<String>, LayoutError> {
    let Some(parent) = view.parents.first() else {
        return Ok(None);
    };
    if gp.create.is_empty() {
        return Ok(None);
    }
    let avail = |id: Option<&VgpuTypeId>| {
        id.and_then(|id| parent.profiles.iter().find(|p| p.id == *id))
            .map_or(0, |p| p.available_instances)
    };
    let counts = parent.profiles.iter().flat_map(|p| {
        [
            p.available_instances,
            p.available_instances.saturating_add(1),
        ]
    });
    let unit = common_multiple(counts);
    let lower = |a: u32, l: u128| l / (u128::from(a) + 1);
    let upper = |a: u32, l: u128| (a > 0).then(|| l / u128::from(a));
    let size = |c: &PlannedInstance| unit.map_or(0, |l| lower(avail(c.type_id.as_ref()), l));
    gp.create.sort_by_key(|c| std::cmp::Reverse(size(c)));

    let mut totals: BTreeMap<String, u32> = BTreeMap::new();
    for c in &gp.create {
        *totals.entry(c.type_label()).or_default() += 1;
    }
    let offered: Vec<String> = parent
        .profiles
        .iter()
        .map(|p| format!("{} {}", p.available_instances, p.name))
        .collect();
    let misfit = |c: &PlannedInstance, placed: &BTreeMap<String, u32>| {
        let ty = c.type_label();
        let freed = if gp.remove.is_empty() {
            String::new()
        } else {
            format!(" before the {} removals", gp.remove.len())
        };
        LayoutError::DoesNotFit {
            gpu: view.label.clone(),
            want: totals.get(&ty).copied().unwrap_or(0),
            fit: placed.get(&ty).copied().unwrap_or(0),
            type_name: ty,
            why: format!(
                "the pool is full (the driver reports {} available{freed}; the types of {} \
                 share one pool)",
                offered.join(", "),
                view.name
            ),
        }
    };
    let mut placed: BTreeMap<String, u32> = BTreeMap::new();
    let mut uncertain = false;
    match unit {
        Some(l) => {
            let mut free_lo = l;
            let mut free_hi = Some(l);
            for r in &gp.remove {
                let a = avail(r.type_id.as_ref());
                let known = parent
                    .profiles
                    .iter()
                    .any(|p| Some(&p.id) == r.type_id.as_ref());
                if known {
                    free_lo += lower(a, l);
                }
                free_hi = free_hi
                    .zip(upper(a, l).filter(|_| known))
                    .map(|(f, u)| f + u);
            }
            let empty = parent.instances.is_empty();
            let (mut used_lo, mut used_hi, mut strict) = (0u128, 0u128, false);
            for c in &gp.create {
                let a = avail(c.type_id.as_ref());
                match upper(a, l) {
                    Some(u) if empty => used_lo += u,
                    _ => {
                        used_lo += lower(a, l);
                        strict = true;
                    }
                }
                // The true use exceeds a strict lower bound, so reaching the free room is a misfit.
                if free_hi.is_some_and(|f| used_lo > f || (strict && used_lo >= f)) {
                    return Err(misfit(c, &placed));
                }
                used_hi = used_hi.saturating_add(upper(a, l).unwrap_or(u128::MAX));
                uncertain |= used_hi > free_lo;
                *placed.entry(c.type_label()).or_default() += 1;
            }
        }
        None => {
            // Counts too irregular for exact sums: each type on its own, the rest left to the
            // executor's re-reads.
            uncertain = true;
            for c in &gp.create {
                let freed = gp.remove.iter().filter(|r| r.type_id == c.type_id).count();
                let room = avail(c.type_id.as_ref())
                    .saturating_add(u32::try_from(freed).unwrap_or(u32::MAX));
                let n = placed.entry(c.type_label()).or_default();
                if *n >= room {
                    return Err(misfit(c, &placed));
                }
                *n += 1;
            }
        }
    }
    if !uncertain {
        return Ok(None);
    }
    let wanted: Vec<String> = totals.iter().map(|(t, n)| format!("{n} × {t}")).collect();
    Ok(Some(format!(
        "{}: the driver's counts cannot tell whether {} fit together (its types share one pool of \
         unknown size); the counts are re-read before each create, and a misfit is rolled back",
        view.label,
        wanted.join(" and ")
    )))
}
