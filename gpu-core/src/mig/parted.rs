//! NVIDIA mig-parted's config format, read unchanged, so operators keep the files they have:
//!
//! ```yaml
//! version: v1
//! mig-configs:
//!   all-1g.10gb:
//!     - devices: all             # or GPU indices [0, 1]
//!       device-filter: "0x233010DE"   # optional; string or list
//!       mig-enabled: true
//!       mig-devices:
//!         "1g.10gb": 7
//!   all-disabled:
//!     - devices: all
//!       mig-enabled: false
//! ```
//!
//! (<https://github.com/NVIDIA/mig-parted>, README "Configuration".) `devices` and
//! `device-filter` select GPUs exactly as in the vGPU layout file ([`crate::layout`]).
//! Profile names are checked against the GPU at apply time (they differ per product);
//! compute-instance forms (`1c.3g.40gb`) are refused here: gpuslice makes GPU instances, for
//! MIG-backed vGPUs, and a vGPU's compute instances are its guest's.

use serde::Serialize;
use serde_yaml_ng::Value;

use crate::layout::LayoutError;
use crate::layout::config::{
    as_mapping, decode_max, invalid, key_str, kind, parse_devices, parse_filters, show,
    unknown_key, versioned_section,
};
use crate::layout::{DeviceFilter, Devices};

/// A parsed mig-parted file: named configs in file order.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct MigPartedFile {
    /// The configs, in file order.
    pub configs: Vec<MigPartedConfig>,
}

/// One named config (a key under `mig-configs`).
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct MigPartedConfig {
    /// Its name.
    pub name: String,
    /// Its entries, in file order.
    pub entries: Vec<MigPartedEntry>,
}

/// One entry: which GPUs, MIG mode on or off, and the GPU instances they should hold.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct MigPartedEntry {
    /// `devices`.
    pub devices: Devices,
    /// `device-filter` (empty: every NVIDIA GPU).
    pub filters: Vec<DeviceFilter>,
    /// `mig-enabled`.
    pub mig_enabled: bool,
    /// `mig-devices`: profile name and count, in file order (empty with MIG off).
    pub mig_devices: Vec<(String, u32)>,
}

impl MigPartedFile {
    /// Parses and validates a mig-parted file (YAML; JSON is YAML too).
    ///
    /// # Errors
    /// [`LayoutError::Decode`] for text that is not YAML or is over the document cap,
    /// [`LayoutError::Invalid`] naming the place (`mig-configs.NAME[i].mig-devices`) and what
    /// is wrong.
    pub fn parse(text: &str) -> Result<Self, LayoutError> {
        let root = decode_max(text, crate::limits::MAX_DOCUMENT_BYTES)?;
        let cmap = versioned_section(&root, "mig-configs")?;
        let mut out = Vec::with_capacity(cmap.len());
        for (k, v) in cmap {
            let name = key_str(k, "mig-configs")?.to_owned();
            let at = format!("mig-configs.{name}");
            let Value::Sequence(items) = v else {
                return Err(invalid(
                    &at,
                    format!("expected a list of entries, found {}", kind(v)),
                ));
            };
            if items.is_empty() {
                return Err(invalid(&at, "at least one entry is required"));
            }
            let entries = items
                .iter()
                .enumerate()
                .map(|(i, item)| parse_entry(item, &format!("{at}[{i}]")))
                .collect::<Result<Vec<_>, _>>()?;
            out.push(MigPartedConfig { name, entries });
        }
        Ok(MigPartedFile { configs: out })
    }

    /// The config named `name`.
    ///
    /// # Errors
    /// [`LayoutError::UnknownConfig`] with the names the file has.
    pub fn select(&self, name: &str) -> Result<&MigPartedConfig, LayoutError> {
        self.configs
            .iter()
            .find(|c| c.name == name)
            .ok_or_else(|| LayoutError::UnknownConfig {
                name: name.to_owned(),
                known: self
                    .configs
                    .iter()
                    .map(|c| c.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", "),
            })
    }
}

fn parse_entry(v: &Value, at: &str) -> Result<MigPartedEntry, LayoutError> {
    let m = as_mapping(v, at)?;
    let mut devices = None;
    let mut filters = Vec::new();
    let mut enabled = None;
    let mut wanted = None;
    for (k, val) in m {
        match key_str(k, at)? {
            "devices" => devices = Some(parse_devices(val, &format!("{at}.devices"))?),
            "device-filter" => filters = parse_filters(val, &format!("{at}.device-filter"))?,
            "mig-enabled" => match val {
                Value::Bool(b) => enabled = Some(*b),
                other => {
                    return Err(invalid(
                        &format!("{at}.mig-enabled"),
                        format!("expected true or false, found {}", show(other)),
                    ));
                }
            },
            "mig-devices" => wanted = Some(parse_mig_devices(val, &format!("{at}.mig-devices"))?),
            other => {
                return Err(unknown_key(
                    at,
                    other,
                    &["devices", "device-filter", "mig-enabled", "mig-devices"],
                ));
            }
        }
    }
    let devices = devices.ok_or_else(|| invalid(at, "missing required key 'devices'"))?;
    let mig_enabled = enabled.ok_or_else(|| invalid(at, "missing required key 'mig-enabled'"))?;
    let mig_devices = wanted.unwrap_or_default();
    if !mig_enabled && !mig_devices.is_empty() {
        return Err(invalid(
            &format!("{at}.mig-devices"),
            "GPU instances need MIG mode: set mig-enabled: true or leave mig-devices out",
        ));
    }
    Ok(MigPartedEntry {
        devices,
        filters,
        mig_enabled,
        mig_devices,
    })
}

fn parse_mig_devices(v: &Value, at: &str) -> Result<Vec<(String, u32)>, LayoutError> {
    let m = match v {
        Value::Null => return Ok(Vec::new()),
        other => as_mapping(other, at)?,
    };
    let mut out: Vec<(String, u32)> = Vec::with_capacity(m.len());
    for (k, val) in m {
        let name = key_str(k, at)?.trim().to_owned();
        let here = format!("{at}.{name}");
        if !is_gpu_instance_profile(&name) {
            let why = if name.matches('.').count() == 2 && name.contains('c') {
                "is a compute-instance profile; gpuslice makes GPU instances only (name the \
                 GPU-instance profile, such as 3g.40gb)"
                    .to_owned()
            } else {
                "is not a GPU-instance profile name such as 1g.10gb or 3g.71gb".to_owned()
            };
            return Err(invalid(&here, format!("{name:?} {why}")));
        }
        let count = val
            .as_u64()
            .and_then(|n| u32::try_from(n).ok())
            .ok_or_else(|| {
                invalid(
                    &here,
                    format!(
                        "expected a count (a non-negative integer), found {}",
                        show(val)
                    ),
                )
            })?;
        if out.iter().any(|(n, _)| n.eq_ignore_ascii_case(&name)) {
            return Err(invalid(&here, "listed twice"));
        }
        if count > 0 {
            out.push((name, count));
        }
    }
    Ok(out)
}

/// `Ng.Mgb`, optionally with a `+me`/`+gfx`-style suffix: the GPU-instance profile names NVIDIA
/// uses (`1g.10gb`, `1g.18gb+me`, `3g.71gb`).
fn is_gpu_instance_profile(name: &str) -> bool {
    let base = name.split('+').next().unwrap_or(name);
    let Some((g, mem)) = base.split_once('.') else {
        return false;
    };
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    g.strip_suffix('g').is_some_and(digits)
        && mem
            .to_ascii_lowercase()
            .strip_suffix("gb")
            .is_some_and(digits)
}

#[cfg(test)]
mod tests {
    use super::*;

    const FILE: &str = r#"
version: v1
mig-configs:
  all-disabled:
    - devices: all
      mig-enabled: false
  all-enabled:
    - devices: all
      mig-enabled: true
      mig-devices: {}
  all-1g.10gb:
    - devices: all
      mig-enabled: true
      mig-devices:
        "1g.10gb": 7
  custom-config:
    - devices: [0,1,2,3]
      mig-enabled: false
    - devices: [4]
      device-filter: ["0x233010DE", "0x233110DE"]
      mig-enabled: true
      mig-devices:
        "3g.40gb": 2
"#;

    #[test]
    fn a_mig_parted_file_is_read_as_mig_parted_writes_it() {
        let f = MigPartedFile::parse(FILE).unwrap();
        let names: Vec<&str> = f.configs.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "all-disabled",
                "all-enabled",
                "all-1g.10gb",
                "custom-config"
            ]
        );
        let c = f.select("custom-config").unwrap();
        assert_eq!(c.entries[0].devices, Devices::Indices(vec![0, 1, 2, 3]));
        assert!(!c.entries[0].mig_enabled);
        assert_eq!(c.entries[1].filters.len(), 2);
        assert_eq!(c.entries[1].mig_devices, vec![("3g.40gb".to_owned(), 2)]);
        assert!(
            f.select("all-enabled").unwrap().entries[0]
                .mig_devices
                .is_empty()
        );
        assert!(matches!(
            f.select("nope"),
            Err(LayoutError::UnknownConfig { .. })
        ));
    }

    #[test]
    fn a_malformed_entry_is_refused_naming_where() {
        let bad = |body: &str, says: &str| {
            let text = format!("version: v1\nmig-configs:\n  c:\n{body}");
            let e = MigPartedFile::parse(&text).unwrap_err().to_string();
            assert!(e.contains(says), "{e}");
        };
        bad("    - devices: all\n", "missing required key 'mig-enabled'");
        bad(
            "    - devices: all\n      mig-enabled: false\n      mig-devices: {\"1g.10gb\": 1}\n",
            "mig-configs.c[0].mig-devices",
        );
        bad(
            "    - devices: all\n      mig-enabled: true\n      mig-devices: {\"1c.3g.40gb\": 1}\n",
            "compute-instance profile",
        );
        bad(
            "    - devices: all\n      mig-enabled: true\n      mig-devices: {\"1g.10gb\": -1}\n",
            "expected a count",
        );
        bad(
            "    - devices: all\n      mig-enabled: yes-please\n",
            "true or false",
        );
        bad(
            "    - devices: all\n      mig-enabled: true\n      mixed: 1\n",
            "unknown key",
        );
        assert!(
            MigPartedFile::parse("version: v2\nmig-configs: {}\n")
                .unwrap_err()
                .to_string()
                .contains("only v1")
        );
    }
}
