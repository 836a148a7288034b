//! The mixed-size placements a DRA export publishes per slot
//! ([`gpu_integrations::dra::DraOptions::mixed_placements`]): for each GPU whose driver says it
//! is in mixed-size mode (`nvmlDeviceGetVgpuHeterogeneousMode`), every supported type's
//! placement size and IDs (`nvmlDeviceGetVgpuTypeSupportedPlacements`, heterogeneous mode), read
//! from NVML, never from a table. A GPU in same-size mode, one NVML does not know, or one whose
//! answer fails is left out (it keeps the framebuffer encodings), the failure said.

use std::collections::BTreeMap;
use std::path::Path;

use gpu_core::{NodeTopology, PciAddress};
use gpu_integrations::dra::{GpuPlacements, TypePlacements};
use gpu_nvml::{NvmlDevices, VgpuMode};

use crate::front::Front;

/// The placements of the GPUs among `gpus` that are in mixed-size mode, and what could not be
/// read (`GPU: why`).
pub fn placements(
    nvml: &dyn NvmlDevices,
    gpus: impl IntoIterator<Item = PciAddress>,
) -> (BTreeMap<PciAddress, GpuPlacements>, Vec<String>) {
    let mut out = BTreeMap::new();
    let mut warnings = Vec::new();
    for gpu in gpus {
        match nvml.vgpu_heterogeneous_mode(&gpu) {
            Ok(VgpuMode::Heterogeneous) => {}
            Ok(VgpuMode::Homogeneous) => continue,
            Err(e) if e.is_not_applicable() => continue,
            Err(e) => {
                warnings.push(format!("{gpu}: the vGPU size mode cannot be read: {e}"));
                continue;
            }
        }
        let types = match nvml.vgpu_supported_types(&gpu) {
            Ok(t) => t,
            Err(e) => {
                warnings.push(format!("{gpu}: its vGPU types cannot be listed: {e}"));
                continue;
            }
        };
        let mut of_gpu = GpuPlacements::new();
        for t in types {
            match nvml.vgpu_type_supported_placements(&gpu, t.id, VgpuMode::Heterogeneous) {
                Ok(p) if !p.placement_ids.is_empty() => {
                    of_gpu.insert(
                        t.id.to_string(),
                        TypePlacements {
                            placement_size: p.placement_size,
                            placement_ids: p.placement_ids,
                        },
                    );
                }
                Ok(_) => {}
                Err(e) => warnings.push(format!(
                    "{gpu}: the placements of vGPU type {} cannot be read: {e}",
                    t.id
                )),
            }
        }
        out.insert(gpu, of_gpu);
    }
    (out, warnings)
}

impl Front<'_> {
    /// The mixed-size placements of this host's GPUs in `nodes` for a DRA export
    /// (`gpuslice export dra`), through the NVML every front-end shares (the local driver's, a
    /// sandbox's saved one). None for a fleet file (`inventory`: other hosts) or a root without
    /// NVML: such GPUs keep the framebuffer encodings.
    pub fn mixed_placements(
        &self,
        inventory: Option<&Path>,
        nodes: &[NodeTopology],
    ) -> (BTreeMap<PciAddress, GpuPlacements>, Vec<String>) {
        if inventory.is_some() {
            return (BTreeMap::new(), Vec::new());
        }
        let Ok(root) = self.open_host() else {
            return (BTreeMap::new(), Vec::new());
        };
        let Ok(nvml) = crate::mig::open::open_nvml(&root, &gpu_health::NvmlSource::LocalOnly)
        else {
            return (BTreeMap::new(), Vec::new());
        };
        placements(
            nvml.as_ref(),
            nodes.iter().flat_map(|n| n.gpus.iter().map(|g| g.address)),
        )
    }
}
