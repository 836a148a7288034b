//! The pure part of publishing: the slices a node should have, and the writes that make what the
//! API server lists hold exactly those ([`plan`]). Nothing here talks to the server.

use std::collections::{BTreeMap, BTreeSet};

use gpu_core::{NodeTopology, PciAddress};
use gpu_integrations::dra::build::node_slices;
use gpu_integrations::dra::model::ResourceSlice;
use gpu_integrations::dra::{DEFAULT_DRIVER, DraOptions, K8sVersion};
use serde_json::{Value, json};

use super::server::NodeOwner;
use crate::kube::KubeError;

/// One pool as it should be: the node, the driver and the slices (their generation is set by
/// the plan).
#[derive(Debug, Clone)]
pub struct PoolTarget {
    /// The node (and pool) name.
    pub node: String,
    /// The driver name.
    pub driver: String,
    /// The wanted slices.
    pub slices: Vec<ResourceSlice>,
    /// The owner to name in `ownerReferences`; `None` only for a dry run.
    pub owner: Option<NodeOwner>,
}

/// What `gpuslice dra publish` and the agent pass to [`node_slices`] besides the topology.
#[derive(Debug, Clone)]
pub struct SliceOptions {
    /// The driver name.
    pub driver: String,
    /// `--size-for`: the profile an unlocked GPU offers under the one-size encoding.
    pub size_for: BTreeMap<PciAddress, String>,
    /// The mixed-size placements of GPUs in mixed-size mode, as NVML lists them: published with
    /// a counter per placement slot ([`DraOptions::mixed_placements`]).
    pub mixed_placements: BTreeMap<PciAddress, gpu_integrations::dra::GpuPlacements>,
}

impl Default for SliceOptions {
    fn default() -> Self {
        Self {
            driver: DEFAULT_DRIVER.to_owned(),
            size_for: BTreeMap::new(),
            mixed_placements: BTreeMap::new(),
        }
    }
}

/// The slices of `node` for `version`, with what the driver's own claims hold (`prepared`, from
/// the claim store) left in: the scheduler counts that through the claims.
///
/// # Errors
/// [`KubeError::Invalid`] when [`node_slices`] refuses the node (a bad name, a GPU that does not
/// fit a slice under the version's rules).
pub fn wanted_slices(
    node: &NodeTopology,
    version: K8sVersion,
    opts: &SliceOptions,
    prepared: BTreeMap<String, gpu_integrations::dra::Prepared>,
) -> Result<(Vec<ResourceSlice>, Vec<String>), KubeError> {
    let dra = DraOptions {
        driver: opts.driver.clone(),
        version,
        generation: 0,
        prepared,
        size_for: opts.size_for.clone(),
        mixed_placements: opts.mixed_placements.clone(),
    };
    let s = node_slices(node, &dra)
        .map_err(|e| KubeError::Invalid(format!("node {}: {e}", node.node)))?;
    Ok((s.slices, s.warnings))
}

/// One write of a plan.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PlanStep {
    /// Create the slice.
    Create {
        /// Its name.
        name: String,
    },
    /// Replace the slice (its content or generation changed).
    Update {
        /// Its name.
        name: String,
        /// The resourceVersion it replaces.
        resource_version: String,
    },
    /// Delete a slice of the pool that is no longer wanted.
    Delete {
        /// Its name.
        name: String,
    },
}

impl PlanStep {
    /// The slice the step writes.
    pub fn name(&self) -> &str {
        match self {
            PlanStep::Create { name }
            | PlanStep::Update { name, .. }
            | PlanStep::Delete { name } => name,
        }
    }
}

impl std::fmt::Display for PlanStep {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PlanStep::Create { name } => write!(f, "create {name}"),
            PlanStep::Update { name, .. } => write!(f, "update {name}"),
            PlanStep::Delete { name } => write!(f, "delete {name}"),
        }
    }
}

/// What one round writes for a pool.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    /// The node (and pool).
    pub node: String,
    /// `pool.generation` after the plan (the current one when nothing changes).
    pub generation: i64,
    /// The writes, creates and updates before deletes; empty when the pool is as wanted.
    pub steps: Vec<PlanStep>,
    /// The JSON bodies of the objects to create or replace, by name.
    pub objects: BTreeMap<String, Vec<u8>>,
}

impl Plan {
    /// Whether the pool is already as wanted.
    pub fn is_empty(&self) -> bool {
        self.steps.is_empty()
    }
}

/// A wanted slice as it is written: its generation set, owned by the Node, and (to replace
/// it) the `resourceVersion` it replaces. Serialized straight from the typed slice, so a write
/// never builds the document as a `serde_json::Value`.
struct SliceDoc<'a> {
    slice: &'a ResourceSlice,
    generation: i64,
    owner: Option<&'a NodeOwner>,
    resource_version: Option<&'a str>,
}

impl serde::Serialize for SliceDoc<'_> {
    fn serialize<S: serde::Serializer>(&self, ser: S) -> Result<S::Ok, S::Error> {
        use gpu_integrations::dra::model::{ObjectMeta, ResourcePool, ResourceSliceSpec};
        use serde::ser::SerializeMap as _;
        // Exhaustive patterns: a field added to the model does not compile until it is written
        // here too.
        let ResourceSlice {
            api_version,
            kind,
            metadata,
            spec,
        } = self.slice;
        let ObjectMeta { name, labels } = metadata;
        let ResourceSliceSpec {
            driver,
            pool,
            node_name,
            shared_counters,
            devices,
        } = spec;
        let ResourcePool {
            name: pool_name,
            generation: _,
            resource_slice_count,
        } = pool;
        struct Meta<'a>(&'a SliceDoc<'a>, &'a str, &'a BTreeMap<String, String>);
        impl serde::Serialize for Meta<'_> {
            fn serialize<S: serde::Serializer>(&self, ser: S) -> Result<S::Ok, S::Error> {
                let Meta(doc, name, labels) = self;
                let mut m = ser.serialize_map(None)?;
                m.serialize_entry("name", name)?;
                if !labels.is_empty() {
                    m.serialize_entry("labels", labels)?;
                }
                if let Some(rv) = doc.resource_version {
                    m.serialize_entry("resourceVersion", rv)?;
                }
                if let Some(o) = doc.owner {
                    m.serialize_entry(
                        "ownerReferences",
                        &[json!({"apiVersion": "v1", "kind": "Node", "name": o.name, "uid": o.uid, "controller": true})],
                    )?;
                }
                m.end()
            }
        }
        struct Spec<'a> {
            driver: &'a str,
            pool: ResourcePool,
            node_name: &'a Option<String>,
            shared_counters: &'a [gpu_integrations::dra::model::CounterSet],
            devices: &'a [gpu_integrations::dra::model::Device],
        }
        impl serde::Serialize for Spec<'_> {
            fn serialize<S: serde::Serializer>(&self, ser: S) -> Result<S::Ok, S::Error> {
                let mut m = ser.serialize_map(None)?;
                m.serialize_entry("driver", self.driver)?;
                m.serialize_entry("pool", &self.pool)?;
                if let Some(n) = self.node_name {
                    m.serialize_entry("nodeName", n)?;
                }
                if !self.shared_counters.is_empty() {
                    m.serialize_entry("sharedCounters", self.shared_counters)?;
                }
                if !self.devices.is_empty() {
                    m.serialize_entry("devices", self.devices)?;
                }
                m.end()
            }
        }
        let mut m = ser.serialize_map(None)?;
        m.serialize_entry("apiVersion", api_version)?;
        m.serialize_entry("kind", kind)?;
        m.serialize_entry("metadata", &Meta(self, name, labels))?;
        m.serialize_entry(
            "spec",
            &Spec {
                driver,
                pool: ResourcePool {
                    name: pool_name.clone(),
                    generation: self.generation,
                    resource_slice_count: *resource_slice_count,
                },
                node_name,
                shared_counters,
                devices,
            },
        )?;
        m.end()
    }
}

/// The JSON of a wanted slice with generation `generation`, owned by `owner` (to compare with
/// what the server holds).
fn slice_doc(s: &ResourceSlice, generation: i64, owner: Option<&NodeOwner>) -> Value {
    let doc = SliceDoc {
        slice: s,
        generation,
        owner,
        resource_version: None,
    };
    serde_json::to_value(&doc).unwrap_or(Value::Null)
}

/// Whether everything `want` says is in `have` (`have` may hold more: fields the server
/// defaulted or set, such as a taint's `timeAdded`). Lists must match element by element.
fn holds(want: &Value, have: &Value) -> bool {
    match (want, have) {
        (Value::Object(w), Value::Object(h)) => w
            .iter()
            .all(|(k, wv)| h.get(k).is_some_and(|hv| holds(wv, hv))),
        (Value::Array(w), Value::Array(h)) => {
            w.len() == h.len() && w.iter().zip(h).all(|(a, b)| holds(a, b))
        }
        (Value::Number(a), Value::Number(b)) => a.as_f64() == b.as_f64(),
        _ => want == have,
    }
}

fn generation_of(s: &Value) -> i64 {
    s.pointer("/spec/pool/generation")
        .and_then(Value::as_i64)
        .unwrap_or(0)
}

fn name_of(s: &Value) -> &str {
    s.pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or("")
}

/// The writes that make `existing` (the driver's slices of the node, as listed) hold exactly
/// `target`'s slices. The generation goes one above both the highest listed and `floor` (the
/// last one this publisher wrote) whenever anything changes.
pub fn plan(target: &PoolTarget, existing: &[Value], floor: i64) -> Plan {
    let ours: Vec<&Value> = existing
        .iter()
        .filter(|s| {
            s.pointer("/spec/driver").and_then(Value::as_str) == Some(target.driver.as_str())
                && s.pointer("/spec/pool/name").and_then(Value::as_str)
                    == Some(target.node.as_str())
        })
        .collect();
    let current = ours.iter().map(|s| generation_of(s)).max().unwrap_or(0);
    let by_name: BTreeMap<&str, &Value> = ours.iter().map(|s| (name_of(s), *s)).collect();
    let wanted: BTreeSet<&str> = target
        .slices
        .iter()
        .map(|s| s.metadata.name.as_str())
        .collect();
    let unchanged = !ours.is_empty()
        && ours.len() == target.slices.len()
        && by_name.len() == ours.len()
        && ours.iter().all(|s| generation_of(s) == current)
        && target.slices.iter().all(|s| {
            by_name
                .get(s.metadata.name.as_str())
                .is_some_and(|have| holds(&slice_doc(s, current, target.owner.as_ref()), have))
        });
    if unchanged {
        return Plan {
            node: target.node.clone(),
            generation: current,
            steps: vec![],
            objects: BTreeMap::new(),
        };
    }
    let generation = current.max(floor).saturating_add(1);
    let mut steps = Vec::new();
    let mut objects = BTreeMap::new();
    for s in &target.slices {
        let name = s.metadata.name.clone();
        let rv = by_name.get(name.as_str()).map(|have| {
            have.pointer("/metadata/resourceVersion")
                .and_then(Value::as_str)
                .unwrap_or("")
        });
        let doc = SliceDoc {
            slice: s,
            generation,
            owner: target.owner.as_ref(),
            resource_version: rv,
        };
        // A typed document always serializes; an empty body would be refused by the server.
        let body = serde_json::to_vec(&doc).unwrap_or_default();
        match rv {
            Some(rv) => steps.push(PlanStep::Update {
                name: name.clone(),
                resource_version: rv.to_owned(),
            }),
            None => steps.push(PlanStep::Create { name: name.clone() }),
        }
        objects.insert(name, body);
    }
    for name in by_name.keys().filter(|n| !wanted.contains(*n)) {
        steps.push(PlanStep::Delete {
            name: (*name).to_owned(),
        });
    }
    Plan {
        node: target.node.clone(),
        generation,
        steps,
        objects,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_server_default_does_not_count_as_a_change_but_a_missing_field_does() {
        let want = json!({"a": [{"k": "x"}], "n": 1});
        assert!(holds(
            &want,
            &json!({"a": [{"k": "x", "timeAdded": "t"}], "n": 1, "extra": true})
        ));
        assert!(!holds(&want, &json!({"a": [{"k": "y"}], "n": 1})));
        assert!(!holds(
            &want,
            &json!({"a": [{"k": "x"}, {"k": "x"}], "n": 1})
        ));
        assert!(!holds(&want, &json!({"a": [{"k": "x"}]})));
    }
}
