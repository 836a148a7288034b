//! The NVML adapter: [`Telemetry`] over NVIDIA's management library, loaded at run time.
//!
//! `libnvidia-ml.so.1` comes with the NVIDIA driver, not with gpuslice, so it is opened with
//! `dlopen` when asked for; a host without it (or without a loaded driver) is a value
//! ([`NvmlUnavailable`]) that leaves the NVML signals Unknown, never a link error or a crash.
//! Every call that returns `NVML_ERROR_NOT_SUPPORTED`, or whose symbol the loaded library lacks,
//! reads as Unsupported; every other failure as Unknown with NVML's reason.
//!
//! `nvmlDeviceGetRemappedRows` and the GPU-instance calls (`nvmlDeviceGetGpuInstanceProfileInfo`,
//! `nvmlDeviceGetGpuInstances`, `nvmlGpuInstanceGetInfo`) have no safe wrapper in nvml-wrapper;
//! they are called through the loaded library's symbol table after checking that each symbol
//! resolved (a missing one reads as unsupported).

// The unsafe calls are confined to `remapped_rows` and `gpu_instances` below, one small block
// per foreign call, each with what makes it sound.
#![allow(unsafe_code)]

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

use gpu_core::PciAddress;
use nvml_wrapper::enum_wrappers::device::{
    EccCounter, MemoryError, RetirementCause, TemperatureSensor, TemperatureThreshold,
};
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::{Device, Nvml};

use gpu_sysfs::resolver::{GpuInstancePlacement, GpuInstances};
use nvml_wrapper_sys::bindings::{
    NVML_GPU_INSTANCE_PROFILE_COUNT, nvmlGpuInstance_t, nvmlGpuInstanceInfo_t,
    nvmlGpuInstancePlacement_t, nvmlGpuInstanceProfileInfo_t,
};

use crate::reading::Reading;
use crate::telemetry::{GpuTelemetry, RowRemap, Telemetry};

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

/// Why NVML could not be opened. Each is an expected state of a host, not a fault of gpuslice.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NvmlUnavailable {
    /// The library could not be loaded (no NVIDIA driver installed, or a wrong path).
    #[error("{library} could not be loaded: {message}")]
    LibraryNotFound {
        /// The name or path tried.
        library: String,
        /// The loader's message.
        message: String,
    },
    /// The library loaded but the NVIDIA kernel driver is not running.
    #[error("the NVIDIA driver is not loaded")]
    DriverNotLoaded,
    /// The library loaded but may not talk to the driver.
    #[error("no permission to talk to the NVIDIA driver")]
    NoPermission,
    /// `nvmlInit` failed for another reason.
    #[error("NVML initialization failed: {0}")]
    InitFailed(String),
}

/// Loads NVML from `library` (a path, or [`DEFAULT_LIBRARY`] through the dynamic linker when
/// `None`) and initializes it: [`NvmlTelemetry::open`] and the event reader share this.
///
/// # Errors
/// As [`NvmlTelemetry::open`].
pub(crate) fn open_library(library: Option<&Path>) -> Result<Nvml, NvmlUnavailable> {
    if no_driver_for(library) {
        return Err(NvmlUnavailable::DriverNotLoaded);
    }
    let lib_os: &OsStr = library.map_or(OsStr::new(DEFAULT_LIBRARY), Path::as_os_str);
    let library_name = lib_os.to_string_lossy().into_owned();
    let nvml = Nvml::builder()
        .lib_path(lib_os)
        .init()
        .map_err(|e| match e {
            NvmlError::LibloadingError(le) => NvmlUnavailable::LibraryNotFound {
                library: library_name.clone(),
                message: le.to_string(),
            },
            NvmlError::FailedToLoadSymbol(m) => NvmlUnavailable::LibraryNotFound {
                library: library_name.clone(),
                message: format!("nvmlInit_v2 not found: {m}"),
            },
            NvmlError::LibraryNotFound => NvmlUnavailable::LibraryNotFound {
                library: library_name.clone(),
                message: "NVML reported its library missing".to_owned(),
            },
            NvmlError::DriverNotLoaded => NvmlUnavailable::DriverNotLoaded,
            NvmlError::NoPermission => NvmlUnavailable::NoPermission,
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

/// One NVML for a node: the vGPU type-name resolver and the telemetry share it, so the library
/// is looked up and initialized once per composition, not once per user. Its open may run on a
/// thread of its own ([`NvmlOnce::start`]) while discovery reads sysfs: `nvmlInit` costs from
/// a fraction of a millisecond (no driver: the loader's path search) to hundreds on a real
/// host, and nothing in sysfs waits for it. The first [`NvmlOnce::get`] waits for the open.
pub(crate) struct NvmlOnce {
    library: String,
    opened: OnceLock<Result<Arc<Nvml>, NvmlUnavailable>>,
    pending: Mutex<Option<std::thread::JoinHandle<Result<Nvml, NvmlUnavailable>>>>,
}

impl std::fmt::Debug for NvmlOnce {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NvmlOnce")
            .field("library", &self.library)
            .field("opened", &self.opened.get().map(Result::is_ok))
            .finish_non_exhaustive()
    }
}

impl NvmlOnce {
    fn name(library: Option<&Path>) -> String {
        library
            .map_or(OsStr::new(DEFAULT_LIBRARY), Path::as_os_str)
            .to_string_lossy()
            .into_owned()
    }

    /// An NVML opened already (`opened`) or being opened (`pending`).
    fn new(
        library: String,
        opened: Option<Result<Nvml, NvmlUnavailable>>,
        pending: Option<std::thread::JoinHandle<Result<Nvml, NvmlUnavailable>>>,
    ) -> Self {
        let once = NvmlOnce {
            library,
            opened: OnceLock::new(),
            pending: Mutex::new(pending),
        };
        if let Some(result) = opened {
            let _ = once.opened.set(result.map(Arc::new));
        }
        once
    }

    /// NVML opened now, on this thread.
    pub(crate) fn open_now(library: Option<&Path>) -> Arc<Self> {
        Arc::new(Self::new(
            Self::name(library),
            Some(open_library(library)),
            None,
        ))
    }

    /// NVML being opened on a thread of its own; where no thread can be started, opened now.
    pub(crate) fn start(library: Option<PathBuf>) -> Arc<Self> {
        if no_driver_for(library.as_deref()) {
            // The answer is known at once: no thread to start.
            return Self::open_now(None);
        }
        let name = Self::name(library.as_deref());
        let lib = library.clone();
        match std::thread::Builder::new()
            .name("gpuslice-nvml".into())
            .spawn(move || open_library(lib.as_deref()))
        {
            Ok(handle) => Arc::new(Self::new(name, None, Some(handle))),
            Err(_) => Self::open_now(library.as_deref()),
        }
    }

    /// The opened NVML, or why it is not there; waits for an open still running.
    pub(crate) fn get(&self) -> Result<&Arc<Nvml>, &NvmlUnavailable> {
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
                handle
                    .join()
                    .unwrap_or_else(|_| {
                        Err(NvmlUnavailable::InitFailed(
                            "opening NVML panicked".to_owned(),
                        ))
                    })
                    .map(Arc::new)
            })
            .as_ref()
    }

    /// Telemetry over this NVML, or why there is none.
    pub(crate) fn telemetry(&self) -> Result<NvmlTelemetry, NvmlUnavailable> {
        let nvml = self.get().map_err(Clone::clone)?;
        Ok(NvmlTelemetry::from_shared(
            Arc::clone(nvml),
            self.library.clone(),
        ))
    }
}

/// [`Telemetry`] read through NVML.
pub struct NvmlTelemetry {
    nvml: Arc<Nvml>,
    library: String,
    driver_version: Option<String>,
}

impl std::fmt::Debug for NvmlTelemetry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NvmlTelemetry")
            .field("library", &self.library)
            .field("driver_version", &self.driver_version)
            .finish()
    }
}

impl NvmlTelemetry {
    /// Loads NVML from `library` (a path, or [`DEFAULT_LIBRARY`] through the dynamic linker when
    /// `None`) and initializes it.
    ///
    /// # Errors
    /// [`NvmlUnavailable::LibraryNotFound`] when the library (or its `nvmlInit_v2`) cannot be
    /// loaded, [`NvmlUnavailable::DriverNotLoaded`], [`NvmlUnavailable::NoPermission`], and
    /// [`NvmlUnavailable::InitFailed`] for any other init error.
    pub fn open(library: Option<&Path>) -> Result<Self, NvmlUnavailable> {
        let nvml = open_library(library)?;
        Ok(Self::from_shared(Arc::new(nvml), NvmlOnce::name(library)))
    }

    /// Telemetry over an NVML opened already (shared with the type-name resolver).
    fn from_shared(nvml: Arc<Nvml>, library: String) -> Self {
        let driver_version = nvml.sys_driver_version().ok();
        NvmlTelemetry {
            nvml,
            library,
            driver_version,
        }
    }

    /// The driver version NVML reports, when it does.
    pub fn driver_version(&self) -> Option<&str> {
        self.driver_version.as_deref()
    }

    fn read_device(&self, device: &Device<'_>) -> GpuTelemetry {
        let ecc = |kind: MemoryError, counter: EccCounter| {
            reading(device.total_ecc_errors(kind, counter))
        };
        let retired = |cause: RetirementCause| {
            reading(device.retired_pages(cause).map(|pages| pages.len() as u64))
        };
        GpuTelemetry {
            ecc_uncorrected_volatile: ecc(MemoryError::Uncorrected, EccCounter::Volatile),
            ecc_uncorrected_aggregate: ecc(MemoryError::Uncorrected, EccCounter::Aggregate),
            ecc_corrected_volatile: ecc(MemoryError::Corrected, EccCounter::Volatile),
            ecc_corrected_aggregate: ecc(MemoryError::Corrected, EccCounter::Aggregate),
            retired_pages_sbe: retired(RetirementCause::MultipleSingleBitEccErrors),
            retired_pages_dbe: retired(RetirementCause::DoubleBitEccError),
            pages_pending_retirement: reading(device.are_pages_pending_retired()),
            row_remap: self.remapped_rows(device),
            temperature_c: reading(device.temperature(TemperatureSensor::Gpu)),
            slowdown_c: reading(device.temperature_threshold(TemperatureThreshold::Slowdown)),
            shutdown_c: reading(device.temperature_threshold(TemperatureThreshold::Shutdown)),
            pcie_replay_counter: reading(device.pcie_replay_counter().map(u64::from)),
            memory_total_bytes: reading(device.memory_info().map(|m| m.total)),
            gpu_lost: false,
        }
    }

    /// `nvmlDeviceGetRemappedRows`, called raw: the safe wrapper has no method for it.
    fn remapped_rows(&self, device: &Device<'_>) -> Reading<RowRemap> {
        // Drivers before R450 lack the symbol: that is "not supported", not an error.
        let Ok(sym) = self.nvml.lib().nvmlDeviceGetRemappedRows.as_ref() else {
            return Reading::Unsupported;
        };
        let (mut corrected, mut uncorrected, mut pending, mut failure) = (0u32, 0u32, 0u32, 0u32);
        // SAFETY: `sym` was resolved from the loaded NVML by the name NVML documents with this
        // signature; the device handle is valid while `device` borrows `self.nvml`; the four out
        // pointers point at live, writable `c_uint`s.
        let code = unsafe {
            sym(
                device.handle(),
                &mut corrected,
                &mut uncorrected,
                &mut pending,
                &mut failure,
            )
        };
        if code == 0 {
            Reading::Value(RowRemap {
                corrected_rows: corrected,
                uncorrected_rows: uncorrected,
                pending: pending != 0,
                failure: failure != 0,
            })
        } else {
            error_reading(NvmlError::from(code))
        }
    }
}

/// The most GPU instances of one profile gpuslice reads from one GPU; NVML sizes its answer by
/// the profile's `instanceCount` (at most 7 on any MIG GPU), so more is not a real answer.
const MAX_GPU_INSTANCES_PER_PROFILE: u32 = 64;

const NVML_ERROR_INVALID_ARGUMENT: u32 = 2;
const NVML_ERROR_NOT_SUPPORTED: u32 = 3;
const NVML_ERROR_NO_PERMISSION: u32 = 4;

/// The GPU instances of `device` with their placements, read raw: nvml-wrapper 0.13 wraps none
/// of the three calls. Every GPU-instance profile index NVML defines is asked for its profile
/// (ID, compute slices, most instances); one the GPU lacks answers `NOT_SUPPORTED` or
/// `INVALID_ARGUMENT` and is skipped. Then the instances of each profile are listed and each
/// is asked for its placement (first memory slice and memory slices held). A library without
/// one of the symbols, a GPU without MIG profiles and a GPU not in MIG mode are
/// [`GpuInstances::Unsupported`]; any other failure is [`GpuInstances::Failed`] with NVML's
/// reason.
pub(crate) fn gpu_instances(nvml: &Nvml, device: &Device<'_>) -> GpuInstances {
    let lib = nvml.lib();
    let (Ok(profile_info), Ok(list), Ok(get_info)) = (
        lib.nvmlDeviceGetGpuInstanceProfileInfo.as_ref(),
        lib.nvmlDeviceGetGpuInstances.as_ref(),
        lib.nvmlGpuInstanceGetInfo.as_ref(),
    ) else {
        return GpuInstances::Unsupported(
            "the loaded NVML lacks nvmlDeviceGetGpuInstanceProfileInfo, \
             nvmlDeviceGetGpuInstances or nvmlGpuInstanceGetInfo"
                .to_owned(),
        );
    };
    // SAFETY: the handle is only passed to NVML calls below, while `device` borrows `nvml`
    // (so the library stays loaded and initialized).
    let handle = unsafe { device.handle() };
    let failed = |call: &str, code: u32| {
        let hint = if code == NVML_ERROR_NO_PERMISSION {
            " (listing GPU instances needs root)"
        } else {
            ""
        };
        GpuInstances::Failed(format!("{call}: NVML: {}{hint}", NvmlError::from(code)))
    };
    let mut out = Vec::new();
    let mut seen_profiles: Vec<u32> = Vec::new();
    let mut any_profile = false;
    for index in 0..NVML_GPU_INSTANCE_PROFILE_COUNT {
        let mut profile = nvmlGpuInstanceProfileInfo_t {
            id: 0,
            isP2pSupported: 0,
            sliceCount: 0,
            instanceCount: 0,
            multiprocessorCount: 0,
            copyEngineCount: 0,
            decoderCount: 0,
            encoderCount: 0,
            jpegCount: 0,
            ofaCount: 0,
            memorySizeMB: 0,
        };
        // SAFETY: `profile_info` was resolved from the loaded NVML by the name nvml.h gives
        // this signature; `handle` is live (above); `profile` is a live, writable struct of
        // the layout the call fills.
        let code = unsafe { profile_info(handle, index, &mut profile) };
        match code {
            0 => {}
            NVML_ERROR_NOT_SUPPORTED | NVML_ERROR_INVALID_ARGUMENT => continue,
            other => return failed("nvmlDeviceGetGpuInstanceProfileInfo", other),
        }
        any_profile = true;
        if seen_profiles.contains(&profile.id) || profile.instanceCount == 0 {
            continue;
        }
        seen_profiles.push(profile.id);
        if profile.instanceCount > MAX_GPU_INSTANCES_PER_PROFILE {
            return GpuInstances::Failed(format!(
                "NVML says profile {} may have {} GPU instances",
                profile.id, profile.instanceCount
            ));
        }
        let mut handles: Vec<nvmlGpuInstance_t> =
            vec![std::ptr::null_mut(); profile.instanceCount as usize];
        let mut count: u32 = profile.instanceCount;
        // SAFETY: `list` was resolved by its documented name; `handles` has room for
        // `instanceCount` handles, the most NVML writes for this profile, and `count` is a
        // live, writable `c_uint`.
        let code = unsafe { list(handle, profile.id, handles.as_mut_ptr(), &mut count) };
        match code {
            0 => {}
            // The GPU is not in MIG mode: it has no GPU instances to read.
            NVML_ERROR_NOT_SUPPORTED => {
                return GpuInstances::Unsupported("the GPU is not in MIG mode".to_owned());
            }
            other => return failed("nvmlDeviceGetGpuInstances", other),
        }
        let Some(listed) = handles.get(..count as usize) else {
            return GpuInstances::Failed(format!(
                "nvmlDeviceGetGpuInstances reported {count} GPU instances of profile {} with \
                 room for {}",
                profile.id, profile.instanceCount
            ));
        };
        for gi in listed {
            let mut info = nvmlGpuInstanceInfo_t {
                device: std::ptr::null_mut(),
                id: 0,
                profileId: 0,
                placement: nvmlGpuInstancePlacement_t { start: 0, size: 0 },
            };
            // SAFETY: `get_info` was resolved by its documented name; `gi` is a handle NVML
            // just returned for this device; `info` is a live, writable struct of the layout
            // the call fills.
            let code = unsafe { get_info(*gi, &mut info) };
            if code != 0 {
                return failed("nvmlGpuInstanceGetInfo", code);
            }
            out.push(GpuInstancePlacement {
                id: info.id,
                compute_slices: profile.sliceCount,
                start: info.placement.start,
                size: info.placement.size,
            });
        }
    }
    if !any_profile {
        return GpuInstances::Unsupported("the GPU has no GPU-instance profiles".to_owned());
    }
    out.sort_by_key(|g| (g.start, g.id));
    GpuInstances::Known(out)
}

/// Translates one NVML result into a reading: the one place NVML's error codes are judged.
fn reading<T>(r: Result<T, NvmlError>) -> Reading<T> {
    match r {
        Ok(v) => Reading::Value(v),
        Err(e) => error_reading(e),
    }
}

fn error_reading<T>(e: NvmlError) -> Reading<T> {
    match e {
        NvmlError::NotSupported
        | NvmlError::FunctionNotFound
        | NvmlError::FailedToLoadSymbol(_) => Reading::Unsupported,
        other => Reading::Unknown(format!("NVML: {other}")),
    }
}

impl Telemetry for NvmlTelemetry {
    fn source(&self) -> String {
        match &self.driver_version {
            Some(v) => format!("NVML (driver {v})"),
            None => "NVML".to_owned(),
        }
    }

    fn read(&self, address: &PciAddress) -> GpuTelemetry {
        match self.nvml.device_by_pci_bus_id(address.to_string()) {
            Ok(device) => self.read_device(&device),
            Err(NvmlError::GpuLost) => {
                let mut t = GpuTelemetry::unknown("NVML: the GPU has fallen off the bus");
                t.gpu_lost = true;
                t
            }
            Err(NvmlError::NotFound) => GpuTelemetry::unknown("NVML does not know this device"),
            Err(e) => GpuTelemetry::unknown(&format!("NVML: {e}")),
        }
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
        let once = NvmlOnce::start(None);
        let pending = once
            .pending
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .is_some();
        assert!(!pending, "a thread was started to find no driver");
        assert!(matches!(once.get(), Err(NvmlUnavailable::DriverNotLoaded)));
    }
}
