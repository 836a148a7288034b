//! Names of NVIDIA vendor-specific VFIO vGPU types.
//!
//! A VF's `nvidia/creatable_vgpu_types` lists only what can still be created GPU-wide, so the type
//! an existing instance uses (its `current_vgpu_type`, a bare number) may no longer appear in any
//! list. Type numbers change between driver versions, so they are never looked up in a built-in
//! table: discovery first uses the names it read from every VF of the host in the same scan, then
//! asks a [`TypeNameResolver`] (`gpu_health::NvmlResolver` on a real host, or [`InMemoryResolver`] in tests
//! and for operators who pin a driver version).

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

/// Maps vendor-VFIO type numbers to names (and sizes when known).
pub trait TypeNameResolver: Send + Sync + std::fmt::Debug {
    /// The type `id` as supported by the physical GPU at `gpu`, or `None` when unknown.
    fn resolve(&self, gpu: &PciAddress, id: u32) -> Option<TypeInfo>;
}

/// A resolver over a fixed table, for tests and for hosts whose driver version is pinned.
#[derive(Debug, Clone, Default)]
pub struct InMemoryResolver {
    by_id: BTreeMap<u32, TypeInfo>,
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
}

impl TypeNameResolver for InMemoryResolver {
    fn resolve(&self, _gpu: &PciAddress, id: u32) -> Option<TypeInfo> {
        self.by_id.get(&id).cloned()
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
