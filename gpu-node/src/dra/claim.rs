//! The node side of DRA as one call per claim: [`prepare_claim`] and [`unprepare_claim`], over a
//! node opened once ([`DraNode`]) and the node's claim store ([`ClaimStore`]); the kubelet
//! plugin and `gpuslice dra prepare|unprepare` reach them through [`super::prepare`] and
//! [`super::unprepare`], which add the claim's checks and its CDI files.
//!
//! A claim (UID, namespace, name, its allocation results, opaque parameters) goes in; per
//! request the pool, the device name and the facts a CDI spec and KubeVirt's device metadata need
//! come out (PCI address, IOMMU group and its vfio device nodes, mdev UUID), or a classified error
//! ([`IntegrationError::kind`]) with nothing written.
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

use gpu_integrations::dra::model::DeviceAllocationResult;
use gpu_integrations::dra::node::{PrepareAnswer, identity};
use gpu_integrations::dra::prepare::{ClaimPhase, PrepareAction, PreparedClaim, plan_prepare};
use gpu_integrations::dra::{
    Claim, ClaimResult, ClaimStore, DraNode, PrepareOptions, PreparedDevice, Unprepared,
};
use gpu_integrations::{IntegrationError, Result};
use gpu_sysfs::Host;

use super::host;

/// Refuses a change through a recording (what is written to its replayed tree is thrown away).
fn writable(recording: bool) -> Result<()> {
    if recording {
        return Err(IntegrationError::Invalid {
            what: "--root".to_owned(),
            why: "prepare and unprepare change the host: --root must be a directory, not a \
                  recording"
                .to_owned(),
        });
    }
    Ok(())
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

/// The devices other claims' records hold (by [`identity`]), with the claim holding
/// each. Records of an earlier boot count: their claims get the same devices back.
fn held_by_others(store: &ClaimStore, uid: &str) -> Result<BTreeMap<String, String>> {
    let mut out = BTreeMap::new();
    for other in store.read_all()? {
        if other.claim_uid == uid {
            continue;
        }
        for a in other.held() {
            out.insert(identity(a), other.claim_uid.clone());
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
        let id = identity(a);
        if let Some(holder) = others.get(&id) {
            let (request, _) = a.request_and_device();
            return Err(IntegrationError::Refused {
                what: format!("request {request}"),
                why: format!(
                    "claim {uid}: request {request}: device {id} is held by claim {holder}; \
                     nothing was changed"
                ),
            });
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
    let (found, actions) = held.into_iter().partition(|a| host::in_place(dra.host, a));
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
        .filter(|a| !others.contains_key(&identity(a)))
        .cloned()
        .collect();
    host::refuse_held(host, &recorded.claim_uid, &mine)?;
    let claim = PreparedClaim {
        actions: mine,
        ..recorded.clone()
    };
    host::unprepare(host, &claim, false)?;
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
    let boot = host::boot_id(dra.host);
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
    if let Err(failed) = host::run_plan(dra.host, &planned, resuming) {
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
    if rebooted(&claim, host::boot_id(host).as_deref()) {
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
        .filter(|a| !others.contains_key(&identity(a)))
        .cloned()
        .collect();
    if !force {
        host::refuse_held(host, uid, &mine)?;
    }
    let present: Vec<String> = match claim.phase {
        ClaimPhase::Completed => mine.iter().map(identity).collect(),
        ClaimPhase::Started => mine
            .iter()
            .filter(|a| host::in_place(host, a))
            .map(identity)
            .collect(),
    };
    let mine = PreparedClaim {
        actions: mine,
        ..claim
    };
    host::unprepare(host, &mine, force)?;
    store.remove(uid)?;
    Ok(Unprepared {
        claim_uid: uid.to_owned(),
        removed: present,
        touched: mine.actions,
    })
}
