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

/// A `GPU=PROFILE` value (`--size-for`) that is not one; each names the value given.
#[derive(Debug, thiserror::Error)]
pub enum SizeForError {
    /// No `=` in it.
    #[error("{given:?}: expected GPU=PROFILE (0000:41:00.0=L40S-8Q)")]
    NoEquals {
        /// The value given.
        given: String,
    },
    /// The part before `=` is not a PCI address.
    #[error("{given:?}: GPU {gpu:?} is not a PCI address: {source}")]
    NotAddress {
        /// The value given.
        given: String,
        /// The part before `=`.
        gpu: String,
        /// Why it is not an address.
        source: Box<gpu_core::CoreError>,
    },
    /// Nothing after `=`.
    #[error("{given:?}: no profile after =")]
    NoProfile {
        /// The value given.
        given: String,
    },
}

/// Parses `GPU=PROFILE`, the profile a GPU offers while no vGPU locks its size
/// (`0000:41:00.0=L40S-8Q`), spaces around either part ignored.
///
/// # Errors
/// A [`SizeForError`] naming the value.
pub fn parse_size_for(s: &str) -> Result<(PciAddress, String), SizeForError> {
    let given = || s.to_owned();
    let (gpu, profile) = s
        .split_once('=')
        .ok_or_else(|| SizeForError::NoEquals { given: given() })?;
    let gpu = gpu
        .trim()
        .parse()
        .map_err(|source| SizeForError::NotAddress {
            given: given(),
            gpu: gpu.to_owned(),
            source: Box::new(source),
        })?;
    let profile = profile.trim();
    if profile.is_empty() {
        return Err(SizeForError::NoProfile { given: given() });
    }
    Ok((gpu, profile.to_owned()))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn a_size_for_value_that_is_not_gpu_equals_profile_is_refused_naming_it() {
        let (gpu, profile) = parse_size_for(" 0000:41:00.0 = L40S-8Q ").unwrap();
        assert_eq!(
            (gpu.to_string().as_str(), profile.as_str()),
            ("0000:41:00.0", "L40S-8Q")
        );
        assert_eq!(
            parse_size_for("L40S-8Q").unwrap_err().to_string(),
            "\"L40S-8Q\": expected GPU=PROFILE (0000:41:00.0=L40S-8Q)"
        );
        assert_eq!(
            parse_size_for("0000:41:00.0=").unwrap_err().to_string(),
            "\"0000:41:00.0=\": no profile after ="
        );
        let e = parse_size_for("gpu0=L40S-8Q").unwrap_err();
        let address = "gpu0".parse::<PciAddress>().unwrap_err();
        assert_eq!(
            e.to_string(),
            format!("\"gpu0=L40S-8Q\": GPU \"gpu0\" is not a PCI address: {address}")
        );
        assert!(
            std::error::Error::source(&e).is_some(),
            "the address error is its source"
        );
    }
}
