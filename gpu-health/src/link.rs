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

/// Parses a link width file: a decimal lane count. `0` means the kernel has no width to report.
///
/// # Errors
/// A message naming the text when it is not a lane count.
pub fn parse_width(text: &str) -> Result<Option<u32>, String> {
    let t = text.trim();
    match t.parse::<u32>() {
        Ok(0) => Ok(None),
        Ok(n) if n <= 32 => Ok(Some(n)),
        _ => Err(format!("expected a lane count, found {:?}", cut(t))),
    }
}

/// Parses a link speed file (`16.0 GT/s PCIe`, `2.5 GT/s`, `8 GT/s`) into GT/s; `Unknown` (what
/// the kernel prints when the speed field is not a known value) gives `None`.
///
/// # Errors
/// A message naming the text when it is neither a speed nor `Unknown`.
pub fn parse_speed(text: &str) -> Result<Option<f64>, String> {
    let t = text.trim();
    if t.starts_with("Unknown") {
        return Ok(None);
    }
    let bad = || {
        format!(
            "expected a speed such as \"16.0 GT/s PCIe\", found {:?}",
            cut(t)
        )
    };
    let number = t.strip_suffix("PCIe").unwrap_or(t).trim();
    let number = number.strip_suffix("GT/s").ok_or_else(bad)?.trim();
    match number.parse::<f64>() {
        Ok(v) if v.is_finite() && v > 0.0 && v < 1000.0 => Ok(Some(v)),
        _ => Err(bad()),
    }
}

fn cut(t: &str) -> String {
    t.chars().take(40).collect()
}

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_what_kernels_print() {
        assert_eq!(parse_width("8\n"), Ok(Some(8)));
        assert_eq!(parse_width("0\n"), Ok(None));
        assert!(parse_width("x8").is_err());
        assert!(parse_width("64").is_err());
        assert_eq!(parse_speed("16.0 GT/s PCIe\n"), Ok(Some(16.0)));
        assert_eq!(parse_speed("2.5 GT/s PCIe"), Ok(Some(2.5)));
        assert_eq!(parse_speed("8 GT/s"), Ok(Some(8.0)));
        assert_eq!(parse_speed("Unknown\n"), Ok(None));
        assert_eq!(parse_speed("Unknown speed"), Ok(None));
        assert!(parse_speed("fast").is_err());
        assert!(parse_speed("NaN GT/s").is_err());
    }
}
