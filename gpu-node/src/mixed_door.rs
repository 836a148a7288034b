//! The one door every front-end creates a vGPU through when it may mix sizes: NVML opened the
//! way every front-end shares ([`crate::mig::open::open_nvml`]: the local driver's, a sandbox's
//! saved one), the writer given it for mixed-size placement ([`crate::Node::with_mixed_sizes`])
//! and for MIG on request ([`crate::Node::create_vgpu_with_mig`], called, not copied).
//!
//! The policy (docs/partitions.md, "Mixed-size vGPUs"): a GPU already in mixed-size mode is
//! used as such by every create; a GPU in same-size mode is turned to mixed-size mode only when
//! the request asks for it (`mixed`) and the GPU is idle. Asked without NVML, the create is
//! refused, never guessed.

use gpu_core::{MdevUuid, ParentId, PciAddress};
use gpu_sysfs::actuate::Created;

use crate::mig::{InstanceView, MigError};
use crate::mixed::{MixedError, PlacementPlan};
use crate::node::Locked;
use crate::{Node, NodeError, Target};
use gpu_nvml::NvmlDevices;

/// Creates a vGPU of `profile` on `parent` through `node`, with NVML where the root has one
/// (mixed-size placement, MIG on request), else as [`Node::create_vgpu`]. `mixed`: the request
/// asks for mixed-size mode to be turned on where the GPU is idle.
///
/// # Errors
/// [`NodeError::Mixed`] ([`MixedError::NoNvml`]) when `mixed` is asked of a root without NVML;
/// what [`Node::create_vgpu_with_mig`] and [`Node::create_vgpu`] answer.
#[allow(clippy::too_many_arguments)]
pub fn create_on_request<E: From<NodeError> + From<MigError>>(
    node: &Node<'_>,
    root: &gpu_sysfs::OpenedRoot,
    parent: &ParentId,
    profile: &str,
    force: bool,
    mixed: bool,
    gpu_named: impl Fn(&str) -> Result<PciAddress, E>,
    name: impl Fn(&Target) -> Result<Option<MdevUuid>, E>,
) -> Result<(Created, Option<InstanceView>), E> {
    match crate::mig::open::open_nvml(root, &gpu_health::NvmlSource::LocalOnly) {
        Ok(nvml) => create_with_nvml(
            node,
            nvml.as_ref(),
            parent,
            profile,
            force,
            mixed,
            gpu_named,
            name,
        ),
        Err(MigError::NoNvml { why }) if mixed => {
            Err(NodeError::Mixed(Box::new(MixedError::NoNvml { why })).into())
        }
        Err(_) => Ok((
            node.create_vgpu(parent, profile, force, gpu_named, name)?,
            None,
        )),
    }
}

/// [`create_on_request`] with the node's NVML given: mixed-size placement (`mixed`: turn the
/// mode on where the GPU is idle), a type the driver time-slices inside GPU instances placed
/// in the instance with room or a new one ([`crate::mixed_mig::before_vgpu_in_instance`]),
/// other MIG-backed types with their instance made on request
/// ([`Node::create_vgpu_with_mig`]).
///
/// # Errors
/// As [`create_on_request`].
#[allow(clippy::too_many_arguments)]
pub fn create_with_nvml<E: From<NodeError> + From<MigError>>(
    node: &Node<'_>,
    nvml: &dyn NvmlDevices,
    parent: &ParentId,
    profile: &str,
    force: bool,
    mixed: bool,
    gpu_named: impl Fn(&str) -> Result<PciAddress, E>,
    name: impl Fn(&Target) -> Result<Option<MdevUuid>, E>,
) -> Result<(Created, Option<InstanceView>), E> {
    let node = node.with_mixed_sizes(nvml).mixed_sizes_on_request(mixed);
    let mig = node.mig(nvml);
    // A type the driver time-slices inside GPU instances (Blackwell RTX PRO): the instance
    // with room, or a new one, then the vGPU as any other.
    if let Some(gpu) = in_mig_mode(&node, nvml, parent) {
        if let Some((_, made)) =
            crate::mixed_mig::before_vgpu_in_instance(node.host, &mig, nvml, &gpu, profile, false)?
        {
            return match node.create_vgpu(parent, profile, force, gpu_named, name) {
                Ok(c) => Ok((c, made)),
                Err(e) => {
                    if let Some(gi) = &made {
                        // Undo what this call made; the vGPU's own error is the answer.
                        let _ = mig.destroy(&gpu, gi.id, false);
                    }
                    Err(e)
                }
            };
        }
    }
    node.create_vgpu_with_mig(&mig, parent, profile, force, gpu_named, name)
}

/// The GPU of a PCI `parent` (a VF's physical function) when NVML has it in MIG mode.
fn in_mig_mode(node: &Node<'_>, nvml: &dyn NvmlDevices, parent: &ParentId) -> Option<PciAddress> {
    let ParentId::Pci(a) = parent else {
        return None;
    };
    let gpu = crate::mixed_create::gpu_of(node.host, a);
    let modes = nvml.mig_mode(&gpu).ok()?;
    (modes.current == gpu_nvml::MigMode::Enabled && !modes.is_pending()).then_some(gpu)
}

impl Locked<'_, '_> {
    /// For a writer that holds the lock across its own steps (the agent): what a create of
    /// `profile` on `parent` must do first on a GPU in (or, with `turn_on`, going to)
    /// mixed-size mode, checked before any write, with the mode turned on where planned. `None`:
    /// today's one-size rule applies. Call [`Locked::mixed_placed`] after the type write.
    ///
    /// # Errors
    /// As [`crate::Node::create_vgpu`]'s mixed-size refusals, and the mode's write.
    pub fn mixed_before(
        &self,
        nvml: &dyn NvmlDevices,
        parent: &ParentId,
        profile: &str,
        turn_on: bool,
    ) -> Result<Option<PlacementPlan>, NodeError> {
        let plan = crate::mixed_create::check(self.node.host, nvml, parent, profile, turn_on)?;
        if let Some(p) = &plan {
            crate::mixed::turn_on(nvml, p).map_err(|e| NodeError::Mixed(Box::new(e)))?;
        }
        Ok(plan)
    }

    /// After the type write planned by [`Locked::mixed_before`]: the placement read back.
    ///
    /// # Errors
    /// [`MixedError::ReadBack`].
    pub fn mixed_placed(&self, plan: &PlacementPlan, made: &Created) -> Result<(), NodeError> {
        crate::mixed_create::read_back(self.node.host, plan, made)
    }
}
