//! How the kernel reads what is written to its files: errno values, `kstrtoull`, device names,
//! and the constants the stores use.

use super::*;

pub(super) fn err(code: i32) -> io::Error {
    io::Error::from_raw_os_error(code)
}

/// `"../"` repeated so that a link inside directory `dir` (root-relative) reaches `sys/`.
pub(super) fn up_to_sys(dir: &str) -> String {
    "../".repeat(dir.split('/').count().saturating_sub(1))
}

pub(super) fn strip_sys(p: &str) -> &str {
    p.strip_prefix("sys/").unwrap_or(p)
}

/// Splits a write's data the way sysfs attributes read it: one trailing newline dropped.
pub(super) fn value(data: &[u8]) -> String {
    let s = String::from_utf8_lossy(data);
    s.strip_suffix('\n').unwrap_or(&s).to_owned()
}

/// What a store sees as a C string: the data up to its first NUL byte (sysfs terminates the
/// buffer after the written bytes).
pub(super) fn c_str(data: &[u8]) -> &[u8] {
    data.iter()
        .position(|b| *b == 0)
        .map_or(data, |i| &data[..i])
}

/// The kernel's `kstrtoull(s, 0, ..)`: an optional `+`, digits in base 16 (`0x` followed by a hex
/// digit), 8 (a leading `0`) or 10, then at most one `\n`. `Err(EINVAL)` for anything else,
/// `Err(ERANGE)` past `u64::MAX`.
pub(super) fn kstrtoull(data: &[u8]) -> Result<u64, i32> {
    let mut s = c_str(data);
    if let [b'+', rest @ ..] = s {
        s = rest;
    }
    let base: u8 = match s {
        [b'0', x, d, ..] if x.eq_ignore_ascii_case(&b'x') && d.is_ascii_hexdigit() => {
            s = &s[2..];
            16
        }
        [b'0', ..] => 8,
        _ => 10,
    };
    let mut value: u64 = 0;
    let mut digits = 0;
    let mut overflow = false;
    for &c in s {
        let d = match c {
            b'0'..=b'9' => c - b'0',
            b'a'..=b'f' => c - b'a' + 10,
            b'A'..=b'F' => c - b'A' + 10,
            _ => break,
        };
        if d >= base {
            break;
        }
        match value
            .checked_mul(u64::from(base))
            .and_then(|v| v.checked_add(u64::from(d)))
        {
            Some(v) => value = v,
            None => overflow = true,
        }
        digits += 1;
    }
    if overflow {
        return Err(errno::ERANGE);
    }
    if digits == 0 {
        return Err(errno::EINVAL);
    }
    match &s[digits..] {
        [] | [b'\n'] => Ok(value),
        _ => Err(errno::EINVAL),
    }
}

/// The PCI device named by a write to `bind`, `unbind` or `drivers_probe`: the kernel compares
/// the text with the device's name exactly (`sysfs_streq`: one trailing newline allowed), so
/// `01:00.0` or `0000:01:00.0 ` name nothing.
pub(super) fn named_device(data: &[u8]) -> Option<PciAddress> {
    let s = c_str(data);
    let s = s.strip_suffix(b"\n").unwrap_or(s);
    let s = std::str::from_utf8(s).ok()?;
    let a: PciAddress = s.parse().ok()?;
    (a.to_string() == s).then_some(a)
}

/// The `power/` attributes of a device without runtime power management, as a real host's mdev
/// instances show them (harvester/pcidevices' A2 capture, Apache-2.0).
pub(super) const POWER_ATTRS: &[(&str, &str)] = &[
    ("async", "disabled"),
    ("control", "auto"),
    ("runtime_active_kids", "0"),
    ("runtime_active_time", "0"),
    ("runtime_enabled", "disabled"),
    ("runtime_status", "unsupported"),
    ("runtime_suspended_time", "0"),
    ("runtime_usage", "0"),
];

/// The mdev driver NVIDIA's host driver registers.
pub(super) const NVIDIA_MDEV_DRIVER: &str = "nvidia-vgpu-vfio";

/// Sysfs stores see at most a page; `driver_override` refuses one that long.
pub(super) const PAGE_SIZE: usize = 4096;
