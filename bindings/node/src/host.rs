//! `discover`, `discoverAsync` and `health`: reading a host through the shared composition.

use std::path::{Path, PathBuf};

use gpu_health::policy::PolicyFormat;
use gpu_health::{NodeRequest, Policy};
use napi::bindgen_prelude::{AsyncTask, Unknown};
use napi::{Env, Task};
use napi_derive::napi;

use crate::convert::to_json;
use crate::errors::Failure;

/// Where and what to discover.
#[napi(object, js_name = "DiscoverOptions")]
#[derive(Debug, Clone, Default)]
pub struct JsDiscoverOptions {
    /// The directory standing for the host's `/` (default `/`).
    pub root: Option<String>,
    /// The node name written into the topology (default: this machine's hostname).
    pub node: Option<String>,
    /// Add `holder` (`pid`, `command`, `node`) to each whole GPU and vGPU instance a process
    /// holds open, as `gpuslice topology`'s HOLDER column shows it (default false).
    pub holders: Option<bool>,
}

/// Where to assess health and by which rules.
#[napi(object, js_name = "HealthOptions")]
#[derive(Debug, Clone, Default)]
pub struct JsHealthOptions {
    /// The directory standing for the host's `/` (default `/`).
    pub root: Option<String>,
    /// A health policy overriding the built-in thresholds: an object in the policy file's shape,
    /// or its YAML/JSON text.
    #[napi(ts_type = "HealthPolicy | string")]
    pub policy: Option<serde_json::Value>,
    /// A policy file (`.toml`, `.yaml`, `.yml` or `.json`), instead of `policy`.
    pub policy_file: Option<String>,
}

fn discover_node(
    root: &str,
    node: Option<String>,
    holders: bool,
) -> Result<serde_json::Value, Failure> {
    let node = node.unwrap_or_else(gpu_sysfs::default_node_name);
    gpu_core::validate_name(&node).map_err(|e| Failure::core(&e, crate::errors::Input::Request))?;
    let c = gpu_health::open_node(Path::new(root), &NodeRequest::new(node))
        .map_err(|e| Failure::of(&e))?;
    if holders {
        return Ok(gpu_sysfs::actuate::held_topology(
            c.host.host(),
            &c.topology,
        ));
    }
    to_json(&c.topology)
}

fn root_of(root: Option<String>) -> String {
    root.unwrap_or_else(|| "/".to_owned())
}

/// Discovers a node: its GPUs, vGPU parents, profiles, instances and framebuffer pools, with a
/// health verdict per GPU. Returns the node topology document (camelCase keys).
///
/// Throws `HOST_ERROR` (with `path` and `errno`) when the host cannot be read, `INVALID_REQUEST`
/// when `node` is not a valid name.
#[napi(ts_return_type = "NodeTopology")]
pub fn discover(env: Env, options: Option<JsDiscoverOptions>) -> napi::Result<serde_json::Value> {
    let options = options.unwrap_or_default();
    discover_node(
        &root_of(options.root),
        options.node,
        options.holders.unwrap_or(false),
    )
    .map_err(|e| e.into_js(&env))
}

/// `discover` on the libuv thread pool: the promise resolves to the topology, or rejects with
/// the same errors `discover` throws.
#[napi(ts_return_type = "Promise<NodeTopology>")]
pub fn discover_async(options: Option<JsDiscoverOptions>) -> AsyncTask<DiscoverTask> {
    let options = options.unwrap_or_default();
    AsyncTask::new(DiscoverTask {
        root: root_of(options.root),
        node: options.node,
        holders: options.holders.unwrap_or(false),
    })
}

/// The work of `discoverAsync`.
pub struct DiscoverTask {
    root: String,
    node: Option<String>,
    holders: bool,
}

impl Task for DiscoverTask {
    type Output = Result<serde_json::Value, Failure>;
    type JsValue = Unknown<'static>;

    fn compute(&mut self) -> napi::Result<Self::Output> {
        Ok(discover_node(&self.root, self.node.take(), self.holders))
    }

    fn resolve(&mut self, env: Env, output: Self::Output) -> napi::Result<Self::JsValue> {
        let value = output.map_err(|e| e.into_js(&env))?;
        env.to_js_value(&value)
    }
}

fn load_policy(options: &JsHealthOptions) -> Result<Policy, Failure> {
    if let Some(file) = &options.policy_file {
        return Policy::from_file(&PathBuf::from(file)).map_err(|e| Failure::of(&e));
    }
    // JSON is YAML: one parser reads objects (as JSON) and text in either form.
    let text = match &options.policy {
        None | Some(serde_json::Value::Null) => return Ok(Policy::default()),
        Some(serde_json::Value::String(text)) => text.clone(),
        Some(value) => value.to_string(),
    };
    Policy::from_str_as(&text, PolicyFormat::Yaml, "<policy>").map_err(|e| Failure::of(&e))
}

/// Assesses the health of every GPU of the host: one report per GPU with its verdict and the
/// signals read (PCIe AER counters, link state, and NVML telemetry when `root` is `/` and the
/// NVIDIA driver's library loads).
///
/// Throws `HOST_ERROR` when the host or the policy file cannot be read, `CONFIG_ERROR` when the
/// policy is malformed.
#[napi(ts_return_type = "GpuHealthReport[]")]
pub fn health(env: Env, options: Option<JsHealthOptions>) -> napi::Result<serde_json::Value> {
    let options = options.unwrap_or_default();
    let run = || -> Result<serde_json::Value, Failure> {
        let policy = load_policy(&options)?;
        let root = root_of(options.root.clone());
        let mut req = NodeRequest::new(gpu_sysfs::default_node_name());
        req.policy = policy;
        let composed =
            gpu_health::open_node(Path::new(&root), &req).map_err(|e| Failure::of(&e))?;
        to_json(&composed.reports)
    };
    run().map_err(|e| e.into_js(&env))
}
