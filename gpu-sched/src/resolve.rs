//! Turning a Machine into checked, resolved requests: templates applied, profiles looked up in
//! the fleet's catalogue, GPU names split into exact names, addresses and families.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use gpu_core::nvidia::{VgpuTypeName, strip_prefix};
use gpu_core::{DeviceClass, DeviceRequest, Machine, Profile, Vendor};

use crate::error::SchedError;

/// A profile class: one (type ID, name) pair as drivers report it. IDs are per driver version, so
/// the pair, not the ID alone, is the identity.
pub(crate) type ClassId = u32;

/// Every profile class seen in the fleet, findable by lower-case ID or by name without prefix.
#[derive(Debug, Clone, Default)]
pub(crate) struct Catalog {
    by_pair: HashMap<(String, String), ClassId>,
    by_key: HashMap<String, Vec<ClassId>>,
    /// Every profile name as offered, without its `NVIDIA `/`GRID ` prefix: what an unknown
    /// name is compared with.
    names: BTreeSet<String>,
    count: u32,
}

fn norm_name(name: &str) -> String {
    strip_prefix(name).to_ascii_lowercase()
}

/// Longest key lower-cased without an allocation.
const KEY_ON_STACK: usize = 64;

/// `text` in ASCII lower case: in `buf` when it fits, else allocated.
fn lower_key<'b>(text: &str, buf: &'b mut [u8; KEY_ON_STACK]) -> std::borrow::Cow<'b, str> {
    let Some(dst) = buf.get_mut(..text.len()) else {
        return text.to_ascii_lowercase().into();
    };
    dst.copy_from_slice(text.as_bytes());
    dst.make_ascii_lowercase();
    // Lower-casing ASCII bytes keeps UTF-8 valid; the fallback is never taken.
    match std::str::from_utf8(dst) {
        Ok(s) => s.into(),
        Err(_) => text.to_ascii_lowercase().into(),
    }
}

impl Catalog {
    /// The class of a profile, added when new.
    pub(crate) fn intern(&mut self, p: &Profile) -> ClassId {
        let id = p.id.as_str().to_ascii_lowercase();
        let name = norm_name(&p.name);
        if let Some(c) = self.by_pair.get(&(id.clone(), name.clone())) {
            return *c;
        }
        let c = self.count;
        self.count += 1;
        self.by_pair.insert((id.clone(), name.clone()), c);
        self.by_key.entry(id.clone()).or_default().push(c);
        if name != id {
            self.by_key.entry(name).or_default().push(c);
        }
        self.names.insert(strip_prefix(&p.name).to_owned());
        c
    }

    /// The offered names nearest to `text`, a name no node offers ([`crate::suggest::nearest`]).
    pub(crate) fn nearest(&self, text: &str) -> Vec<&str> {
        crate::suggest::nearest(strip_prefix(text.trim()), &self.names)
    }

    /// The class of a profile as an allocation records it (type ID and name), if the fleet has it.
    pub(crate) fn class_of(&self, id: &str, name: &str) -> Option<ClassId> {
        self.by_pair
            .get(&(id.to_ascii_lowercase(), norm_name(name)))
            .copied()
    }

    /// The classes a request's `profile` text names: by ID or name, ignoring case and the
    /// `NVIDIA `/`GRID ` prefix; a MIG attribute suffix is dropped only when the exact name is
    /// unknown in the whole fleet.
    pub(crate) fn resolve(&self, text: &str) -> Vec<ClassId> {
        let t = text.trim();
        let mut out: Vec<ClassId> = Vec::new();
        // The keys are lower-cased on the stack (a name is short): the text as written, then
        // without its prefix when it has one.
        let (mut whole, mut bare) = ([0u8; KEY_ON_STACK], [0u8; KEY_ON_STACK]);
        let stripped = strip_prefix(t);
        let keys = [
            Some(lower_key(t, &mut whole)),
            (stripped.len() != t.len()).then(|| lower_key(stripped, &mut bare)),
        ];
        for key in keys.iter().flatten() {
            if let Some(cs) = self.by_key.get(key.as_ref()) {
                out.extend(cs);
            }
        }
        if out.is_empty() {
            if let Ok(parsed) = VgpuTypeName::parse(t) {
                if parsed.suffix.is_some() {
                    let base = parsed.base().to_string().to_ascii_lowercase();
                    if let Some(cs) = self.by_key.get(&base) {
                        out.extend(cs);
                    }
                }
            }
        }
        out.sort_unstable();
        out.dedup();
        out
    }
}

/// A GPU named in a request: the model's one classification. `Kind::Whole::exact` holds only
/// names and addresses; families go to `Kind::Whole::families`.
pub(crate) use gpu_core::GpuRef;

/// What a request asks for.
#[derive(Debug, Clone)]
pub(crate) enum Kind {
    /// vGPU instances of a profile.
    Vgpu {
        /// The profile as written.
        text: String,
        /// Matching classes (empty only in a fleet without nodes: where there are nodes, a
        /// profile none offers is an invalid request).
        classes: Vec<ClassId>,
    },
    /// Whole GPUs.
    Whole {
        /// GPUs that must be among the picks.
        exact: Vec<GpuRef>,
        /// Families the other picks may come from; empty with `exact` empty means any GPU.
        families: Vec<&'static str>,
        /// True when `gpus` was given at all.
        listed: bool,
    },
}

/// A request after templates and checks.
#[derive(Debug, Clone)]
pub(crate) struct Req {
    pub name: String,
    pub wanted: u32,
    pub kind: Kind,
    pub vendor: Option<(Vendor, Option<u16>)>,
    pub model: Option<String>,
    pub accelerator: bool,
    pub min_mib: Option<u64>,
    pub numa: bool,
}

impl Req {
    pub(crate) fn is_vgpu(&self) -> bool {
        matches!(self.kind, Kind::Vgpu { .. })
    }

    /// The requested vGPU size, for ordering requests (largest first).
    pub(crate) fn exact_count(&self) -> usize {
        match &self.kind {
            Kind::Whole { exact, .. } => exact.len(),
            Kind::Vgpu { .. } => 0,
        }
    }
}

/// A Machine after templates and checks.
#[derive(Debug, Clone)]
pub(crate) struct Resolved {
    pub name: String,
    pub reqs: Vec<Req>,
    /// The only node the Machine may go to (`targetNode`).
    pub target: Option<String>,
}

fn invalid(machine: &str, why: impl Into<String>) -> SchedError {
    SchedError::InvalidRequest {
        machine: machine.to_owned(),
        why: why.into(),
    }
}

/// Applies templates (`use:`), validates, and resolves profiles and GPU names. With
/// `known_only` (a fleet that has nodes), a profile no node offers is an invalid request; in a
/// fleet without nodes nothing can be told from the catalogue, and the request is refused for
/// want of nodes instead.
///
/// # Errors
/// [`SchedError::InvalidRequest`] for a malformed Machine, an unknown template or (with
/// `known_only`) a profile no node offers.
pub(crate) fn resolve(
    m: &Machine,
    templates: &BTreeMap<String, DeviceRequest>,
    catalog: &Catalog,
    known_only: bool,
) -> Result<Resolved, SchedError> {
    if m.devices.iter().all(|d| d.template.is_none()) {
        return resolve_merged(m, catalog, known_only);
    }
    let mut merged = m.clone();
    for d in &mut merged.devices {
        if let Some(t) = d.template.clone() {
            let tpl = templates.get(&t).ok_or_else(|| {
                let known: Vec<&str> = templates.keys().map(String::as_str).collect();
                invalid(
                    &m.name,
                    format!(
                        "device request {:?} uses unknown template {t:?} (known: {})",
                        d.name,
                        if known.is_empty() {
                            "none".to_owned()
                        } else {
                            known.join(", ")
                        }
                    ),
                )
            })?;
            if tpl.template.is_some() {
                return Err(invalid(
                    &m.name,
                    format!("template {t:?} itself uses a template, which is not supported"),
                ));
            }
            *d = d.merged_with(tpl);
        }
    }
    resolve_merged(&merged, catalog, known_only)
}

fn resolve_merged(
    m: &Machine,
    catalog: &Catalog,
    known_only: bool,
) -> Result<Resolved, SchedError> {
    m.validate().map_err(|e| invalid(&m.name, e.to_string()))?;
    let mut reqs = Vec::with_capacity(m.devices.len());
    for d in &m.devices {
        reqs.push(resolve_request(&m.name, d, catalog, known_only)?);
    }
    Ok(Resolved {
        name: m.name.clone(),
        reqs,
        target: m.target_node.clone(),
    })
}

/// A profile no node of the fleet offers, by ID or name: a request that cannot be right (no
/// capacity freed later would place it), answered with the offered names nearest to it.
fn unknown_profile(machine: &str, request: &str, profile: &str, catalog: &Catalog) -> SchedError {
    let nearest = catalog.nearest(profile);
    let hint = if nearest.is_empty() {
        String::new()
    } else {
        format!("; nearest offered: {}", nearest.join(", "))
    };
    invalid(
        machine,
        format!(
            "device request {request:?}: no node in the fleet offers vGPU profile {:?}{hint}",
            profile.trim()
        ),
    )
}

fn resolve_request(
    machine: &str,
    d: &DeviceRequest,
    catalog: &Catalog,
    known_only: bool,
) -> Result<Req, SchedError> {
    let vendor = d
        .vendor_ref()
        .map_err(|_| {
            invalid(
                machine,
                format!(
                    "device request {:?}: unknown vendor {:?}",
                    d.name,
                    d.vendor.as_deref().unwrap_or_default()
                ),
            )
        })?
        .map(|v| (v.vendor, v.pci_id));
    let wanted = d.wanted();
    if let Some(vf) = &d.virtual_function {
        // Placement picks parents by profile; a VF named up front is the orchestrator's choice.
        return Err(invalid(
            machine,
            format!(
                "device request {:?}: `virtualFunction` {vf} names the device itself, which \
                 the solver does not place; give the VF's vGPU type as `profile` to place one",
                d.name
            ),
        ));
    }
    let kind = if let Some(p) = &d.profile {
        let classes = catalog.resolve(p);
        if classes.is_empty() && known_only {
            return Err(unknown_profile(machine, &d.name, p, catalog));
        }
        Kind::Vgpu {
            text: p.trim().to_owned(),
            classes,
        }
    } else {
        let mut exact = Vec::new();
        let mut families = Vec::new();
        // As `DeviceRequest::gpu_refs`, the first entry that is no GPU reference refused,
        // without collecting the references first.
        for g in &d.gpus {
            match GpuRef::parse(g) {
                Ok(GpuRef::Family(v)) => families.push(v.family()),
                Ok(exact_ref) => exact.push(exact_ref),
                Err(e @ gpu_core::CoreError::InvalidGpu { .. }) => {
                    return Err(invalid(
                        machine,
                        format!("device request {:?}: {e}", d.name),
                    ));
                }
                Err(e) => return Err(invalid(machine, e.to_string())),
            }
        }
        if exact.len() > wanted as usize {
            return Err(invalid(
                machine,
                format!(
                    "device request {:?}: `count` {wanted} is less than the {} GPUs named",
                    d.name,
                    exact.len()
                ),
            ));
        }
        if !d.gpus.is_empty() && families.is_empty() && exact.len() != wanted as usize {
            return Err(invalid(
                machine,
                format!(
                    "device request {:?}: `count` {wanted} does not match the {} GPUs named",
                    d.name,
                    exact.len()
                ),
            ));
        }
        Kind::Whole {
            exact,
            families,
            listed: !d.gpus.is_empty(),
        }
    };
    Ok(Req {
        name: d.name.clone(),
        wanted,
        kind,
        vendor,
        model: d.model.as_ref().map(|m| m.trim().to_ascii_lowercase()),
        accelerator: d.class == DeviceClass::Accelerator,
        min_mib: d.min_memory.map(|m| m.get()),
        numa: d.alignment.is_some(),
    })
}
