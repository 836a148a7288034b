//! Kubernetes Dynamic Resource Allocation (`resource.k8s.io/v1`, Kubernetes 1.34–1.37).
//!
//! [`build`] publishes a node's GPUs and vGPU profiles as ResourceSlices and DeviceClasses,
//! [`version`] holds the API's limits per Kubernetes version, [`device_name`] the grammar of the
//! device names, [`rules`] checks the slices against the API's limits and gpuslice's exclusivity promise,
//! [`claims`] holds example ResourceClaims, [`partition`] the NVSwitch partition attributes and
//! the claim check against partitions, [`model`] the API's types (slices, classes, and the
//! allocated claims the node side reads). The node side is one call per claim in the one writer
//! (`gpu_node::dra::prepare` / `unprepare`); here are its pure parts: [`claim`] the claim and
//! the devices a prepare gives, [`prepare`] plans an allocation back onto the host in named
//! steps, [`node`] what a plan means for the node (identities, the hand-off answer), and
//! [`store`] the record of what was done. The result goes to the container runtime as a CDI
//! spec ([`cdi`]) carrying KubeVirt's device metadata ([`metadata`]). Before 1.36.2 a layout config
//! picks the size each GPU offers ([`sizes`]).

pub mod build;
pub mod cdi;
pub mod claim;
pub mod claims;
pub mod device_name;
pub mod metadata;
pub mod model;
pub mod names;
pub mod node;
pub mod partition;
pub mod prepare;
pub mod rules;
pub mod sizes;
pub mod store;
pub mod version;

pub use build::{DraOptions, GpuPlacements, Prepared, SLOT_COUNTER, TypePlacements, export};
pub use claim::{Claim, ClaimResult, DraNode, PrepareOptions, PreparedDevice, Unprepared};
pub use device_name::DeviceName;
pub use sizes::{LayoutSizes, SizeForError, layout_sizes, parse_size_for};
pub use store::{ClaimStore, DEFAULT_STATE_DIR};
pub use version::{DEFAULT_DRIVER, Encoding, K8sVersion};
