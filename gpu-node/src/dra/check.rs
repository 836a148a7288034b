//! The claim's checks, one set for every front-end: the UID is the one named, the claim is
//! allocated, it holds a device of this driver, and the opaque parameters for this driver are
//! its `VgpuConfig`. The pool and the devices are checked by the planner
//! ([`gpu_integrations::dra::prepare::plan_prepare`]) against the node.

use gpu_integrations::dra::Claim;
use gpu_integrations::dra::metadata::{ClaimRef, POD_CLAIM_NAME_ANNOTATION};
use gpu_integrations::dra::model::PrepareInput;
use serde_json::Value;

use super::error::DraError;

/// A claim as it is named: by the kubelet (namespace, name, UID), or by the document a person
/// gave (`gpuslice dra prepare --claim`, where the name may be missing).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimId {
    /// Its namespace (empty when not known).
    pub namespace: String,
    /// Its UID.
    pub uid: String,
    /// Its name (empty when not known).
    pub name: String,
}

impl ClaimId {
    /// The claim `doc` names, with `uid` when given (else its `metadata.uid`).
    ///
    /// # Errors
    /// [`DraError::NoUid`] when neither names a UID.
    pub fn of_document(doc: &Value, uid: Option<&str>) -> Result<Self, DraError> {
        let meta = |key: &str| {
            doc.pointer(&format!("/metadata/{key}"))
                .and_then(Value::as_str)
                .map(str::to_owned)
        };
        let Some(uid) = uid.map(str::to_owned).or_else(|| meta("uid")) else {
            return Err(DraError::NoUid);
        };
        Ok(ClaimId {
            namespace: meta("namespace").unwrap_or_default(),
            uid,
            name: meta("name").unwrap_or_default(),
        })
    }
}

impl std::fmt::Display for ClaimId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.name.is_empty() {
            write!(f, "claim {}", self.uid)
        } else {
            write!(f, "resourceclaim {}/{}", self.namespace, self.name)
        }
    }
}

/// A claim document checked against the claim named.
#[derive(Debug, Clone)]
pub struct Checked {
    /// The claim as the library prepares it.
    pub claim: Claim,
    /// What the CDI spec and KubeVirt's metadata name; `None` when the document names no
    /// claim (a bare AllocationResult).
    pub reference: Option<ClaimRef>,
}

/// The opaque parameter fields this driver reads (`kind: VgpuConfig`).
pub const OPAQUE_FIELDS: [&str; 3] = ["apiVersion", "kind", "profile"];
/// The one kind of opaque configuration this driver reads.
pub const OPAQUE_KIND: &str = "VgpuConfig";

/// Checks the ResourceClaim `doc` (as the API server returns it, or a bare AllocationResult)
/// for the claim `id` and `driver`.
///
/// # Errors
/// [`DraError::UidChanged`] (the document holds another UID), [`DraError::NotAClaim`],
/// [`DraError::NotAllocated`], [`DraError::NoDeviceOfDriver`], [`DraError::BadOpaque`]
/// (parameters of `driver` that are not its `VgpuConfig`).
pub fn check_claim(doc: &Value, id: &ClaimId, driver: &str) -> Result<Checked, DraError> {
    let claim = id.to_string();
    // A document without a UID (a bare AllocationResult) is the claim named.
    if let Some(uid) = doc.pointer("/metadata/uid").and_then(Value::as_str) {
        if uid != id.uid {
            return Err(DraError::UidChanged {
                claim,
                found: uid.to_owned(),
                named: id.uid.clone(),
            });
        }
    }
    let input: PrepareInput =
        serde_json::from_value(doc.clone()).map_err(|source| DraError::NotAClaim {
            claim: claim.clone(),
            source,
        })?;
    let Ok(devices) = input.allocation() else {
        return Err(DraError::NotAllocated { claim });
    };
    if !devices.results.iter().any(|r| r.driver == driver) {
        return Err(DraError::NoDeviceOfDriver {
            claim,
            driver: driver.to_owned(),
        });
    }
    for c in &devices.config {
        let Some(o) = c.opaque.as_ref().filter(|o| o.driver == driver) else {
            continue;
        };
        check_opaque(&o.parameters).map_err(|why| DraError::BadOpaque {
            claim: claim.clone(),
            why,
        })?;
    }
    let pod_claim_name = doc
        .pointer("/metadata/annotations")
        .and_then(|a| a.get(POD_CLAIM_NAME_ANNOTATION))
        .and_then(Value::as_str)
        .map(str::to_owned);
    let named = !id.name.is_empty() && !id.namespace.is_empty();
    Ok(Checked {
        claim: Claim {
            uid: id.uid.clone(),
            namespace: (!id.namespace.is_empty()).then(|| id.namespace.clone()),
            name: (!id.name.is_empty()).then(|| id.name.clone()),
            allocation: devices.clone(),
        },
        reference: named.then(|| ClaimRef {
            name: id.name.clone(),
            namespace: id.namespace.clone(),
            uid: id.uid.clone(),
            pod_claim_name,
            guest: serde_json::Map::new(),
        }),
    })
}

/// What is wrong with opaque `parameters` for this driver, if anything.
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
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
        assert!(e.to_string().contains("UID changed"), "{e}");
        assert_eq!(e.kind(), gpu_core::ErrorKind::InvalidArgument);
    }

    #[test]
    fn an_unallocated_claim_or_one_without_this_driver_is_refused() {
        let e = check_claim(&doc("u-1", None), &id(), "gpu.gpuslice.dev").expect_err("alloc");
        assert!(e.to_string().contains("not allocated"), "{e}");
        assert!(e.to_string().contains("holds no allocation"), "{e}");
        let other = doc("u-1", Some(allocation("gpu.nvidia.com", json!({}))));
        let e = check_claim(&other, &id(), "gpu.gpuslice.dev").expect_err("driver");
        assert!(
            e.to_string()
                .contains("no device of driver gpu.gpuslice.dev"),
            "{e}"
        );
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
            let e = check_claim(&d, &id(), "gpu.gpuslice.dev")
                .expect_err("opaque")
                .to_string();
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
        assert_eq!(c.reference.expect("named").pod_claim_name, None);
    }

    #[test]
    fn a_bare_allocation_result_is_the_claim_named_and_names_no_claim() {
        let bare = allocation("gpu.gpuslice.dev", json!({"profile": "A2-4Q"}));
        let id = ClaimId::of_document(&bare, Some("u-9")).expect("uid given");
        assert_eq!(id.to_string(), "claim u-9");
        let c = check_claim(&bare, &id, "gpu.gpuslice.dev").expect("valid");
        assert_eq!(c.claim.uid, "u-9");
        assert!(c.reference.is_none());
        assert!(matches!(
            ClaimId::of_document(&bare, None),
            Err(DraError::NoUid)
        ));
    }
}
