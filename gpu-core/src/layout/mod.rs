//! Declarative vGPU layouts: NVIDIA's `vgpu-device-manager` config files, read unchanged, and a
//! pure planner that turns one of their configs into the writes a host needs.
//!
//! A layout file names configs; each config says which GPUs (by NVIDIA's index, optionally
//! narrowed by PCI IDs, or by address) or virtual mdev parents (by name, such as the kernel's
//! sample driver `mbochs`) should hold which vGPU types and how many. The planner
//! compares that with a [`NodeTopology`] and produces a [`Plan`]: the instances to keep, the surplus
//! to remove, and the ones to create, largest framebuffer first, with the GPU's framebuffer pool
//! simulated step by step so a plan that cannot fit is refused before anything is written.
//!
//! Unlike NVIDIA's tool, instances that already match are kept (a MIG suffix such as `ME` matches
//! the driver's base name when the driver lists only that), instances open by a VM are never
//! planned for removal without `force`, only the GPUs the config selects are looked at, and both
//! vGPU frameworks are handled: mdev (instances named by stable UUIDs) and NVIDIA's vendor-specific
//! VFIO (a type written to a virtual function). The executor that performs a plan lives in
//! `gpu-sysfs`; this module never touches the host.

pub(crate) mod config;
mod plan;

pub use config::{
    DeviceFilter, Devices, Entry, LayoutConfig, LayoutFile, Selector, TypeCount, TypeRef, Want,
    nvidia_indices,
};
pub use plan::{
    Assertion, GpuLayoutPlan, Mode, Plan, PlanOptions, PlannedInstance, Step, TypeDiff, TypeNames,
    assert_layout, assert_layout_named, mixed_sizes_asked, plan_layout, plan_layout_named,
    wanted_counts, wanted_types,
};

use crate::topology::NodeTopology;

/// Why a layout could not be read or planned.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LayoutError {
    /// The text is not YAML.
    #[error("cannot read the layout file: {message}")]
    Decode {
        /// The YAML parser's message (with line and column).
        message: String,
    },
    /// A key or value is not what the format allows.
    #[error("{at}: {why}")]
    Invalid {
        /// Where: `vgpu-configs.NAME[i].vgpu-devices.TYPE`.
        at: String,
        /// What is wrong.
        why: String,
    },
    /// Two requested names denote the same type.
    #[error("{at}: {first:?} and {second:?} are the same vGPU type ({resolved}); list it once")]
    DuplicateType {
        /// The entry or GPU.
        at: String,
        /// The first name.
        first: String,
        /// The second name.
        second: String,
        /// The type both resolve to.
        resolved: String,
    },
    /// `-c NAME` names no config of the file.
    #[error("no config named {name:?} in the layout file (it has: {known})")]
    UnknownConfig {
        /// The requested name.
        name: String,
        /// The names the file has.
        known: String,
    },
    /// The file has several configs and none was chosen.
    #[error("the layout file has {count} configs; choose one with -c NAME (it has: {known})")]
    ConfigNotChosen {
        /// How many configs there are.
        count: usize,
        /// Their names.
        known: String,
    },
    /// A GPU does not offer a requested type.
    #[error("{gpu}: vGPU type {name:?} is not offered by this GPU (it offers: {offered})")]
    UnknownType {
        /// The GPU (`nvidia0 (0000:08:00.0)`).
        gpu: String,
        /// The requested name or ID.
        name: String,
        /// What it offers.
        offered: String,
    },
    /// A type name for another board than the GPU's; nothing was written.
    #[error(
        "{gpu}: vGPU type {name:?} is for the {board} board, not this GPU's ({gpu_board}); \
         nothing was written"
    )]
    WrongBoard {
        /// The GPU (`nvidia0 (0000:26:00.0)`).
        gpu: String,
        /// The requested name.
        name: String,
        /// The requested name's board part.
        board: String,
        /// The GPU's board (`L40S`), or why it is not known.
        gpu_board: String,
    },
    /// Two entries select one GPU with different layouts that both fit it.
    #[error(
        "{gpu} is selected by both {first} and {second}; narrow them with device-filter or indices"
    )]
    AmbiguousEntries {
        /// The GPU.
        gpu: String,
        /// The first entry.
        first: String,
        /// The second entry.
        second: String,
    },
    /// A selected GPU cannot hold vGPUs.
    #[error("{gpu} cannot hold vGPUs: {why}")]
    NotVgpuCapable {
        /// The GPU.
        gpu: String,
        /// Why.
        why: String,
    },
    /// An address in the per-address forms names no GPU or VF of the host.
    #[error("{at}: {address} {why}")]
    UnknownDevice {
        /// Where in the file.
        at: String,
        /// The address.
        address: String,
        /// What is wrong with it.
        why: String,
    },
    /// Two forms claim one GPU.
    #[error("{gpu}: {why}")]
    Conflict {
        /// The GPU.
        gpu: String,
        /// What conflicts.
        why: String,
    },
    /// The wanted instances do not fit the GPU; nothing was changed.
    #[error("{gpu}: {want} × {type_name} do not fit: {fit} fit, then {why}")]
    DoesNotFit {
        /// The GPU.
        gpu: String,
        /// The type.
        type_name: String,
        /// Instances wanted beyond those kept.
        want: u32,
        /// How many of them fit.
        fit: u32,
        /// The pool's numbers at the first misfit.
        why: String,
    },
}

impl crate::error::ClassifiedError for LayoutError {
    fn kind(&self) -> crate::ErrorKind {
        self.kind()
    }
}

impl LayoutError {
    /// The kind of this error (`does-not-fit`, `unknown-config`, ...), from gpuslice's one
    /// vocabulary of error kinds.
    pub fn kind(&self) -> crate::ErrorKind {
        use crate::ErrorKind as K;
        match self {
            LayoutError::Decode { .. } => K::LayoutDecode,
            LayoutError::Invalid { .. } => K::LayoutInvalid,
            LayoutError::DuplicateType { .. } => K::DuplicateType,
            LayoutError::UnknownConfig { .. } => K::UnknownConfig,
            LayoutError::ConfigNotChosen { .. } => K::ConfigNotChosen,
            LayoutError::UnknownType { .. } => K::UnknownType,
            LayoutError::WrongBoard { .. } => K::WrongBoard,
            LayoutError::AmbiguousEntries { .. } => K::AmbiguousEntries,
            LayoutError::NotVgpuCapable { .. } => K::NotVgpuCapable,
            LayoutError::UnknownDevice { .. } => K::UnknownDevice,
            LayoutError::Conflict { .. } => K::Conflict,
            LayoutError::DoesNotFit { .. } => K::DoesNotFit,
        }
    }
}

/// Plans config `config_name` of the layout file `config_text` against `topology`: the one pure
/// entry point the CLI and the bindings share. An empty `config_name` picks the file's only config.
///
/// # Errors
/// Any [`LayoutError`]: the file is malformed, the config is unknown, a type is not offered, or
/// the layout does not fit.
pub fn plan_vgpu_config(
    config_text: &str,
    config_name: &str,
    topology: &NodeTopology,
) -> Result<Plan, LayoutError> {
    let file = LayoutFile::parse(config_text)?;
    let config = file.select((!config_name.is_empty()).then_some(config_name))?;
    plan_layout(config, topology, &PlanOptions::default())
}
