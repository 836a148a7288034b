//! The real NVML: `libnvidia-ml.so.1`, loaded at run time through nvml-wrapper.
//!
//! The library comes with the NVIDIA driver, not with gpuslice, so it is opened with `dlopen`
//! when asked for; a host without it (or without a loaded driver) is a value
//! ([`NvmlUnavailable`]), never a link error or a crash. The calls nvml-wrapper lacks are made
//! raw in one module (`raw`), the crate's only unsafe code.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};

use gpu_core::PciAddress;
use nvml_wrapper::enum_wrappers::device::{
    EccCounter, MemoryError, RetirementCause, TemperatureSensor, TemperatureThreshold,
};
use nvml_wrapper::error::NvmlError as WrapperError;
use nvml_wrapper::{Device, Nvml};

use crate::devices::NvmlDevices;
use crate::error::{NvmlError, NvmlErrorKind, NvmlUnavailable};
use crate::raw::{self, PlacementList};
use crate::types::{
    ActiveVgpu, GpuInstance, GpuInstanceProfile, HealthReads, MigActivation, MigMode, MigModes,
    Placement, VgpuMode, VgpuPlacements, VgpuScheduler, VgpuTypeInfo,
};

/// The library name opened when no path is given (found through the dynamic linker's paths).
pub const DEFAULT_LIBRARY: &str = "libnvidia-ml.so.1";

/// The NVIDIA driver's control device, which NVML opens: absent, the driver is not loaded (or
/// not given to this container) and the default library is not even looked for.
pub const CONTROL_DEVICE: &str = "/dev/nvidiactl";

/// True when the default library is asked for and the driver's control device is missing. NVML
/// talks to the driver through that device: without it nvmlInit cannot succeed, and the dynamic
/// linker's search for a library that is not installed (every hardware-capability directory of
/// every default path, under the loader's lock, which also holds up every thread being started)
/// is skipped. A named library is always opened.
fn no_driver_for(library: Option<&Path>) -> bool {
    library.is_none() && !Path::new(CONTROL_DEVICE).exists()
}

/// An nvml-wrapper error as this crate's: the one place its variants are judged (those that
/// carry an NVML return code go through [`NvmlErrorKind::from_code`]).
pub(crate) fn from_wrapper(call: &'static str, e: WrapperError) -> NvmlError {
    let kind = match e {
        WrapperError::FailedToLoadSymbol(_) | WrapperError::FunctionNotFound => {
            NvmlErrorKind::FunctionNotFound
        }
        WrapperError::UnexpectedVariant(code) => {
            NvmlErrorKind::from_code(code).unwrap_or(NvmlErrorKind::Unexpected(code))
        }
        other => {
            let code = nvml_wrapper_sys::bindings::nvmlReturn_t::from(other);
            NvmlErrorKind::from_code(code).unwrap_or(NvmlErrorKind::Unknown)
        }
    };
    NvmlError::new(call, kind)
}

/// Loads NVML from `library` (a path, or [`DEFAULT_LIBRARY`] through the dynamic linker when
/// `None`) and initializes it. The event reader of gpu-health opens its own NVML through this.
///
/// # Errors
/// [`NvmlUnavailable::LibraryNotFound`] when the library (or its `nvmlInit_v2` or
/// `nvmlShutdown`) cannot be loaded, [`NvmlUnavailable::DriverNotLoaded`],
/// [`NvmlUnavailable::NoPermission`], and [`NvmlUnavailable::InitFailed`] for any other init
/// error.
pub fn open_library(library: Option<&Path>) -> Result<Nvml, NvmlUnavailable> {
    if no_driver_for(library) {
        return Err(NvmlUnavailable::DriverNotLoaded);
    }
    let lib_os: &OsStr = library.map_or(OsStr::new(DEFAULT_LIBRARY), Path::as_os_str);
    let library_name = lib_os.to_string_lossy().into_owned();
    let nvml = Nvml::builder()
        .lib_path(lib_os)
        .init()
        .map_err(|e| match e {
            WrapperError::LibloadingError(le) => NvmlUnavailable::LibraryNotFound {
                library: library_name.clone(),
                message: le.to_string(),
            },
            WrapperError::FailedToLoadSymbol(m) => NvmlUnavailable::LibraryNotFound {
                library: library_name.clone(),
                message: format!("nvmlInit_v2 not found: {m}"),
            },
            WrapperError::LibraryNotFound => NvmlUnavailable::LibraryNotFound {
                library: library_name.clone(),
                message: "NVML reported its library missing".to_owned(),
            },
            WrapperError::DriverNotLoaded => NvmlUnavailable::DriverNotLoaded,
            WrapperError::NoPermission => NvmlUnavailable::NoPermission,
            other => NvmlUnavailable::InitFailed(other.to_string()),
        })?;
    if nvml.lib().nvmlShutdown.is_err() {
        // nvml-wrapper calls nvmlShutdown unchecked when dropped; a library without it is not
        // a usable NVML, and must not be dropped through that path.
        std::mem::forget(nvml);
        return Err(NvmlUnavailable::LibraryNotFound {
            library: library_name,
            message: "nvmlShutdown not found".to_owned(),
        });
    }
    Ok(nvml)
}

fn library_name(library: Option<&Path>) -> String {
    library
        .map_or(OsStr::new(DEFAULT_LIBRARY), Path::as_os_str)
        .to_string_lossy()
        .into_owned()
}

type Opening = std::thread::JoinHandle<Result<Nvml, NvmlUnavailable>>;

/// One NVML for a node, opened once and shared by every user (the vGPU type-name resolver, the
/// telemetry, the writers). Its open may run on a thread of its own ([`NvmlLibrary::start`])
/// while discovery reads sysfs: `nvmlInit` costs from a fraction of a millisecond (no driver:
/// the loader's path search) to hundreds on a real host, and nothing in sysfs waits for it. The
/// first question waits for the open.
pub struct NvmlLibrary {
    library: String,
    opened: OnceLock<Result<Nvml, NvmlUnavailable>>,
    pending: Mutex<Option<Opening>>,
}

impl std::fmt::Debug for NvmlLibrary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NvmlLibrary")
            .field("library", &self.library)
            .field("opened", &self.opened.get().map(Result::is_ok))
            .finish_non_exhaustive()
    }
}

impl NvmlLibrary {
    fn new(
        library: String,
        opened: Option<Result<Nvml, NvmlUnavailable>>,
        pending: Option<Opening>,
    ) -> Self {
        let once = NvmlLibrary {
            library,
            opened: OnceLock::new(),
            pending: Mutex::new(pending),
        };
        if let Some(result) = opened {
            let _ = once.opened.set(result);
        }
        once
    }

    /// Loads and initializes NVML from `library` (as [`open_library`]) now.
    ///
    /// # Errors
    /// As [`open_library`].
    pub fn open(library: Option<&Path>) -> Result<Self, NvmlUnavailable> {
        let nvml = open_library(library)?;
        Ok(Self::new(library_name(library), Some(Ok(nvml)), None))
    }

    /// NVML opened now, on this thread; a failure is kept and answered by every call
    /// ([`NvmlErrorKind::Unavailable`]).
    pub fn open_now(library: Option<&Path>) -> Self {
        Self::new(library_name(library), Some(open_library(library)), None)
    }

    /// NVML being opened on a thread of its own; where no thread can be started, or the answer
    /// is known at once (no driver), opened now.
    pub fn start(library: Option<PathBuf>) -> Self {
        if no_driver_for(library.as_deref()) {
            return Self::open_now(None);
        }
        let lib = library.clone();
        match std::thread::Builder::new()
            .name("gpuslice-nvml".into())
            .spawn(move || open_library(lib.as_deref()))
        {
            Ok(handle) => Self::new(library_name(library.as_deref()), None, Some(handle)),
            Err(_) => Self::open_now(library.as_deref()),
        }
    }

    /// The library's name or path as asked for.
    pub fn library(&self) -> &str {
        &self.library
    }

    /// Whether NVML opened (waiting for an open still running).
    ///
    /// # Errors
    /// Why it did not.
    pub fn wait(&self) -> Result<(), NvmlUnavailable> {
        self.get().map(|_| ()).map_err(Clone::clone)
    }

    fn get(&self) -> Result<&Nvml, &NvmlUnavailable> {
        self.opened
            .get_or_init(|| {
                let handle = self
                    .pending
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .take();
                let Some(handle) = handle else {
                    return Err(NvmlUnavailable::InitFailed(
                        "NVML was never opened".to_owned(),
                    ));
                };
                handle.join().unwrap_or_else(|_| {
                    Err(NvmlUnavailable::InitFailed(
                        "opening NVML panicked".to_owned(),
                    ))
                })
            })
            .as_ref()
    }

    /// The opened NVML, or [`NvmlErrorKind::Unavailable`].
    fn nvml(&self) -> Result<&Nvml, NvmlError> {
        self.get()
            .map_err(|e| NvmlError::new("nvmlInit_v2", NvmlErrorKind::Unavailable(e.clone())))
    }

    /// Runs `f` on the device at `gpu`.
    fn with_device<T>(
        &self,
        gpu: &PciAddress,
        f: impl FnOnce(&Nvml, &Device<'_>) -> Result<T, NvmlError>,
    ) -> Result<T, NvmlError> {
        let nvml = self.nvml()?;
        let device = nvml
            .device_by_pci_bus_id(gpu.to_string())
            .map_err(|e| from_wrapper("nvmlDeviceGetHandleByPciBusId_v2", e))?;
        f(nvml, &device)
    }
}

fn health_reads(nvml: &Nvml, device: &Device<'_>) -> HealthReads {
    const ECC: &str = "nvmlDeviceGetTotalEccErrors";
    const RETIRED: &str = "nvmlDeviceGetRetiredPages";
    let ecc = |kind: MemoryError, counter: EccCounter| {
        device
            .total_ecc_errors(kind, counter)
            .map_err(|e| from_wrapper(ECC, e))
    };
    let retired = |cause: RetirementCause| {
        device
            .retired_pages(cause)
            .map(|pages| pages.len() as u64)
            .map_err(|e| from_wrapper(RETIRED, e))
    };
    let threshold = |t: TemperatureThreshold| {
        device
            .temperature_threshold(t)
            .map_err(|e| from_wrapper("nvmlDeviceGetTemperatureThreshold", e))
    };
    HealthReads {
        ecc_uncorrected_volatile: ecc(MemoryError::Uncorrected, EccCounter::Volatile),
        ecc_uncorrected_aggregate: ecc(MemoryError::Uncorrected, EccCounter::Aggregate),
        ecc_corrected_volatile: ecc(MemoryError::Corrected, EccCounter::Volatile),
        ecc_corrected_aggregate: ecc(MemoryError::Corrected, EccCounter::Aggregate),
        retired_pages_sbe: retired(RetirementCause::MultipleSingleBitEccErrors),
        retired_pages_dbe: retired(RetirementCause::DoubleBitEccError),
        pages_pending_retirement: device
            .are_pages_pending_retired()
            .map_err(|e| from_wrapper("nvmlDeviceGetRetiredPagesPendingStatus", e)),
        remapped_rows: raw::remapped_rows(nvml, device),
        temperature_c: device
            .temperature(TemperatureSensor::Gpu)
            .map_err(|e| from_wrapper("nvmlDeviceGetTemperature", e)),
        slowdown_c: threshold(TemperatureThreshold::Slowdown),
        shutdown_c: threshold(TemperatureThreshold::Shutdown),
        pcie_replay_counter: device
            .pcie_replay_counter()
            .map(u64::from)
            .map_err(|e| from_wrapper("nvmlDeviceGetPcieReplayCounter", e)),
        memory_total_bytes: device
            .memory_info()
            .map(|m| m.total)
            .map_err(|e| from_wrapper("nvmlDeviceGetMemoryInfo", e)),
    }
}

/// Lists every GPU instance of the device, with its profile's compute slices, by start.
fn gpu_instances(nvml: &Nvml, device: &Device<'_>) -> Result<Vec<GpuInstance>, NvmlError> {
    let profiles = raw::gpu_instance_profiles(nvml, device)?;
    let mut seen: Vec<u32> = Vec::new();
    let mut out = Vec::new();
    for profile in &profiles {
        if seen.contains(&profile.id) {
            continue;
        }
        seen.push(profile.id);
        for gi in raw::gpu_instances_of(nvml, device, profile)? {
            out.push(GpuInstance {
                id: gi.id,
                profile_id: gi.profile_id,
                slice_count: profile.slice_count,
                placement: gi.placement,
            });
        }
    }
    out.sort_by_key(|g| (g.placement.start, g.id));
    Ok(out)
}

impl NvmlDevices for NvmlLibrary {
    fn driver_version(&self) -> Option<String> {
        self.nvml().ok()?.sys_driver_version().ok()
    }

    fn health_reads(&self, gpu: &PciAddress) -> Result<HealthReads, NvmlError> {
        self.with_device(gpu, |nvml, d| Ok(health_reads(nvml, d)))
    }

    fn vgpu_supported_types(&self, gpu: &PciAddress) -> Result<Vec<VgpuTypeInfo>, NvmlError> {
        self.with_device(gpu, |_, d| {
            let types = d
                .vgpu_supported_types()
                .map_err(|e| from_wrapper("nvmlDeviceGetSupportedVgpus", e))?;
            Ok(types
                .into_iter()
                .filter_map(|t| {
                    Some(VgpuTypeInfo {
                        id: t.id(),
                        name: t.name().ok()?,
                        framebuffer_mib: t.framebuffer_size().ok().map(|b| b / (1024 * 1024)),
                        max_instances: t.max_instances().ok(),
                    })
                })
                .collect())
        })
    }

    fn module_id(&self, gpu: &PciAddress) -> Result<u32, NvmlError> {
        self.with_device(gpu, raw::module_id)
    }

    fn mig_mode(&self, gpu: &PciAddress) -> Result<MigModes, NvmlError> {
        self.with_device(gpu, |_, d| {
            let m = d
                .mig_mode()
                .map_err(|e| from_wrapper("nvmlDeviceGetMigMode", e))?;
            Ok(MigModes {
                current: MigMode::from_raw(m.current),
                pending: MigMode::from_raw(m.pending),
            })
        })
    }

    fn set_mig_mode(&self, gpu: &PciAddress, mode: MigMode) -> Result<MigActivation, NvmlError> {
        self.with_device(gpu, |_, d| {
            let status = d
                .set_mig_mode(mode == MigMode::Enabled)
                .map_err(|e| from_wrapper("nvmlDeviceSetMigMode", e))?;
            Ok(match NvmlErrorKind::from_code(status) {
                None => MigActivation::Active,
                Some(kind) => MigActivation::Pending(kind),
            })
        })
    }

    fn gpu_instance_profiles(
        &self,
        gpu: &PciAddress,
    ) -> Result<Vec<GpuInstanceProfile>, NvmlError> {
        self.with_device(gpu, raw::gpu_instance_profiles)
    }

    fn gpu_instance_possible_placements(
        &self,
        gpu: &PciAddress,
        profile_id: u32,
    ) -> Result<Vec<Placement>, NvmlError> {
        self.with_device(gpu, |n, d| raw::possible_placements(n, d, profile_id))
    }

    fn gpu_instances(&self, gpu: &PciAddress) -> Result<Vec<GpuInstance>, NvmlError> {
        self.with_device(gpu, gpu_instances)
    }

    fn create_gpu_instance(
        &self,
        gpu: &PciAddress,
        profile_id: u32,
        placement: Placement,
    ) -> Result<GpuInstance, NvmlError> {
        self.with_device(gpu, |n, d| {
            let gi = raw::create_gpu_instance(n, d, profile_id, placement)?;
            let slice_count = raw::gpu_instance_profiles(n, d)?
                .iter()
                .find(|p| p.id == gi.profile_id)
                .map_or(0, |p| p.slice_count);
            Ok(GpuInstance {
                id: gi.id,
                profile_id: gi.profile_id,
                slice_count,
                placement: gi.placement,
            })
        })
    }

    fn destroy_gpu_instance(&self, gpu: &PciAddress, id: u32) -> Result<(), NvmlError> {
        self.with_device(gpu, |n, d| raw::destroy_gpu_instance(n, d, id))
    }

    fn gpu_instance_vgpu_creatable_placements(
        &self,
        gpu: &PciAddress,
        gpu_instance: u32,
        type_id: u32,
    ) -> Result<VgpuPlacements, NvmlError> {
        self.with_device(gpu, |n, d| {
            raw::gpu_instance_vgpu_creatable(n, d, gpu_instance, type_id)
        })
    }

    fn vgpu_scheduler(&self, gpu: &PciAddress) -> Result<VgpuScheduler, NvmlError> {
        self.with_device(gpu, |_, d| {
            let state = d
                .vgpu_scheduler_state()
                .map_err(|e| from_wrapper("nvmlDeviceGetVgpuSchedulerState", e))?;
            Ok(VgpuScheduler::from_raw(state.scheduler_policy))
        })
    }

    fn vgpu_heterogeneous_mode(&self, gpu: &PciAddress) -> Result<VgpuMode, NvmlError> {
        self.with_device(gpu, raw::vgpu_heterogeneous_mode)
    }

    fn set_vgpu_heterogeneous_mode(
        &self,
        gpu: &PciAddress,
        mode: VgpuMode,
    ) -> Result<(), NvmlError> {
        self.with_device(gpu, |n, d| raw::set_vgpu_heterogeneous_mode(n, d, mode))
    }

    fn vgpu_type_supported_placements(
        &self,
        gpu: &PciAddress,
        type_id: u32,
        mode: VgpuMode,
    ) -> Result<VgpuPlacements, NvmlError> {
        self.with_device(gpu, |n, d| {
            raw::vgpu_placements(n, d, PlacementList::Supported, type_id, mode)
        })
    }

    fn vgpu_type_creatable_placements(
        &self,
        gpu: &PciAddress,
        type_id: u32,
        mode: VgpuMode,
    ) -> Result<VgpuPlacements, NvmlError> {
        self.with_device(gpu, |n, d| {
            raw::vgpu_placements(n, d, PlacementList::Creatable, type_id, mode)
        })
    }

    fn active_vgpus(&self, gpu: &PciAddress) -> Result<Vec<ActiveVgpu>, NvmlError> {
        self.with_device(gpu, raw::active_vgpus)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_the_drivers_control_device_no_thread_is_started_for_the_default_library() {
        if Path::new(CONTROL_DEVICE).exists() {
            println!("SKIPPED: this machine has an NVIDIA driver");
            return;
        }
        let once = NvmlLibrary::start(None);
        let pending = once
            .pending
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .is_some();
        assert!(!pending, "a thread was started to find no driver");
        assert!(matches!(once.get(), Err(NvmlUnavailable::DriverNotLoaded)));
    }

    #[test]
    fn a_library_path_that_does_not_exist_answers_unavailable_without_panicking() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("libnvidia-ml.so.1");
        let nvml = NvmlLibrary::open_now(Some(&missing));
        assert!(matches!(
            nvml.wait(),
            Err(NvmlUnavailable::LibraryNotFound { library, .. }) if library == missing.display().to_string()
        ));
        let gpu: PciAddress = "0000:18:00.0".parse().unwrap();
        // Every question, read or write, is the same value: no NVML.
        let e = nvml.mig_mode(&gpu).unwrap_err();
        assert!(matches!(e.kind, NvmlErrorKind::Unavailable(_)), "{e}");
        let e = nvml
            .create_gpu_instance(&gpu, 19, Placement { start: 0, size: 1 })
            .unwrap_err();
        assert!(matches!(e.kind, NvmlErrorKind::Unavailable(_)), "{e}");
        assert_eq!(nvml.driver_version(), None);
        assert!(NvmlLibrary::open(Some(&missing)).is_err());
    }

    #[test]
    fn wrapper_errors_are_translated_by_their_nvml_code() {
        assert_eq!(
            from_wrapper("x", WrapperError::InUse).kind,
            NvmlErrorKind::InUse
        );
        assert_eq!(
            from_wrapper("x", WrapperError::UnexpectedVariant(23)).kind,
            NvmlErrorKind::InsufficientResources
        );
        assert_eq!(
            from_wrapper("x", WrapperError::FailedToLoadSymbol("f".into())).kind,
            NvmlErrorKind::FunctionNotFound
        );
        assert_eq!(
            from_wrapper("x", WrapperError::NotSupported).kind,
            NvmlErrorKind::NotSupported
        );
    }
}
