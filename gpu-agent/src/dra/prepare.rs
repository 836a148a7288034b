//! Prepare and unprepare, the same for every version of the kubelet's service: read the claim,
//! check it, make its devices as one of the agent's writes, write its CDI spec.
//!
//! Every claim is answered on its own: a claim that cannot be read, whose UID is not the one the
//! kubelet named (it was deleted and made again), that is not allocated, holds no device of
//! this driver, names another node's pool or an unknown device, carries opaque parameters this
//! driver does not read, or whose device is in use, gets an error naming that, and nothing on
//! the host changes for it. A claim that was prepared before is answered from its record, with
//! no write.

use std::sync::Arc;

use gpu_integrations::dra::cdi::CdiLayout;
use gpu_integrations::dra::metadata::{ClaimRef, POD_CLAIM_NAME_ANNOTATION};
use gpu_integrations::dra::model::{DeviceResult, PrepareInput};
use gpu_integrations::dra::prepare::PrepareAction;
use gpu_integrations::dra::{
    self, ClaimStore, DraNode, PrepareOptions, PreparedDevice, prepare_claim, unprepare_claim,
};
use serde_json::Value;

use super::DraPlugin;
use crate::agent::Agent;
use crate::agent::writes::Touched;
use crate::claims::ClaimFetchError;

/// A claim as the kubelet names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimId {
    /// Its namespace.
    pub namespace: String,
    /// Its UID.
    pub uid: String,
    /// Its name.
    pub name: String,
}

impl std::fmt::Display for ClaimId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "resourceclaim {}/{}", self.namespace, self.name)
    }
}

/// A device given to a claim, as the kubelet's answer lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GivenDevice {
    /// The requests it answers.
    pub request_names: Vec<String>,
    /// Its pool.
    pub pool: String,
    /// Its published name.
    pub device: String,
    /// The CDI devices the container runtime adds.
    pub cdi_device_ids: Vec<String>,
    /// The share of a multi-allocatable device, when the allocation names one.
    pub share_id: Option<String>,
}

/// The opaque parameter fields this driver reads (`kind: VgpuConfig`).
const OPAQUE_FIELDS: [&str; 3] = ["apiVersion", "kind", "profile"];
/// The one kind of opaque configuration this driver reads.
const OPAQUE_KIND: &str = "VgpuConfig";

/// A claim document checked against what the kubelet asked for.
#[derive(Debug, Clone)]
pub struct Checked {
    /// The claim as the library prepares it.
    pub claim: dra::Claim,
    /// What the KubeVirt metadata names.
    pub reference: ClaimRef,
}

/// Checks the ResourceClaim `doc` (as the API server returns it) for the kubelet's `id`.
///
/// # Errors
/// A message naming what is wrong: another UID, not a ResourceClaim, not allocated, no device
/// of `driver`, opaque parameters of `driver` that are not its `VgpuConfig`.
pub fn check_claim(doc: &Value, id: &ClaimId, driver: &str) -> Result<Checked, String> {
    let uid = doc
        .pointer("/metadata/uid")
        .and_then(Value::as_str)
        .unwrap_or_default();
    if uid != id.uid {
        return Err(format!(
            "{id}: UID changed: the API server has {uid:?}, the kubelet asked for {:?} (the \
             claim was deleted and made again)",
            id.uid
        ));
    }
    let input: PrepareInput = serde_json::from_value(doc.clone())
        .map_err(|e| format!("{id}: not a ResourceClaim: {e}"))?;
    let Some(allocation) = input.status.as_ref().and_then(|s| s.allocation.as_ref()) else {
        return Err(format!("{id}: not allocated (no status.allocation)"));
    };
    let devices = &allocation.devices;
    if !devices.results.iter().any(|r| r.driver == driver) {
        return Err(format!(
            "{id}: the allocation holds no device of driver {driver}"
        ));
    }
    for c in &devices.config {
        let Some(o) = c.opaque.as_ref().filter(|o| o.driver == driver) else {
            continue;
        };
        check_opaque(&o.parameters).map_err(|e| format!("{id}: bad opaque parameters: {e}"))?;
    }
    let pod_claim_name = doc
        .pointer("/metadata/annotations")
        .and_then(|a| a.get(POD_CLAIM_NAME_ANNOTATION))
        .and_then(Value::as_str)
        .map(str::to_owned);
    Ok(Checked {
        claim: dra::Claim {
            uid: id.uid.clone(),
            namespace: Some(id.namespace.clone()),
            name: Some(id.name.clone()),
            allocation: devices.clone(),
        },
        reference: ClaimRef {
            name: id.name.clone(),
            namespace: id.namespace.clone(),
            uid: id.uid.clone(),
            pod_claim_name,
        },
    })
}

fn check_opaque(parameters: &Value) -> Result<(), String> {
    let Some(fields) = parameters.as_object() else {
        return Err(format!("expected an object, got {parameters}"));
    };
    if let Some(unknown) = fields.keys().find(|k| !OPAQUE_FIELDS.contains(&k.as_str())) {
        return Err(format!(
            "unknown field {unknown:?} (this driver reads {})",
            OPAQUE_FIELDS.join(", ")
        ));
    }
    match fields.get("kind") {
        None => {}
        Some(Value::String(k)) if k == OPAQUE_KIND => {}
        Some(other) => return Err(format!("kind must be {OPAQUE_KIND:?}, got {other}")),
    }
    match fields.get("profile") {
        None | Some(Value::String(_)) => Ok(()),
        Some(other) => Err(format!("profile must be a string, got {other}")),
    }
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

/// The node's claim store, in the agent's root.
///
/// # Errors
/// A host without a root directory.
pub(super) fn store_of(agent: &Agent) -> Result<ClaimStore, String> {
    let root = agent
        .host()
        .root_dir()
        .ok_or_else(|| "the host has no root directory".to_owned())?;
    ClaimStore::open(root, None).map_err(|e| e.to_string())
}

/// What discovery reads again after a prepare or unprepare that changed `actions`.
fn touched(actions: &[PrepareAction]) -> Touched {
    if actions.is_empty() {
        Touched::Nothing
    } else {
        Touched::Devices(actions.iter().map(dra::node::change_of).collect())
    }
}

/// Prepares one checked claim on the host, as the writer: the library's prepare, planned on
/// the agent's snapshot, then the CDI spec; when the spec cannot be written, what this call
/// made is undone. Also says what it changed on the host, so that only that is read again.
fn prepare_on_host(
    agent: &Agent,
    store: &ClaimStore,
    cdi: &CdiLayout,
    driver: &str,
    checked: &Checked,
) -> (Result<Vec<GivenDevice>, String>, Touched) {
    let snapshot = agent.snapshot();
    let node = DraNode {
        host: agent.host(),
        topology: &snapshot.topology,
        recording: false,
    };
    let opts = PrepareOptions {
        driver: driver.to_owned(),
        dry_run: false,
    };
    let made = match prepare_claim(&node, store, &checked.claim, &opts) {
        Ok(made) => made,
        // A refusal changed nothing; a failed write was undone, or not all of it: read all.
        Err(e) => return (Err(e.to_string()), Touched::Host),
    };
    match cdi.write(&checked.reference, &made.devices) {
        Ok(w) => (
            Ok(given(
                &made.devices,
                w.device_ids,
                &checked.claim.allocation.results,
                driver,
            )),
            touched(&made.touched),
        ),
        Err(e) => {
            let mut why = format!("claim {}: {e}", checked.claim.uid);
            if !made.unchanged {
                if let Err(u) =
                    unprepare_claim(agent.host(), false, store, &checked.claim.uid, false)
                {
                    why.push_str(&format!("; undoing the prepare also failed: {u}"));
                } else {
                    why.push_str("; the prepare was undone");
                }
            }
            (Err(why), Touched::Host)
        }
    }
}

impl DraPlugin {
    /// Prepares the claim `id`: reads it, checks it, and makes its devices as one write.
    ///
    /// # Errors
    /// A message for the kubelet's per-claim `error` (see the module's list).
    pub async fn prepare(self: &Arc<Self>, id: &ClaimId) -> Result<Vec<GivenDevice>, String> {
        let out = self.prepare_inner(id).await;
        let s = self.stats();
        tally(
            &out,
            &s.prepared,
            &s.prepare_failed,
            "NodePrepareResources",
            id,
        );
        out
    }

    async fn prepare_inner(self: &Arc<Self>, id: &ClaimId) -> Result<Vec<GivenDevice>, String> {
        let doc = self
            .claims
            .get(&id.namespace, &id.name)
            .await
            .map_err(|e| match e {
                ClaimFetchError::NotFound { .. } => format!("{id}: not found"),
                other => format!("{id}: {other}"),
            })?;
        let checked = check_claim(&doc, id, &self.config.driver)?;
        let me = Arc::clone(self);
        self.agent
            .write_touching(true, move |agent| {
                let (out, touched) =
                    prepare_on_host(agent, &me.store, &me.cdi, &me.config.driver, &checked);
                (Ok(out), touched)
            })
            .await
            .map_err(|e| e.message)?
    }

    /// Unprepares claim `uid`: undoes what its prepare did and removes its CDI spec and
    /// metadata. A claim never prepared is no error.
    ///
    /// # Errors
    /// A message for the kubelet's per-claim `error`: the undo failed (the record is kept, so
    /// the kubelet's retry finishes it).
    pub async fn unprepare(self: &Arc<Self>, id: &ClaimId) -> Result<(), String> {
        let me = Arc::clone(self);
        let uid = id.uid.clone();
        let out = self
            .agent
            .write_touching(true, move |agent| {
                match unprepare_claim(agent.host(), false, &me.store, &uid, false) {
                    Ok(undone) => {
                        let removed = me.cdi.remove(&uid).map_err(|e| format!("claim {uid}: {e}"));
                        (Ok(removed), touched(&undone.touched))
                    }
                    // Refused with nothing changed, or some undo failed: read all.
                    Err(e) => (Ok(Err(e.to_string())), Touched::Host),
                }
            })
            .await
            .map_err(|e| e.message)
            .and_then(|r| r);
        let s = self.stats();
        tally(
            &out,
            &s.unprepared,
            &s.unprepare_failed,
            "NodeUnprepareResources",
            id,
        );
        out
    }
}

/// Counts a claim's result (`ok` or `failed`) and logs a failure, naming the call and the claim.
fn tally<T>(
    out: &Result<T, String>,
    ok: &std::sync::atomic::AtomicU64,
    failed: &std::sync::atomic::AtomicU64,
    call: &str,
    id: &ClaimId,
) {
    DraPlugin::count(if out.is_ok() { ok } else { failed });
    if let Err(e) = out {
        crate::log!("gpuslice agent: {call} {id} ({}): {e}", id.uid);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn id() -> ClaimId {
        ClaimId {
            namespace: "default".into(),
            uid: "u-1".into(),
            name: "vm-gpu".into(),
        }
    }

    fn doc(uid: &str, allocation: Option<Value>) -> Value {
        let mut d = json!({
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": "vm-gpu", "namespace": "default", "uid": uid},
            "spec": {},
        });
        if let Some(a) = allocation {
            d["status"] = json!({ "allocation": a });
        }
        d
    }

    fn allocation(driver: &str, parameters: Value) -> Value {
        json!({"devices": {
            "results": [{"request": "gpu", "driver": driver, "pool": "node-a", "device": "gpu-0000-3b-00-0"}],
            "config": [{"source": "FromClaim", "opaque": {"driver": driver, "parameters": parameters}}],
        }})
    }

    #[test]
    fn a_claim_made_again_under_the_same_name_is_refused_as_uid_changed() {
        let e = check_claim(&doc("u-2", None), &id(), "gpu.gpuslice.dev").expect_err("uid");
        assert!(e.contains("UID changed"), "{e}");
    }

    #[test]
    fn an_unallocated_claim_or_one_without_this_driver_is_refused() {
        let e = check_claim(&doc("u-1", None), &id(), "gpu.gpuslice.dev").expect_err("alloc");
        assert!(e.contains("not allocated"), "{e}");
        let other = doc("u-1", Some(allocation("gpu.nvidia.com", json!({}))));
        let e = check_claim(&other, &id(), "gpu.gpuslice.dev").expect_err("driver");
        assert!(e.contains("no device of driver gpu.gpuslice.dev"), "{e}");
    }

    #[test]
    fn opaque_parameters_this_driver_does_not_read_are_refused() {
        for (p, why) in [
            (json!("A2-4Q"), "expected an object"),
            (
                json!({"profile": "A2-4Q", "sharing": "x"}),
                "unknown field \"sharing\"",
            ),
            (json!({"kind": "GpuConfig"}), "kind must be"),
            (json!({"profile": 4}), "profile must be a string"),
        ] {
            let d = doc("u-1", Some(allocation("gpu.gpuslice.dev", p)));
            let e = check_claim(&d, &id(), "gpu.gpuslice.dev").expect_err("opaque");
            assert!(
                e.contains("bad opaque parameters") && e.contains(why),
                "{e}"
            );
        }
        let d = doc(
            "u-1",
            Some(allocation(
                "gpu.gpuslice.dev",
                json!({"apiVersion": "gpu.gpuslice.dev/v1", "kind": "VgpuConfig", "profile": "A2-4Q"}),
            )),
        );
        let c = check_claim(&d, &id(), "gpu.gpuslice.dev").expect("valid");
        assert_eq!(c.claim.allocation.results.len(), 1);
        assert_eq!(c.reference.pod_claim_name, None);
    }
}
