//! What gpuslice hands to other tools, from Python: Kubernetes DRA ResourceSlices, Prometheus
//! metrics, KubeVirt `permittedHostDevices` and QEMU arguments. The same `gpu-integrations` calls
//! as `gpuslice export` and `gpuslice metrics`.

use gpu_core::{Allocation, NodeTopology};
use gpu_integrations::dra::{self, DraOptions, K8sVersion};
use gpu_integrations::{handoff, kubevirt, metrics};
use pyo3::prelude::*;

use crate::convert::{document, to_py};
use crate::errors::Failure;

fn documents<'py, T: crate::convert::Document>(
    items: &[Bound<'py, PyAny>],
) -> Result<Vec<T>, Failure> {
    items.iter().map(|i| document(i)).collect()
}

/// The Kubernetes DRA objects (`resource.k8s.io/v1`) publishing the GPUs and vGPU profiles of
/// `nodes` (topologies as `discover` returns them, or their JSON/YAML text): DeviceClasses then
/// ResourceSlices, as `gpuslice export dra` prints them.
///
/// Returns ``{"objects": [...], "warnings": [...]}``; a warning names what was left out and why.
/// Raises `InvalidRequest` for an unsupported `k8s_version` or a bad driver or node name,
/// `ConfigError` for a malformed topology.
#[pyfunction]
#[pyo3(signature = (nodes, k8s_version = "1.37", driver = None, generation = 1))]
pub fn export_dra<'py>(
    py: Python<'py>,
    nodes: Vec<Bound<'py, PyAny>>,
    k8s_version: &str,
    driver: Option<String>,
    generation: i64,
) -> PyResult<Bound<'py, PyAny>> {
    let nodes: Vec<NodeTopology> = documents(&nodes)?;
    let version: K8sVersion = k8s_version.parse().map_err(|e| Failure::of(&e))?;
    let opts = DraOptions {
        driver: driver.unwrap_or_else(|| dra::DEFAULT_DRIVER.to_owned()),
        version,
        generation,
        ..DraOptions::default()
    };
    let export = py
        .detach(|| dra::export(&nodes, &opts))
        .map_err(|e| Failure::of(&e))?;
    to_py(
        py,
        &serde_json::json!({ "objects": export.objects, "warnings": export.warnings }),
    )
}

/// The Prometheus text exposition of `nodes` with the fleet's `allocations` counted, as
/// `gpuslice metrics` serves it.
#[pyfunction]
#[pyo3(signature = (nodes, allocations = Vec::new()))]
pub fn metrics_text<'py>(
    py: Python<'py>,
    nodes: Vec<Bound<'py, PyAny>>,
    allocations: Vec<Bound<'py, PyAny>>,
) -> PyResult<String> {
    let nodes: Vec<NodeTopology> = documents(&nodes)?;
    let allocations: Vec<Allocation> = documents(&allocations)?;
    Ok(py
        .detach(|| metrics::text(&nodes, &allocations))
        .map_err(|e| Failure::of(&e))?)
}

/// The KubeVirt `permittedHostDevices` patch for the GPUs and vGPU types of `nodes`, as
/// `gpuslice export kubevirt` prints it.
#[pyfunction]
pub fn export_kubevirt<'py>(
    py: Python<'py>,
    nodes: Vec<Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyAny>> {
    let nodes: Vec<NodeTopology> = documents(&nodes)?;
    to_py(
        py,
        &kubevirt::export(&nodes, &kubevirt::KubevirtOptions::default()).patch,
    )
}

/// The QEMU arguments handing `allocation`'s devices to a VM on `node` (`-device vfio-pci,...`).
///
/// Raises `InvalidRequest` when the allocation is on another node, `NotFound` when it names a
/// GPU the node does not have.
#[pyfunction]
pub fn qemu_args<'py>(
    allocation: &Bound<'py, PyAny>,
    node: &Bound<'py, PyAny>,
) -> PyResult<Vec<String>> {
    let allocation: Allocation = document(allocation)?;
    let node: NodeTopology = document(node)?;
    Ok(handoff::allocation_qemu_args(&allocation, &node).map_err(|e| Failure::of(&e))?)
}
