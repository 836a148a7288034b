//! `gpuslice.discover` and `gpuslice.health`: reading a host through the shared composition.

use std::path::PathBuf;

use gpu_health::{NodeRequest, Policy};
use pyo3::prelude::*;
use pyo3::types::PyString;

use crate::convert::to_py;
use crate::errors::Failure;

/// Discovers a node: its GPUs, vGPU parents, profiles, instances and framebuffer pools, with a
/// health verdict per GPU. Returns the node topology document (camelCase keys).
///
/// `root` (a `str` or `os.PathLike`) stands for the host's `/` (a directory holding `sys/`, as on
/// a real host or in a recorded tree); `node` names the node (default: this machine's hostname).
///
/// With `holders=True`, each whole GPU and vGPU instance a process holds open gets `holder`
/// (`pid`, `command`, `node`: the VFIO node it has open), as the HOLDER column of `gpuslice
/// topology` and `gpu list` shows it (a recording has no processes: no holders).
///
/// Raises `HostError` (with `.path` and `.errno`) when the host cannot be read, `InvalidRequest`
/// when `node` is not a valid name.
#[pyfunction]
#[pyo3(
    signature = (root = PathBuf::from("/"), node = None, holders = false),
    text_signature = "(root='/', node=None, holders=False)"
)]
pub fn discover<'py>(
    py: Python<'py>,
    root: PathBuf,
    node: Option<&str>,
    holders: bool,
) -> PyResult<Bound<'py, PyAny>> {
    let topology = py.detach(|| {
        let node = node.map_or_else(gpu_sysfs::default_node_name, str::to_owned);
        gpu_core::validate_name(&node)
            .map_err(|e| Failure::core(&e, crate::errors::Input::Request))?;
        let c =
            gpu_health::open_node(&root, &NodeRequest::new(node)).map_err(|e| Failure::of(&e))?;
        let held = holders.then(|| gpu_sysfs::actuate::held_topology(c.host.host(), &c.topology));
        Ok::<_, Failure>((c.topology, held))
    })?;
    match topology {
        (_, Some(held)) => to_py(py, &held),
        (topology, None) => to_py(py, &topology),
    }
}

/// Where a health policy comes from.
enum PolicySource {
    Default,
    Text(String),
    File(PathBuf),
}

impl PolicySource {
    fn from_py(policy: Option<&Bound<'_, PyAny>>) -> Result<Self, Failure> {
        let Some(p) = policy.filter(|p| !p.is_none()) else {
            return Ok(PolicySource::Default);
        };
        if let Ok(s) = p.cast::<PyString>() {
            return Ok(PolicySource::Text(
                s.to_cow().map_err(|e| bad_policy(&e))?.into_owned(),
            ));
        }
        if let Ok(path) = p.extract::<PathBuf>() {
            return Ok(PolicySource::File(path));
        }
        let value: serde_json::Value = crate::pyde::from_py(p).map_err(|e| bad_policy(&e))?;
        Ok(PolicySource::Text(value.to_string()))
    }

    fn load(self) -> Result<Policy, Failure> {
        match self {
            PolicySource::Default => Ok(Policy::default()),
            // JSON is YAML: one parser reads dicts (as JSON) and text in either form.
            PolicySource::Text(text) => {
                Policy::from_str_as(&text, gpu_health::policy::PolicyFormat::Yaml, "<policy>")
                    .map_err(|e| Failure::of(&e))
            }
            PolicySource::File(path) => Policy::from_file(&path).map_err(|e| Failure::of(&e)),
        }
    }
}

fn bad_policy(e: &dyn std::fmt::Display) -> Failure {
    Failure::new(
        gpu_core::ErrorKind::InvalidConfig,
        format!("policy <policy>: {e}"),
    )
}

/// Assesses the health of every GPU of the host under `root`: one report per GPU with its
/// verdict and the signals read (PCIe AER counters, link state, and NVML telemetry when `root`
/// is `/` and the NVIDIA driver's library loads).
///
/// `policy` overrides the built-in grading thresholds: a dict in the policy file's shape, its
/// YAML/JSON text, or a path (`os.PathLike`) to a `.toml`, `.yaml` or `.json` file.
///
/// Raises `HostError` when the host cannot be read, `ConfigError` when the policy is malformed.
#[pyfunction]
#[pyo3(signature = (root = PathBuf::from("/"), policy = None), text_signature = "(root='/', policy=None)")]
pub fn health<'py>(
    py: Python<'py>,
    root: PathBuf,
    policy: Option<&Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyAny>> {
    let source = PolicySource::from_py(policy)?;
    let reports = py.detach(|| {
        let policy = source.load()?;
        let mut req = NodeRequest::new(gpu_sysfs::default_node_name());
        req.policy = policy;
        let composed = gpu_health::open_node(&root, &req).map_err(|e| Failure::of(&e))?;
        Ok::<_, Failure>(composed.reports)
    })?;
    to_py(py, &reports)
}
