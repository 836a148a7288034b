//! The node side of DRA: from an allocation result back to what must exist on the host.
//!
//! The scheduler's allocation names the driver, the pool (the node), the device (as published by
//! [`super::build`]) and, for a multi-allocatable vGPU device, a share ID. The claim's opaque
//! configuration names the profile. [`plan_prepare`] turns that into concrete actions on this
//! node's parents and VFs; the command layer runs them through the actuation layer and records
//! them, so `unprepare` removes exactly what `prepare` created and the export can tell the
//! scheduler's own vGPUs from vGPUs made outside Kubernetes.

use std::collections::{BTreeMap, BTreeSet};

use crate::error::{Result, fail};
use gpu_core::{
    GpuState, MdevUuid, NodeTopology, Parent, ParentId, PciAddress, Profile, VgpuFramework,
    VgpuTypeId, nvidia,
};
use serde::{Deserialize, Serialize};

use super::build::Prepared;
use super::device_name::{DeviceName, VirtualDeviceName};
pub use super::model::{
    AllocationConfig, AllocationResult, ClaimMeta, ClaimStatus, DeviceAllocationResult,
    DeviceResult, Opaque, PrepareInput,
};

/// One thing to make exist on the host.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "action", rename_all = "kebab-case")]
pub enum PrepareAction {
    /// Bind a whole GPU (and its companion functions) to vfio-pci.
    #[serde(rename_all = "camelCase")]
    BindGpu {
        /// The request.
        request: String,
        /// The device name.
        device: String,
        /// The GPU.
        address: PciAddress,
    },
    /// Create an mdev.
    #[serde(rename_all = "camelCase")]
    CreateMdev {
        /// The request.
        request: String,
        /// The device name.
        device: String,
        /// The parent.
        parent: ParentId,
        /// The type directory.
        type_id: VgpuTypeId,
        /// The profile's name.
        profile: String,
        /// The instance UUID.
        uuid: MdevUuid,
    },
    /// Set a vGPU type on a vendor-VFIO VF.
    #[serde(rename_all = "camelCase")]
    SetVfType {
        /// The request.
        request: String,
        /// The device name.
        device: String,
        /// The VF.
        vf: PciAddress,
        /// The type number.
        type_id: VgpuTypeId,
        /// The profile's name.
        profile: String,
    },
}

impl PrepareAction {
    /// The request and the published device the action answers.
    pub fn request_and_device(&self) -> (&str, &str) {
        match self {
            PrepareAction::BindGpu {
                request, device, ..
            }
            | PrepareAction::CreateMdev {
                request, device, ..
            }
            | PrepareAction::SetVfType {
                request, device, ..
            } => (request, device),
        }
    }

    /// The key the export uses to recognise what prepare created.
    pub fn record(&self, prepared: &mut Prepared) {
        match self {
            PrepareAction::BindGpu { address, .. } => {
                prepared.gpus.insert(*address);
            }
            PrepareAction::CreateMdev { uuid, .. } => {
                prepared.instances.insert(uuid.to_string());
            }
            PrepareAction::SetVfType { vf, .. } => {
                prepared.instances.insert(vf.to_string());
            }
        }
    }
}

/// A device of the node named in an allocation result.
pub type PublishedDevice = DeviceName;

/// Resolves a published device name against the GPUs of `node`.
///
/// # Errors
/// When no GPU of `node` publishes a device of that name.
pub fn parse_device_name(node: &NodeTopology, name: &str) -> Result<PublishedDevice> {
    match name.parse::<DeviceName>() {
        Ok(d) if node.gpu_by_address(&d.gpu()).is_some() => Ok(d),
        _ => fail!(
            NotFound, name;
            "device {name:?} is not published by any GPU of node {}",
            node.node
        ),
    }
}

fn profile_for(config: &[AllocationConfig], driver: &str, request: &str) -> Result<Option<String>> {
    let mut found = None;
    for c in config {
        let applies = c.requests.is_empty()
            || c.requests.iter().any(|r| {
                r == request
                    || request
                        .strip_prefix(r.as_str())
                        .is_some_and(|rest| rest.starts_with('/'))
            });
        let Some(o) = c.opaque.as_ref().filter(|o| o.driver == driver) else {
            continue;
        };
        if !applies {
            continue;
        }
        match o.parameters.get("profile") {
            Some(serde_json::Value::String(p)) => found = Some(p.clone()),
            Some(other) => fail!(
                Invalid, format!("request {request}");
                "request {request}: profile must be a string, got {other}"
            ),
            None => {}
        }
    }
    Ok(found)
}

fn parents_of(node: &NodeTopology, gpu: PciAddress) -> Vec<&Parent> {
    node.mediated_devices
        .parents
        .iter()
        .filter(|p| p.gpu == Some(gpu))
        .collect()
}

/// The stable UUID of a claim's vGPU: the share ID when it is a UUID, else one derived from the
/// claim UID, request and device.
pub fn instance_uuid(claim_uid: &str, result: &DeviceResult, index: u32) -> MdevUuid {
    result
        .share_id
        .as_deref()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            MdevUuid::for_machine(
                &format!("dra\0{claim_uid}"),
                &format!("{}\0{}", result.request, result.device),
                index,
            )
        })
}

/// Plans what `prepare` creates for the results of `driver` in `node`'s pool, in named steps:
/// each result is checked against this node ([`check_pool`]), its device resolved
/// ([`parse_device_name`]), a whole GPU planned as a bind ([`plan_whole_gpu`]), a vGPU's profile
/// chosen ([`choose_profile`]) and checked against the reservation ([`check_reservation`]), and a
/// free parent picked ([`choose_parent`]); last, the claim's sizes are checked against the
/// same-size rule of each GPU ([`check_one_size`]) and its whole GPUs on an NVSwitch node
/// against the partitions ([`super::partition::claim_partition`]). Nothing is written.
///
/// # Errors
/// When a result is for another node, names an unknown device, asks for a profile the device does
/// not offer (or none when it offers several), no free parent is left, the claim would put
/// time-sliced vGPUs of two sizes on one GPU, or its whole GPUs are no NVSwitch partition.
pub fn plan_prepare(
    input: &DeviceAllocationResult,
    claim_uid: &str,
    driver: &str,
    node: &NodeTopology,
) -> Result<Vec<PrepareAction>> {
    let mut actions = Vec::new();
    let mut taken: BTreeSet<ParentId> = BTreeSet::new();
    let mut per_device: BTreeMap<String, u32> = BTreeMap::new();
    for r in input.results.iter().filter(|r| r.driver == driver) {
        check_pool(r, node)?;
        let index = per_device.entry(r.device.clone()).or_default();
        let this_index = *index;
        *index += 1;
        if let Ok(v) = r.device.parse::<VirtualDeviceName>() {
            actions.push(plan_virtual(
                r, &v, node, input, driver, claim_uid, this_index, &actions,
            )?);
            continue;
        }
        let published = parse_device_name(node, &r.device)?;
        let (gpu, size, mig) = match published {
            PublishedDevice::Gpu(address) => {
                actions.push(plan_whole_gpu(r, address, node)?);
                continue;
            }
            PublishedDevice::Vgpu(g, s) | PublishedDevice::VgpuInstance(g, s, _) => {
                (g, Some(s), None)
            }
            PublishedDevice::Mixed(g) => (g, None, None),
            PublishedDevice::Mig {
                gpu,
                slices,
                size_mib,
                ..
            } => (gpu, Some(size_mib), Some(slices)),
        };
        let wanted = Wanted { gpu, size, mig };
        if let (Some(size), None) = (size, mig) {
            check_locked_size(r, gpu, size, node)?;
        }
        let parents = parents_of(node, gpu);
        let profile = choose_profile(r, &parents, &wanted, &input.config, driver)?;
        if let PublishedDevice::Mixed(_) = published {
            check_reservation(r, &profile)?;
        }
        let (parent, t) = choose_parent(r, &parents, &wanted, &profile, &taken)?;
        if parent.id != ParentId::Pci(gpu) {
            taken.insert(parent.id.clone());
        }
        actions.push(action_for(r, parent, t, profile, claim_uid, this_index)?);
    }
    check_one_size(&actions, node)?;
    super::partition::claim_partition(&bound_gpus(&actions), node)?;
    Ok(actions)
}

/// The whole GPUs a plan binds.
pub fn bound_gpus(actions: &[PrepareAction]) -> Vec<PciAddress> {
    actions
        .iter()
        .filter_map(|a| match a {
            PrepareAction::BindGpu { address, .. } => Some(*address),
            _ => None,
        })
        .collect()
}

/// What a vGPU device of an allocation stands for: its GPU, its framebuffer size (none for a
/// mixed-size device) and its MIG slices (none for a time-sliced one).
struct Wanted {
    gpu: PciAddress,
    size: Option<u64>,
    mig: Option<u8>,
}

impl Wanted {
    /// Whether profile `p` is of the device's size and kind.
    fn fits(&self, p: &Profile) -> bool {
        let (fb, ms) = profile_size(p);
        p.device_api == "vfio-pci" && ms == self.mig && self.size.is_none_or(|s| fb == Some(s))
    }
}

/// A profile's framebuffer and MIG slices, from the model or, failing that, its NVIDIA name.
pub fn profile_size(p: &Profile) -> (Option<u64>, Option<u8>) {
    let parsed = nvidia::VgpuTypeName::parse(&p.name).ok();
    let fb = p
        .framebuffer_mib
        .or(parsed.as_ref().map(|n| n.framebuffer_mib()));
    let ms = p.mig_slices.or(parsed.as_ref().and_then(|n| n.mig_slices));
    (fb, ms)
}

/// Step 1: a result must be for this node's pool.
///
/// # Errors
/// `Invalid` when the result's pool is another node.
pub fn check_pool(r: &DeviceResult, node: &NodeTopology) -> Result<()> {
    if r.pool != node.node {
        fail!(
            Invalid, format!("request {}", r.request);
            "request {}: device {} is in pool {}, this node is {}",
            r.request,
            r.device,
            r.pool,
            node.node
        );
    }
    Ok(())
}

/// Step 2 for a whole GPU: bind it, when it is free (only a free GPU is published whole).
///
/// # Errors
/// `NotFound` for a GPU not on the node; `Refused` for one that is blocked or not free.
pub fn plan_whole_gpu(
    r: &DeviceResult,
    address: PciAddress,
    node: &NodeTopology,
) -> Result<PrepareAction> {
    let g = node.gpu_by_address(&address).ok_or_else(
        || crate::error::error!(NotFound, address; "GPU {address} is not on node {}", node.node),
    )?;
    if g.state == GpuState::Blocked {
        fail!(Refused, format!("request {}", r.request); "request {}: GPU {address} is blocked", r.request);
    }
    // One already on vfio-pci may be another VM's: binding it would be a no-op that unprepare
    // then undoes by releasing it.
    if g.state != GpuState::Free {
        fail!(
            Refused, format!("request {}", r.request);
            "request {}: device {} (GPU {address}) is not published: it is {} ({}); \
             nothing was changed",
            r.request,
            r.device,
            g.state.as_str(),
            g.state_reason
                .as_deref()
                .unwrap_or("bound to vfio-pci or held by a VM")
        );
    }
    Ok(PrepareAction::BindGpu {
        request: r.request.clone(),
        device: r.device.clone(),
        address,
    })
}

/// Step 2 for a vGPU: the profile of the device the claim's opaque configuration names, or the
/// only one the device offers.
fn choose_profile(
    r: &DeviceResult,
    parents: &[&Parent],
    wanted: &Wanted,
    config: &[AllocationConfig],
    driver: &str,
) -> Result<String> {
    let requested = profile_for(config, driver, &r.request)?;
    let names: BTreeSet<String> = parents
        .iter()
        .flat_map(|p| &p.profiles)
        .filter(|p| wanted.fits(p))
        .map(|p| nvidia::strip_prefix(&p.name).to_owned())
        .collect();
    let offered = || names.iter().cloned().collect::<Vec<_>>().join(", ");
    match requested {
        Some(w) => names
            .iter()
            .find(|n| nvidia::names_match(n, &w))
            .cloned()
            .ok_or_else(|| {
                crate::error::error!(NotFound, format!("request {}", r.request);
                    "request {}: device {} does not offer profile {w} (it offers {})",
                    r.request,
                    r.device,
                    offered()
                )
            }),
        None if names.len() == 1 => Ok(names.iter().next().cloned().unwrap_or_default()),
        None => fail!(
            Invalid, format!("request {}", r.request);
            "request {}: device {} offers {}; name one in the claim's opaque config (parameters.profile)",
            r.request,
            r.device,
            offered()
        ),
    }
}

/// Step 3 on a mixed-size GPU: the scheduler reserved some framebuffer, the profile must fit it.
fn check_reservation(r: &DeviceResult, profile: &str) -> Result<()> {
    let Some(reserved) = r.consumed_capacity.get("framebuffer") else {
        return Ok(());
    };
    let need = nvidia::VgpuTypeName::parse(profile)
        .ok()
        .map(|n| u128::from(n.framebuffer_mib()) << 20);
    let have = super::names::parse_quantity(reserved);
    if need.is_none() || have.is_none() || need > have {
        fail!(
            Refused, format!("request {}", r.request);
            "request {}: profile {profile} does not fit the {reserved} of framebuffer the allocation reserved",
            r.request
        );
    }
    Ok(())
}

/// Step 4: a parent offering the profile that this claim has not taken yet (an SR-IOV VF holds
/// one vGPU; a PF mdev parent many, while its type has room).
fn choose_parent<'n>(
    r: &DeviceResult,
    parents: &[&'n Parent],
    wanted: &Wanted,
    profile: &str,
    taken: &BTreeSet<ParentId>,
) -> Result<(&'n Parent, &'n Profile)> {
    let gpu = wanted.gpu;
    parents
        .iter()
        .find_map(|p| {
            if taken.contains(&p.id) {
                return None;
            }
            let one_per_parent = p.id != ParentId::Pci(gpu);
            if one_per_parent && !p.instances.is_empty() {
                return None;
            }
            let t = p
                .profiles
                .iter()
                .find(|t| wanted.fits(t) && nvidia::names_match(&t.name, profile))?;
            if p.framework == VgpuFramework::Mdev && t.available_instances == 0 {
                return None;
            }
            Some((*p, t))
        })
        .ok_or_else(|| {
            crate::error::error!(Refused, format!("request {}", r.request);
                "request {}: no free parent on GPU {gpu} offers {profile}",
                r.request
            )
        })
}

/// Step 5: the action that makes the vGPU on the chosen parent.
fn action_for(
    r: &DeviceResult,
    parent: &Parent,
    t: &Profile,
    profile: String,
    claim_uid: &str,
    index: u32,
) -> Result<PrepareAction> {
    match (parent.framework, &parent.id) {
        (VgpuFramework::Mdev, _) => Ok(PrepareAction::CreateMdev {
            request: r.request.clone(),
            device: r.device.clone(),
            parent: parent.id.clone(),
            type_id: t.id.clone(),
            profile,
            uuid: instance_uuid(claim_uid, r, index),
        }),
        (VgpuFramework::VendorVfio, ParentId::Pci(vf)) => Ok(PrepareAction::SetVfType {
            request: r.request.clone(),
            device: r.device.clone(),
            vf: *vf,
            type_id: t.id.clone(),
            profile,
        }),
        (VgpuFramework::VendorVfio, ParentId::Named(n)) => {
            fail!(Invalid, n; "vendor-VFIO parent {n} is not a PCI function")
        }
    }
}

/// Step 2 for a time-sliced vGPU: a GPU its vGPUs lock to another size cannot take this one
/// (its VFs no longer even list the type).
///
/// # Errors
/// `Refused`, naming the GPU and the two sizes.
fn check_locked_size(
    r: &DeviceResult,
    gpu: PciAddress,
    size: u64,
    node: &NodeTopology,
) -> Result<()> {
    match node.pool(&ParentId::Pci(gpu)) {
        Some(p) if !p.mixed_size && p.size_locked_mib.is_some_and(|l| l != size) => {
            let locked = p.size_locked_mib.unwrap_or_default();
            fail!(
                Refused, format!("request {}", r.request);
                "{}",
                two_sizes(&r.request, gpu, size, locked, "the vGPUs it holds")
            )
        }
        _ => Ok(()),
    }
}

/// The refusal of the same-size rule.
fn two_sizes(request: &str, gpu: PciAddress, size: u64, other: u64, by: &str) -> String {
    format!(
        "request {request}: GPU {gpu} would hold time-sliced vGPUs of two sizes, {size} MiB and \
         {other} MiB ({by}); a GPU not in mixed-size mode holds one size; nothing was changed"
    )
}

/// The GPU a planned vGPU sits on and its time-sliced size, from the profile it names.
fn time_sliced_size(a: &PrepareAction, node: &NodeTopology) -> Option<(PciAddress, u64)> {
    let (parent, type_id) = match a {
        PrepareAction::BindGpu { .. } => return None,
        PrepareAction::CreateMdev {
            parent, type_id, ..
        } => (parent.clone(), type_id),
        PrepareAction::SetVfType { vf, type_id, .. } => (ParentId::Pci(*vf), type_id),
    };
    let p = node
        .mediated_devices
        .parents
        .iter()
        .find(|p| p.id == parent)?;
    let t = p.profiles.iter().find(|t| &t.id == type_id)?;
    match profile_size(t) {
        (Some(fb), None) => Some((p.gpu?, fb)),
        _ => None,
    }
}

/// Step 6: a GPU not in mixed-size mode holds time-sliced vGPUs of one size: the vGPUs of one
/// claim too (the size the GPU is locked to was checked per result). A Kubernetes scheduler before 1.36.2 can
/// allocate two sizes on one GPU across scheduling cycles (kubernetes#139034); this is the node's
/// refusal, before any write.
///
/// # Errors
/// `Refused`, naming the GPU and the two sizes.
pub fn check_one_size(actions: &[PrepareAction], node: &NodeTopology) -> Result<()> {
    let mut sizes: BTreeMap<PciAddress, (u64, String)> = BTreeMap::new();
    for a in actions {
        let Some((gpu, size)) = time_sliced_size(a, node) else {
            continue;
        };
        if node.pool(&ParentId::Pci(gpu)).is_some_and(|p| p.mixed_size) {
            continue;
        }
        let request = a.request_and_device().0.to_owned();
        match sizes.get(&gpu) {
            Some((s, _)) if *s == size => {}
            Some((s, by)) => {
                fail!(Refused, format!("request {request}"); "{}", two_sizes(&request, gpu, size, *s, by))
            }
            None => {
                sizes.insert(gpu, (size, format!("request {request}")));
            }
        }
    }
    Ok(())
}

/// A vGPU of a virtual mdev parent ([`VirtualDeviceName`], see [`super::build`]): the parent
/// whose label the device names, the display type of the device's size (an instance device) or
/// the one the claim's opaque configuration names or its reserved `framebuffer` fits (the mixed
/// device), and an mdev with the share ID or a UUID derived from the claim. `planned`: what this
/// claim already plans, so two results do not count on the same free instance.
///
/// # Errors
/// `NotFound` for a parent that is not on the node or a profile it does not offer; `Invalid`
/// when the device offers several profiles and the claim names none; `Refused` when the
/// profile does not fit the reservation or the type has no room left.
#[allow(clippy::too_many_arguments)]
fn plan_virtual(
    r: &DeviceResult,
    v: &VirtualDeviceName,
    node: &NodeTopology,
    input: &DeviceAllocationResult,
    driver: &str,
    claim_uid: &str,
    index: u32,
    planned: &[PrepareAction],
) -> Result<PrepareAction> {
    let who = format!("request {}", r.request);
    let parent = v
        .parent(node)
        .filter(|p| p.framework == VgpuFramework::Mdev)
        .ok_or_else(|| {
            crate::error::error!(NotFound, r.device;
                "{who}: device {} names no virtual mdev parent of node {}",
                r.device,
                node.node
            )
        })?;
    let reserved = r
        .consumed_capacity
        .get("framebuffer")
        .map(|q| (q, super::names::parse_quantity(q)));
    let fits = |p: &Profile| -> bool {
        let (fb, mig) = profile_size(p);
        p.device_api == "vfio-pci"
            && mig.is_none()
            && match (v, fb) {
                (VirtualDeviceName::Instance { size_mib, .. }, Some(fb)) => fb == *size_mib,
                (VirtualDeviceName::Mixed { .. }, Some(fb)) => fb > 0,
                (_, None) => false,
            }
    };
    let types: Vec<&Profile> = parent.profiles.iter().filter(|p| fits(p)).collect();
    if types.is_empty() {
        fail!(
            NotFound, who;
            "{who}: device {} is not published: its mdev parent offers no display type of that size",
            r.device
        );
    }
    let offered = || {
        types
            .iter()
            .map(|t| t.name.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    };
    let t = match profile_for(&input.config, driver, &r.request)? {
        Some(w) => types
            .iter()
            .find(|t| nvidia::names_match(&t.name, &w))
            .copied()
            .ok_or_else(|| {
                crate::error::error!(NotFound, who;
                    "{who}: device {} does not offer profile {w} (it offers {})",
                    r.device,
                    offered()
                )
            })?,
        None => {
            // The mixed device: the type whose size is what the scheduler reserved.
            let exact: Vec<&Profile> = match reserved {
                Some((_, Some(bytes))) => types
                    .iter()
                    .filter(|t| profile_size(t).0.map(|fb| u128::from(fb) << 20) == Some(bytes))
                    .copied()
                    .collect(),
                _ => types.clone(),
            };
            match exact[..] {
                [one] => one,
                _ => fail!(
                    Invalid, who;
                    "{who}: device {} offers {}; name one in the claim's opaque config (parameters.profile)",
                    r.device,
                    offered()
                ),
            }
        }
    };
    if let Some((q, have)) = reserved {
        let need = profile_size(t).0.map(|fb| u128::from(fb) << 20);
        if need.is_none() || have.is_none() || need > have {
            fail!(
                Refused, who;
                "{who}: profile {} does not fit the {q} of framebuffer the allocation reserved",
                t.name
            );
        }
    }
    let already = planned
        .iter()
        .filter(|a| {
            matches!(a, PrepareAction::CreateMdev { parent: p, type_id, .. }
                if *p == parent.id && *type_id == t.id)
        })
        .count();
    if u64::from(t.available_instances) <= already as u64 {
        fail!(
            Refused, who;
            "{who}: mdev parent {} has no room left for {}; nothing was changed",
            v.label(),
            t.name
        );
    }
    action_for(r, parent, t, t.name.clone(), claim_uid, index)
}

/// What prepare did for one claim, kept on the node for unprepare and for the export.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PreparedClaim {
    /// The claim's UID.
    pub claim_uid: String,
    /// The node.
    pub node: String,
    /// The changes prepare made: exactly what unprepare undoes.
    pub actions: Vec<PrepareAction>,
    /// Devices the claim was given that were already in the wanted state before prepare (an
    /// instance of that UUID existed, the VF held the type, the GPU was on vfio-pci): the claim
    /// holds them, but prepare changed nothing for them, so unprepare leaves them as they are.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub found: Vec<PrepareAction>,
    /// Where the record stands: `started` is written before the first host write (`actions`
    /// then holds the plan, with its UUIDs), `completed` after the last.
    #[serde(default)]
    pub phase: ClaimPhase,
    /// The boot the devices were made in (the host's `/proc/sys/kernel/random/boot_id`); none
    /// when the root has no boot ID (the record is then trusted as made in this boot).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub boot_id: Option<String>,
}

/// Where a recorded claim stands (the checkpoint's two phases).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ClaimPhase {
    /// Recorded before the host writes; the writes may be partly done (a crash, `kill -9`):
    /// the next prepare of the claim finishes them, the next unprepare undoes them.
    Started,
    /// Every write done. A record without a phase (written before the checkpoint had phases)
    /// was written after the writes, so it is completed.
    #[default]
    Completed,
}

impl PreparedClaim {
    /// Every device the claim holds, changed by prepare or found in place (the export's view).
    pub fn held(&self) -> impl Iterator<Item = &PrepareAction> {
        self.actions.iter().chain(self.found.iter())
    }
}

#[cfg(test)]
mod tests;
