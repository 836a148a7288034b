//! PCIe Advanced Error Reporting counters from sysfs.
//!
//! The kernel exposes three files per function, `aer_dev_correctable`, `aer_dev_nonfatal` and
//! `aer_dev_fatal`, each a list of `NAME COUNT` lines closed by a totals line
//! (`TOTAL_ERR_COR N`, `TOTAL_ERR_NONFATAL N`, `TOTAL_ERR_FATAL N`). Counters run from boot (or
//! from the device's last reset) and never go down while the device stays.

use std::collections::BTreeMap;
use std::io;

use gpu_core::PciAddress;
use gpu_sysfs::Host;
use serde::{Deserialize, Serialize};

use crate::reading::Reading;

/// One AER file's counters.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AerCounters {
    /// Per-error counts by the kernel's names (`RxErr`, `CmpltTO`, ...), in file order.
    /// JSON: an object `{"RxErr": 0, ...}` in that order.
    #[serde(with = "pairs_as_map")]
    pub counts: Vec<(String, u64)>,
    /// The `TOTAL_ERR_*` line, or the sum of the counts when the kernel printed none.
    pub total: u64,
}

impl AerCounters {
    /// The non-zero counts as `"CmpltTO 3, MalfTLP 1"`, for reasons.
    pub fn nonzero_summary(&self) -> String {
        self.counts
            .iter()
            .filter(|(_, n)| *n > 0)
            .map(|(name, n)| format!("{name} {n}"))
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// The count of one named error.
    pub fn count(&self, name: &str) -> Option<u64> {
        self.counts.iter().find(|(n, _)| n == name).map(|(_, c)| *c)
    }
}

/// Serializes name/count pairs as a JSON object, keeping their order.
mod pairs_as_map {
    use serde::de::{MapAccess, Visitor};
    use serde::ser::SerializeMap;
    use serde::{Deserializer, Serializer};

    pub fn serialize<S: Serializer>(pairs: &[(String, u64)], s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(Some(pairs.len()))?;
        for (k, v) in pairs {
            m.serialize_entry(k, v)?;
        }
        m.end()
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<(String, u64)>, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Vec<(String, u64)>;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("an object of error names to counts")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                let mut out = Vec::new();
                while let Some((k, v)) = map.next_entry::<String, u64>()? {
                    out.push((k, v));
                }
                Ok(out)
            }
        }
        d.deserialize_map(V)
    }
}

/// Why an AER file could not be parsed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AerParseError {
    /// The file holds no counter line at all.
    #[error("no counters")]
    Empty,
    /// A line is not `NAME COUNT`.
    #[error("line {line}: expected `NAME COUNT`, found {text:?}")]
    BadLine {
        /// 1-based line number.
        line: usize,
        /// The line (cut to 80 characters).
        text: String,
    },
    /// A name appears twice (a torn read or a corrupted file).
    #[error("line {line}: {name} appears twice")]
    Duplicate {
        /// 1-based line number.
        line: usize,
        /// The repeated name.
        name: String,
    },
}

/// Parses the text of one `aer_dev_*` file.
///
/// # Errors
/// [`AerParseError::Empty`] when there is no counter line, [`AerParseError::BadLine`] for a line
/// that is not a name followed by a decimal count, [`AerParseError::Duplicate`] for a repeated name.
pub fn parse_aer(text: &str) -> Result<AerCounters, AerParseError> {
    let mut counts: Vec<(String, u64)> = Vec::new();
    let mut seen: BTreeMap<&str, ()> = BTreeMap::new();
    let mut total = None;
    for (i, raw) in text.lines().enumerate() {
        let line = raw.trim();
        if line.is_empty() {
            continue;
        }
        let bad = || AerParseError::BadLine {
            line: i + 1,
            text: line.chars().take(80).collect(),
        };
        let mut parts = line.split_whitespace();
        let (Some(name), Some(count), None) = (parts.next(), parts.next(), parts.next()) else {
            return Err(bad());
        };
        if !count.bytes().all(|b| b.is_ascii_digit()) {
            return Err(bad());
        }
        let n: u64 = count.parse().map_err(|_| bad())?;
        if seen.insert(name, ()).is_some() {
            return Err(AerParseError::Duplicate {
                line: i + 1,
                name: name.to_owned(),
            });
        }
        if name.starts_with("TOTAL_ERR_") {
            total = Some(n);
        } else {
            counts.push((name.to_owned(), n));
        }
    }
    if counts.is_empty() && total.is_none() {
        return Err(AerParseError::Empty);
    }
    let total =
        total.unwrap_or_else(|| counts.iter().map(|(_, n)| *n).fold(0, u64::saturating_add));
    Ok(AerCounters { counts, total })
}

/// The three AER files of one function.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AerReadings {
    /// `aer_dev_correctable`.
    pub correctable: Reading<AerCounters>,
    /// `aer_dev_nonfatal`.
    pub nonfatal: Reading<AerCounters>,
    /// `aer_dev_fatal`.
    pub fatal: Reading<AerCounters>,
}

/// Reads one AER file: missing is Unsupported (no AER capability or kernel support), unreadable
/// or garbled is Unknown with the file and problem named.
pub fn read_aer_file(host: &dyn Host, address: &PciAddress, file: &str) -> Reading<AerCounters> {
    let path = format!("sys/bus/pci/devices/{address}/{file}");
    match host.read(&path) {
        Ok(bytes) => match std::str::from_utf8(&bytes) {
            Ok(text) => match parse_aer(text) {
                Ok(c) => Reading::Value(c),
                Err(e) => Reading::Unknown(format!("{file}: {e}")),
            },
            Err(_) => Reading::Unknown(format!("{file}: not UTF-8 text")),
        },
        Err(e) if e.kind() == io::ErrorKind::NotFound => Reading::Unsupported,
        Err(e) => Reading::Unknown(format!("{file}: {e}")),
    }
}

/// Reads all three AER files of a function.
pub fn read_aer(host: &dyn Host, address: &PciAddress) -> AerReadings {
    AerReadings {
        correctable: read_aer_file(host, address, "aer_dev_correctable"),
        nonfatal: read_aer_file(host, address, "aer_dev_nonfatal"),
        fatal: read_aer_file(host, address, "aer_dev_fatal"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_counts_and_the_totals_line() {
        let c = parse_aer("RxErr 2\nBadTLP 0\nTOTAL_ERR_COR 2\n").unwrap();
        assert_eq!(c.total, 2);
        assert_eq!(c.count("RxErr"), Some(2));
        assert_eq!(c.nonzero_summary(), "RxErr 2");
        let json = serde_json::to_string(&c).unwrap();
        assert_eq!(json, r#"{"counts":{"RxErr":2,"BadTLP":0},"total":2}"#);
        assert_eq!(serde_json::from_str::<AerCounters>(&json).unwrap(), c);
    }

    #[test]
    fn sums_the_counts_when_there_is_no_totals_line() {
        assert_eq!(parse_aer("DLP 1\nTLP 4\n").unwrap().total, 5);
    }

    #[test]
    fn rejects_garbage_naming_the_line() {
        assert_eq!(
            parse_aer("RxErr 0\nRxErr zero\n"),
            Err(AerParseError::BadLine {
                line: 2,
                text: "RxErr zero".into()
            })
        );
        assert_eq!(parse_aer("\n\n"), Err(AerParseError::Empty));
        assert!(parse_aer("A 1 2").is_err());
        assert!(parse_aer("A -1").is_err());
        assert!(parse_aer("A +1").is_err());
        assert!(parse_aer("A 99999999999999999999999").is_err());
        assert!(matches!(
            parse_aer("A 1\nA 2"),
            Err(AerParseError::Duplicate { line: 2, .. })
        ));
    }
}
