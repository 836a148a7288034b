//! PCIe link width and speed from sysfs.
//!
//! `max_link_width` is what the GPU chip advertises in its Link Capabilities register, not what
//! the board is wired for: an NVIDIA A2 chip advertises x16 on a board wired x8. And NVIDIA GPUs
//! lower their link *speed* at idle by design (16 GT/s → 2.5 GT/s). So neither "width below
//! maximum" nor "speed below maximum" says on its own that a link degraded; see
//! [`crate::policy::LinkPolicy`] for how the expected width is chosen.

use gpu_core::PciAddress;
use gpu_sysfs::Host;
use gpu_sysfs::link::{LinkFile, LinkFiles, LinkParseError};
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

fn reading<T>(
    file: &str,
    f: &LinkFile,
    parse: fn(&str) -> Result<Option<T>, LinkParseError>,
) -> Reading<T> {
    match f {
        LinkFile::Text(t) => match parse(t) {
            Ok(Some(v)) => Reading::Value(v),
            Ok(None) => Reading::Unknown(format!("{file}: not reported")),
            Err(e) => Reading::Unknown(format!("{file}: {e}")),
        },
        LinkFile::Absent => Reading::Unsupported,
        LinkFile::Unreadable(e) => Reading::Unknown(format!("{file}: {e}")),
    }
}

impl LinkReadings {
    /// The readings of link files already read (by discovery): no file is read again.
    pub fn from_files(files: &LinkFiles) -> Self {
        let [cw, mw, cs, ms] = LinkFiles::NAMES;
        LinkReadings {
            current_width: reading(cw, &files.current_width, parse_width),
            max_width: reading(mw, &files.max_width, parse_width),
            current_speed_gts: reading(cs, &files.current_speed, parse_speed),
            max_speed_gts: reading(ms, &files.max_speed, parse_speed),
        }
    }
}

/// Reads the link files of a function.
pub fn read_link(host: &dyn Host, address: &PciAddress) -> LinkReadings {
    let dir = format!("sys/bus/pci/devices/{address}");
    LinkReadings::from_files(&LinkFiles::read(host, &dir, None))
}
