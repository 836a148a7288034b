//! The one vGPU size each GPU offers before Kubernetes 1.36.2, read from a layout config.
//!
//! Under the one-size-per-instance encoding a GPU that no vGPU locks yet offers a single size
//! ([`super::DraOptions::size_for`]). When the node is kept to a layout (`vgpu apply`, the agent's
//! `--layout`), the size to offer is the one the layout is about to make: the first vGPU type the
//! config asks of the GPU. `gpuslice export dra --layout` and the agent's publisher both take it
//! from here, and `--size-for` wins over it for the GPUs it names.

use std::collections::BTreeMap;

use gpu_core::layout::{LayoutConfig, LayoutError, wanted_types};
use gpu_core::nvidia::VgpuTypeName;
use gpu_core::{NodeTopology, PciAddress};

/// The size each GPU of a node offers under a layout config, and what could not be kept.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LayoutSizes {
    /// The profile each GPU the config names offers (its first wanted type).
    pub sizes: BTreeMap<PciAddress, String>,
    /// GPUs the config gives types of more than one size: they offer the first one's.
    pub warnings: Vec<String>,
}

/// The profile each GPU of `node` offers before 1.36.2 under `config`: the first type the config
/// asks of it. GPUs the config leaves alone are not named.
///
/// # Errors
/// What [`wanted_types`] returns: the config names a GPU, VF or parent the node does not have.
pub fn layout_sizes(
    config: &LayoutConfig,
    node: &NodeTopology,
) -> Result<LayoutSizes, LayoutError> {
    let mut out = LayoutSizes::default();
    let size = |n: &str| VgpuTypeName::parse(n).ok().map(|t| t.framebuffer_mib());
    for (gpu, names) in wanted_types(config, node)? {
        let Some(first) = names.first() else { continue };
        if names.iter().any(|n| size(n) != size(first)) {
            out.warnings.push(format!(
                "{gpu} is given vGPUs of more than one size ({}); before Kubernetes 1.36.2 it offers {first}'s size",
                names.join(", ")
            ));
        }
        out.sizes.insert(gpu, first.clone());
    }
    Ok(out)
}
