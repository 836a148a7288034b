//! What a plan is made of: modes, options, planned instances, per-GPU diffs and steps.

use super::*;

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

/// The layout plan for one GPU: have and want per type, and the instances kept, removed and
/// created on it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GpuLayoutPlan {
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

impl GpuLayoutPlan {
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
    pub gpus: Vec<GpuLayoutPlan>,
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
    pub fn refused(&self) -> impl Iterator<Item = &GpuLayoutPlan> {
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
    pub gpus: Vec<GpuLayoutPlan>,
    /// Human-readable differences, one per GPU and type.
    pub diff: Vec<String>,
}
