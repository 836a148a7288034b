//! The subset of Kubernetes `resource.k8s.io/v1` that gpuslice writes and reads, as serde types.
//!
//! Field names and shapes follow the v1 API of Kubernetes 1.34–1.37; optional fields are left out
//! when empty so the objects validate against the strict schemas of every supported version.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// The API version of every object here.
pub const API_VERSION: &str = "resource.k8s.io/v1";

/// The ResourceSlices of a YAML stream or a JSON `List`, any driver's (objects of other kinds
/// are skipped).
///
/// # Errors
/// When a document is not YAML/JSON or a ResourceSlice does not have the v1 shape (the message
/// names the document or slice by its number).
pub fn parse_slices(text: &str) -> crate::Result<Vec<ResourceSlice>> {
    use crate::IntegrationError;
    let mut docs: Vec<serde_json::Value> = Vec::new();
    for (i, d) in serde_yaml_ng::Deserializer::from_str(text).enumerate() {
        let v = serde_json::Value::deserialize(d).map_err(|e| IntegrationError::Decode {
            what: format!("document {}", i + 1),
            source: Box::new(e),
        })?;
        match v.get("items").and_then(|x| x.as_array()) {
            Some(items) if v.get("kind").and_then(|k| k.as_str()) == Some("List") => {
                docs.extend(items.iter().cloned())
            }
            _ if v.is_null() => {}
            _ => docs.push(v),
        }
    }
    docs.into_iter()
        .filter(|d| d.get("kind").and_then(|k| k.as_str()) == Some("ResourceSlice"))
        .enumerate()
        .map(|(i, d)| {
            serde_json::from_value(d).map_err(|e| IntegrationError::Decode {
                what: format!("ResourceSlice {}", i + 1),
                source: Box::new(e),
            })
        })
        .collect()
}

/// `metadata` of an object: only the name and labels are written.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct ObjectMeta {
    /// `metadata.name`.
    pub name: String,
    /// `metadata.labels`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
}

/// A ResourceSlice.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ResourceSlice {
    /// Always [`API_VERSION`].
    pub api_version: String,
    /// Always `ResourceSlice`.
    pub kind: String,
    /// Name and labels.
    pub metadata: ObjectMeta,
    /// The published devices and counters.
    pub spec: ResourceSliceSpec,
}

/// `ResourceSlice.spec`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ResourceSliceSpec {
    /// The DRA driver name.
    pub driver: String,
    /// The pool this slice belongs to.
    pub pool: ResourcePool,
    /// The node that has the devices.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_name: Option<String>,
    /// Counter sets (physical GPUs' shared capacity).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub shared_counters: Vec<CounterSet>,
    /// Devices.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub devices: Vec<Device>,
}

/// `spec.pool`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ResourcePool {
    /// Pool name (the node's name).
    pub name: String,
    /// Changes whenever the pool's content changes.
    pub generation: i64,
    /// How many slices the pool has at this generation.
    pub resource_slice_count: i64,
}

/// A named set of counters: one physical GPU's framebuffer and MIG memory slices.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CounterSet {
    /// A DNS label.
    pub name: String,
    /// Counter name (a DNS label) → amount.
    pub counters: BTreeMap<String, Counter>,
}

/// An amount of a counter.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Counter {
    /// A Kubernetes quantity (`16Gi`, `1`).
    pub value: String,
}

/// One published device.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct Device {
    /// A DNS label, unique in the pool.
    pub name: String,
    /// Attributes for CEL selectors.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub attributes: BTreeMap<String, DeviceAttribute>,
    /// Capacities.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub capacity: BTreeMap<String, DeviceCapacity>,
    /// Counters taken from counter sets while the device is allocated.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub consumes_counters: Vec<DeviceCounterConsumption>,
    /// The device can be allocated to several requests at once (its capacity is consumable).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allow_multiple_allocations: Option<bool>,
    /// Driver-defined taints.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub taints: Vec<DeviceTaint>,
}

/// A typed attribute value: `{int: 1}`, `{string: "gpu"}`, ...
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(into = "AttributeRepr", try_from = "AttributeRepr")]
pub enum DeviceAttribute {
    /// An integer.
    Int(i64),
    /// A boolean.
    Bool(bool),
    /// A string (at most 64 characters).
    String(String),
    /// A semantic version.
    Version(String),
}

/// The wire form of [`DeviceAttribute`]: an object with exactly one field set.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
struct AttributeRepr {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    int: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    bool: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    string: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    version: Option<String>,
}

impl From<DeviceAttribute> for AttributeRepr {
    fn from(a: DeviceAttribute) -> Self {
        let mut r = AttributeRepr::default();
        match a {
            DeviceAttribute::Int(v) => r.int = Some(v),
            DeviceAttribute::Bool(v) => r.bool = Some(v),
            DeviceAttribute::String(v) => r.string = Some(v),
            DeviceAttribute::Version(v) => r.version = Some(v),
        }
        r
    }
}

impl TryFrom<AttributeRepr> for DeviceAttribute {
    type Error = String;
    fn try_from(r: AttributeRepr) -> Result<Self, Self::Error> {
        match (r.int, r.bool, r.string, r.version) {
            (Some(v), None, None, None) => Ok(DeviceAttribute::Int(v)),
            (None, Some(v), None, None) => Ok(DeviceAttribute::Bool(v)),
            (None, None, Some(v), None) => Ok(DeviceAttribute::String(v)),
            (None, None, None, Some(v)) => Ok(DeviceAttribute::Version(v)),
            _ => {
                Err("a device attribute must set exactly one of int, bool, string, version".into())
            }
        }
    }
}

/// A capacity, optionally consumable in steps given by a request policy.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeviceCapacity {
    /// The amount.
    pub value: String,
    /// How requests consume it (multi-allocatable devices).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_policy: Option<CapacityRequestPolicy>,
}

/// How much of a capacity one allocation takes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CapacityRequestPolicy {
    /// Taken when the request does not say.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default: Option<String>,
    /// The allowed amounts, ascending (at most 10).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub valid_values: Vec<String>,
    /// The allowed range.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub valid_range: Option<CapacityRequestPolicyRange>,
}

/// `requestPolicy.validRange`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CapacityRequestPolicyRange {
    /// Smallest amount.
    pub min: String,
    /// Largest amount.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max: Option<String>,
    /// Granularity.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step: Option<String>,
}

/// What a device takes from one counter set.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeviceCounterConsumption {
    /// The counter set's name.
    pub counter_set: String,
    /// Counter name → amount taken.
    pub counters: BTreeMap<String, Counter>,
}

/// A taint on a device.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceTaint {
    /// A label key.
    pub key: String,
    /// A label value.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
    /// `NoSchedule`, `NoExecute`, or (from 1.35) `None`.
    pub effect: String,
}

/// A DeviceClass.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeviceClass {
    /// Always [`API_VERSION`].
    pub api_version: String,
    /// Always `DeviceClass`.
    pub kind: String,
    /// Name.
    pub metadata: ObjectMeta,
    /// Selectors.
    pub spec: DeviceClassSpec,
}

/// `DeviceClass.spec`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceClassSpec {
    /// Every device of the class matches all of these.
    pub selectors: Vec<DeviceSelector>,
}

/// A device selector.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceSelector {
    /// A CEL expression over `device`.
    pub cel: CelDeviceSelector,
}

/// `cel` of a selector.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CelDeviceSelector {
    /// The expression.
    pub expression: String,
}

impl DeviceSelector {
    /// A CEL selector.
    pub fn cel(expression: impl Into<String>) -> Self {
        DeviceSelector {
            cel: CelDeviceSelector {
                expression: expression.into(),
            },
        }
    }
}

/// A ResourceClaim (the examples; gpuslice never creates claims itself).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ResourceClaim {
    /// Always [`API_VERSION`].
    pub api_version: String,
    /// Always `ResourceClaim`.
    pub kind: String,
    /// Name.
    pub metadata: ObjectMeta,
    /// What is requested.
    pub spec: ResourceClaimSpec,
}

/// `ResourceClaim.spec`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResourceClaimSpec {
    /// Device requests.
    pub devices: DeviceClaim,
}

/// `spec.devices`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceClaim {
    /// Requests.
    pub requests: Vec<DeviceRequest>,
    /// Constraints across requests.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub constraints: Vec<DeviceConstraint>,
    /// Configuration for the driver.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub config: Vec<DeviceClaimConfiguration>,
}

/// One request: exactly one of `exactly` and `firstAvailable`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeviceRequest {
    /// A DNS label.
    pub name: String,
    /// One kind of device.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exactly: Option<ExactDeviceRequest>,
    /// Alternatives, in order of preference.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub first_available: Vec<DeviceSubRequest>,
}

/// `exactly` of a request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ExactDeviceRequest {
    /// The DeviceClass.
    pub device_class_name: String,
    /// Extra selectors.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub selectors: Vec<DeviceSelector>,
    /// `ExactCount` or `All`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allocation_mode: Option<String>,
    /// How many devices.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub count: Option<i64>,
}

/// One alternative of `firstAvailable`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeviceSubRequest {
    /// A DNS label.
    pub name: String,
    /// The DeviceClass.
    pub device_class_name: String,
    /// Extra selectors.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub selectors: Vec<DeviceSelector>,
    /// How many devices.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub count: Option<i64>,
}

/// A constraint across requests.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeviceConstraint {
    /// The requests it applies to (all when empty).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub requests: Vec<String>,
    /// The attribute every allocated device must share.
    pub match_attribute: String,
}

/// Configuration passed to the driver for some requests.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceClaimConfiguration {
    /// Requests (or `request/subrequest`) it applies to.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub requests: Vec<String>,
    /// The driver-specific part.
    pub opaque: OpaqueDeviceConfiguration,
}

/// Opaque configuration for one driver.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OpaqueDeviceConfiguration {
    /// The driver it is for.
    pub driver: String,
    /// Driver parameters.
    pub parameters: serde_json::Value,
}

/// A Kubernetes object gpuslice writes to a DRA export.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub enum Object {
    /// A ResourceSlice.
    Slice(ResourceSlice),
    /// A DeviceClass.
    Class(DeviceClass),
    /// A ResourceClaim example.
    Claim(ResourceClaim),
}

// The node side's input: an allocated claim, as the API server or the kubelet plugin hands it over.

/// A ResourceClaim (with `status.allocation`) or a bare AllocationResult, as JSON.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PrepareInput {
    /// The claim's metadata (for its UID).
    #[serde(default)]
    pub metadata: Option<ClaimMeta>,
    /// The claim's status.
    #[serde(default)]
    pub status: Option<ClaimStatus>,
    /// A bare AllocationResult's `devices`.
    #[serde(default)]
    pub devices: Option<DeviceAllocationResult>,
}

/// `metadata` of a claim.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct ClaimMeta {
    /// The claim's UID.
    #[serde(default)]
    pub uid: Option<String>,
    /// The claim's name.
    #[serde(default)]
    pub name: Option<String>,
    /// The claim's namespace.
    #[serde(default)]
    pub namespace: Option<String>,
}

/// `status` of a claim.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct ClaimStatus {
    /// The allocation.
    #[serde(default)]
    pub allocation: Option<AllocationResult>,
}

/// `status.allocation`.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct AllocationResult {
    /// Devices.
    pub devices: DeviceAllocationResult,
}

/// `allocation.devices`.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct DeviceAllocationResult {
    /// One entry per allocated device.
    #[serde(default)]
    pub results: Vec<DeviceResult>,
    /// Configuration copied from the claim and its classes.
    #[serde(default)]
    pub config: Vec<AllocationConfig>,
}

/// One allocated device.
#[derive(Debug, Clone, Deserialize)]
pub struct DeviceResult {
    /// The request (`vgpu`, or `gpu/a2-8q` for a `firstAvailable` alternative).
    pub request: String,
    /// The driver.
    pub driver: String,
    /// The pool (node).
    pub pool: String,
    /// The device name.
    pub device: String,
    /// The share of a multi-allocatable device (a UUID).
    #[serde(default, rename = "shareID")]
    pub share_id: Option<String>,
    /// What the allocation took of the device's consumable capacities (`framebuffer: 8Gi`).
    #[serde(default, rename = "consumedCapacity")]
    pub consumed_capacity: BTreeMap<String, String>,
}

/// One configuration entry of an allocation.
#[derive(Debug, Clone, Deserialize)]
pub struct AllocationConfig {
    /// The requests it applies to (all when empty).
    #[serde(default)]
    pub requests: Vec<String>,
    /// The driver's part.
    #[serde(default)]
    pub opaque: Option<Opaque>,
}

/// Opaque configuration.
#[derive(Debug, Clone, Deserialize)]
pub struct Opaque {
    /// The driver.
    pub driver: String,
    /// Parameters; gpuslice reads `profile`.
    #[serde(default)]
    pub parameters: serde_json::Value,
}

impl PrepareInput {
    /// The allocation's devices, from either form.
    ///
    /// # Errors
    /// When the document holds no allocation.
    pub fn allocation(&self) -> crate::Result<&DeviceAllocationResult> {
        self.status
            .as_ref()
            .and_then(|s| s.allocation.as_ref())
            .map(|a| &a.devices)
            .or(self.devices.as_ref())
            .ok_or_else(|| crate::error::IntegrationError::Invalid { what: ("allocation").to_string(), why: "the input holds no allocation: expected a ResourceClaim with status.allocation, or an AllocationResult with devices.results".to_owned() })
    }

    /// The claim UID from the metadata.
    pub fn claim_uid(&self) -> Option<&str> {
        self.metadata.as_ref().and_then(|m| m.uid.as_deref())
    }
}
