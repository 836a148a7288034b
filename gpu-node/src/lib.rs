//! The one writer of a node.
//!
//! Every change gpuslice makes to a host goes through this crate: opening a node once
//! ([`open`]), taking the host-wide write lock, choosing a parent or VF for a profile, creating
//! and removing vGPUs, binding and releasing whole GPUs, enabling and disabling SR-IOV,
//! applying layouts, and realizing an allocation (a placement or a DRA claim) as devices.
//!
//! Each operation is one call that checks everything before the first write, writes under the
//! host-wide lock, re-reads what it touched and returns what it did (a caller with a state
//! directory, the agent, records its intent around it). The CLI, the node agent, the kubelet
//! plugin and the bindings call it and only render the answer. See `docs/architecture.md` for where this crate stands among the others.
//!
//! # The writer
//!
//! A [`Node`] is made from an opened node (`Node::of(&opened)`) or from a host and its
//! discovery options (the agent's). Its operations ([`Node::create_vgpu`],
//! [`Node::remove_vgpu`], [`Node::bind_gpu`], [`Node::release_gpu`], [`Node::enable_sriov`],
//! [`Node::disable_sriov`], [`Node::apply_layout`], [`Node::clear_vgpus`]) each take the host-wide lock
//! (`run/gpuslice/vgpu.lock` under the root) for their whole length; [`Node::lock`] gives a
//! [`Locked`] writer with the same operations, for a caller that records something of its own
//! between steps (the agent's promises). Where a vGPU goes is decided by one function,
//! [`choose_target`], so that `gpuslice vgpu create`, the agent's `POST /v1/vgpus` and a layout
//! asking for the same profile on the same GPU land on the same parent.
//!
//! Failures are [`NodeError`]s, one variant per operation, each carrying the step's own error
//! as its source; their kinds are the source's ([`gpu_core::ErrorKind`]).

pub mod clear;
pub mod dra;
pub mod error;
pub mod fabric;
pub mod front;
mod full;
pub mod handoff;
pub mod intent;
pub mod mig;
pub mod mig_vgpu;
pub mod mixed;
mod mixed_create;
pub mod mixed_door;
mod mixed_layout;
pub mod mixed_mig;
pub mod mixed_slots;
pub mod node;
pub mod open;
mod probe;
pub mod realize;
pub mod recover;
pub mod target;
pub mod text;

pub use clear::{ClearScope, Cleared};
pub use error::{NodeError, as_classified};
pub use node::{LayoutWrite, Locked, Node, Removed, VgpuId, WriteLock, lock_host};
pub use open::{ComposedNode, NodeRequest, NvmlSource, OpenedNode, open_node, open_node_host};
pub use realize::{RealizeError, Realized, RealizedAllocation, RealizedDevice};
pub use target::{Target, choose_target};
