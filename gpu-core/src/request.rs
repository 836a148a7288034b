//! What a Machine (a VM) asks for.

use serde::{Deserialize, Serialize};

use crate::error::CoreError;
use crate::ids::MiB;

/// The class of device asked for. `gpu` matches any GPU (display or accelerator class);
/// `accelerator` matches headless compute devices only (3D controllers `0x0302` and processing
/// accelerators `0x12`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum DeviceClass {
    /// Any GPU.
    #[default]
    Gpu,
    /// Headless compute only.
    Accelerator,
}

/// Placement constraint across the devices of one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Alignment {
    /// All devices of the request on one NUMA node.
    Numa,
}

/// One named device request of a Machine.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DeviceRequest {
    /// Request name, unique within the Machine (`gpu`, `pass`).
    pub name: String,
    /// Device class.
    #[serde(default)]
    pub class: DeviceClass,
    /// Vendor filter (`nvidia`, `amd`, `intel`, or a PCI vendor ID).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vendor: Option<String>,
    /// Model filter: case-insensitive substring of the model name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// vGPU profile: type ID (`nvidia-558`, `1155`) or name (`A100-3-20C`, `GRID A100-3-20C`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub profile: Option<String>,
    /// How many devices (default 1; with `gpus`, the number of names given).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub count: Option<u32>,
    /// Explicit GPUs: names (`radeon0`), bare families (`radeon` = first free one) or PCI addresses.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gpus: Vec<String>,
    /// Minimum memory per device (`80Gi`, or MiB as a number).
    #[serde(
        default,
        with = "crate::ids::quantity",
        skip_serializing_if = "Option::is_none"
    )]
    pub min_memory: Option<MiB>,
    /// Alignment of the request's devices.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub alignment: Option<Alignment>,
    /// Name of a reusable request template (from the fleet's `templates`) this one extends.
    #[serde(default, rename = "use", skip_serializing_if = "Option::is_none")]
    pub template: Option<String>,
}

impl DeviceRequest {
    /// The number of devices this request needs.
    pub fn wanted(&self) -> u32 {
        self.count.unwrap_or(if self.gpus.is_empty() {
            1
        } else {
            self.gpus.len() as u32
        })
    }

    /// True when the request asks for vGPUs rather than whole GPUs.
    pub fn is_vgpu(&self) -> bool {
        self.profile.is_some()
    }

    /// Fills unset fields from a template.
    pub fn merged_with(&self, template: &DeviceRequest) -> DeviceRequest {
        DeviceRequest {
            name: self.name.clone(),
            class: if self.class == DeviceClass::default() {
                template.class
            } else {
                self.class
            },
            vendor: self.vendor.clone().or_else(|| template.vendor.clone()),
            model: self.model.clone().or_else(|| template.model.clone()),
            profile: self.profile.clone().or_else(|| template.profile.clone()),
            count: self.count.or(template.count),
            gpus: if self.gpus.is_empty() {
                template.gpus.clone()
            } else {
                self.gpus.clone()
            },
            min_memory: self.min_memory.or(template.min_memory),
            alignment: self.alignment.or(template.alignment),
            template: None,
        }
    }

    /// Checks the request on its own.
    ///
    /// # Errors
    /// [`CoreError::InvalidRequest`] naming the request and what is wrong.
    pub fn validate(&self) -> Result<(), CoreError> {
        let bad = |why: String| CoreError::InvalidRequest {
            request: self.name.clone(),
            why,
        };
        crate::validate_name(&self.name).map_err(|e| bad(e.to_string()))?;
        if self.profile.is_some() && !self.gpus.is_empty() {
            return Err(bad("`profile` cannot be combined with `gpus`".into()));
        }
        if let Some(p) = &self.profile {
            if p.trim().is_empty() {
                return Err(bad("`profile` is empty".into()));
            }
        }
        if self.count == Some(0) {
            return Err(bad("`count` must be at least 1".into()));
        }
        if let Some(c) = self.count {
            if c > 4096 {
                return Err(bad(format!("`count` {c} is more than any node holds")));
            }
        }
        if let (Some(c), false) = (self.count, self.gpus.is_empty()) {
            let names_all_explicit = self
                .gpus
                .iter()
                .all(|g| crate::vendor::split_name(g).is_some() || g.contains(':'));
            if names_all_explicit && c as usize != self.gpus.len() {
                return Err(bad(format!(
                    "`count` {c} does not match the {} GPUs named",
                    self.gpus.len()
                )));
            }
        }
        if let Some(v) = &self.vendor {
            if crate::vendor::Vendor::parse_loose(v).is_none() {
                return Err(bad(format!(
                    "unknown vendor {v:?} (use nvidia, amd, intel or a PCI vendor ID)"
                )));
            }
        }
        let mut seen = std::collections::BTreeSet::new();
        for g in &self.gpus {
            if g.trim().is_empty() {
                return Err(bad("empty entry in `gpus`".into()));
            }
            if g.contains(':') {
                g.parse::<crate::address::PciAddress>()
                    .map_err(|e| bad(e.to_string()))?;
            }
            let is_family = crate::vendor::split_name(g).is_none() && !g.contains(':');
            if !is_family && !seen.insert(g.as_str()) {
                return Err(bad(format!("GPU {g:?} is named twice")));
            }
        }
        Ok(())
    }
}

/// A Machine: a VM with named device requests.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Machine {
    /// Machine name, unique in the fleet.
    pub name: String,
    /// Device requests.
    #[serde(default)]
    pub devices: Vec<DeviceRequest>,
    /// Place on this node only (`targetNode`); a refusal then gives that node's reasons.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_node: Option<String>,
}

impl Machine {
    /// Parses a Machine from JSON or YAML.
    ///
    /// # Errors
    /// [`CoreError::Decode`] for malformed text, [`CoreError::InvalidRequest`] when invalid.
    pub fn from_text(text: &str) -> Result<Self, CoreError> {
        let m: Machine = crate::decode_text("machine", text)?;
        m.validate()?;
        Ok(m)
    }

    /// Checks the Machine and each of its requests.
    ///
    /// # Errors
    /// [`CoreError::InvalidRequest`] naming what is wrong.
    pub fn validate(&self) -> Result<(), CoreError> {
        crate::validate_name(&self.name).map_err(|e| CoreError::InvalidRequest {
            request: self.name.clone(),
            why: e.to_string(),
        })?;
        if self.devices.is_empty() {
            return Err(CoreError::InvalidRequest {
                request: self.name.clone(),
                why: "no devices requested".into(),
            });
        }
        if let Some(node) = &self.target_node {
            crate::validate_name(node).map_err(|e| CoreError::InvalidRequest {
                request: self.name.clone(),
                why: format!("targetNode: {e}"),
            })?;
        }
        let mut names = std::collections::BTreeSet::new();
        for d in &self.devices {
            if !names.insert(d.name.as_str()) {
                return Err(CoreError::InvalidRequest {
                    request: self.name.clone(),
                    why: format!("device request {:?} appears twice", d.name),
                });
            }
            d.validate()?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_documented_example() {
        let m = Machine::from_text(
            r#"
name: inference
devices:
  - {name: gpu, class: gpu, vendor: nvidia, profile: "GRID A100-3-20C", count: 1}
  - {name: pass, class: gpu, vendor: amd, gpus: [radeon0], alignment: numa}
  - {name: big, class: accelerator, model: "H200", minMemory: 80Gi, count: 4}
"#,
        )
        .unwrap();
        assert_eq!(m.devices.len(), 3);
        assert_eq!(m.devices[1].wanted(), 1);
        assert_eq!(m.devices[2].min_memory, Some(MiB(81920)));
        assert_eq!(m.devices[2].class, DeviceClass::Accelerator);
        assert_eq!(m.devices[1].alignment, Some(Alignment::Numa));
    }

    #[test]
    fn rejects_profile_with_gpus() {
        let e =
            Machine::from_text("name: m\ndevices: [{name: x, profile: A2-4Q, gpus: [nvidia0]}]")
                .unwrap_err();
        assert!(
            e.to_string()
                .contains("`profile` cannot be combined with `gpus`"),
            "{e}"
        );
    }

    #[test]
    fn rejects_unknown_keys_zero_counts_and_duplicates() {
        assert!(Machine::from_text("name: m\ndevices: [{name: x, colour: red}]").is_err());
        assert!(Machine::from_text("name: m\ndevices: [{name: x, count: 0}]").is_err());
        assert!(Machine::from_text("name: m\ndevices: [{name: x}, {name: x}]").is_err());
        assert!(Machine::from_text("name: m\ndevices: [{name: x, vendor: banana}]").is_err());
        assert!(Machine::from_text("name: m\ndevices: []").is_err());
        assert!(
            Machine::from_text("name: m\ndevices: [{name: x, gpus: [nvidia0, nvidia0]}]").is_err()
        );
        assert!(Machine::from_text("name: m\ndevices: [{name: x, minMemory: lots}]").is_err());
    }
}
