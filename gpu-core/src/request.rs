//! What a Machine (a VM) asks for.

use serde::{Deserialize, Serialize};

use crate::address::PciAddress;
use crate::error::CoreError;
use crate::ids::MiB;
use crate::vendor::{Vendor, VendorRef};

/// A GPU as a request's `gpus` or a command names it, classified once: the solver, the CLI and
/// the agent all read GPU references through [`GpuRef::parse`].
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum GpuRef {
    /// A PCI address (`0000:3b:00.0`): anything with a `:`.
    Address(PciAddress),
    /// A per-node name: a family and an index (`nvidia0`, `radeon12`).
    Name(String),
    /// A bare family (`nvidia`, `radeon`, `gpu`): in a request, any GPU of that family.
    Family(Vendor),
}

impl GpuRef {
    /// Classifies `text` (trimmed): a PCI address when it holds a `:`, a per-node name when it
    /// ends in an index, a family when it is one.
    ///
    /// # Errors
    /// [`CoreError::InvalidPciAddress`] for a malformed address; [`CoreError::InvalidGpu`] for
    /// text that is none of the three.
    pub fn parse(text: &str) -> Result<Self, CoreError> {
        let t = text.trim();
        if t.contains(':') {
            return t.parse().map(GpuRef::Address);
        }
        if crate::vendor::split_name(t).is_some() {
            return Ok(GpuRef::Name(t.to_owned()));
        }
        Vendor::from_family(t)
            .map(GpuRef::Family)
            .ok_or_else(|| CoreError::InvalidGpu {
                input: t.to_owned(),
            })
    }

    /// Classifies the one GPU a command names (`gpuslice gpu bind GPU`, the agent's
    /// `/v1/gpus/{gpu}`): a PCI address as [`GpuRef::parse`] reads it, or else a name to look up
    /// among the node's GPUs ([`GpuRef::Name`] even when it has no index: the node says whether
    /// it has such a GPU).
    ///
    /// # Errors
    /// [`CoreError::InvalidPciAddress`] for a malformed address; [`CoreError::InvalidName`] for
    /// text that cannot be a name.
    pub fn parse_one(text: &str) -> Result<Self, CoreError> {
        let t = text.trim();
        if t.contains(':') {
            return Self::parse(t);
        }
        crate::validate_name(t)?;
        Ok(GpuRef::Name(t.to_owned()))
    }

    /// True for a reference to one GPU (an address or a per-node name), false for a family.
    pub fn is_exact(&self) -> bool {
        !matches!(self, GpuRef::Family(_))
    }
}

impl std::fmt::Display for GpuRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            GpuRef::Address(a) => a.fmt(f),
            GpuRef::Name(n) => f.write_str(n),
            GpuRef::Family(v) => f.write_str(v.family()),
        }
    }
}

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
    /// One VF of an NVIDIA vendor-VFIO GPU (`0000:26:00.4`), handed over with the vGPU type set
    /// on it (the platform guide's field). The VF's type is its profile, so it cannot be
    /// combined with `profile`, nor with `gpus` or a `count` other than 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub virtual_function: Option<String>,
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

    /// The request's `gpus`, classified ([`GpuRef::parse`]).
    ///
    /// # Errors
    /// The first entry that is not a GPU reference.
    pub fn gpu_refs(&self) -> Result<Vec<GpuRef>, CoreError> {
        self.gpus.iter().map(|g| GpuRef::parse(g)).collect()
    }

    /// The request's `vendor`, parsed ([`VendorRef::parse`]); `None` when it names none.
    ///
    /// # Errors
    /// [`CoreError::InvalidRequest`] for a vendor that is neither a known name nor a PCI
    /// vendor ID.
    pub fn vendor_ref(&self) -> Result<Option<VendorRef>, CoreError> {
        let Some(v) = &self.vendor else {
            return Ok(None);
        };
        VendorRef::parse(v)
            .map(Some)
            .ok_or_else(|| CoreError::InvalidRequest {
                request: self.name.clone(),
                why: format!("unknown vendor {v:?} (use nvidia, amd, intel or a PCI vendor ID)"),
            })
    }

    /// True when the request asks for vGPUs rather than whole GPUs (a profile, or a VF with
    /// its vGPU type).
    pub fn is_vgpu(&self) -> bool {
        self.profile.is_some() || self.virtual_function.is_some()
    }

    /// The request's `virtualFunction`, parsed; `None` when it names none.
    ///
    /// # Errors
    /// [`CoreError::InvalidPciAddress`] for text that is not a PCI address.
    pub fn virtual_function_address(&self) -> Result<Option<PciAddress>, CoreError> {
        self.virtual_function
            .as_deref()
            .map(|v| v.trim().parse())
            .transpose()
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
            virtual_function: self
                .virtual_function
                .clone()
                .or_else(|| template.virtual_function.clone()),
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
        if let Some(vf) = &self.virtual_function {
            self.virtual_function_address()
                .map_err(|e| bad(e.to_string()))?;
            if self.profile.is_some() {
                return Err(bad(format!(
                    "`virtualFunction` {vf} cannot be combined with `profile`: the VF is handed \
                     over with the vGPU type set on it, which is its profile (give one or the \
                     other)"
                )));
            }
            if !self.gpus.is_empty() {
                return Err(bad(format!(
                    "`virtualFunction` {vf} cannot be combined with `gpus`: it names one VF"
                )));
            }
            if self.count.is_some_and(|c| c != 1) {
                return Err(bad(format!(
                    "`virtualFunction` {vf} names one VF; `count` must be 1 or left out"
                )));
            }
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
        if self.gpus.iter().any(|g| g.trim().is_empty()) {
            return Err(bad("empty entry in `gpus`".into()));
        }
        // An entry that is no GPU reference at all is left to the solver, which says so with the
        // request and the Machine (a Machine is checked on its own before a fleet is known).
        // One pass: the first malformed entry, whether every entry names one GPU, and the first
        // GPU named twice (reported after the count and the vendor, as before).
        let mut names_all_explicit = true;
        let mut seen = std::collections::HashSet::new();
        let mut twice: Option<&String> = None;
        for g in &self.gpus {
            match GpuRef::parse(g) {
                Ok(r) if r.is_exact() => {
                    if !seen.insert(r) && twice.is_none() {
                        twice = Some(g);
                    }
                }
                Ok(_) | Err(CoreError::InvalidGpu { .. }) => names_all_explicit = false,
                Err(e) => return Err(bad(e.to_string())),
            }
        }
        if let (Some(c), false) = (self.count, self.gpus.is_empty()) {
            if names_all_explicit && c as usize != self.gpus.len() {
                return Err(bad(format!(
                    "`count` {c} does not match the {} GPUs named",
                    self.gpus.len()
                )));
            }
        }
        self.vendor_ref()?;
        if let Some(g) = twice {
            return Err(bad(format!("GPU {g:?} is named twice")));
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
        // Few requests are compared pairwise; many go through a set.
        let mut names = std::collections::BTreeSet::new();
        for (i, d) in self.devices.iter().enumerate() {
            let again = if self.devices.len() <= 16 {
                self.devices[..i].iter().any(|e| e.name == d.name)
            } else {
                !names.insert(d.name.as_str())
            };
            if again {
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
    fn a_gpu_reference_is_an_address_a_name_or_a_family() {
        assert_eq!(
            GpuRef::parse(" 0000:3b:00.0 ").unwrap(),
            GpuRef::Address("0000:3b:00.0".parse().unwrap())
        );
        assert_eq!(
            GpuRef::parse("radeon12").unwrap(),
            GpuRef::Name("radeon12".into())
        );
        assert_eq!(
            GpuRef::parse("radeon").unwrap(),
            GpuRef::Family(Vendor::Amd)
        );
        assert_eq!(GpuRef::parse("gpu").unwrap(), GpuRef::Family(Vendor::Other));
        assert!(matches!(
            GpuRef::parse("0000:zz:00.0"),
            Err(CoreError::InvalidPciAddress { .. })
        ));
        assert!(matches!(
            GpuRef::parse("banana"),
            Err(CoreError::InvalidGpu { .. })
        ));
        assert!(matches!(
            GpuRef::parse_one("a/b0"),
            Err(CoreError::InvalidName { .. })
        ));
        assert_eq!(
            GpuRef::parse_one("nosuch").unwrap(),
            GpuRef::Name("nosuch".into())
        );
    }

    #[test]
    fn a_request_entry_that_is_no_gpu_is_left_for_the_solver_to_refuse() {
        let m =
            Machine::from_text("name: m\ndevices: [{name: x, gpus: [nvidia0, banana]}]").unwrap();
        let e = m.devices[0].gpu_refs().unwrap_err();
        assert_eq!(
            e.to_string(),
            "\"banana\" is neither a GPU name (nvidia0), a family (nvidia, radeon, intel, matrox, aspeed, gpu) nor a PCI address"
        );
    }

    #[test]
    fn one_address_written_twice_in_two_spellings_is_named_twice() {
        let e = Machine::from_text(
            "name: m\ndevices: [{name: x, gpus: ['0000:3b:00.0', '0000:3B:00.0']}]",
        )
        .unwrap_err();
        assert!(e.to_string().contains("is named twice"), "{e}");
    }

    #[test]
    fn a_pci_vendor_id_is_kept_with_its_vendor() {
        let d = |v: &str| DeviceRequest {
            name: "x".into(),
            vendor: Some(v.into()),
            ..DeviceRequest::default()
        };
        let id = d("0x1AF4").vendor_ref().unwrap().unwrap();
        assert_eq!((id.vendor, id.pci_id), (Vendor::Other, Some(0x1af4)));
        let named = d("NVIDIA").vendor_ref().unwrap().unwrap();
        assert_eq!((named.vendor, named.pci_id), (Vendor::Nvidia, None));
        assert!(d("banana").vendor_ref().is_err());
    }

    #[test]
    fn a_virtual_function_is_accepted_alone_and_refused_with_a_profile_by_the_guides_rule() {
        let m = Machine::from_text(
            "name: m\ndevices: [{name: gpu, virtualFunction: \"0000:26:00.4\"}]",
        )
        .unwrap();
        let d = &m.devices[0];
        assert!(d.is_vgpu());
        assert_eq!(
            d.virtual_function_address().unwrap(),
            Some("0000:26:00.4".parse().unwrap())
        );
        let e = Machine::from_text(
            "name: m\ndevices: [{name: gpu, virtualFunction: \"0000:26:00.4\", profile: L40S-24Q}]",
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("`virtualFunction` 0000:26:00.4 cannot be combined with `profile`"),
            "{e}"
        );
        assert!(!e.contains("unknown field"), "{e}");
        for (extra, says) in [
            ("gpus: [nvidia0]", "cannot be combined with `gpus`"),
            ("count: 2", "`count` must be 1"),
        ] {
            let e = Machine::from_text(&format!(
                "name: m\ndevices: [{{name: gpu, virtualFunction: \"0000:26:00.4\", {extra}}}]"
            ))
            .unwrap_err()
            .to_string();
            assert!(e.contains(says), "{e}");
        }
        let e = Machine::from_text("name: m\ndevices: [{name: gpu, virtualFunction: vf4}]")
            .unwrap_err()
            .to_string();
        assert!(e.contains("vf4"), "{e}");
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
