//! The MIG-backed vGPU types a MIG-capable GPU supports, listed whether or not MIG mode is on
//! and whether or not a GPU instance for them exists, so that a user can ask for one (gpuslice
//! then makes the instance). The source is what the driver says the GPU supports (the
//! resolver's [`TypeNameResolver::supported`]: NVML's `nvmlDeviceGetSupportedVgpus`; in a
//! sandbox, the types its recording's VFs listed, [`Host::recorded_vgpu_types`]), never a
//! table; where nothing says, the list is `unknown`. A type no parent of the GPU lists as
//! creatable now is marked `needsGpuInstance`.

use gpu_core::nvidia::VgpuTypeName;
use gpu_core::vgpu_types::{MigBackedType, MigBackedTypes};
use gpu_core::{Gpu, MigGeometry, Parent, Vendor, VgpuTypeId};

use crate::Host;
use crate::resolver::{TypeInfo, TypeNameResolver};

/// Fills each MIG-capable NVIDIA GPU's `mig_backed_types` from `resolver`.
pub(super) fn fill(
    host: &dyn Host,
    gpus: &mut [Gpu],
    parents: &[Parent],
    resolver: Option<&dyn TypeNameResolver>,
) {
    for g in gpus.iter_mut() {
        if g.vendor != Vendor::Nvidia || MigGeometry::for_device(g.device_id.0).is_none() {
            continue;
        }
        let recorded = || {
            let types = host.recorded_vgpu_types(&g.address)?;
            let info = |name: String| TypeInfo {
                framebuffer_mib: VgpuTypeName::parse(&name).ok().map(|t| t.framebuffer_mib()),
                name,
                max_instances: None,
            };
            Some((
                "sandbox",
                types.into_iter().map(|(id, n)| (id, info(n))).collect(),
            ))
        };
        let found = resolver
            .and_then(|r| r.supported(&g.address))
            .map(|s| ("nvml", s))
            .or_else(recorded);
        let Some((source, supported)) = found else {
            g.mig_backed_types = Some(MigBackedTypes {
                source: "unknown".to_owned(),
                types: Vec::new(),
            });
            continue;
        };
        let listed = |name: &str| {
            parents
                .iter()
                .filter(|p| p.gpu == Some(g.address))
                .any(|p| p.profiles.iter().any(|x| x.name == name))
        };
        let types = supported
            .into_iter()
            .filter_map(|(id, info)| {
                let slices = VgpuTypeName::parse(&info.name).ok()?.mig_slices?;
                Some(MigBackedType {
                    id: VgpuTypeId::vendor_vfio(id),
                    needs_gpu_instance: !listed(&info.name),
                    name: info.name,
                    framebuffer_mib: info.framebuffer_mib,
                    mig_slices: slices,
                })
            })
            .collect();
        g.mig_backed_types = Some(MigBackedTypes {
            source: source.to_owned(),
            types,
        });
    }
}
