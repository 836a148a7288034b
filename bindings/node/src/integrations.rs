//! What gpuslice hands to other tools, from JavaScript: Kubernetes DRA ResourceSlices,
//! Prometheus metrics, KubeVirt `permittedHostDevices` and QEMU arguments. The same
//! `gpu-integrations` calls as `gpuslice export` and `gpuslice metrics`.

use gpu_core::{Allocation, NodeTopology};
use gpu_integrations::dra::{self, DraOptions, K8sVersion};
use gpu_integrations::{handoff, kubevirt, metrics};
use napi::Env;
use napi_derive::napi;

use crate::convert::{Document, document, to_json};
use crate::errors::Failure;

fn documents<T: Document>(items: Vec<serde_json::Value>) -> Result<Vec<T>, Failure> {
    items.into_iter().map(document).collect()
}

/// Options of `exportDra`.
#[napi(object, js_name = "DraExportOptions")]
#[derive(Debug, Clone, Default)]
pub struct JsDraExportOptions {
    /// The Kubernetes release the objects are for: `1.34`, `1.35`, `1.36` or `1.37` (default), or a
    /// patch release (`1.36.2`); a minor alone means its oldest patch. Before 1.36.2 each GPU offers
    /// one vGPU size, one device per vGPU (docs/dra.md).
    #[napi(js_name = "k8sVersion")]
    pub k8s_version: Option<String>,
    /// The DRA driver name (default `gpu.gpuslice.dev`).
    pub driver: Option<String>,
    /// `pool.generation` (default 1).
    pub generation: Option<i64>,
}

/// The Kubernetes DRA objects (`resource.k8s.io/v1`) publishing the GPUs and vGPU profiles of
/// `nodes`: DeviceClasses then ResourceSlices, with what was left out as `warnings`.
#[napi(
    ts_args_type = "nodes: Array<NodeTopology | string>, options?: DraExportOptions",
    ts_return_type = "DraExport"
)]
pub fn export_dra(
    env: Env,
    nodes: Vec<serde_json::Value>,
    options: Option<JsDraExportOptions>,
) -> napi::Result<serde_json::Value> {
    let run = || -> Result<serde_json::Value, Failure> {
        let nodes: Vec<NodeTopology> = documents(nodes)?;
        let o = options.unwrap_or_default();
        let version: K8sVersion = match &o.k8s_version {
            Some(v) => v.parse().map_err(|e| Failure::of(&e))?,
            None => K8sVersion::default(),
        };
        let opts = DraOptions {
            driver: o.driver.unwrap_or_else(|| dra::DEFAULT_DRIVER.to_owned()),
            version,
            generation: o.generation.unwrap_or(1),
            ..DraOptions::default()
        };
        let export = dra::export(&nodes, &opts).map_err(|e| Failure::of(&e))?;
        to_json(&serde_json::json!({ "objects": export.objects, "warnings": export.warnings }))
    };
    run().map_err(|f| f.into_js(&env))
}

/// The Prometheus text exposition of `nodes` with the fleet's `allocations` counted, as
/// `gpuslice metrics` serves it.
#[napi(
    ts_args_type = "nodes: Array<NodeTopology | string>, allocations?: Array<Allocation | string>"
)]
pub fn metrics_text(
    env: Env,
    nodes: Vec<serde_json::Value>,
    allocations: Option<Vec<serde_json::Value>>,
) -> napi::Result<String> {
    let run = || -> Result<String, Failure> {
        let nodes: Vec<NodeTopology> = documents(nodes)?;
        let allocations: Vec<Allocation> = documents(allocations.unwrap_or_default())?;
        metrics::text(&nodes, &allocations).map_err(|e| Failure::of(&e))
    };
    run().map_err(|f| f.into_js(&env))
}

/// The KubeVirt `permittedHostDevices` patch for the GPUs and vGPU types of `nodes`.
#[napi(
    ts_args_type = "nodes: Array<NodeTopology | string>",
    ts_return_type = "Record<string, unknown>"
)]
pub fn export_kubevirt(env: Env, nodes: Vec<serde_json::Value>) -> napi::Result<serde_json::Value> {
    let run = || -> Result<serde_json::Value, Failure> {
        let nodes: Vec<NodeTopology> = documents(nodes)?;
        to_json(&kubevirt::export(&nodes, &kubevirt::KubevirtOptions::default()).patch)
    };
    run().map_err(|f| f.into_js(&env))
}

/// The QEMU arguments (`-device vfio-pci,...`) handing `allocation`'s devices to a VM on `node`.
/// Throws `INVALID_REQUEST` when the allocation is on another node, `NOT_FOUND` when it names a
/// GPU the node does not have.
#[napi(ts_args_type = "allocation: Allocation | string, node: NodeTopology | string")]
pub fn qemu_args(
    env: Env,
    allocation: serde_json::Value,
    node: serde_json::Value,
) -> napi::Result<Vec<String>> {
    let run = || -> Result<Vec<String>, Failure> {
        let allocation: Allocation = document(allocation)?;
        let node: NodeTopology = document(node)?;
        handoff::allocation_qemu_args(&allocation, &node).map_err(|e| Failure::of(&e))
    };
    run().map_err(|f| f.into_js(&env))
}
