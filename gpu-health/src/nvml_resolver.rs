//! The NVML vGPU type-name resolver: names vendor-VFIO type numbers that no VF lists any more,
//! and reports the GPU instances (with their placements) of MIG-enabled GPUs, so that
//! discovery holds exactly the memory slices existing MIG-backed vGPUs occupy. It lives with
//! the other NVML code so that gpu-sysfs does not depend on NVML.

use std::collections::BTreeMap;
use std::sync::Arc;

use gpu_core::PciAddress;
use gpu_sysfs::resolver::{GpuInstances, TypeInfo, TypeNameResolver};

/// A resolver over NVML (`libnvidia-ml.so.1`, loaded at run time): the GPU's supported vGPU
/// types (`nvmlDeviceGetSupportedVgpus`) with their names, framebuffer sizes and per-GPU maxima,
/// and its GPU instances with their placements. Type answers are cached per GPU; a GPU NVML does
/// not know, or a driver without vGPU support, gives `None`, never an error. GPU instances are
/// read afresh on each ask (they change as vGPUs come and go).
pub struct NvmlResolver {
    nvml: Arc<crate::nvml::NvmlOnce>,
    cache: std::sync::Mutex<BTreeMap<PciAddress, BTreeMap<u32, TypeInfo>>>,
}

impl std::fmt::Debug for NvmlResolver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NvmlResolver").finish_non_exhaustive()
    }
}

impl NvmlResolver {
    /// Loads NVML the way [`NvmlResolver::open_library`] does with `None` (not looked for at
    /// all without the driver's control device, [`crate::nvml::CONTROL_DEVICE`]), with the
    /// error as NVML's own kind. Prefer [`NvmlResolver::open_library`], whose error says more.
    ///
    /// # Errors
    /// `DriverNotLoaded`, `NoPermission`, `LibraryNotFound`, or `Unknown` for any other
    /// failure to initialise: a value for the caller to report, not a reason to fail discovery.
    pub fn open() -> Result<Self, nvml_wrapper::error::NvmlError> {
        use crate::nvml::NvmlUnavailable as U;
        use nvml_wrapper::error::NvmlError as E;
        Self::open_library(None).map_err(|e| match e {
            U::DriverNotLoaded => E::DriverNotLoaded,
            U::NoPermission => E::NoPermission,
            U::LibraryNotFound { .. } => E::LibraryNotFound,
            U::InitFailed(_) => E::Unknown,
        })
    }

    /// Loads NVML from `library` (a path, or `libnvidia-ml.so.1` through the dynamic linker
    /// when `None`), as [`crate::NvmlTelemetry::open`] does.
    ///
    /// # Errors
    /// As [`crate::NvmlTelemetry::open`].
    pub fn open_library(
        library: Option<&std::path::Path>,
    ) -> Result<Self, crate::nvml::NvmlUnavailable> {
        let once = crate::nvml::NvmlOnce::open_now(library);
        once.get().map_err(Clone::clone)?;
        Ok(Self::over(once))
    }

    /// A resolver over the node's one NVML (which may still be opening: the first question
    /// waits for it; an NVML that did not open answers nothing).
    pub(crate) fn over(nvml: Arc<crate::nvml::NvmlOnce>) -> Self {
        NvmlResolver {
            nvml,
            cache: std::sync::Mutex::new(BTreeMap::new()),
        }
    }

    fn supported(&self, gpu: &PciAddress) -> BTreeMap<u32, TypeInfo> {
        let mut out = BTreeMap::new();
        let Ok(nvml) = self.nvml.get() else {
            return out;
        };
        let Ok(dev) = nvml.device_by_pci_bus_id(gpu.to_string()) else {
            return out;
        };
        let Ok(types) = dev.vgpu_supported_types() else {
            return out;
        };
        for t in types {
            let Ok(name) = t.name() else { continue };
            out.insert(
                t.id(),
                TypeInfo {
                    name,
                    framebuffer_mib: t.framebuffer_size().ok().map(|b| b / (1024 * 1024)),
                    max_instances: t.max_instances().ok(),
                },
            );
        }
        out
    }
}

impl TypeNameResolver for NvmlResolver {
    fn resolve(&self, gpu: &PciAddress, id: u32) -> Option<TypeInfo> {
        let mut cache = self.cache.lock().ok()?;
        if !cache.contains_key(gpu) {
            let types = self.supported(gpu);
            cache.insert(*gpu, types);
        }
        cache.get(gpu).and_then(|m| m.get(&id)).cloned()
    }

    fn gpu_instances(&self, gpu: &PciAddress) -> GpuInstances {
        let nvml = match self.nvml.get() {
            Ok(n) => n,
            // As without a resolver: NVML is not there to ask.
            Err(e) => return GpuInstances::Unsupported(format!("no NVML: {e}")),
        };
        match nvml.device_by_pci_bus_id(gpu.to_string()) {
            Ok(dev) => crate::nvml::gpu_instances(nvml, &dev),
            Err(nvml_wrapper::error::NvmlError::NotFound) => {
                GpuInstances::Unsupported(format!("NVML does not know {gpu}"))
            }
            Err(e) => GpuInstances::Failed(format!("NVML: {e}")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nvml_resolver_is_an_error_value_without_a_driver() {
        // On a machine with an NVIDIA driver this opens; elsewhere it must fail cleanly.
        match NvmlResolver::open() {
            Ok(r) => {
                let nowhere: PciAddress = "ffff:ff:1f.7".parse().unwrap();
                assert_eq!(r.resolve(&nowhere, 1), None);
            }
            Err(e) => assert!(!e.to_string().is_empty()),
        }
    }

    #[test]
    fn open_does_not_look_for_nvml_without_the_drivers_control_device() {
        if std::path::Path::new(crate::nvml::CONTROL_DEVICE).exists() {
            println!("SKIPPED: this machine has an NVIDIA driver");
            return;
        }
        assert!(matches!(
            NvmlResolver::open(),
            Err(nvml_wrapper::error::NvmlError::DriverNotLoaded)
        ));
    }
}
