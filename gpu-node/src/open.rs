//! Opening a node: the one composition from a root to a node's host, topology and health.
//!
//! The composition itself is gpu-health's (discovery and grading are reads); this module is
//! the only door the front-ends use, so that a node that is going to be changed is opened the
//! same way everywhere.

pub use gpu_health::{
    ComposedNode, NodeRequest, NvmlSource, OpenedNode, open_node, open_node_host,
};
