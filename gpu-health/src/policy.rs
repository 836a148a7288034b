//! The grading policy: which signal values make a GPU Degraded or Unhealthy.
//!
//! Defaults live in code ([`Policy::default`]); a TOML, YAML or JSON file overrides any subset of
//! keys ([`Policy::from_file`]). Unknown keys are rejected, so a misspelt threshold is an error
//! rather than a silently ignored line. `docs/health-policy.md` documents every key.

use std::fmt;
use std::path::Path;

use gpu_core::PciId;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::error::HealthError;

/// A count limit: a signal above `Max(n)` trips its rule; `Off` disables the rule.
/// In files: a non-negative integer, or the string `"off"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Limit {
    /// The rule is disabled.
    Off,
    /// The rule trips when the value is greater than this.
    Max(u64),
}

impl Limit {
    /// True when `value` trips the rule.
    pub fn exceeded_by(self, value: u64) -> bool {
        match self {
            Limit::Off => false,
            Limit::Max(m) => value > m,
        }
    }
}

impl fmt::Display for Limit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Limit::Off => f.write_str("off"),
            Limit::Max(n) => write!(f, "{n}"),
        }
    }
}

impl Serialize for Limit {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Limit::Off => s.serialize_str("off"),
            Limit::Max(n) => s.serialize_u64(*n),
        }
    }
}

impl<'de> Deserialize<'de> for Limit {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = Limit;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a non-negative integer or \"off\"")
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<Limit, E> {
                Ok(Limit::Max(v))
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<Limit, E> {
                u64::try_from(v)
                    .map(Limit::Max)
                    .map_err(|_| E::custom(format!("{v} is negative; use a count or \"off\"")))
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Limit, E> {
                if v == "off" {
                    Ok(Limit::Off)
                } else {
                    Err(E::custom(format!(
                        "{v:?} is not a count; use a count or \"off\""
                    )))
                }
            }
        }
        d.deserialize_any(V)
    }
}

/// PCIe Advanced Error Reporting rules.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct AerPolicy {
    /// Unhealthy when `TOTAL_ERR_FATAL` is above this (default 0: any fatal error).
    pub fatal_max: Limit,
    /// Degraded when the non-fatal total grew by more than this since the baseline (or since boot
    /// when there is no baseline). Default 0.
    pub nonfatal_growth_max: Limit,
    /// Degraded when the correctable total grew by more than this. Default off: correctable
    /// link errors are retried by hardware and common on healthy links.
    pub correctable_growth_max: Limit,
}

impl Default for AerPolicy {
    fn default() -> Self {
        AerPolicy {
            fatal_max: Limit::Max(0),
            nonfatal_growth_max: Limit::Max(0),
            correctable_growth_max: Limit::Off,
        }
    }
}

/// What a GPU's link width is judged against when nothing better is known.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub enum LinkFallback {
    /// The chip's `max_link_width` (misfires on boards wired narrower than their chip, which is
    /// why boards and baselines come first).
    #[default]
    MaxWidth,
    /// No judgement: the width is reported but never degrades the GPU.
    None,
}

/// A board wired for fewer lanes than its chip advertises.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct BoardWidth {
    /// Board name, for reports (`A2`).
    pub model: String,
    /// PCI vendor ID (`"10de"`).
    pub vendor: PciId,
    /// PCI device ID (`"25b6"`).
    pub device: PciId,
    /// Subsystem vendor ID; matches any when absent.
    #[serde(default)]
    pub subsystem_vendor: Option<PciId>,
    /// Subsystem device ID; matches any when absent.
    #[serde(default)]
    pub subsystem_device: Option<PciId>,
    /// Lanes the board is wired for.
    pub width: u32,
}

impl BoardWidth {
    fn same_ids(&self, other: &BoardWidth) -> bool {
        (
            self.vendor,
            self.device,
            self.subsystem_vendor,
            self.subsystem_device,
        ) == (
            other.vendor,
            other.device,
            other.subsystem_vendor,
            other.subsystem_device,
        )
    }

    /// True when this entry describes a function with these IDs.
    pub fn matches(
        &self,
        vendor: PciId,
        device: PciId,
        subsystem_vendor: Option<PciId>,
        subsystem_device: Option<PciId>,
    ) -> bool {
        self.vendor == vendor
            && self.device == device
            && self
                .subsystem_vendor
                .is_none_or(|v| Some(v) == subsystem_vendor)
            && self
                .subsystem_device
                .is_none_or(|d| Some(d) == subsystem_device)
    }
}

/// The boards gpuslice knows to be wired narrower than their chip.
pub fn builtin_boards() -> Vec<BoardWidth> {
    vec![
        // NVIDIA A2 (GA107, PCIe Gen4 x8 board; the chip advertises x16). Subsystem 10de:157e is
        // the A2 board; the same device ID 25b6 is also the A16, so the subsystem is required.
        BoardWidth {
            model: "A2".to_owned(),
            vendor: PciId(0x10de),
            device: PciId(0x25b6),
            subsystem_vendor: Some(PciId(0x10de)),
            subsystem_device: Some(PciId(0x157e)),
            width: 8,
        },
    ]
}

/// PCIe link rules. Speed is never judged: NVIDIA GPUs lower their link speed at idle.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct LinkPolicy {
    /// Judge the link width at all (default true).
    pub judge_width: bool,
    /// Compare against other GPUs of the same model on the host when there is no baseline or
    /// board entry (default true).
    pub compare_peers: bool,
    /// What to compare against when nothing better is known (default `maxWidth`).
    pub fallback: LinkFallback,
    /// Boards wired narrower than their chip. A file's entries are added to the built-in table;
    /// an entry with the same IDs replaces the built-in one.
    pub boards: Vec<BoardWidth>,
}

impl Default for LinkPolicy {
    fn default() -> Self {
        LinkPolicy {
            judge_width: true,
            compare_peers: true,
            fallback: LinkFallback::MaxWidth,
            boards: builtin_boards(),
        }
    }
}

impl LinkPolicy {
    /// The board entry for a function with these IDs.
    pub fn board(
        &self,
        vendor: PciId,
        device: PciId,
        subsystem_vendor: Option<PciId>,
        subsystem_device: Option<PciId>,
    ) -> Option<&BoardWidth> {
        self.boards
            .iter()
            .find(|b| b.matches(vendor, device, subsystem_vendor, subsystem_device))
    }
}

/// ECC rules (NVML).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct EccPolicy {
    /// Unhealthy when volatile uncorrectable errors are above this (default 0).
    pub uncorrectable_volatile_max: Limit,
    /// Unhealthy when lifetime uncorrectable errors are above this (default 0).
    pub uncorrectable_aggregate_max: Limit,
    /// Degraded when volatile correctable errors are above this (default 1000).
    pub correctable_volatile_max: Limit,
    /// Degraded when lifetime correctable errors are above this (default off).
    pub correctable_aggregate_max: Limit,
}

impl Default for EccPolicy {
    fn default() -> Self {
        EccPolicy {
            uncorrectable_volatile_max: Limit::Max(0),
            uncorrectable_aggregate_max: Limit::Max(0),
            correctable_volatile_max: Limit::Max(1000),
            correctable_aggregate_max: Limit::Off,
        }
    }
}

/// Page retirement rules (NVML; GPUs before Ampere).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct RetirementPolicy {
    /// Unhealthy when retired pages (both causes, pending ones included) are above this
    /// (default 60, NVIDIA's replacement guidance).
    pub retired_pages_max: Limit,
    /// Degraded while pages wait for retirement (a reset applies it). Default true.
    pub pending_degrades: bool,
}

impl Default for RetirementPolicy {
    fn default() -> Self {
        RetirementPolicy {
            retired_pages_max: Limit::Max(60),
            pending_degrades: true,
        }
    }
}

/// Row-remapping rules (NVML; Ampere and later). A failed remapping is always Unhealthy.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct RowRemapPolicy {
    /// Degraded while a remapping waits for a GPU reset. Default true.
    pub pending_degrades: bool,
}

impl Default for RowRemapPolicy {
    fn default() -> Self {
        RowRemapPolicy {
            pending_degrades: true,
        }
    }
}

/// Temperature rules against the GPU's own thresholds (NVML).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct TemperaturePolicy {
    /// Degraded at `slowdown − margin` °C or above (default 0).
    pub slowdown_margin_c: u32,
    /// Unhealthy at `shutdown − margin` °C or above (default 0).
    pub shutdown_margin_c: u32,
}

/// PCIe replay rules (NVML).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct PciePolicy {
    /// Degraded when the replay counter grew by more than this since the baseline (or since the
    /// driver loaded). Default off: the counter only means something as a rate.
    pub replay_growth_max: Limit,
}

impl Default for PciePolicy {
    fn default() -> Self {
        PciePolicy {
            replay_growth_max: Limit::Off,
        }
    }
}

/// The whole grading policy.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct Policy {
    /// PCIe AER.
    pub aer: AerPolicy,
    /// PCIe link width.
    pub link: LinkPolicy,
    /// ECC.
    pub ecc: EccPolicy,
    /// Page retirement.
    pub retirement: RetirementPolicy,
    /// Row remapping.
    pub row_remap: RowRemapPolicy,
    /// Temperature.
    pub temperature: TemperaturePolicy,
    /// PCIe replays.
    pub pcie: PciePolicy,
    /// NVML XID events, graded as they happen (the agent).
    pub xid: crate::events::XidPolicy,
}

/// A policy file's format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PolicyFormat {
    /// TOML.
    Toml,
    /// YAML (and JSON, which YAML reads).
    Yaml,
}

impl Policy {
    /// Reads a policy file: `.toml` as TOML, `.yaml`, `.yml` and `.json` as YAML/JSON. Keys left
    /// out keep their defaults.
    ///
    /// # Errors
    /// [`HealthError::PolicyRead`] when the file cannot be read, [`HealthError::Policy`] for an
    /// unknown extension, a syntax error, an unknown key or a value out of range.
    pub fn from_file(path: &Path) -> Result<Self, HealthError> {
        let shown = path.display().to_string();
        let format = match path.extension().and_then(|e| e.to_str()) {
            Some("toml") => PolicyFormat::Toml,
            Some("yaml" | "yml" | "json") => PolicyFormat::Yaml,
            _ => {
                return Err(HealthError::Policy {
                    source_name: shown,
                    message: "unknown file type; use .toml, .yaml, .yml or .json".to_owned(),
                });
            }
        };
        let limit = gpu_sysfs::DocumentLimit::from_env().unwrap_or_default();
        let text = gpu_sysfs::read_document(path, "policy", limit).map_err(|source| {
            HealthError::PolicyRead {
                path: path.to_path_buf(),
                source,
            }
        })?;
        Self::from_str_as(&text, format, &shown)
    }

    /// Parses policy text. `source_name` names it in errors.
    ///
    /// # Errors
    /// [`HealthError::Policy`] for a syntax error, an unknown key or a value out of range.
    pub fn from_str_as(
        text: &str,
        format: PolicyFormat,
        source_name: &str,
    ) -> Result<Self, HealthError> {
        let err = |message: String| HealthError::Policy {
            source_name: source_name.to_owned(),
            message,
        };
        // Size and nesting first: a hostile file is refused before any decoder sees it.
        gpu_core::limits::check_document(text).map_err(|e| err(e.to_string()))?;
        let mut policy: Policy = if text.trim().is_empty() {
            Policy::default()
        } else {
            match format {
                PolicyFormat::Toml => {
                    toml::from_str(text).map_err(|e| err(e.to_string().trim_end().to_owned()))?
                }
                PolicyFormat::Yaml => {
                    serde_yaml_ng::from_str(text).map_err(|e| err(e.to_string()))?
                }
            }
        };
        policy.link.boards =
            merge_boards(builtin_boards(), std::mem::take(&mut policy.link.boards));
        policy.validate().map_err(|e| err(e.to_string()))?;
        Ok(policy)
    }

    /// The policy as a TOML policy file.
    ///
    /// # Errors
    /// [`HealthError::Policy`] if the encoder fails (it does not for any policy this crate builds).
    pub fn to_toml(&self) -> Result<String, HealthError> {
        toml::to_string_pretty(self).map_err(|e| HealthError::Policy {
            source_name: "<encoded>".to_owned(),
            message: e.to_string(),
        })
    }

    /// Checks values serde cannot: lane counts and temperature margins.
    ///
    /// # Errors
    /// [`HealthError::PolicyLaneCount`], [`HealthError::PolicyMargin`] or
    /// [`HealthError::PolicyXidTwice`], naming the key and the value.
    pub fn validate(&self) -> Result<(), HealthError> {
        for b in &self.link.boards {
            if !matches!(b.width, 1 | 2 | 4 | 8 | 12 | 16 | 32) {
                return Err(HealthError::PolicyLaneCount {
                    model: b.model.clone(),
                    width: b.width,
                });
            }
        }
        for (key, v) in [
            (
                "temperature.slowdownMarginC",
                self.temperature.slowdown_margin_c,
            ),
            (
                "temperature.shutdownMarginC",
                self.temperature.shutdown_margin_c,
            ),
        ] {
            if v > 50 {
                return Err(HealthError::PolicyMargin { key, value: v });
            }
        }
        if let Some(x) = self
            .xid
            .unhealthy
            .iter()
            .find(|x| self.xid.degraded.contains(x))
        {
            return Err(HealthError::PolicyXidTwice { xid: *x });
        }
        Ok(())
    }
}

/// The built-in boards, with entries of `extra` replacing built-in ones of the same IDs and the
/// rest appended.
fn merge_boards(builtin: Vec<BoardWidth>, extra: Vec<BoardWidth>) -> Vec<BoardWidth> {
    let mut out: Vec<BoardWidth> = builtin
        .into_iter()
        .filter(|b| !extra.iter().any(|e| e.same_ids(b)))
        .collect();
    for e in extra {
        if !out.iter().any(|o| o.same_ids(&e)) {
            out.push(e);
        }
    }
    out
}
