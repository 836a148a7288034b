//! A DRA claim as the node side prepares it, and what a prepare answers: the claim ([`Claim`]:
//! UID, namespace, name, its allocation), the node it is prepared on ([`DraNode`]), and per
//! request the device given ([`PreparedDevice`]: pool, device name, PCI address, IOMMU group
//! and its vfio nodes, mdev UUID), which the CDI spec and KubeVirt's metadata are rendered from.
//! The prepare and unprepare themselves are the one writer's (`gpu_node::dra`).

use gpu_core::{MdevUuid, NodeTopology, PciAddress};
use gpu_sysfs::Host;
use serde::Serialize;

use super::model::{DeviceAllocationResult, PrepareInput};
use super::node::PrepareAnswer;
use super::prepare::{PrepareAction, PreparedClaim};
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
