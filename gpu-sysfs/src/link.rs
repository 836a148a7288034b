//! The one parser of the PCIe link files (`current_link_width`, `max_link_width`,
//! `current_link_speed`, `max_link_speed`), used by discovery and by the health grading, and
//! [`LinkFiles`]: the files as discovery read them, handed on to the health grading so that a
//! composition reads each link file once.

use std::io;

use crate::host::Host;

/// One link file as it was read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LinkFile {
    /// The function has no such file.
    Absent,
    /// The file's text.
    Text(String),
    /// The file could not be read: the error's message.
    Unreadable(String),
}

impl LinkFile {
    /// Reads `path`: a missing file is [`LinkFile::Absent`].
    pub fn read(host: &dyn Host, path: &str) -> Self {
        match host.read(path) {
            Ok(bytes) => LinkFile::Text(String::from_utf8_lossy(&bytes).trim().to_owned()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => LinkFile::Absent,
            Err(e) => LinkFile::Unreadable(e.to_string()),
        }
    }
}

/// The four link files of one function, each read once.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinkFiles {
    /// `current_link_width`.
    pub current_width: LinkFile,
    /// `max_link_width`.
    pub max_width: LinkFile,
    /// `current_link_speed`.
    pub current_speed: LinkFile,
    /// `max_link_speed`.
    pub max_speed: LinkFile,
}

impl LinkFiles {
    /// The file names, in the order of the fields.
    pub const NAMES: [&'static str; 4] = [
        "current_link_width",
        "max_link_width",
        "current_link_speed",
        "max_link_speed",
    ];

    /// Reads the link files in the function directory `dir`; `listed` (the directory's
    /// entries, when known) saves the reads of files that are not there.
    pub fn read(
        host: &dyn Host,
        dir: &str,
        listed: Option<&std::collections::BTreeSet<String>>,
    ) -> Self {
        let one = |name: &str| {
            if listed.is_some_and(|l| !l.contains(name)) {
                return LinkFile::Absent;
            }
            LinkFile::read(host, &format!("{dir}/{name}"))
        };
        let [cw, mw, cs, ms] = Self::NAMES;
        LinkFiles {
            current_width: one(cw),
            max_width: one(mw),
            current_speed: one(cs),
            max_speed: one(ms),
        }
    }
}

/// A link file whose text is neither a value nor one of the kernel's words for "none".
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LinkParseError {
    /// A width file that does not hold a lane count (1 to 32).
    #[error("expected a lane count, found {found:?}")]
    Width {
        /// The text found (its first 40 characters).
        found: String,
    },
    /// A speed file that holds neither a speed nor `Unknown`.
    #[error("expected a speed such as \"16.0 GT/s PCIe\", found {found:?}")]
    Speed {
        /// The text found (its first 40 characters).
        found: String,
    },
}

/// Parses a link width file: a decimal lane count. `0` (what VFs and links that are down
/// report) means the kernel has no width to report and gives `None`.
///
/// # Errors
/// [`LinkParseError::Width`] naming the text when it is not a lane count (1 to 32).
pub fn parse_width(text: &str) -> Result<Option<u32>, LinkParseError> {
    let t = text.trim();
    match t.parse::<u32>() {
        Ok(0) => Ok(None),
        Ok(n) if n <= 32 => Ok(Some(n)),
        _ => Err(LinkParseError::Width { found: cut(t) }),
    }
}

/// Parses a link speed file (`16.0 GT/s PCIe`, `2.5 GT/s`, `8 GT/s`) into GT/s; `Unknown` (what
/// the kernel prints when the speed field is not a known value) or an empty file gives `None`.
///
/// # Errors
/// [`LinkParseError::Speed`] naming the text when it is neither a speed nor `Unknown`.
pub fn parse_speed(text: &str) -> Result<Option<f64>, LinkParseError> {
    let t = text.trim();
    if t.is_empty() || t.starts_with("Unknown") || t.eq_ignore_ascii_case("unknown") {
        return Ok(None);
    }
    let bad = || LinkParseError::Speed { found: cut(t) };
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
        assert_eq!(parse_speed(""), Ok(None));
        assert!(parse_speed("fast").is_err());
        assert!(parse_speed("NaN GT/s").is_err());
    }

    #[test]
    fn a_file_that_is_no_link_value_is_a_typed_error_quoting_its_text() {
        let e = parse_width("x8\n").unwrap_err();
        assert_eq!(e, LinkParseError::Width { found: "x8".into() });
        assert_eq!(e.to_string(), "expected a lane count, found \"x8\"");
        let e = parse_speed("fast").unwrap_err();
        assert_eq!(
            e.to_string(),
            "expected a speed such as \"16.0 GT/s PCIe\", found \"fast\""
        );
        let long = "9".repeat(60);
        assert_eq!(
            parse_width(&long).unwrap_err(),
            LinkParseError::Width {
                found: "9".repeat(40)
            },
            "the text is quoted up to 40 characters"
        );
    }
}
