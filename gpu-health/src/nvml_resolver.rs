//! The NVML vGPU type-name resolver: names vendor-VFIO type numbers that no VF lists any more,
//! and reports the GPU instances (with their placements) of MIG-enabled GPUs, so that
//! discovery holds exactly the memory slices existing MIG-backed vGPUs occupy. It asks gpu-nvml's
//! [`NvmlDevices`], so that gpu-sysfs does not depend on NVML.

use std::collections::BTreeMap;
use std::sync::Arc;

use gpu_core::PciAddress;
use gpu_nvml::{NvmlDevices, NvmlErrorKind, NvmlLibrary};
use gpu_sysfs::resolver::{GpuInstancePlacement, GpuInstances, TypeInfo, TypeNameResolver};

/// The device lookup gpu-nvml names when a GPU cannot be found.
const LOOKUP: &str = "nvmlDeviceGetHandleByPciBusId_v2";

/// A resolver over NVML (`libnvidia-ml.so.1`, loaded at run time, or the fake): the GPU's
/// supported vGPU types (`nvmlDeviceGetSupportedVgpus`) with their names, framebuffer sizes and
/// per-GPU maxima, and its GPU instances with their placements. Type answers are cached per GPU;
/// a GPU NVML does not know, or a driver without vGPU support, gives `None`, never an error. GPU
/// instances are read afresh on each ask (they change as vGPUs come and go).
pub struct NvmlResolver {
    devices: Arc<dyn NvmlDevices>,
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
        Ok(Self::over(Arc::new(NvmlLibrary::open(library)?)))
    }

    /// A resolver over NVML's devices: the node's one NVML (which may still be opening: the
    /// first question waits for it; an NVML that did not open answers nothing), or the fake.
    pub fn over(devices: Arc<dyn NvmlDevices>) -> Self {
        NvmlResolver {
            devices,
            cache: std::sync::Mutex::new(BTreeMap::new()),
        }
    }

    fn ask_supported(&self, gpu: &PciAddress) -> BTreeMap<u32, TypeInfo> {
        let Ok(types) = self.devices.vgpu_supported_types(gpu) else {
            return BTreeMap::new();
        };
        types
            .into_iter()
            .map(|t| {
                (
                    t.id,
                    TypeInfo {
                        name: t.name,
                        framebuffer_mib: t.framebuffer_mib,
                        max_instances: t.max_instances,
                    },
                )
            })
            .collect()
    }
}

impl NvmlResolver {
    /// The supported types of `gpu`, asked once and cached.
    fn cached(&self, gpu: &PciAddress) -> Option<BTreeMap<u32, TypeInfo>> {
        let mut cache = self.cache.lock().ok()?;
        if !cache.contains_key(gpu) {
            let types = self.ask_supported(gpu);
            cache.insert(*gpu, types);
        }
        cache.get(gpu).cloned()
    }
}

impl TypeNameResolver for NvmlResolver {
    fn resolve(&self, gpu: &PciAddress, id: u32) -> Option<TypeInfo> {
        let cache = self.cache.lock().ok()?;
        if let Some(m) = cache.get(gpu) {
            return m.get(&id).cloned();
        }
        drop(cache);
        self.cached(gpu)?.remove(&id)
    }

    /// NVML's supported types (`nvmlDeviceGetSupportedVgpus`); `None` where NVML answers none
    /// (no vGPU support, no NVML, a GPU it does not know).
    fn supported(&self, gpu: &PciAddress) -> Option<Vec<(u32, TypeInfo)>> {
        let all = self.cached(gpu)?;
        (!all.is_empty()).then(|| all.into_iter().collect())
    }

    /// A library without one of the GPU-instance calls, a GPU without MIG profiles and a GPU not
    /// in MIG mode are [`GpuInstances::Unsupported`]; any other failure is
    /// [`GpuInstances::Failed`] with NVML's reason.
    fn gpu_instances(&self, gpu: &PciAddress) -> GpuInstances {
        let e = match self.devices.gpu_instances(gpu) {
            Ok(list) => {
                return GpuInstances::Known(
                    list.iter()
                        .map(|g| GpuInstancePlacement {
                            id: g.id,
                            compute_slices: g.slice_count,
                            start: g.placement.start,
                            size: g.placement.size,
                        })
                        .collect(),
                );
            }
            Err(e) => e,
        };
        match (e.call, &e.kind) {
            // As without a resolver: NVML is not there to ask.
            (_, NvmlErrorKind::Unavailable(u)) => {
                GpuInstances::Unsupported(format!("no NVML: {u}"))
            }
            (LOOKUP, NvmlErrorKind::NotFound) => {
                GpuInstances::Unsupported(format!("NVML does not know {gpu}"))
            }
            (LOOKUP, kind) => GpuInstances::Failed(format!("NVML: {kind}")),
            (call, NvmlErrorKind::FunctionNotFound) => {
                GpuInstances::Unsupported(format!("the loaded NVML lacks {call}"))
            }
            ("nvmlDeviceGetGpuInstanceProfileInfo", NvmlErrorKind::NotSupported) => {
                GpuInstances::Unsupported("the GPU has no GPU-instance profiles".to_owned())
            }
            (_, NvmlErrorKind::NotSupported) => {
                GpuInstances::Unsupported("the GPU is not in MIG mode".to_owned())
            }
            (_, NvmlErrorKind::NoPermission) => {
                GpuInstances::Failed(format!("{e} (listing GPU instances needs root)"))
            }
            _ => GpuInstances::Failed(e.to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpu_nvml::MigMode;
    use gpu_nvml::fake::{FakeGpu, FakeNvml, FakeVgpuType};

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

    #[test]
    fn the_resolver_reads_types_and_gpu_instances_through_the_trait() {
        let gpu: PciAddress = "0000:18:00.0".parse().unwrap();
        let geometry = gpu_core::mig::MigGeometry::for_device(0x2335).unwrap();
        let fake = Arc::new(
            FakeNvml::new().with_gpu(
                gpu,
                FakeGpu::mig(geometry)
                    .with_mig_mode(MigMode::Enabled)
                    .with_vgpu_types(vec![FakeVgpuType::new(
                        1414,
                        "NVIDIA H200X-1-18C",
                        18432,
                        0,
                        &[],
                    )]),
            ),
        );
        fake.create_gpu_instance(&gpu, 19, gpu_nvml::Placement { start: 4, size: 1 })
            .unwrap();
        let r = NvmlResolver::over(fake.clone());
        assert_eq!(
            r.resolve(&gpu, 1414).map(|t| t.name),
            Some("NVIDIA H200X-1-18C".to_owned())
        );
        assert_eq!(
            r.gpu_instances(&gpu),
            GpuInstances::Known(vec![GpuInstancePlacement {
                id: 1,
                compute_slices: 1,
                start: 4,
                size: 1
            }])
        );
        fake.set_mig_mode(&gpu, MigMode::Disabled).unwrap_err();
        fake.destroy_gpu_instance(&gpu, 1).unwrap();
        fake.set_mig_mode(&gpu, MigMode::Disabled).unwrap();
        assert_eq!(
            r.gpu_instances(&gpu),
            GpuInstances::Unsupported("the GPU has no GPU-instance profiles".into())
        );
    }
}
