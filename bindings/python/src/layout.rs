//! `gpuslice.plan_vgpu_config`: NVIDIA vgpu-device-manager layouts, planned as a dry run.

use gpu_core::NodeTopology;
use pyo3::prelude::*;

use crate::convert::{document, to_py};
use crate::errors::Failure;

/// Plans config `name` of a vGPU layout file (NVIDIA vgpu-device-manager format, its YAML text
/// in `config_text`) against a node `topology` (dict or JSON/YAML text, as `discover` returns).
///
/// Returns the plan: per GPU, the instances kept, removed and created. Nothing is changed on any
/// host. An empty `name` picks the file's only config.
///
/// Raises `ConfigError` when the file is malformed, names an unknown config or type, or the
/// layout does not fit the GPUs.
#[pyfunction]
#[pyo3(signature = (config_text, name, topology))]
pub fn plan_vgpu_config<'py>(
    py: Python<'py>,
    config_text: &str,
    name: &str,
    topology: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyAny>> {
    let topology: NodeTopology = document(topology)?;
    let plan = py
        .detach(|| gpu_core::layout::plan_vgpu_config(config_text, name, &topology))
        .map_err(|e| Failure::of(&e))?;
    to_py(py, &plan)
}
