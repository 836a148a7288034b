//! DRA prepare and unprepare as one call each, the same for the kubelet plugin and for
//! `gpuslice dra prepare|unprepare`.
//!
//! [`prepare`] checks the claim ([`check_claim`]: the UID named, allocated, a device of this
//! driver, opaque parameters read with one set of rules), plans it onto the node (the pure
//! planner, [`gpu_integrations::dra::prepare::plan_prepare`], which also refuses another node's
//! pool and unknown devices), records the plan in the claim store before the first write,
//! makes the devices through the actuation layer, records the outcome, and writes the claim's
//! CDI spec and KubeVirt device metadata ([`CdiLayout::write`]). When a device write fails,
//! what the call made is undone; when the CDI files cannot be written, the whole prepare is
//! undone. A claim prepared before is answered from its record, with no write. [`unprepare`]
//! undoes what the record says and removes the CDI files.
//!
//! Both change the host: call them under the host-wide lock ([`crate::node::lock_host`], the
//! `run/gpuslice/vgpu.lock` that layouts and the agent take), once per claim. The agent takes
//! it inside its writer; the CLI takes it around the call.

pub mod check;
pub mod claim;
pub mod error;
pub mod host;
pub mod once;

use std::path::{Path, PathBuf};

use gpu_integrations::dra::ClaimStore;
use gpu_integrations::dra::cdi::CdiLayout;
use gpu_integrations::dra::model::DeviceResult;
use gpu_sysfs::Host;
use serde::Serialize;
use serde_json::Value;

pub use check::{Checked, ClaimId, OPAQUE_FIELDS, OPAQUE_KIND, check_claim};
pub use claim::{prepare_claim, unprepare_claim};
pub use error::{DraError, as_classified};
pub use gpu_integrations::dra::{
    Claim, ClaimResult, DraNode, PrepareOptions, PreparedDevice, Unprepared,
};

/// What a prepare or unprepare works with besides the node: the driver, the claim store, and
/// where the CDI spec and KubeVirt's metadata go (none: no CDI files).
#[derive(Debug, Clone, Copy)]
pub struct DraSetup<'a> {
    /// The driver name the devices were published under.
    pub driver: &'a str,
    /// The node's claim store.
    pub store: &'a ClaimStore,
    /// The CDI spec and metadata directories, when the claim gets CDI files.
    pub cdi: Option<&'a CdiLayout>,
    /// Check and plan only: nothing is written, not even the record.
    pub dry_run: bool,
}

/// A device given to a claim, as the kubelet's answer lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct GivenDevice {
    /// The requests it answers.
    pub request_names: Vec<String>,
    /// Its pool.
    pub pool: String,
    /// Its published name.
    pub device: String,
    /// The CDI devices the container runtime adds (none without CDI files).
    pub cdi_device_ids: Vec<String>,
    /// The share of a multi-allocatable device, when the allocation names one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub share_id: Option<String>,
}

/// What a prepare did for one claim.
#[derive(Debug, Clone)]
pub struct PrepareAnswer {
    /// The library's answer: the record, the devices, the hand-off, what the host changed.
    pub result: ClaimResult,
    /// The devices as the kubelet lists them, with their CDI device IDs.
    pub given: Vec<GivenDevice>,
    /// The CDI spec written (or found already written), when CDI files were asked for.
    pub cdi_spec: Option<PathBuf>,
}

/// The claim store of `host`: `state_dir` as given, else the default one inside the host's
/// root (for a sandbox, under its host tree: where the agent keeps it too).
///
/// # Errors
/// [`DraError::NoRoot`] without `state_dir` on a host with no root directory; a `state_dir`
/// that names no directory.
pub fn claim_store(host: &dyn Host, state_dir: Option<&Path>) -> Result<ClaimStore, DraError> {
    let root = match state_dir {
        Some(_) => Path::new("."),
        None => host.root_dir().ok_or(DraError::NoRoot)?,
    };
    Ok(ClaimStore::open(root, state_dir)?)
}

/// Prepares the claim `id` from its document `doc` on `node`: checks it ([`check_claim`]),
/// then [`prepare_checked`]. Call under the host lock ([`crate::node::lock_host`]).
///
/// # Errors
/// See [`check_claim`] and [`prepare_checked`].
pub fn prepare(
    node: &DraNode<'_>,
    doc: &Value,
    id: &ClaimId,
    setup: &DraSetup<'_>,
) -> Result<PrepareAnswer, DraError> {
    let checked = check_claim(doc, id, setup.driver)?;
    prepare_checked(node, &checked, setup)
}

/// Prepares a checked claim on `node`: plans, records the plan, makes the devices, records
/// the outcome ([`prepare_claim`]), then writes its CDI spec and metadata when `setup` has a
/// CDI layout. When the CDI files cannot be written, what this call made is undone.
///
/// # Errors
/// [`DraError::Unnamed`] (CDI files for a claim the input does not name) before anything is
/// planned; [`DraError::Claim`] for the planner's refusals (another node's pool, an unknown
/// device or profile, no free parent), the store's and the host's; [`DraError::Cdi`] when the
/// CDI files could not be written (the prepare undone, or what the undo failed on).
pub fn prepare_checked(
    node: &DraNode<'_>,
    checked: &Checked,
    setup: &DraSetup<'_>,
) -> Result<PrepareAnswer, DraError> {
    let uid = &checked.claim.uid;
    let cdi = match (setup.cdi, &checked.reference) {
        (Some(_), None) => return Err(DraError::Unnamed { uid: uid.clone() }),
        (Some(layout), Some(reference)) if !setup.dry_run => Some((layout, reference)),
        _ => None,
    };
    let opts = PrepareOptions {
        driver: setup.driver.to_owned(),
        dry_run: setup.dry_run,
    };
    let made = prepare_claim(node, setup.store, &checked.claim, &opts)?;
    let (ids, spec) = match cdi {
        None => (vec![Vec::new(); made.devices.len()], None),
        Some((layout, reference)) => match layout.write(reference, &made.devices) {
            Ok(w) => (w.device_ids, Some(w.spec)),
            Err(source) => {
                let undo = if made.unchanged {
                    String::new()
                } else {
                    match unprepare_claim(node.host, node.recording, setup.store, uid, false) {
                        Ok(_) => "; the prepare was undone".to_owned(),
                        Err(u) => format!("; undoing the prepare also failed: {u}"),
                    }
                };
                return Err(DraError::Cdi {
                    uid: uid.clone(),
                    source: Box::new(source),
                    undo,
                });
            }
        },
    };
    let given = given(
        &made.devices,
        ids,
        &checked.claim.allocation.results,
        setup.driver,
    );
    Ok(PrepareAnswer {
        result: made,
        given,
        cdi_spec: spec,
    })
}

/// Unprepares claim `uid` on `host` (`force`: even while a VM holds a device): undoes what its
/// record says ([`unprepare_claim`]), then removes its CDI spec and metadata when `setup` has
/// a CDI layout. A claim never prepared is no error. Call under the host lock ([`crate::node::lock_host`]).
///
/// # Errors
/// [`DraError::Claim`]: an invalid UID, a recording as the root, a device a VM holds (nothing
/// changed), an undo that failed (the record kept, so a retry finishes it);
/// [`DraError::Cdi`] when the CDI files cannot be removed.
pub fn unprepare(
    host: &dyn Host,
    recording: bool,
    uid: &str,
    force: bool,
    setup: &DraSetup<'_>,
) -> Result<Unprepared, DraError> {
    let done = unprepare_claim(host, recording, setup.store, uid, force)?;
    if let Some(layout) = setup.cdi {
        layout.remove(uid).map_err(|source| DraError::Cdi {
            uid: uid.to_owned(),
            source: Box::new(source),
            undo: String::new(),
        })?;
    }
    Ok(done)
}

/// [`prepare`] on an NVSwitch node: the partition whose members are exactly the claim's whole
/// GPUs is activated (through the Fabric Manager `fabric` names) before the claim's devices are
/// made, as NVIDIA's DRA driver orders it, and deactivated again when they cannot be made. A
/// claim whose GPUs are no partition is refused by its plan before any write.
///
/// # Errors
/// As [`prepare`]; [`DraError::Fabric`] when the partition cannot be activated.
pub fn prepare_with_fabric(
    node: &DraNode<'_>,
    doc: &Value,
    id: &ClaimId,
    setup: &DraSetup<'_>,
    fabric: &gpu_health::fabric::FabricSource,
) -> Result<PrepareAnswer, DraError> {
    let checked = check_claim(doc, id, setup.driver)?;
    prepare_checked_with_fabric(node, &checked, setup, fabric)
}

/// [`prepare_checked`] with the claim's partition activated first (see
/// [`prepare_with_fabric`]).
///
/// # Errors
/// As [`prepare_with_fabric`].
pub fn prepare_checked_with_fabric(
    node: &DraNode<'_>,
    checked: &Checked,
    setup: &DraSetup<'_>,
    fabric: &gpu_health::fabric::FabricSource,
) -> Result<PrepareAnswer, DraError> {
    let fabric_err = |source| DraError::Fabric {
        uid: checked.claim.uid.clone(),
        source: Box::new(source),
    };
    let actions = if setup.dry_run {
        vec![]
    } else {
        planned_actions(node.topology, checked, setup.driver)
    };
    let gpus = bound_gpus(&actions);
    // Fabric Manager in vGPU mode: vGPUs on several GPUs are checked against NVIDIA's NVLink
    // rules before any write, and their partition activated with their VFs after.
    let with_vfs =
        crate::fabric::vgpu_claim_partition(node.topology, &actions).map_err(fabric_err)?;
    let activated = crate::fabric::activate_for_claim(fabric, node.host, node.topology, &gpus)
        .map_err(fabric_err)?;
    // The guest's needs on an NVSwitch node go into the KubeVirt device metadata.
    let guest = gpu_integrations::dra::partition::guest_attributes(node.topology, &gpus);
    let answer = if guest.is_empty() {
        prepare_checked(node, checked, setup)
    } else {
        let mut checked = checked.clone();
        if let Some(r) = checked.reference.as_mut() {
            r.guest = guest;
        }
        prepare_checked(node, &checked, setup)
    };
    if let (Ok(_), Some((id, vfs))) = (&answer, &with_vfs) {
        let done =
            crate::fabric::activate_vfs_for_claim(fabric, node.host, node.topology, *id, vfs);
        if let Err(e) = done {
            let _ = unprepare_claim(
                node.host,
                node.recording,
                setup.store,
                &checked.claim.uid,
                false,
            );
            return Err(fabric_err(e));
        }
    }
    if answer.is_err() && activated.is_some() {
        let mut after = node.topology.clone();
        gpu_health::fabric::fabric_at(fabric, node.host, &mut after);
        let _ = crate::fabric::deactivate_for_claim(fabric, node.host, &after, &gpus);
    }
    answer
}

/// [`unprepare`] on an NVSwitch node: after the claim's devices are undone, the partition its
/// whole GPUs were is deactivated.
///
/// # Errors
/// As [`unprepare`]; [`DraError::Fabric`] when the partition cannot be deactivated.
pub fn unprepare_with_fabric(
    host: &dyn Host,
    recording: bool,
    uid: &str,
    force: bool,
    setup: &DraSetup<'_>,
    topology: &gpu_core::NodeTopology,
    fabric: &gpu_health::fabric::FabricSource,
) -> Result<Unprepared, DraError> {
    let gpus: Vec<gpu_core::PciAddress> = setup
        .store
        .read(uid)
        .ok()
        .flatten()
        .map(|rec| {
            let mut gpus = bound_gpus(&rec.actions);
            gpus.extend(crate::fabric::claim_vf_gpus(topology, &rec.actions));
            gpus
        })
        .unwrap_or_default();
    let done = unprepare(host, recording, uid, force, setup)?;
    crate::fabric::deactivate_for_claim(fabric, host, topology, &gpus).map_err(|source| {
        DraError::Fabric {
            uid: uid.to_owned(),
            source: Box::new(source),
        }
    })?;
    Ok(done)
}

/// What a claim's prepare plans (nothing where it cannot be planned: the prepare itself then
/// answers why).
fn planned_actions(
    topology: &gpu_core::NodeTopology,
    checked: &Checked,
    driver: &str,
) -> Vec<gpu_integrations::dra::prepare::PrepareAction> {
    gpu_integrations::dra::prepare::plan_prepare(
        &checked.claim.allocation,
        &checked.claim.uid,
        driver,
        topology,
    )
    .unwrap_or_default()
}

fn bound_gpus(
    actions: &[gpu_integrations::dra::prepare::PrepareAction],
) -> Vec<gpu_core::PciAddress> {
    actions
        .iter()
        .filter_map(|a| match a {
            gpu_integrations::dra::prepare::PrepareAction::BindGpu { address, .. } => {
                Some(*address)
            }
            _ => None,
        })
        .collect()
}

/// Pairs each prepared device with its allocation result (in order, for several shares of one
/// device) and lists it as the kubelet's answer does.
fn given(
    devices: &[PreparedDevice],
    ids: Vec<Vec<String>>,
    results: &[DeviceResult],
    driver: &str,
) -> Vec<GivenDevice> {
    let mut used = vec![false; results.len()];
    devices
        .iter()
        .zip(ids)
        .map(|(d, cdi_device_ids)| {
            let found = results.iter().enumerate().position(|(i, r)| {
                !used[i] && r.driver == driver && r.request == d.request && r.device == d.device
            });
            let share_id = found.and_then(|i| {
                used[i] = true;
                results[i].share_id.clone()
            });
            GivenDevice {
                request_names: vec![d.request.clone()],
                pool: d.pool.clone(),
                device: d.device.clone(),
                cdi_device_ids,
                share_id,
            }
        })
        .collect()
}
