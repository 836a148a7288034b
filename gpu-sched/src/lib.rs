//! Placement for gpuslice: put Machines' GPU and vGPU requests on a fleet, explain every refusal.
//!
//! A fleet is node topologies (what discovery saw) plus allocations (`pending` or `created`).
//! [`FleetState`] holds it in indexed form. [`FleetState::place`] puts all devices of a
//! [`Machine`](gpu_core::Machine) on one node or refuses with a [`Refusal`] that says, node by
//! node and request by request, what was missing: `0/3 nodes available: 1 node(s):
//! TopologyUnsatisfiable: needs 4 gpu profile mbochs-large, 3 free; ...`.
//!
//! **Accounting.** A profile's free count on a parent is what the driver reported, minus
//! allocated instances the snapshot does not show yet; types of one parent share its capacity in
//! proportion to their reported counts. Framebuffer pools per physical GPU are charged with
//! [`Pool::charge`](gpu_core::Pool::charge) for the same instances, which enforces the same-size
//! rule on NVIDIA GPUs (unless the GPU runs mixed-size) and MIG slice counts. The proportional
//! share is exact when a parent's counts all come from one capacity, and errs on the safe side
//! (fewer instances) when existing instances have already skewed the reported counts. An
//! instance that the snapshot already shows (same mdev UUID, or a vendor-VFIO VF with that type)
//! is not charged twice.
//! Unhealthy GPUs are never handed out and their parents offer nothing; Degraded ones are used
//! last, fleet-wide (a node that would need one is taken only when no node can do without), and
//! reported in [`Placement::degraded`]. A GPU hosting vGPUs is not free whole, and a
//! GPU held whole offers no vGPUs.
//!
//! **Choosing.** [`Policy::Binpack`] (default) looks first among nodes whose GPUs already host
//! vGPUs and can take the request, then takes the node with the least room left that fits, and
//! on it partly used GPUs (whose locked size then matches), keeping whole cards free;
//! [`Policy::Spread`] takes the emptiest; [`Policy::FirstFit`] scores nothing (the first node in
//! node order, the first GPUs in address order), as the Kubernetes DRA allocator. Ties go by
//! node order and PCI address. `alignment: numa` keeps a request's devices, whole GPUs or vGPUs,
//! on GPUs of one NUMA node; a Machine's `targetNode` restricts it to that node. Multi-device
//! requests never enumerate subsets: instances are taken one by one from the best GPU, which is
//! exact for one profile because instances of one profile draw on each GPU independently.
//! Machines with several requests fit the most constrained first (named GPUs, whole GPUs,
//! larger vGPUs); on a node where each request fits alone but the first order fails, other
//! orders (up to 4 requests) and the other way of choosing GPUs are tried before the node reports
//! [`ReasonKind::ConflictingRequests`]. Property tests check feasibility against a brute-force
//! oracle for Machines of one and two requests.
//!
//! **Speed and size.** Per profile class and per vendor, a sorted index of `(free count, node)`
//! gives the candidate nodes in policy order without scanning the fleet. A refusal fits one
//! node per group of nodes whose state a fit cannot tell apart (same shape, same usage) and
//! counts the rest, with the same result as asking every node; each group's nodes are a
//! reference-counted snapshot of the fleet's own member set, so a refusal does not grow with the
//! fleet and one kept for later still reads as it was. Nodes keep no topology of their
//! own: GPUs, parents, pools, profile lists, instance counts and offers are interned fleet-wide
//! (every host of the same hardware, every VF of a GPU model and driver, reads the same), a VF's
//! accounting is a few counters, and [`FleetState::nodes`] rebuilds the topologies on demand.
//!
//! **Lifecycle and plans.** [`FleetState::release`], [`FleetState::mark_created`], and plans
//! for migration, node drain and health-driven evacuation ([`MigrationPlan`], [`DrainPlan`],
//! [`EvacuationPlan`]).

mod classes;
mod error;
mod members;
mod node;
mod plan;
mod policy;
mod refusal;
mod resolve;
mod slots;
mod state;
mod suggest;
pub mod text;
mod view;

#[cfg(any(test, feature = "testing"))]
pub mod testing;

pub use error::{SchedError, as_classified};
pub use gpu_core::usage::{VramUsage, vram_usage};
pub use plan::{
    AffectedDevice, DeviceMove, DrainPlan, Evacuation, EvacuationPlan, MigrationPlan, Stay,
};
pub use policy::Policy;
pub use refusal::{
    Exclusion, FIRST_NODES, Filter, NodeRefusal, Reason, ReasonKind, Refusal, RefusalGroup,
    RefusalReport,
};
pub use slots::SlotPolicy;
pub use state::{DegradedDevice, FleetState, Placement, Unplaced};
pub use view::{AllocatedInstance, NodeView, node_view};
