//! Linux sysfs discovery and actuation for gpuslice.
//!
//! Linux shows a host's GPUs as PCI functions under `/sys/bus/pci/devices`, their isolation as
//! IOMMU groups under `/sys/kernel/iommu_groups`, mdev vGPU parents under `/sys/class/mdev_bus`
//! (each with `mdev_supported_types`), and NVIDIA's vendor-specific VFIO types as per-VF
//! `nvidia/creatable_vgpu_types` and `nvidia/current_vgpu_type` files. This crate reads all of it
//! into a [`gpu_core::NodeTopology`] ([`discover`]) and changes it safely ([`actuate`]: create and
//! remove vGPUs, enable SR-IOV, bind whole GPUs to vfio-pci; [`apply`]: declarative layouts).
//!
//! Every access goes through the small [`Host`] trait over one injected root, so the same code
//! runs against `/`, a directory tree, a replayed umockdev recording ([`umockdev`]), or the public
//! fake kernel (`testing::FakeKernel`, feature `testing`) that reacts to writes as a real kernel does.
//! The same fake kernel over a directory kept between processes is the sandbox host
//! ([`sandbox`], feature `sandbox`; a root written `sandbox:DIR`).
//! [`doctor`] checks whether the node is ready at all (IOMMU, vfio-pci, the vGPU manager, ...).

pub mod actuate;
pub mod apply;
pub mod atomic;
pub mod classify;
pub mod confine;
mod dircache;
pub mod discover;
pub mod doctor;
pub mod document;
pub mod error;
pub mod host;
pub mod link;
pub mod observed;
pub mod open;
pub mod remembered;
pub mod resolver;
#[cfg(feature = "sandbox")]
pub mod sandbox;
pub mod state_dir;
#[cfg(feature = "sandbox")]
pub mod testing;
pub mod umockdev;

pub use confine::{OutsideRoot, is_outside_root};
pub use document::{Document, DocumentLimit, open_document, read_document};
pub use error::SysfsError;
pub use host::{CommandOutput, Host, RealHost, set_parallel_reads};
pub use open::{OpenedRoot, RootKind, is_local_root, open_root};
pub use state_dir::StateDir;

/// The node name to use when none is given: this machine's hostname, else `localhost`.
pub fn default_node_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "localhost".to_owned())
}
