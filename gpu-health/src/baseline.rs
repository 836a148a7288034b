//! What each GPU looked like before, kept by the node agent between runs.
//!
//! Two rules need history: a link is degraded when it trained narrower than the same device did
//! before, and non-fatal AER errors matter when they *grow*. The node agent records both in
//! [`BASELINE_PATH`] under the host root (`gpuslice health --record-baseline`); the file is
//! optional, and an entry only applies to the same device (vendor and device ID) at the same
//! address.

use std::collections::BTreeMap;

use gpu_core::{PciAddress, PciId};
use gpu_sysfs::Host;
use serde::{Deserialize, Serialize};

use crate::error::HealthError;

/// The baseline file, relative to the host root.
pub const BASELINE_PATH: &str = "var/lib/gpuslice/health-baseline.json";

/// The largest baseline file read (a few hundred bytes per device).
pub const BASELINE_MAX: usize = 16 << 20;

/// One device's remembered state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DeviceBaseline {
    /// PCI vendor ID of the device the entry was taken from.
    pub vendor_id: PciId,
    /// PCI device ID of the device the entry was taken from.
    pub device_id: PciId,
    /// The widest link the device trained to, in lanes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub link_width: Option<u32>,
    /// `TOTAL_ERR_NONFATAL` when recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub aer_nonfatal: Option<u64>,
    /// `TOTAL_ERR_COR` when recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub aer_correctable: Option<u64>,
    /// NVML PCIe replay counter when recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pcie_replays: Option<u64>,
}

impl DeviceBaseline {
    /// An entry for a device with nothing recorded yet.
    pub fn new(vendor_id: PciId, device_id: PciId) -> Self {
        DeviceBaseline {
            vendor_id,
            device_id,
            link_width: None,
            aer_nonfatal: None,
            aer_correctable: None,
            pcie_replays: None,
        }
    }
}

/// The baseline of a node: one entry per GPU address.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Baseline {
    /// Entries by PCI address.
    #[serde(default)]
    pub devices: BTreeMap<PciAddress, DeviceBaseline>,
}

impl Baseline {
    /// Parses the baseline file's text.
    ///
    /// # Errors
    /// [`HealthError::BaselineDecode`] without a path: its message is the decoder's.
    pub fn from_json(text: &str) -> Result<Self, HealthError> {
        Self::decode(text, None)
    }

    fn decode(text: &str, path: Option<&std::path::Path>) -> Result<Self, HealthError> {
        serde_json::from_str(text).map_err(|source| HealthError::BaselineDecode {
            path: path.map(std::path::Path::to_path_buf),
            source,
        })
    }

    /// Reads [`BASELINE_PATH`] from the host: `Ok(None)` when there is none.
    ///
    /// # Errors
    /// [`HealthError::BaselineRead`] or [`HealthError::BaselineDecode`], naming the file.
    pub fn load(host: &dyn Host) -> Result<Option<Self>, HealthError> {
        let path = std::path::Path::new(BASELINE_PATH);
        match host.read_bounded(BASELINE_PATH, BASELINE_MAX) {
            Ok(bytes) => Self::decode(&String::from_utf8_lossy(&bytes), Some(path)).map(Some),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(source) => Err(HealthError::BaselineRead {
                path: path.to_owned(),
                source,
            }),
        }
    }

    /// The entry for the device at `address`, when it was taken from the same kind of device.
    pub fn entry(
        &self,
        address: &PciAddress,
        vendor_id: PciId,
        device_id: PciId,
    ) -> Option<&DeviceBaseline> {
        self.devices
            .get(address)
            .filter(|e| e.vendor_id == vendor_id && e.device_id == device_id)
    }

    /// Writes the baseline as pretty JSON to [`BASELINE_PATH`] through the host's atomic
    /// writer ([`Host::write_atomic`]: the directory is created, a temporary file is renamed over
    /// the old one, and the root's confinement covers it).
    ///
    /// # Errors
    /// [`HealthError::BaselineWrite`] naming the file.
    pub fn save(&self, host: &dyn Host) -> Result<(), HealthError> {
        let path = host.root_dir().map_or_else(
            || std::path::PathBuf::from(BASELINE_PATH),
            |r| r.join(BASELINE_PATH),
        );
        let io_err = |source| HealthError::BaselineWrite {
            path: path.clone(),
            source,
        };
        let text =
            serde_json::to_string_pretty(self).map_err(|e| io_err(std::io::Error::other(e)))?;
        host.write_atomic(BASELINE_PATH, format!("{text}\n").as_bytes())
            .map_err(io_err)
    }
}
