//! PCIe link width and speed from sysfs.
//!
//! `max_link_width` is what the GPU chip advertises in its Link Capabilities register, not what
//! the board is wired for: an NVIDIA A2 chip advertises x16 on a board wired x8. And NVIDIA GPUs
//! lower their link *speed* at idle by design (16 GT/s → 2.5 GT/s). So neither "width below
//! maximum" nor "speed below maximum" says on its own that a link degraded; see
//! [`crate::policy::LinkPolicy`] for how the expected width is chosen.

use std::io;

use gpu_core::PciAddress;
use gpu_sysfs::Host;
use serde::{Deserialize, Serialize};

use crate::reading::Reading;

/// The four link files of one function.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LinkReadings {
    /// `current_link_width` in lanes (a `0`, as VFs and links that are down report, is Unknown).
    pub current_width: Reading<u32>,
    /// `max_link_width` in lanes.
    pub max_width: Reading<u32>,
    /// `current_link_speed` in GT/s.
    pub current_speed_gts: Reading<f64>,
    /// `max_link_speed` in GT/s.
    pub max_speed_gts: Reading<f64>,
}

pub use gpu_sysfs::link::{parse_speed, parse_width};

fn read_one<T>(
    host: &dyn Host,
    address: &PciAddress,
    file: &str,
    parse: fn(&str) -> Result<Option<T>, String>,
) -> Reading<T> {
    let path = format!("sys/bus/pci/devices/{address}/{file}");
    match host.read(&path) {
        Ok(bytes) => match parse(&String::from_utf8_lossy(&bytes)) {
            Ok(Some(v)) => Reading::Value(v),
            Ok(None) => Reading::Unknown(format!("{file}: not reported")),
            Err(e) => Reading::Unknown(format!("{file}: {e}")),
        },
        Err(e) if e.kind() == io::ErrorKind::NotFound => Reading::Unsupported,
        Err(e) => Reading::Unknown(format!("{file}: {e}")),
    }
}

/// Reads the link files of a function.
pub fn read_link(host: &dyn Host, address: &PciAddress) -> LinkReadings {
    LinkReadings {
        current_width: read_one(host, address, "current_link_width", parse_width),
        max_width: read_one(host, address, "max_link_width", parse_width),
        current_speed_gts: read_one(host, address, "current_link_speed", parse_speed),
        max_speed_gts: read_one(host, address, "max_link_speed", parse_speed),
    }
}
