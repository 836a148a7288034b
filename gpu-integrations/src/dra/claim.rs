//! The node side of DRA as one call per claim: [`prepare_claim`] and [`unprepare_claim`], over a
//! node opened once ([`DraNode`]) and the node's claim store ([`ClaimStore`]).
//!
//! The CLI's `dra prepare|unprepare` and the kubelet plugin (gRPC `NodePrepareResources` /
//! `NodeUnprepareResources`) both call these: a claim (UID, namespace, name, its allocation
//! results, opaque parameters) goes in; per request the pool, the device name and the facts a CDI
//! spec and KubeVirt's device metadata need come out (PCI address, IOMMU group and its vfio device
//! nodes, mdev UUID), or a classified error ([`IntegrationError::kind`]) with nothing written.
//!
//! A prepare is idempotent: a claim already recorded is answered from the record, with no write.
//! An unprepare undoes exactly what its prepare changed, and succeeds for a claim never prepared.
//!
//! The record is the checkpoint: written `started` (the plan, with its UUIDs, and which devices
//! were already in place) before the first host write and `completed` after the last, with the
//! host's boot ID. After a `kill -9` at any point the next prepare of the claim finishes the
//! plan and the next unprepare undoes it; after a reboot the claim's devices are made again,
//! with the same UUIDs, instead of being answered from the stale record.

use std::collections::BTreeMap;

use gpu_core::{MdevUuid, NodeTopology, PciAddress};
use gpu_sysfs::Host;
use serde::Serialize;

use super::model::{DeviceAllocationResult, PrepareInput};
use super::node::{self, PrepareAnswer};
use super::prepare::{ClaimPhase, PrepareAction, PreparedClaim, plan_prepare};
use super::store::ClaimStore;
use crate::error::{Result, fail};

/// A claim to prepare: what the kubelet names (UID, namespace, name) and what the API server's
/// `status.allocation` holds.
#[derive(Debug, Clone)]
pub struct Claim {
    /// The claim's UID (the key of its record).
    pub uid: String,
    /// Its namespace, when known.
    pub namespace: Option<String>,
    /// Its name, when known.
    pub name: Option<String>,
    /// Its allocation: the results of every driver, and the opaque configuration.
    pub allocation: DeviceAllocationResult,
}

impl Claim {
    /// The claim of a ResourceClaim document (or a bare AllocationResult); `uid` is used when the
    /// document has no `metadata.uid`.
    ///
    /// # Errors
    /// `Invalid` when the document holds no allocation or no UID is known.
    pub fn from_input(input: PrepareInput, uid: Option<String>) -> Result<Self> {
        let allocation = input.allocation()?.clone();
        let meta = input.metadata.unwrap_or_default();
        let Some(uid) = uid.or(meta.uid) else {
            fail!(Invalid, "claim"; "the claim has no metadata.uid; pass --claim-uid");
        };
        Ok(Claim {
            uid,
            namespace: meta.namespace,
            name: meta.name,
            allocation,
        })
    }
}

/// The node a claim is prepared on, opened once: its host and its topology as read then.
#[derive(Clone, Copy)]
pub struct DraNode<'a> {
    /// The host (the node's root).
    pub host: &'a dyn Host,
    /// The node's topology, read from `host`.
    pub topology: &'a NodeTopology,
    /// True when the root is a recording: planning works, writing is refused.
    pub recording: bool,
}

impl std::fmt::Debug for DraNode<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DraNode")
            .field("node", &self.topology.node)
            .field("recording", &self.recording)
            .finish_non_exhaustive()
    }
}

/// Refuses a change through a recording (what is written to its replayed tree is thrown away).
fn writable(recording: bool) -> Result<()> {
    if recording {
        fail!(
            Invalid, "--root";
            "prepare and unprepare change the host: --root must be a directory, not a recording"
        );
    }
    Ok(())
}

/// How a prepare runs.
#[derive(Debug, Clone)]
pub struct PrepareOptions {
    /// The driver name the devices were published under (results of other drivers are ignored).
    pub driver: String,
    /// Plan only: nothing is written, not even the record.
    pub dry_run: bool,
}

/// One device a claim was given, with what a CDI spec and KubeVirt's device metadata need.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PreparedDevice {
    /// The request it answers (`vgpu`, or `gpu/a2-8q` for a `firstAvailable` alternative).
    pub request: String,
    /// The pool (the node).
    pub pool: String,
    /// The published device name.
    pub device: String,
    /// The PCI address a VM is given: the GPU, or the vendor-VFIO VF (none for an mdev).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pci_address: Option<PciAddress>,
    /// The mdev's UUID (`mdevUUID` in KubeVirt's metadata).
    #[serde(rename = "mdevUUID", skip_serializing_if = "Option::is_none")]
    pub mdev_uuid: Option<MdevUuid>,
    /// The IOMMU group of the device, when the host shows it (none for a dry run of a new mdev).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub iommu_group: Option<u32>,
    /// The legacy VFIO device nodes a container needs: `/dev/vfio/<group>` and `/dev/vfio/vfio`
    /// (empty when the group is not known).
    pub vfio_devices: Vec<String>,
    /// True when prepare found it in place and unprepare leaves it.
    pub found: bool,
}

/// What a prepare answers for one claim.
#[derive(Debug, Clone)]
pub struct ClaimResult {
    /// The record: what prepare changed and what it found in place.
    pub claim: PreparedClaim,
    /// Per request, the devices given.
    pub devices: Vec<PreparedDevice>,
    /// True when this call changed nothing (already prepared, or a dry run).
    pub unchanged: bool,
    /// The answer `gpuslice dra prepare` prints (with the QEMU and libvirt hand-off).
    pub answer: PrepareAnswer,
    /// The devices this call changed on the host: those it made, and those of an interrupted
    /// record it undid; empty when it changed nothing. A caller that keeps a picture of the
    /// host reads these again ([`node::change_of`]), not the whole host.
    pub touched: Vec<PrepareAction>,
}

/// What an unprepare did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Unprepared {
    /// The claim's UID.
    pub claim_uid: String,
    /// The devices removed or released (none for a claim that was not prepared).
    pub removed: Vec<String>,
    /// The devices this call may have changed on the host (each undo is a no-op for a device
    /// not there); empty when it changed nothing.
    #[serde(skip)]
    pub touched: Vec<PrepareAction>,
}

fn iommu_group(host: &dyn Host, device_dir: &str) -> Option<u32> {
    host.resolve_link(&format!("{device_dir}/iommu_group"))
        .ok()
        .and_then(|target| target.rsplit('/').next().and_then(|g| g.parse().ok()))
}

fn device_of(
    dra: &DraNode<'_>,
    claim: &PreparedClaim,
    allocation: &DeviceAllocationResult,
    a: &PrepareAction,
    found: bool,
) -> PreparedDevice {
    let (request, device) = a.request_and_device();
    let pool = allocation
        .results
        .iter()
        .find(|r| r.request == request && r.device == device)
        .map_or_else(|| claim.node.clone(), |r| r.pool.clone());
    let (pci_address, mdev_uuid, group) = match a {
        PrepareAction::BindGpu { address, .. } => {
            let g = dra
                .topology
                .gpu_by_address(address)
                .and_then(|g| g.iommu_group)
                .or_else(|| iommu_group(dra.host, &format!("sys/bus/pci/devices/{address}")));
            (Some(*address), None, g)
        }
        PrepareAction::SetVfType { vf, .. } => (
            Some(*vf),
            None,
            iommu_group(dra.host, &format!("sys/bus/pci/devices/{vf}")),
        ),
        PrepareAction::CreateMdev { uuid, .. } => (
            None,
            Some(*uuid),
            iommu_group(dra.host, &format!("sys/bus/mdev/devices/{uuid}")),
        ),
    };
    PreparedDevice {
        request: request.to_owned(),
        pool,
        device: device.to_owned(),
        pci_address,
        mdev_uuid,
        iommu_group: group,
        vfio_devices: group
            .map(|g| vec![format!("/dev/vfio/{g}"), "/dev/vfio/vfio".to_owned()])
            .unwrap_or_default(),
        found,
    }
}

fn result_of(
    dra: &DraNode<'_>,
    claim: PreparedClaim,
    allocation: &DeviceAllocationResult,
    unchanged: bool,
) -> ClaimResult {
    let devices = claim
        .actions
        .iter()
        .map(|a| device_of(dra, &claim, allocation, a, false))
        .chain(
            claim
                .found
                .iter()
                .map(|a| device_of(dra, &claim, allocation, a, true)),
        )
        .collect();
    let answer = PrepareAnswer::new(&claim, unchanged, || Some(dra.topology.clone()));
    ClaimResult {
        claim,
        devices,
        unchanged,
        answer,
        touched: Vec::new(),
    }
}

/// Whether `recorded` was made in an earlier boot than `current` (both boot IDs known and
/// different): its devices did not survive the reboot.
fn rebooted(recorded: &PreparedClaim, current: Option<&str>) -> bool {
    matches!((recorded.boot_id.as_deref(), current), (Some(r), Some(c)) if r != c)
}

/// Whether `recorded` answers `allocation`: the same (request, device) pairs of `driver`.
fn same_requests(
    recorded: &PreparedClaim,
    allocation: &DeviceAllocationResult,
    driver: &str,
) -> bool {
    let mut held: Vec<(&str, &str)> = recorded.held().map(|a| a.request_and_device()).collect();
    let mut wanted: Vec<(&str, &str)> = allocation
        .results
        .iter()
        .filter(|r| r.driver == driver)
        .map(|r| (r.request.as_str(), r.device.as_str()))
        .collect();
    held.sort_unstable();
    wanted.sort_unstable();
    held == wanted
}

/// The devices other claims' records hold (by [`node::identity`]), with the claim holding
/// each. Records of an earlier boot count: their claims get the same devices back.
fn held_by_others(store: &ClaimStore, uid: &str) -> Result<BTreeMap<String, String>> {
    let mut out = BTreeMap::new();
    for other in store.read_all()? {
        if other.claim_uid == uid {
            continue;
        }
        for a in other.held() {
            out.insert(node::identity(a), other.claim_uid.clone());
        }
    }
    Ok(out)
}

/// Refuses a plan naming a device another claim's record holds (a device an interrupted
/// prepare had planned but not made yet looks free on the host).
fn refuse_taken<'a>(
    uid: &str,
    held: impl IntoIterator<Item = &'a PrepareAction>,
    others: &BTreeMap<String, String>,
) -> Result<()> {
    for a in held {
        let id = node::identity(a);
        if let Some(holder) = others.get(&id) {
            let (request, _) = a.request_and_device();
            fail!(
                Refused, format!("request {request}");
                "claim {uid}: request {request}: device {id} is held by claim {holder}; nothing was changed"
            );
        }
    }
    Ok(())
}

/// A plan for `actions`, split before any write into what the claim makes and what it finds in
/// place, recorded as started in boot `boot_id`.
fn started(
    dra: &DraNode<'_>,
    uid: &str,
    held: impl IntoIterator<Item = PrepareAction>,
    boot_id: Option<String>,
) -> PreparedClaim {
    let (found, actions) = held.into_iter().partition(|a| node::in_place(dra.host, a));
    PreparedClaim {
        claim_uid: uid.to_owned(),
        node: dra.topology.node.clone(),
        actions,
        found,
        phase: ClaimPhase::Started,
        boot_id,
    }
}

/// Undoes an interrupted (started) record that no longer answers its claim: every device of it
/// that no other claim holds, refused as a whole while a VM holds one; then forgets it.
/// Returns the actions undone.
fn roll_back(
    host: &dyn Host,
    store: &ClaimStore,
    recorded: &PreparedClaim,
    others: &BTreeMap<String, String>,
) -> Result<Vec<PrepareAction>> {
    let mine: Vec<PrepareAction> = recorded
        .actions
        .iter()
        .filter(|a| !others.contains_key(&node::identity(a)))
        .cloned()
        .collect();
    node::refuse_held(host, &recorded.claim_uid, &mine)?;
    let claim = PreparedClaim {
        actions: mine,
        ..recorded.clone()
    };
    node::unprepare(host, &claim, false)?;
    store.remove(&recorded.claim_uid)?;
    Ok(claim.actions)
}

/// Prepares `claim` on `dra`, with the checkpoint:
/// - a completed record of this boot answers the call, with no write (idempotency);
/// - a started record (a prepare killed midway) is finished with its own plan: the same UUIDs,
///   VFs and GPUs, each device made when it is not there yet;
/// - a record of an earlier boot (the boot ID changed) is never answered from: its devices,
///   gone with the reboot, are made again with the same UUIDs;
/// - a record whose requests are not the claim's allocation is rolled back and forgotten.
///
/// Otherwise every result of `opts.driver` is planned (all checked before any write). The plan
/// is recorded as started (which devices it makes, which it found in place) before the first
/// host write and as completed after the last; when a write fails, this claim's changes are
/// undone and the record forgotten (kept when an undo failed, for the next call to finish).
///
/// # Errors
/// The planning's refusals (another node's pool, an unknown device or profile, no free parent,
/// two sizes on one GPU, a device another claim's record holds) with nothing written; a
/// recording as the root; the store's errors; the actuation layer's refusal, prefixed
/// `claim <uid>: `, with this call's changes undone.
pub fn prepare_claim(
    dra: &DraNode<'_>,
    store: &ClaimStore,
    claim: &Claim,
    opts: &PrepareOptions,
) -> Result<ClaimResult> {
    let boot = node::boot_id(dra.host);
    let recorded = store.read(&claim.uid)?;
    let mut resume = None;
    let mut touched = Vec::new();
    if let Some(rec) = recorded {
        let stale = rebooted(&rec, boot.as_deref());
        if rec.phase == ClaimPhase::Completed && !stale {
            return Ok(result_of(dra, rec, &claim.allocation, true));
        }
        if !same_requests(&rec, &claim.allocation, &opts.driver) {
            if !opts.dry_run {
                writable(dra.recording)?;
                if stale {
                    store.remove(&claim.uid)?; // its devices went with the reboot
                } else {
                    touched =
                        roll_back(dra.host, store, &rec, &held_by_others(store, &claim.uid)?)?;
                }
            }
        } else if stale {
            let held: Vec<PrepareAction> = rec.held().cloned().collect();
            resume = Some(started(dra, &claim.uid, held, boot.clone()));
        } else {
            resume = Some(rec);
        }
    }
    let resuming = resume.is_some();
    let planned = match resume {
        Some(p) => p,
        None => {
            let actions = plan_prepare(&claim.allocation, &claim.uid, &opts.driver, dra.topology)
                .map_err(|e| e.context(format!("claim {}", claim.uid)))?;
            started(dra, &claim.uid, actions, boot)
        }
    };
    if opts.dry_run {
        return Ok(result_of(dra, planned, &claim.allocation, true));
    }
    writable(dra.recording)?;
    refuse_taken(
        &claim.uid,
        planned.held(),
        &held_by_others(store, &claim.uid)?,
    )?;
    store.write(&planned)?; // started: before the first host write
    if let Err(failed) = node::run_plan(dra.host, &planned, resuming) {
        if failed.undone {
            // Nothing held: forget the claim (a failure to do so leaves a started record,
            // which the next call finishes or undoes).
            let _ = store.remove(&claim.uid);
        }
        return Err(failed.error);
    }
    let done = PreparedClaim {
        phase: ClaimPhase::Completed,
        ..planned
    };
    store.write(&done)?;
    touched.extend(done.actions.iter().cloned());
    Ok(ClaimResult {
        touched,
        ..result_of(dra, done, &claim.allocation, false)
    })
}

/// Undoes what prepare recorded for claim `uid` on `host` (`force`: even while a VM holds a
/// device open) and forgets the record. A claim not recorded is no error: the kubelet retries.
/// Without `force`, every device is checked first: one a VM holds refuses the whole call, with
/// nothing changed. A started record (a prepare killed midway) is undone the same way (each
/// undo a no-op for a device never made); a record of an earlier boot is forgotten, removing
/// nothing (its devices went with the reboot; a device of that name now is not the claim's).
/// A device another claim's record also names is left to that claim.
///
/// # Errors
/// An invalid UID or unreadable record; a recording as the root; a device a VM holds (nothing
/// changed); every undo that failed (the others are still undone; the record is kept so a
/// retry can finish).
pub fn unprepare_claim(
    host: &dyn Host,
    recording: bool,
    store: &ClaimStore,
    uid: &str,
    force: bool,
) -> Result<Unprepared> {
    let Some(claim) = store.read(uid)? else {
        return Ok(Unprepared {
            claim_uid: uid.to_owned(),
            removed: vec![],
            touched: vec![],
        });
    };
    writable(recording)?;
    if rebooted(&claim, node::boot_id(host).as_deref()) {
        store.remove(uid)?;
        return Ok(Unprepared {
            claim_uid: uid.to_owned(),
            removed: vec![],
            touched: vec![],
        });
    }
    let others = held_by_others(store, uid)?;
    let mine: Vec<PrepareAction> = claim
        .actions
        .iter()
        .filter(|a| !others.contains_key(&node::identity(a)))
        .cloned()
        .collect();
    if !force {
        node::refuse_held(host, uid, &mine)?;
    }
    let present: Vec<String> = match claim.phase {
        ClaimPhase::Completed => mine.iter().map(node::identity).collect(),
        ClaimPhase::Started => mine
            .iter()
            .filter(|a| node::in_place(host, a))
            .map(node::identity)
            .collect(),
    };
    let mine = PreparedClaim {
        actions: mine,
        ..claim
    };
    node::unprepare(host, &mine, force)?;
    store.remove(uid)?;
    Ok(Unprepared {
        claim_uid: uid.to_owned(),
        removed: present,
        touched: mine.actions,
    })
}
