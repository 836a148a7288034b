//! What gpuslice hands to other tools: Prometheus metrics, QEMU and libvirt device snippets,
//! KubeVirt `permittedHostDevices`, cloud-init licensing files and Kubernetes DRA objects.
//!
//! Every generator is a plain function over the `gpu-core` model (`NodeTopology`, `Allocation`),
//! so the same inventory renders the same output whether it came from this host or a fleet file.
//! Nothing here prints or parses command lines: the CLI and the Python and Node bindings call the
//! same functions and render the results.

pub mod cloud_init;
pub mod device_nodes;
pub mod doctor;
pub mod dra;
pub mod error;
pub mod handoff;
pub mod kubevirt;
pub mod kubevirt_vm;
pub mod metrics;
pub mod yaml;

pub use error::{IntegrationError, Result};
