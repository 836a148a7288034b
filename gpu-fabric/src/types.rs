//! What Fabric Manager answers, as it answers it: partitions with their GPUs by physical
//! (module) ID and PCI bus ID, and the devices whose NVLinks failed. gpu-node turns these into
//! gpu-core's partition model ([`gpu_core::fabric::Fabric`]) with the node's GPU names.

use gpu_core::PciAddress;
use serde::{Deserialize, Serialize};

/// One GPU of a partition (`fmFabricPartitionGpuInfo_t`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FmGpu {
    /// The GPU's physical ID: its module ID on the baseboard (NVML `nvmlDeviceGetModuleId`).
    pub physical_id: u32,
    /// Its UUID, as FM reports it (may be empty).
    #[serde(default)]
    pub uuid: String,
    /// Its PCI address, as FM reports it; `None` where FM gave none or an unparsable one.
    #[serde(default)]
    pub pci_bus_id: Option<PciAddress>,
    /// NVLinks available for use now (fewer than `max_nvlinks` when some failed).
    pub nvlinks: u32,
    /// NVLinks of this GPU without degradation.
    pub max_nvlinks: u32,
    /// Per-NVLink line rate, MB/s.
    #[serde(default)]
    pub line_rate_mbps: u32,
}

impl FmGpu {
    /// Fewer NVLinks than the GPU has without degradation.
    pub fn is_degraded(&self) -> bool {
        self.nvlinks < self.max_nvlinks
    }
}

/// One supported partition (`fmFabricPartitionInfo_t`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FmPartition {
    /// FM's partition ID.
    pub id: u32,
    /// Active now.
    pub active: bool,
    /// Its GPUs, in FM's order.
    pub gpus: Vec<FmGpu>,
}

/// A GPU or NVSwitch with failed NVLinks (`fmNvlinkFailedDeviceInfo_t`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FailedDevice {
    /// Its UUID (may be empty).
    #[serde(default)]
    pub uuid: String,
    /// Its PCI address; `None` where FM gave an unparsable one.
    pub pci_bus_id: Option<PciAddress>,
    /// The ports whose NVLinks failed.
    pub ports: Vec<u32>,
}

/// What `fmGetNvlinkFailedDevices` answers (`fmNvlinkFailedDevices_t`).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NvlinkFailures {
    /// GPUs with failed NVLinks.
    #[serde(default)]
    pub gpus: Vec<FailedDevice>,
    /// NVSwitches with failed NVLinks.
    #[serde(default)]
    pub switches: Vec<FailedDevice>,
}

impl NvlinkFailures {
    /// No device has a failed NVLink.
    pub fn is_empty(&self) -> bool {
        self.gpus.is_empty() && self.switches.is_empty()
    }
}

/// FM's PCI bus ID text (`00000000:18:00.0`) as an address, `None` when it does not parse.
pub(crate) fn parse_bus_id(text: &str) -> Option<PciAddress> {
    text.trim_matches(char::from(0)).trim().parse().ok()
}
