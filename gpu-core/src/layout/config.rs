//! The layout file: NVIDIA's `vgpu-configs` format, plus gpuslice forms keyed by device: a GPU's
//! PCI address, a virtual mdev parent's name, or a VF's address.
//!
//! ```yaml
//! version: v1
//! vgpu-configs:
//!   A2-4Q:                      # NVIDIA form: a list of entries
//!     - devices: all            # or GPU indices [0, 1]
//!       device-filter: "0x25B610DE"       # optional; string or list
//!       vgpu-devices:
//!         A2-4Q: 4
//!   lab:                        # per-device form: a mapping keyed by the GPU's address
//!     "0000:08:00.0": {A2-4Q: 4}
//!     mbochs: {mbochs-medium: 2}  # ... or a virtual mdev parent's name (type name or ID → count)
//!   pinned:                     # vendor-VFIO form: VF address = type ID (or name; 0 = none)
//!     "0000:26:00.4": 1155
//! ```
//!
//! Parsing checks everything that can be checked without a host: keys, counts, type names, the
//! time-sliced/MIG mix, and duplicate names. What the host offers is checked by the planner.
//! Types of a virtual parent are the driver's own (`mbochs-small`, or mtty's `Single port serial`
//! by name and `mtty-1` by ID), so only NVIDIA GPUs' type names are checked against NVIDIA's
//! naming scheme.

use std::collections::BTreeMap;
use std::fmt;

use serde::Serialize;
use serde_yaml_ng::Value;

use crate::address::PciAddress;
use crate::error::CoreError;
use crate::ids::ParentId;
use crate::nvidia::{VgpuTypeName, names_match, strip_prefix};
use crate::topology::{Gpu, PciId};

use super::LayoutError;

/// A parsed layout file: named configs in file order.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct LayoutFile {
    /// The configs, in the order the file lists them.
    pub configs: Vec<LayoutConfig>,
}

/// One named config.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct LayoutConfig {
    /// Its name (the key under `vgpu-configs`).
    pub name: String,
    /// Its entries, in file order.
    pub entries: Vec<Entry>,
}

/// One entry: which GPUs (or VF) it selects and what they should hold.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Entry {
    /// Which devices the entry selects.
    pub selector: Selector,
    /// What they should hold.
    pub want: Want,
    /// `mixed-sizes: true` (NVIDIA-form entries): the GPUs may hold vGPUs of different sizes,
    /// mixed-size mode turned on where nothing is in use (docs/partitions.md).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub mixed_sizes: bool,
}

/// How an entry selects devices.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(
    tag = "kind",
    rename_all = "kebab-case",
    rename_all_fields = "camelCase"
)]
pub enum Selector {
    /// NVIDIA's selection: GPU indices (or all), optionally narrowed by device filters.
    Indexed {
        /// `devices`.
        devices: Devices,
        /// `device-filter` (empty: every NVIDIA GPU).
        filters: Vec<DeviceFilter>,
    },
    /// One physical GPU by PCI address (per-GPU form).
    Gpu {
        /// The GPU's address.
        address: PciAddress,
    },
    /// One virtual function by PCI address (vendor-VFIO form).
    Vf {
        /// The VF's address.
        address: PciAddress,
    },
    /// One virtual mdev parent by name (`mbochs`, `mtty`: the kernel's sample drivers), which is
    /// not a PCI device and has a capacity pool of its own.
    Parent {
        /// The parent, as named under `/sys/class/mdev_bus`.
        parent: ParentId,
    },
}

/// NVIDIA's `devices`: `all` or a list of GPU indices.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum Devices {
    /// Every GPU the filters let through.
    All,
    /// These GPU indices (the i-th NVIDIA display device in address order).
    Indices(Vec<u32>),
}

impl Devices {
    /// Whether GPU index `i` is selected.
    pub fn contains(&self, i: u32) -> bool {
        match self {
            Devices::All => true,
            Devices::Indices(v) => v.contains(&i),
        }
    }
}

/// A `device-filter` item: `0xDDDDVVVV` (device and vendor ID), optionally
/// `:0xSSSSVVVV` (subsystem device and subsystem vendor ID).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceFilter {
    /// PCI device ID.
    pub device: u16,
    /// PCI vendor ID.
    pub vendor: u16,
    /// Subsystem (device, vendor) IDs, when given.
    pub subsystem: Option<(u16, u16)>,
}

impl DeviceFilter {
    /// Parses `0xDDDDVVVV[:0xSSSSVVVV]` (the `0x` is optional, hex digits in either case).
    ///
    /// # Errors
    /// [`CoreError::InvalidDeviceFilter`] naming `text`.
    pub fn parse(text: &str) -> Result<Self, CoreError> {
        fn word(part: &str) -> Option<(u16, u16)> {
            let hex = part
                .strip_prefix("0x")
                .or_else(|| part.strip_prefix("0X"))
                .unwrap_or(part);
            if hex.len() != 8 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
                return None;
            }
            let v = u32::from_str_radix(hex, 16).ok()?;
            Some(((v >> 16) as u16, (v & 0xffff) as u16))
        }
        let t = text.trim();
        let (main, sub) = match t.split_once(':') {
            Some((m, s)) => (m, Some(s)),
            None => (t, None),
        };
        let bad = || CoreError::InvalidDeviceFilter {
            input: text.to_owned(),
        };
        let (device, vendor) = word(main).ok_or_else(bad)?;
        let subsystem = match sub {
            Some(s) => Some(word(s).ok_or_else(bad)?),
            None => None,
        };
        Ok(DeviceFilter {
            device,
            vendor,
            subsystem,
        })
    }

    /// Whether `gpu` passes the filter. A subsystem filter needs the GPU's subsystem IDs.
    pub fn matches(&self, gpu: &Gpu) -> bool {
        if gpu.device_id != PciId(self.device) || gpu.vendor_id != PciId(self.vendor) {
            return false;
        }
        match self.subsystem {
            None => true,
            Some((sd, sv)) => {
                gpu.subsystem_device_id == Some(PciId(sd))
                    && gpu.subsystem_vendor_id == Some(PciId(sv))
            }
        }
    }
}

impl fmt::Display for DeviceFilter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "0x{:04X}{:04X}", self.device, self.vendor)?;
        if let Some((d, v)) = self.subsystem {
            write!(f, ":0x{d:04X}{v:04X}")?;
        }
        Ok(())
    }
}

impl Serialize for DeviceFilter {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// What the selected devices should hold.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(
    tag = "kind",
    rename_all = "kebab-case",
    rename_all_fields = "camelCase"
)]
pub enum Want {
    /// `vgpu-devices`: type name → count, in file order (empty: no vGPUs).
    Counts {
        /// Requested types.
        types: Vec<TypeCount>,
    },
    /// One VF's type (vendor-VFIO form); `None` = no type.
    VfType {
        /// The type, or none.
        #[serde(rename = "type")]
        ty: Option<TypeRef>,
    },
}

/// A requested type and how many instances of it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TypeCount {
    /// The name as written in the file (`A100-1-5CME`).
    pub name: String,
    /// Instances wanted (at least 1).
    pub count: u32,
}

/// A VF's type in the vendor-VFIO form: the driver's type ID, or a type name.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum TypeRef {
    /// Vendor-VFIO type ID (`1155`) or mdev type directory (`nvidia-746`).
    Id(String),
    /// An NVIDIA type name (`L40S-24Q`).
    Name(String),
}

impl fmt::Display for TypeRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TypeRef::Id(s) | TypeRef::Name(s) => f.write_str(s),
        }
    }
}

impl LayoutFile {
    /// Parses and validates a layout file (YAML; JSON is YAML too).
    ///
    /// # Errors
    /// [`LayoutError::Decode`] for text that is not YAML, [`LayoutError::Invalid`] naming the
    /// place (`vgpu-configs.NAME[i].vgpu-devices`) and what is wrong, and
    /// [`LayoutError::DuplicateType`] naming both entries that denote one type.
    pub fn parse(text: &str) -> Result<Self, LayoutError> {
        Self::parse_max(text, crate::limits::MAX_DOCUMENT_BYTES)
    }

    /// [`LayoutFile::parse`] with a size cap of `max_bytes` instead of the default 64 MiB: the
    /// cap every other document honours (`--max-document-mib`, `GPUSLICE_MAX_DOCUMENT_MIB`).
    ///
    /// # Errors
    /// As [`LayoutFile::parse`].
    pub fn parse_max(text: &str, max_bytes: usize) -> Result<Self, LayoutError> {
        let root = decode_max(text, max_bytes)?;
        let cmap = versioned_section(&root, "vgpu-configs")?;
        let mut out = Vec::with_capacity(cmap.len());
        for (k, v) in cmap {
            let name = key_str(k, "vgpu-configs")?.to_owned();
            let at = format!("vgpu-configs.{name}");
            let entries = match v {
                Value::Sequence(items) => {
                    if items.is_empty() {
                        return Err(invalid(&at, "at least one entry is required"));
                    }
                    items
                        .iter()
                        .enumerate()
                        .map(|(i, item)| parse_entry(item, &format!("{at}[{i}]")))
                        .collect::<Result<Vec<_>, _>>()?
                }
                Value::Mapping(m) => parse_by_address(m, &at)?,
                other => {
                    return Err(invalid(
                        &at,
                        format!(
                            "expected a list of entries or a mapping keyed by PCI address or mdev parent name, found {}",
                            kind(other)
                        ),
                    ));
                }
            };
            out.push(LayoutConfig { name, entries });
        }
        Ok(LayoutFile { configs: out })
    }

    /// The config named `name`, or the only config when `name` is `None` and there is just one.
    ///
    /// # Errors
    /// [`LayoutError::UnknownConfig`] (with the names there are) or
    /// [`LayoutError::ConfigNotChosen`] when the file has several and none was named.
    pub fn select(&self, name: Option<&str>) -> Result<&LayoutConfig, LayoutError> {
        match name {
            Some(n) => self.configs.iter().find(|c| c.name == n).ok_or_else(|| {
                LayoutError::UnknownConfig {
                    name: n.to_owned(),
                    known: self.names_hint(),
                }
            }),
            None => match self.configs.as_slice() {
                [only] => Ok(only),
                _ => Err(LayoutError::ConfigNotChosen {
                    count: self.configs.len(),
                    known: self.names_hint(),
                }),
            },
        }
    }

    fn names_hint(&self) -> String {
        let names: Vec<&str> = self.configs.iter().map(|c| c.name.as_str()).collect();
        if names.len() <= 8 {
            names.join(", ")
        } else {
            format!("{}, ... ({} in all)", names[..8].join(", "), names.len())
        }
    }
}

/// `text` decoded as YAML, refused over `max_bytes`.
pub(crate) fn decode_max(text: &str, max_bytes: usize) -> Result<Value, LayoutError> {
    crate::limits::check_document_max(text, max_bytes).map_err(|e| LayoutError::Decode {
        message: e.to_string(),
    })?;
    serde_yaml_ng::from_str(text).map_err(|e| LayoutError::Decode {
        message: e.to_string(),
    })
}

/// The non-empty `section` mapping of a file of NVIDIA's tools (`version: v1` beside it, no
/// other key): `vgpu-configs` of vgpu-device-manager, `mig-configs` of mig-parted.
pub(crate) fn versioned_section<'a>(
    root: &'a Value,
    section: &str,
) -> Result<&'a serde_yaml_ng::Mapping, LayoutError> {
    let map = as_mapping(root, "the file")?;
    let mut version = None;
    let mut configs = None;
    for (k, v) in map {
        match key_str(k, "the file")? {
            "version" => version = Some(v),
            key if key == section => configs = Some(v),
            other => return Err(unknown_key("the file", other, &["version", section])),
        }
    }
    match version {
        None => return Err(invalid("the file", "missing required key 'version'")),
        Some(Value::String(s)) if s == "v1" => {}
        Some(v) => {
            return Err(invalid(
                "version",
                format!("unsupported version {}: only v1 is known", show(v)),
            ));
        }
    }
    let configs = configs.ok_or_else(|| invalid("the file", format!("missing '{section}'")))?;
    let cmap = as_mapping(configs, section)?;
    if cmap.is_empty() {
        return Err(invalid(section, "at least one config is required"));
    }
    Ok(cmap)
}

fn parse_entry(v: &Value, at: &str) -> Result<Entry, LayoutError> {
    let m = as_mapping(v, at)?;
    let mut devices = None;
    let mut filters = Vec::new();
    let mut want = None;
    let mut mixed_sizes = false;
    for (k, val) in m {
        match key_str(k, at)? {
            "devices" => devices = Some(parse_devices(val, &format!("{at}.devices"))?),
            "device-filter" => filters = parse_filters(val, &format!("{at}.device-filter"))?,
            "vgpu-devices" => {
                want = Some(parse_counts(
                    val,
                    &format!("{at}.vgpu-devices"),
                    TypeNames::Nvidia,
                )?);
            }
            "mixed-sizes" => {
                mixed_sizes = val.as_bool().ok_or_else(|| {
                    invalid(&format!("{at}.mixed-sizes"), "expected true or false")
                })?;
            }
            other => {
                return Err(unknown_key(
                    at,
                    other,
                    &["devices", "device-filter", "vgpu-devices", "mixed-sizes"],
                ));
            }
        }
    }
    let devices = devices.ok_or_else(|| invalid(at, "missing required key 'devices'"))?;
    let types = want.ok_or_else(|| invalid(at, "missing required key 'vgpu-devices'"))?;
    Ok(Entry {
        selector: Selector::Indexed { devices, filters },
        want: Want::Counts { types },
        mixed_sizes,
    })
}

pub(crate) fn parse_devices(v: &Value, at: &str) -> Result<Devices, LayoutError> {
    match v {
        Value::String(s) if s == "all" => Ok(Devices::All),
        Value::String(s) => Err(invalid(
            at,
            format!("expected 'all' or a list of GPU indices, found {s:?}"),
        )),
        Value::Sequence(items) => {
            let mut out = Vec::with_capacity(items.len());
            for item in items {
                let i = item
                    .as_u64()
                    .and_then(|n| u32::try_from(n).ok())
                    .ok_or_else(|| {
                        invalid(
                            at,
                            format!(
                                "GPU indices are non-negative integers, found {}",
                                show(item)
                            ),
                        )
                    })?;
                if !out.contains(&i) {
                    out.push(i);
                }
            }
            Ok(Devices::Indices(out))
        }
        other => Err(invalid(
            at,
            format!(
                "expected 'all' or a list of GPU indices, found {}",
                kind(other)
            ),
        )),
    }
}

pub(crate) fn parse_filters(v: &Value, at: &str) -> Result<Vec<DeviceFilter>, LayoutError> {
    let one = |item: &Value| match item {
        Value::String(s) => DeviceFilter::parse(s).map_err(|e| invalid(at, e.to_string())),
        other => Err(invalid(
            at,
            format!(
                "expected a string such as \"0x20B510DE\", found {}",
                show(other)
            ),
        )),
    };
    match v {
        // NVIDIA treats an empty filter string as no filter.
        Value::String(s) if s.trim().is_empty() => Ok(vec![]),
        Value::String(_) => Ok(vec![one(v)?]),
        Value::Sequence(items) => items.iter().map(one).collect(),
        Value::Number(n) => Err(invalid(
            at,
            format!("found the number {n}: quote the filter, as in \"0x20B510DE\" (0xDDDDVVVV)"),
        )),
        other => Err(invalid(
            at,
            format!(
                "expected a string or a list of strings, found {}",
                kind(other)
            ),
        )),
    }
}

/// How requested type names are checked.
#[derive(Clone, Copy, PartialEq, Eq)]
enum TypeNames {
    /// NVIDIA vGPU type names (`A2-4Q`, `A100-1-5CME`), with the time-sliced/MIG rule.
    Nvidia,
    /// Any other driver's type name or type ID (`mbochs-small`, `Single port serial`).
    Driver,
}

fn parse_counts(v: &Value, at: &str, names: TypeNames) -> Result<Vec<TypeCount>, LayoutError> {
    let m = match v {
        // `vgpu-devices: {}` (or an empty value) asks for no vGPUs on the selected GPUs.
        Value::Null => return Ok(vec![]),
        other => as_mapping(other, at)?,
    };
    let mut out: Vec<TypeCount> = Vec::with_capacity(m.len());
    let mut first_kind: Option<(String, bool)> = None;
    for (k, val) in m {
        let name = key_str(k, at)?.to_owned();
        let here = format!("{at}.{name}");
        let max = crate::limits::MAX_INSTANCES;
        let count = match val.as_i64() {
            Some(n) if n > 0 => match u32::try_from(n) {
                Ok(c) if c <= max => c,
                _ => {
                    return Err(invalid(
                        &here,
                        format!("count {n} is more than any GPU holds (at most {max})"),
                    ));
                }
            },
            Some(n) => {
                return Err(invalid(
                    &here,
                    format!("count must be a positive integer, found {n}"),
                ));
            }
            None => {
                return Err(invalid(
                    &here,
                    format!("count must be a positive integer, found {}", show(val)),
                ));
            }
        };
        if names == TypeNames::Driver {
            if name.trim().is_empty() {
                return Err(invalid(&here, "empty type name"));
            }
            if name.trim() != name {
                return Err(invalid(
                    &here,
                    format!("type {name:?} has leading or trailing whitespace; write it without"),
                ));
            }
            if let Some(prev) = out.iter().find(|t| t.name == name) {
                return Err(LayoutError::DuplicateType {
                    at: at.to_owned(),
                    first: prev.name.clone(),
                    second: name.clone(),
                    resolved: name,
                });
            }
            out.push(TypeCount { name, count });
            continue;
        }
        let parsed = VgpuTypeName::parse(&name).map_err(|e| invalid(&here, e.to_string()))?;
        match &first_kind {
            None => first_kind = Some((name.clone(), parsed.is_mig())),
            Some((first, mig)) if *mig != parsed.is_mig() => {
                let (ts, mg) = if *mig {
                    (name.as_str(), first.as_str())
                } else {
                    (first.as_str(), name.as_str())
                };
                return Err(invalid(
                    at,
                    format!(
                        "cannot mix time-sliced and MIG-backed vGPU types on one GPU: \
                         {ts:?} is time-sliced, {mg:?} is MIG-backed"
                    ),
                ));
            }
            Some(_) => {}
        }
        if let Some(prev) = out.iter().find(|t| names_match(&t.name, &name)) {
            return Err(LayoutError::DuplicateType {
                at: at.to_owned(),
                first: prev.name.clone(),
                second: name,
                resolved: strip_prefix(&prev.name).to_owned(),
            });
        }
        out.push(TypeCount { name, count });
    }
    Ok(out)
}

fn parse_by_address(m: &serde_yaml_ng::Mapping, at: &str) -> Result<Vec<Entry>, LayoutError> {
    if m.is_empty() {
        return Err(invalid(at, "at least one entry is required"));
    }
    let mut out = Vec::with_capacity(m.len());
    for (k, v) in m {
        let key = key_str(k, at)?;
        let here = format!("{at}.{key}");
        let parent: ParentId = key.parse().map_err(|e: crate::CoreError| {
            invalid(
                &here,
                format!("keys of the per-device form are PCI addresses or mdev parent names: {e}"),
            )
        })?;
        let address = match parent {
            ParentId::Pci(a) => a,
            ParentId::Named(_) => {
                out.push(parse_named_parent(parent, v, &out, &here)?);
                continue;
            }
        };
        if out
            .iter()
            .any(|e: &Entry| selector_address(&e.selector) == Some(address))
        {
            return Err(invalid(&here, format!("{address} is listed twice")));
        }
        let entry = match v {
            Value::Mapping(_) | Value::Null => Entry {
                selector: Selector::Gpu { address },
                want: Want::Counts {
                    types: parse_counts(v, &here, TypeNames::Nvidia)?,
                },
                mixed_sizes: false,
            },
            Value::Number(n) => {
                let id = n.as_u64().ok_or_else(|| {
                    invalid(
                        &here,
                        format!("a type ID is a non-negative integer, found {n}"),
                    )
                })?;
                Entry {
                    selector: Selector::Vf { address },
                    want: Want::VfType {
                        ty: (id != 0).then(|| TypeRef::Id(id.to_string())),
                    },
                    mixed_sizes: false,
                }
            }
            Value::String(s) => Entry {
                selector: Selector::Vf { address },
                want: Want::VfType {
                    ty: Some(parse_type_ref(s, &here)?),
                },
                mixed_sizes: false,
            },
            other => {
                return Err(invalid(
                    &here,
                    format!(
                        "expected vgpu-devices (type name → count) for a GPU, or a type ID or \
                         name for a VF, found {}",
                        kind(other)
                    ),
                ));
            }
        };
        out.push(entry);
    }
    Ok(out)
}

/// An entry for a virtual mdev parent: type name or ID → count, like a GPU's.
fn parse_named_parent(
    parent: ParentId,
    v: &Value,
    before: &[Entry],
    at: &str,
) -> Result<Entry, LayoutError> {
    if before
        .iter()
        .any(|e| matches!(&e.selector, Selector::Parent { parent: p } if *p == parent))
    {
        return Err(invalid(at, format!("{parent} is listed twice")));
    }
    match v {
        Value::Mapping(_) | Value::Null => Ok(Entry {
            selector: Selector::Parent { parent },
            want: Want::Counts {
                types: parse_counts(v, at, TypeNames::Driver)?,
            },
            mixed_sizes: false,
        }),
        other => Err(invalid(
            at,
            format!(
                "expected type name → count for the mdev parent {parent}, found {}",
                kind(other)
            ),
        )),
    }
}

/// A VF's type: all digits is a vendor-VFIO ID, an NVIDIA name is a name, and anything else that
/// is a valid type directory with a number (`nvidia-746`) is an mdev type ID.
fn parse_type_ref(s: &str, at: &str) -> Result<TypeRef, LayoutError> {
    let t = s.trim();
    if t.is_empty() {
        return Err(invalid(at, "empty type"));
    }
    if t != s {
        return Err(invalid(
            at,
            format!("type {s:?} has leading or trailing whitespace; write it without"),
        ));
    }
    if t.bytes().all(|b| b.is_ascii_digit()) {
        return Ok(TypeRef::Id(t.to_owned()));
    }
    match VgpuTypeName::parse(t) {
        Ok(_) => Ok(TypeRef::Name(t.to_owned())),
        Err(e) => match t.parse::<crate::VgpuTypeId>() {
            Ok(id) if id.number().is_some() => Ok(TypeRef::Id(t.to_owned())),
            _ => Err(invalid(at, e.to_string())),
        },
    }
}

fn selector_address(s: &Selector) -> Option<PciAddress> {
    match s {
        Selector::Gpu { address } | Selector::Vf { address } => Some(*address),
        Selector::Indexed { .. } | Selector::Parent { .. } => None,
    }
}

pub(crate) fn as_mapping<'a>(
    v: &'a Value,
    at: &str,
) -> Result<&'a serde_yaml_ng::Mapping, LayoutError> {
    match v {
        Value::Mapping(m) => Ok(m),
        other => Err(invalid(
            at,
            format!("expected a mapping, found {}", kind(other)),
        )),
    }
}

pub(crate) fn key_str<'a>(k: &'a Value, at: &str) -> Result<&'a str, LayoutError> {
    match k {
        Value::String(s) => Ok(s),
        other => Err(invalid(
            at,
            format!("keys must be strings, found {}", show(other)),
        )),
    }
}

pub(crate) fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "nothing",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Sequence(_) => "a list",
        Value::Mapping(_) => "a mapping",
        Value::Tagged(_) => "a tagged value",
    }
}

pub(crate) fn show(v: &Value) -> String {
    match v {
        Value::String(s) => format!("{s:?}"),
        Value::Number(n) => n.to_string(),
        Value::Bool(b) => b.to_string(),
        other => kind(other).to_owned(),
    }
}

pub(crate) fn invalid(at: &str, why: impl Into<String>) -> LayoutError {
    LayoutError::Invalid {
        at: at.to_owned(),
        why: why.into(),
    }
}

pub(crate) fn unknown_key(at: &str, key: &str, known: &[&str]) -> LayoutError {
    invalid(
        at,
        format!("unknown key {key:?} (expected {})", known.join(", ")),
    )
}

/// Which entries of a config select which GPU, by NVIDIA's rules: GPU index `i` is the `i`-th
/// NVIDIA display device (class `0x0300xx` or `0x0302xx`, never a VF) in numeric address order.
pub fn nvidia_indices(gpus: &[Gpu]) -> BTreeMap<PciAddress, u32> {
    let mut v: Vec<PciAddress> = gpus
        .iter()
        .filter(|g| g.vendor_id == PciId(0x10de) && matches!(g.class.0 >> 8, 0x0300 | 0x0302))
        .map(|g| g.address)
        .collect();
    v.sort();
    v.into_iter()
        .enumerate()
        .map(|(i, a)| (a, u32::try_from(i).unwrap_or(u32::MAX)))
        .collect()
}
