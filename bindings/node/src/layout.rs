//! `planVgpuConfig`: NVIDIA vgpu-device-manager layouts, planned as a dry run.

use gpu_core::NodeTopology;
use napi::Env;
use napi_derive::napi;

use crate::convert::{document, to_json};
use crate::errors::Failure;

/// Plans config `name` of a vGPU layout file (NVIDIA vgpu-device-manager format, its YAML text
/// in `configText`) against a node `topology` (object or JSON/YAML text, as `discover` returns).
///
/// Returns the plan: per GPU, the instances kept, removed and created. Nothing is changed on any
/// host. An empty `name` picks the file's only config.
///
/// Throws `CONFIG_ERROR` when the file is malformed, names an unknown config or type, or the
/// layout does not fit the GPUs.
#[napi(
    js_name = "planVgpuConfig",
    ts_args_type = "configText: string, name: string, topology: NodeTopology | string",
    ts_return_type = "VgpuPlan"
)]
pub fn plan_vgpu_config(
    env: Env,
    config_text: String,
    name: String,
    topology: serde_json::Value,
) -> napi::Result<serde_json::Value> {
    let run = || -> Result<serde_json::Value, Failure> {
        let topology: NodeTopology = document(topology)?;
        let plan = gpu_core::layout::plan_vgpu_config(&config_text, &name, &topology)
            .map_err(|e| Failure::of(&e))?;
        to_json(&plan)
    };
    run().map_err(|f| f.into_js(&env))
}
