//! The one writer of a node.
//!
//! Every change gpuslice makes to a host goes through this crate: opening a node once
//! ([`open`]), taking the host-wide write lock, choosing a parent or VF for a profile, creating
//! and removing vGPUs, binding and releasing whole GPUs, enabling and disabling SR-IOV,
//! applying layouts, and realizing an allocation (a placement or a DRA claim) as devices.
//!
//! Each operation is one call that checks everything before the first write, records its
//! intent in the state directory, writes, re-reads what it touched and returns what it did.
//! The CLI, the node agent, the kubelet plugin and the bindings call it and only render the
//! answer. See `docs/architecture.md` for where this crate stands among the others.

pub mod dra;
pub mod open;

pub use open::{ComposedNode, NodeRequest, NvmlSource, OpenedNode, open_node, open_node_host};
