//! Driver-side signals (NVML on NVIDIA) behind a small trait, so grading never depends on a GPU
//! being present.

use gpu_core::PciAddress;
use serde::{Deserialize, Serialize};

use crate::reading::Reading;

/// Row-remapping state (Ampere and later): rows remapped because of correctable and
/// uncorrectable errors, a remapping waiting for a GPU reset, and a remapping that failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RowRemap {
    /// Rows remapped for correctable errors.
    pub corrected_rows: u32,
    /// Rows remapped for uncorrectable errors.
    pub uncorrected_rows: u32,
    /// A remapping is pending; it takes effect at the next GPU reset.
    pub pending: bool,
    /// A remapping failed: the GPU ran out of spare rows.
    pub failure: bool,
}

/// Everything the driver tells about one GPU. Each field is read on its own; one failing call
/// leaves the others intact.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GpuTelemetry {
    /// Uncorrectable (double-bit) ECC errors since the driver loaded.
    pub ecc_uncorrected_volatile: Reading<u64>,
    /// Uncorrectable ECC errors over the GPU's life.
    pub ecc_uncorrected_aggregate: Reading<u64>,
    /// Corrected (single-bit) ECC errors since the driver loaded.
    pub ecc_corrected_volatile: Reading<u64>,
    /// Corrected ECC errors over the GPU's life.
    pub ecc_corrected_aggregate: Reading<u64>,
    /// Pages retired for multiple single-bit errors.
    pub retired_pages_sbe: Reading<u64>,
    /// Pages retired for a double-bit error.
    pub retired_pages_dbe: Reading<u64>,
    /// Pages are waiting to be retired (at the next driver reload or reset).
    pub pages_pending_retirement: Reading<bool>,
    /// Row remapping (Ampere and later; older GPUs retire pages instead).
    pub row_remap: Reading<RowRemap>,
    /// GPU core temperature in °C.
    pub temperature_c: Reading<u32>,
    /// The temperature at which the GPU slows down, °C.
    pub slowdown_c: Reading<u32>,
    /// The temperature at which the GPU shuts down, °C.
    pub shutdown_c: Reading<u32>,
    /// PCIe replay counter (link-level retransmissions).
    pub pcie_replay_counter: Reading<u64>,
    /// Total framebuffer memory in bytes.
    pub memory_total_bytes: Reading<u64>,
    /// The driver reports the GPU lost: it fell off the bus (XID 79) and needs a reset or reboot.
    #[serde(default)]
    pub gpu_lost: bool,
}

impl GpuTelemetry {
    /// Every signal Unknown for the same reason (library absent, device not found, ...).
    pub fn unknown(why: &str) -> Self {
        let u = || why.to_owned();
        GpuTelemetry {
            ecc_uncorrected_volatile: Reading::Unknown(u()),
            ecc_uncorrected_aggregate: Reading::Unknown(u()),
            ecc_corrected_volatile: Reading::Unknown(u()),
            ecc_corrected_aggregate: Reading::Unknown(u()),
            retired_pages_sbe: Reading::Unknown(u()),
            retired_pages_dbe: Reading::Unknown(u()),
            pages_pending_retirement: Reading::Unknown(u()),
            row_remap: Reading::Unknown(u()),
            temperature_c: Reading::Unknown(u()),
            slowdown_c: Reading::Unknown(u()),
            shutdown_c: Reading::Unknown(u()),
            pcie_replay_counter: Reading::Unknown(u()),
            memory_total_bytes: Reading::Unknown(u()),
            gpu_lost: false,
        }
    }

    /// Every signal Unsupported.
    pub fn unsupported() -> Self {
        GpuTelemetry {
            ecc_uncorrected_volatile: Reading::Unsupported,
            ecc_uncorrected_aggregate: Reading::Unsupported,
            ecc_corrected_volatile: Reading::Unsupported,
            ecc_corrected_aggregate: Reading::Unsupported,
            retired_pages_sbe: Reading::Unsupported,
            retired_pages_dbe: Reading::Unsupported,
            pages_pending_retirement: Reading::Unsupported,
            row_remap: Reading::Unsupported,
            temperature_c: Reading::Unsupported,
            slowdown_c: Reading::Unsupported,
            shutdown_c: Reading::Unsupported,
            pcie_replay_counter: Reading::Unsupported,
            memory_total_bytes: Reading::Unsupported,
            gpu_lost: false,
        }
    }

    /// A healthy, fully readable GPU: no errors, 40 °C against 90/95 °C thresholds, `memory_mib`
    /// of framebuffer. A starting point for fakes.
    pub fn nominal(memory_mib: u64) -> Self {
        GpuTelemetry {
            ecc_uncorrected_volatile: Reading::Value(0),
            ecc_uncorrected_aggregate: Reading::Value(0),
            ecc_corrected_volatile: Reading::Value(0),
            ecc_corrected_aggregate: Reading::Value(0),
            retired_pages_sbe: Reading::Value(0),
            retired_pages_dbe: Reading::Value(0),
            pages_pending_retirement: Reading::Value(false),
            row_remap: Reading::Value(RowRemap::default()),
            temperature_c: Reading::Value(40),
            slowdown_c: Reading::Value(90),
            shutdown_c: Reading::Value(95),
            pcie_replay_counter: Reading::Value(0),
            memory_total_bytes: Reading::Value(memory_mib.saturating_mul(1024 * 1024)),
            gpu_lost: false,
        }
    }

    /// The number of signals that read as a value.
    pub fn values_read(&self) -> usize {
        [
            self.ecc_uncorrected_volatile.is_value(),
            self.ecc_uncorrected_aggregate.is_value(),
            self.ecc_corrected_volatile.is_value(),
            self.ecc_corrected_aggregate.is_value(),
            self.retired_pages_sbe.is_value(),
            self.retired_pages_dbe.is_value(),
            self.pages_pending_retirement.is_value(),
            self.row_remap.is_value(),
            self.temperature_c.is_value(),
            self.pcie_replay_counter.is_value(),
        ]
        .iter()
        .filter(|v| **v)
        .count()
    }

    /// Framebuffer size in MiB, when read.
    pub fn memory_mib(&self) -> Option<u64> {
        self.memory_total_bytes.get().map(|b| b / (1024 * 1024))
    }
}

/// A source of driver-side signals for GPUs addressed by PCI address.
pub trait Telemetry: Send + Sync + std::fmt::Debug {
    /// A short name of the source for reports (`NVML 550.54.15`, `fake`).
    fn source(&self) -> String;

    /// Reads every signal of the GPU at `address`. Never fails as a whole: a GPU the source does
    /// not know, or a call that failed, reads as Unknown or Unsupported field by field.
    fn read(&self, address: &PciAddress) -> GpuTelemetry;
}

/// An in-memory telemetry source for tests: readings set per address; an address not set reads
/// as every signal Unknown ("not a device of this fake").
#[cfg(any(test, feature = "testing"))]
#[derive(Debug, Clone, Default)]
pub struct FakeTelemetry {
    gpus: std::collections::BTreeMap<PciAddress, GpuTelemetry>,
}

#[cfg(any(test, feature = "testing"))]
impl FakeTelemetry {
    /// An empty fake.
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets the readings of one GPU.
    pub fn with(mut self, address: PciAddress, readings: GpuTelemetry) -> Self {
        self.gpus.insert(address, readings);
        self
    }

    /// Sets the readings of one GPU, built from [`GpuTelemetry::nominal`] by `edit`.
    pub fn with_nominal(
        self,
        address: PciAddress,
        memory_mib: u64,
        edit: impl FnOnce(&mut GpuTelemetry),
    ) -> Self {
        let mut t = GpuTelemetry::nominal(memory_mib);
        edit(&mut t);
        self.with(address, t)
    }
}

#[cfg(any(test, feature = "testing"))]
impl Telemetry for FakeTelemetry {
    fn source(&self) -> String {
        "fake".to_owned()
    }

    fn read(&self, address: &PciAddress) -> GpuTelemetry {
        self.gpus
            .get(address)
            .cloned()
            .unwrap_or_else(|| GpuTelemetry::unknown("not a device of this fake"))
    }
}
