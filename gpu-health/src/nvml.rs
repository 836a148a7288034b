//! The NVML adapter: [`Telemetry`] over gpu-nvml's [`NvmlDevices`] (the library loaded at run
//! time, or the fake in tests).
//!
//! A host without `libnvidia-ml.so.1` (or without a loaded driver) is a value
//! ([`NvmlUnavailable`]) that leaves the NVML signals Unknown, never a link error or a crash.
//! Every call that returns `NVML_ERROR_NOT_SUPPORTED`, or whose symbol the loaded library lacks,
//! reads as Unsupported; every other failure as Unknown with NVML's reason. Loading, the raw
//! calls and the translation of NVML's return codes live in gpu-nvml.

use std::path::Path;
use std::sync::Arc;

use gpu_core::PciAddress;
use gpu_nvml::{HealthReads, NvmlDevices, NvmlError, NvmlErrorKind, NvmlLibrary};

pub(crate) use gpu_nvml::open_library;
pub use gpu_nvml::{CONTROL_DEVICE, DEFAULT_LIBRARY, NvmlUnavailable};

use crate::reading::Reading;
use crate::telemetry::{GpuTelemetry, RowRemap, Telemetry};

/// [`Telemetry`] read through NVML.
pub struct NvmlTelemetry {
    devices: Arc<dyn NvmlDevices>,
    driver_version: Option<String>,
}

impl std::fmt::Debug for NvmlTelemetry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NvmlTelemetry")
            .field("devices", &self.devices)
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
        Ok(Self::over(Arc::new(NvmlLibrary::open(library)?)))
    }

    /// Telemetry over NVML's devices opened already (shared with the type-name resolver), or
    /// over the fake.
    pub fn over(devices: Arc<dyn NvmlDevices>) -> Self {
        let driver_version = devices.driver_version();
        NvmlTelemetry {
            devices,
            driver_version,
        }
    }

    /// The driver version NVML reports, when it does.
    pub fn driver_version(&self) -> Option<&str> {
        self.driver_version.as_deref()
    }
}

/// Translates one NVML answer into a reading: the one place gpu-health judges NVML's errors.
fn reading<T>(r: Result<T, NvmlError>) -> Reading<T> {
    match r {
        Ok(v) => Reading::Value(v),
        Err(e) if e.kind.is_unsupported() => Reading::Unsupported,
        Err(e) => Reading::Unknown(format!("NVML: {}", e.kind)),
    }
}

fn telemetry(r: HealthReads) -> GpuTelemetry {
    GpuTelemetry {
        ecc_uncorrected_volatile: reading(r.ecc_uncorrected_volatile),
        ecc_uncorrected_aggregate: reading(r.ecc_uncorrected_aggregate),
        ecc_corrected_volatile: reading(r.ecc_corrected_volatile),
        ecc_corrected_aggregate: reading(r.ecc_corrected_aggregate),
        retired_pages_sbe: reading(r.retired_pages_sbe),
        retired_pages_dbe: reading(r.retired_pages_dbe),
        pages_pending_retirement: reading(r.pages_pending_retirement),
        row_remap: reading(r.remapped_rows).map(|rows| RowRemap {
            corrected_rows: rows.corrected,
            uncorrected_rows: rows.uncorrected,
            pending: rows.pending,
            failure: rows.failure,
        }),
        temperature_c: reading(r.temperature_c),
        slowdown_c: reading(r.slowdown_c),
        shutdown_c: reading(r.shutdown_c),
        pcie_replay_counter: reading(r.pcie_replay_counter),
        memory_total_bytes: reading(r.memory_total_bytes),
        gpu_lost: false,
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
        match self.devices.health_reads(address) {
            Ok(r) => telemetry(r),
            Err(e) => match e.kind {
                NvmlErrorKind::GpuLost => {
                    let mut t = GpuTelemetry::unknown("NVML: the GPU has fallen off the bus");
                    t.gpu_lost = true;
                    t
                }
                NvmlErrorKind::NotFound => GpuTelemetry::unknown("NVML does not know this device"),
                other => GpuTelemetry::unknown(&format!("NVML: {other}")),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpu_nvml::fake::{FakeGpu, FakeNvml};

    fn addr(s: &str) -> PciAddress {
        s.parse().unwrap()
    }

    #[test]
    fn telemetry_reads_through_the_trait_from_the_fake_nvml() {
        let mut reads = HealthReads::nominal(81920);
        reads.ecc_uncorrected_volatile = Ok(3);
        reads.remapped_rows = Err(NvmlError::new(
            "nvmlDeviceGetRemappedRows",
            NvmlErrorKind::FunctionNotFound,
        ));
        reads.temperature_c = Err(NvmlError::new(
            "nvmlDeviceGetTemperature",
            NvmlErrorKind::Timeout,
        ));
        let fake = FakeNvml::new()
            .with_gpu(addr("0000:41:00.0"), FakeGpu::new(81920).with_health(reads))
            .with_gpu(addr("0000:43:00.0"), FakeGpu::new(1024).lost());
        let t = NvmlTelemetry::over(Arc::new(fake));
        assert_eq!(t.source(), "NVML (driver 570.124.03)");
        let r = t.read(&addr("0000:41:00.0"));
        assert_eq!(r.ecc_uncorrected_volatile, Reading::Value(3));
        assert_eq!(r.row_remap, Reading::Unsupported);
        assert_eq!(r.temperature_c, Reading::Unknown("NVML: timeout".into()));
        assert_eq!(r.memory_mib(), Some(81920));
        assert!(t.read(&addr("0000:43:00.0")).gpu_lost);
        assert_eq!(
            t.read(&addr("0000:99:00.0")).temperature_c,
            Reading::Unknown("NVML does not know this device".into())
        );
    }
}
