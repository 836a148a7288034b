//! The MIG-backed vGPU types a MIG-capable GPU supports, as a node's topology lists them
//! (`gpus[].migBackedTypes`), with those whose GPU instance does not exist yet marked.

use serde::{Deserialize, Serialize};

use crate::ids::VgpuTypeId;

/// The MIG-backed vGPU types a GPU supports, from what its driver says it supports (NVML's
/// `nvmlDeviceGetSupportedVgpus`), or `unknown` where nothing says.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MigBackedTypes {
    /// `nvml` (the driver's supported types), `sandbox` (a sandbox's: the types its
    /// recording's VFs listed) or `unknown` (nothing to ask: the types are not listed, never
    /// guessed).
    pub source: String,
    /// The types, in the driver's order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub types: Vec<MigBackedType>,
}

/// One MIG-backed vGPU type a GPU supports.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MigBackedType {
    /// Type ID (`1418`).
    pub id: VgpuTypeId,
    /// Name (`NVIDIA H200X-3-71C`).
    pub name: String,
    /// Framebuffer per vGPU in MiB, when known.
    #[serde(
        default,
        rename = "framebufferMiB",
        skip_serializing_if = "Option::is_none"
    )]
    pub framebuffer_mib: Option<u64>,
    /// Compute slices of its GPU instance.
    pub mig_slices: u8,
    /// No parent of the GPU lists it as creatable now (MIG mode off, or no free GPU instance of
    /// its profile): gpuslice makes the instance (and turns MIG mode on) when it is asked for.
    pub needs_gpu_instance: bool,
}
