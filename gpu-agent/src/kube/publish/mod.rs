//! Keeping a node's ResourceSlices true in the API server.
//!
//! A pool's wanted slices are the ones `gpuslice export dra` prints for the node
//! ([`gpu_integrations::dra::build::node_slices`]), owned by the Node object so they go when the
//! node goes. One round ([`sync_pool`]) lists the driver's slices of the node, plans
//! ([`plan`]) and applies: create what is missing, replace what changed, delete what is no
//! longer wanted. When anything of the pool's content changes, every slice is written with
//! `pool.generation` one higher (the scheduler only reads a pool's newest generation) and the
//! right `resourceSliceCount`; when nothing changed nothing is written. A conflict (409: someone
//! changed a slice between the list and the write) re-reads and applies again.
//!
//! In the agent ([`spawn_publisher`]) a round runs on start and after each new revision of the
//! topology or health: at once after a quiet spell, at most once per
//! [`PublishOptions::min_interval`] during a burst (the last round carries the last state), with
//! bounded back-off while the server fails. Nothing else in the agent waits on it.
//!
//! One concern per file: [`server`] (what the API server is, who owns the pool), [`diff`] (the
//! wanted slices and the pure plan), [`apply`](mod@apply) (the writes and a whole round) and
//! [`publisher`] (the agent's debounced loop).

pub mod apply;
pub mod diff;
pub mod publisher;
pub mod report;
pub mod server;

pub use apply::{
    CONFLICT_RETRIES, NodeReport, PublishOutcome, SLICES_PATH, WRITES_IN_FLIGHT, apply, list_pool,
    publish_nodes, sync_pool,
};
pub use diff::{Plan, PlanStep, PoolTarget, SliceOptions, plan, wanted_slices};
pub use publisher::{PublishOptions, PublisherHandle, spawn_publisher, spawn_publisher_degrading};
pub use report::PublishSummary;
pub use server::{
    NEWEST_MINOR, NodeOwner, OLDEST_MINOR, ServerInfo, node_owner, server_info, server_version,
};
