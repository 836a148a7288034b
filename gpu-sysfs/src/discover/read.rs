//! Reading single attributes with the discovery policy: a missing file is simply absent, any other
//! failure (unreadable, malformed) becomes a warning on the device concerned and the scan goes on.

use std::io;

use crate::error::SysfsError;
use crate::host::Host;

/// Reads an attribute as trimmed text. `None` when absent; other errors are pushed to `warnings`.
pub(crate) fn text(host: &dyn Host, path: &str, warnings: &mut Vec<String>) -> Option<String> {
    bytes(host, path, warnings).map(|b| String::from_utf8_lossy(&b).trim().to_owned())
}

/// Reads an attribute's bytes. `None` when absent; other errors are pushed to `warnings`.
fn bytes(host: &dyn Host, path: &str, warnings: &mut Vec<String>) -> Option<Vec<u8>> {
    match host.read(path) {
        Ok(bytes) => Some(bytes),
        Err(e) if e.kind() == io::ErrorKind::NotFound => None,
        Err(e) => {
            warnings.push(format!("{path}: {e}"));
            None
        }
    }
}

/// Reads and parses an attribute; absent gives `None`, unreadable or malformed gives a warning.
pub(crate) fn parsed<T>(
    host: &dyn Host,
    path: &str,
    warnings: &mut Vec<String>,
    parse: impl FnOnce(&str, &str) -> Result<T, SysfsError>,
) -> Option<T> {
    // As `text`, without a copy of the text: it is parsed where it was read.
    let bytes = bytes(host, path, warnings)?;
    match parse(String::from_utf8_lossy(&bytes).trim(), path) {
        Ok(v) => Some(v),
        Err(e) => {
            warnings.push(e.to_string());
            None
        }
    }
}

/// `name` (a directory entry, a link's last component) parsed as a `T`; one that does not parse
/// is noted as `at: why` in `warnings` and gives `None`, so the scan skips it.
pub(crate) fn name_as<T: std::str::FromStr>(
    name: &str,
    at: impl std::fmt::Display,
    warnings: &mut Vec<String>,
) -> Option<T>
where
    T::Err: std::fmt::Display,
{
    match name.parse() {
        Ok(v) => Some(v),
        Err(e) => {
            warnings.push(format!("{at}: {e}"));
            None
        }
    }
}

/// The last component of a symlink's target (`driver` → `nvidia`, `iommu_group` → `38`,
/// `virtfn3` → `0000:08:00.7`). One `readlink`, no path walk. `None` when absent.
pub(crate) fn link_name(host: &dyn Host, path: &str, warnings: &mut Vec<String>) -> Option<String> {
    match host.read_link(path) {
        Ok(target) => {
            let t = target.to_string_lossy();
            let last = t.trim_end_matches('/').rsplit('/').next().unwrap_or("");
            if last.is_empty() || last == ".." || last == "." {
                warnings.push(format!("{path}: link target {t:?} names no device"));
                None
            } else {
                Some(last.to_owned())
            }
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => None,
        Err(e) => {
            warnings.push(format!("{path}: {e}"));
            None
        }
    }
}

/// The raw target of a symlink, `None` when absent.
pub(crate) fn link_target(
    host: &dyn Host,
    path: &str,
    warnings: &mut Vec<String>,
) -> Option<String> {
    match host.read_link(path) {
        Ok(target) => Some(target.to_string_lossy().into_owned()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => None,
        Err(e) => {
            warnings.push(format!("{path}: {e}"));
            None
        }
    }
}

/// Lists a directory; absent gives an empty list, other errors a warning.
pub(crate) fn list(host: &dyn Host, dir: &str, warnings: &mut Vec<String>) -> Vec<String> {
    match host.list(dir) {
        Ok(v) => v,
        Err(e) if e.kind() == io::ErrorKind::NotFound => Vec::new(),
        Err(e) => {
            warnings.push(format!("{dir}: {e}"));
            Vec::new()
        }
    }
}

/// Parses a hex ID attribute (`0x10de`).
pub(crate) fn hex16(text: &str, file: &str) -> Result<u16, SysfsError> {
    text.parse::<gpu_core::PciId>()
        .map(|p| p.0)
        .map_err(|e| SysfsError::malformed(file, 1, e.to_string()))
}

/// Parses a class attribute (`0x030200`).
pub(crate) fn class(text: &str, file: &str) -> Result<gpu_core::ClassCode, SysfsError> {
    text.parse::<gpu_core::ClassCode>()
        .map_err(|e| SysfsError::malformed(file, 1, e.to_string()))
}
