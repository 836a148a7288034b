//! Names of NVIDIA vendor-specific VFIO vGPU types.
//!
//! A VF's `nvidia/creatable_vgpu_types` lists only what can still be created GPU-wide, so the type
//! an existing instance uses (its `current_vgpu_type`, a bare number) may no longer appear in any
//! list. Type numbers change between driver versions, so they are never looked up in a built-in
//! table: discovery first uses the names it read from every VF of the host in the same scan, then
//! asks a [`TypeNameResolver`] (`gpu_health::NvmlResolver` on a real host, or [`InMemoryResolver`] in tests
//! and for operators who pin a driver version).
//!
//! The same source reports the GPU instances of a MIG-enabled GPU with their placements
//! ([`TypeNameResolver::gpu_instances`]): sysfs does not show where a MIG-backed vGPU's GPU
//! instance sits, so without them discovery holds each one wherever it may sit.

use std::collections::BTreeMap;

use gpu_core::PciAddress;

/// What a resolver knows about one vGPU type.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TypeInfo {
    /// The type's name as the driver prints it (`NVIDIA L40S-24Q`).
    pub name: String,
    /// Framebuffer per instance in MiB, when known.
    pub framebuffer_mib: Option<u64>,
    /// Most instances per GPU, when known.
    pub max_instances: Option<u32>,
}

/// One GPU instance of a MIG-enabled GPU as NVML reports it (`nvmlGpuInstanceGetInfo` and its
/// profile's `nvmlDeviceGetGpuInstanceProfileInfo`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GpuInstancePlacement {
    /// NVML's ID of the GPU instance on its GPU.
    pub id: u32,
    /// Compute slices of its profile (`sliceCount`: the `3` of `3g.71gb`).
    pub compute_slices: u32,
    /// Index of the first memory slice it occupies (`placement.start`).
    pub start: u32,
    /// Memory slices it occupies (`placement.size`).
    pub size: u32,
}

/// What a source knows of the GPU instances of one GPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GpuInstances {
    /// Every GPU instance of the GPU, with its placement.
    Known(Vec<GpuInstancePlacement>),
    /// The source cannot say (no NVML, a library without the MIG calls, a GPU NVML does not
    /// know or that is not in MIG mode): discovery holds each MIG-backed vGPU wherever it may
    /// sit, as without NVML.
    Unsupported(String),
    /// The source was asked and failed: discovery falls back as for
    /// [`GpuInstances::Unsupported`] and says so on the GPU.
    Failed(String),
}

/// Maps vendor-VFIO type numbers to names (and sizes when known), and reports the GPU
/// instances of MIG-enabled GPUs where the source knows them (NVML on a real host).
pub trait TypeNameResolver: Send + Sync + std::fmt::Debug {
    /// The type `id` as supported by the physical GPU at `gpu`, or `None` when unknown.
    fn resolve(&self, gpu: &PciAddress, id: u32) -> Option<TypeInfo>;

    /// The GPU instances of the physical GPU at `gpu` with their placements. Sources that do
    /// not know them (the default) answer [`GpuInstances::Unsupported`].
    fn gpu_instances(&self, gpu: &PciAddress) -> GpuInstances {
        let _ = gpu;
        GpuInstances::Unsupported("this type-name source does not report GPU instances".to_owned())
    }

    /// Every vGPU type the physical GPU at `gpu` supports (ID and what is known of it), in the
    /// driver's order; `None` where this source does not know (the default).
    fn supported(&self, gpu: &PciAddress) -> Option<Vec<(u32, TypeInfo)>> {
        let _ = gpu;
        None
    }
}

/// A resolver over a fixed table, for tests and for hosts whose driver version is pinned.
#[derive(Debug, Clone, Default)]
pub struct InMemoryResolver {
    by_id: BTreeMap<u32, TypeInfo>,
    instances: BTreeMap<PciAddress, GpuInstances>,
}

impl InMemoryResolver {
    /// An empty resolver.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a type by name; the framebuffer is taken from the NVIDIA name when it parses.
    pub fn with(mut self, id: u32, name: &str) -> Self {
        let framebuffer_mib = gpu_core::nvidia::VgpuTypeName::parse(name)
            .ok()
            .map(|n| n.framebuffer_mib());
        self.by_id.insert(
            id,
            TypeInfo {
                name: name.to_owned(),
                framebuffer_mib,
                max_instances: None,
            },
        );
        self
    }

    /// Adds a type with everything known about it.
    pub fn with_info(mut self, id: u32, info: TypeInfo) -> Self {
        self.by_id.insert(id, info);
        self
    }

    /// Answers `instances` for the GPU instances of the GPU at `gpu` (other GPUs stay
    /// unsupported).
    pub fn with_gpu_instances(mut self, gpu: PciAddress, instances: GpuInstances) -> Self {
        self.instances.insert(gpu, instances);
        self
    }
}

impl TypeNameResolver for InMemoryResolver {
    fn resolve(&self, _gpu: &PciAddress, id: u32) -> Option<TypeInfo> {
        self.by_id.get(&id).cloned()
    }

    fn gpu_instances(&self, gpu: &PciAddress) -> GpuInstances {
        self.instances.get(gpu).cloned().unwrap_or_else(|| {
            GpuInstances::Unsupported(format!("no GPU instances were given for {gpu}"))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn in_memory_resolver_answers_what_it_was_given() {
        let r = InMemoryResolver::new().with(1155, "NVIDIA L40S-24Q");
        let gpu: PciAddress = "0000:26:00.0".parse().unwrap();
        let info = r.resolve(&gpu, 1155).unwrap();
        assert_eq!(info.name, "NVIDIA L40S-24Q");
        assert_eq!(info.framebuffer_mib, Some(24 * 1024));
        assert_eq!(r.resolve(&gpu, 1156), None);
    }
}
