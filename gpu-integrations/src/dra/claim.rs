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

use gpu_core::{MdevUuid, NodeTopology, PciAddress};
use gpu_sysfs::Host;
use serde::Serialize;

use super::model::{DeviceAllocationResult, PrepareInput};
use super::node::{self, PrepareAnswer};
use super::prepare::{PrepareAction, PreparedClaim, plan_prepare};
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
}

/// What an unprepare did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Unprepared {
    /// The claim's UID.
    pub claim_uid: String,
    /// The devices removed or released (none for a claim that was not prepared).
    pub removed: Vec<String>,
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
    }
}

/// Prepares `claim` on `dra`: answers from the record when it was prepared before; otherwise
/// plans every result of `opts.driver` (checking all of them before any write), records the
/// store's directory, makes the devices through the actuation layer (undoing this call's changes
/// when one fails) and records what it changed.
///
/// # Errors
/// The planning's refusals (another node's pool, an unknown device or profile, no free parent,
/// two sizes on one GPU) with nothing written; a recording as the root; the store's errors; the
/// actuation layer's refusal, prefixed `claim <uid>: `, with this call's changes undone.
pub fn prepare_claim(
    dra: &DraNode<'_>,
    store: &ClaimStore,
    claim: &Claim,
    opts: &PrepareOptions,
) -> Result<ClaimResult> {
    if let Some(recorded) = store.read(&claim.uid)? {
        return Ok(result_of(dra, recorded, &claim.allocation, true));
    }
    let actions = plan_prepare(&claim.allocation, &claim.uid, &opts.driver, dra.topology)
        .map_err(|e| e.context(format!("claim {}", claim.uid)))?;
    let planned = PreparedClaim {
        claim_uid: claim.uid.clone(),
        node: dra.topology.node.clone(),
        actions,
        found: vec![],
    };
    if opts.dry_run {
        return Ok(result_of(dra, planned, &claim.allocation, true));
    }
    writable(dra.recording)?;
    store.create()?; // before any change, so that every change can be recorded
    let made = node::prepare(dra.host, planned)?;
    store.write(&made)?;
    Ok(result_of(dra, made, &claim.allocation, false))
}

/// Undoes what prepare recorded for claim `uid` on `host` (`force`: even while a VM holds a
/// device open) and forgets the record. A claim not recorded is no error: the kubelet retries.
///
/// # Errors
/// An invalid UID or unreadable record; a recording as the root; every undo that failed (the
/// others are still undone; the record is kept so a retry can finish).
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
        });
    };
    writable(recording)?;
    let removed = node::unprepare(host, &claim, force)?;
    store.remove(uid)?;
    Ok(Unprepared {
        claim_uid: uid.to_owned(),
        removed,
    })
}
