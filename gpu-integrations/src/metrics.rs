//! Prometheus metrics of one host or a whole fleet.
//!
//! The exposition is rendered by `prometheus-client` (OpenMetrics text, which Prometheus scrapes
//! natively), so every family carries its `# HELP` and `# TYPE` lines. The library writes label
//! values as given, so every value taken from input (node, GPU, parent and type names) is escaped
//! here ([`gpu_core::limits::escape_label_value`]): a name cannot inject a line. Every metric is a gauge: the values are a snapshot of the inventory, taken again
//! on every scrape.
//!
//! "Allocated" memory is what is taken on a node now or reserved for it: whole GPUs in use (bound
//! to vfio-pci or held by a VM, not merely hosting the vGPU framework), the framebuffer of existing vGPU instances, and the
//! devices of *pending* allocations, which the host does not show yet. Created allocations are
//! already visible as instances and in-use GPUs, so they are not counted twice.

use std::collections::{BTreeMap, BTreeSet};

use gpu_core::limits::escape_label_value as esc;
use gpu_core::{Allocation, AllocationStatus, GpuState, HealthState, NodeTopology, nvidia};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// The content type of the rendered exposition, for HTTP responses.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct NodeState {
    node: String,
    state: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct NodeHealth {
    node: String,
    health: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ParentProfile {
    node: String,
    parent: String,
    profile: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct GpuProfile {
    node: String,
    gpu: String,
    profile: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct GpuLabels {
    node: String,
    gpu: String,
    address: String,
    state: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct GpuHealthLabels {
    node: String,
    gpu: String,
    address: String,
    health: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PoolLabels {
    node: String,
    pool: String,
    state: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct NodeParent {
    node: String,
    parent: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct NodeStatus {
    node: String,
    status: String,
}

type Gauges<L> = Family<L, Gauge>;

fn gauge_value(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

const GPU_STATES: [GpuState; 3] = [GpuState::Free, GpuState::InUse, GpuState::Blocked];
const HEALTH_STATES: [HealthState; 4] = [
    HealthState::Healthy,
    HealthState::Degraded,
    HealthState::Unhealthy,
    HealthState::Unknown,
];

/// The short profile name used as a label: `NVIDIA A2-4Q` → `A2-4Q`.
fn profile_label(name: &str) -> String {
    nvidia::strip_prefix(name).to_owned()
}

pub use gpu_core::usage::{pending_mib, vram_usage};

/// Renders the metrics of `nodes`, with `allocations` (a fleet's; empty for one host) counted as
/// described in the module documentation.
///
/// # Errors
/// Only a formatting error of the encoder, which writing into a `String` does not produce.
pub fn render(
    nodes: &[NodeTopology],
    allocations: &[Allocation],
) -> Result<String, std::fmt::Error> {
    let mut registry = Registry::default();

    let vram = Gauges::<NodeState>::default();
    let devices = Gauges::<NodeHealth>::default();
    let available = Gauges::<ParentProfile>::default();
    let gpu_available = Gauges::<GpuProfile>::default();
    let gpu_state = Gauges::<GpuLabels>::default();
    let gpu_health = Gauges::<GpuHealthLabels>::default();
    let gpu_memory = Gauges::<NodeParent>::default();
    let pool_fb = Gauges::<PoolLabels>::default();
    let pool_mig = Gauges::<PoolLabels>::default();
    let instances = Gauges::<NodeParent>::default();
    let allocs = Gauges::<NodeStatus>::default();
    let pending_vram = Gauges::<NodeState>::default();

    for node in nodes {
        let n = || esc(&node.node);
        let usage = vram_usage(node, allocations);
        vram.get_or_create(&NodeState {
            node: n(),
            state: "total".into(),
        })
        .set(gauge_value(usage.total_mib));
        vram.get_or_create(&NodeState {
            node: n(),
            state: "allocated".into(),
        })
        .set(gauge_value(usage.allocated_mib));

        let mut by_health: BTreeMap<&'static str, u64> =
            HEALTH_STATES.iter().map(|h| (h.as_str(), 0)).collect();
        for gpu in &node.gpus {
            *by_health.entry(gpu.health.state.as_str()).or_default() += 1;
            for s in GPU_STATES {
                gpu_state
                    .get_or_create(&GpuLabels {
                        node: n(),
                        gpu: esc(&gpu.name),
                        address: gpu.address.to_string(),
                        state: s.as_str().into(),
                    })
                    .set(i64::from(gpu.state == s));
            }
            for h in HEALTH_STATES {
                gpu_health
                    .get_or_create(&GpuHealthLabels {
                        node: n(),
                        gpu: esc(&gpu.name),
                        address: gpu.address.to_string(),
                        health: h.as_str().into(),
                    })
                    .set(i64::from(gpu.health.state == h));
            }
            if let Some(m) = gpu.memory_mib {
                gpu_memory
                    .get_or_create(&NodeParent {
                        node: n(),
                        parent: gpu.address.to_string(),
                    })
                    .set(gauge_value(m));
            }
        }
        for (health, count) in by_health {
            devices
                .get_or_create(&NodeHealth {
                    node: n(),
                    health: health.into(),
                })
                .set(gauge_value(count));
        }

        for parent in &node.mediated_devices.parents {
            let mut seen = BTreeSet::new();
            for p in &parent.profiles {
                let label = profile_label(&p.name);
                // Two type IDs with one name on a parent would collide as series; keep the first.
                if !seen.insert(label.clone()) {
                    continue;
                }
                available
                    .get_or_create(&ParentProfile {
                        node: n(),
                        parent: esc(&parent.id.to_string()),
                        profile: esc(&label),
                    })
                    .set(i64::from(p.available_instances));
            }
            instances
                .get_or_create(&NodeParent {
                    node: n(),
                    parent: parent.id.to_string(),
                })
                .set(gauge_value(parent.instances.len() as u64));
        }
        // Per GPU (or virtual parent such as `mbochs`): the parents' counts capped by the pool
        // they share, the figure that adds up across GPUs (`gpuslice topology`'s FREE column).
        for (key, members) in gpu_core::pool::parents_by_pool(node) {
            let gpu = key
                .pci()
                .and_then(|a| node.gpu_by_address(&a))
                .map_or_else(|| key.to_string(), |g| g.name.clone());
            let mut seen = BTreeSet::new();
            for offer in gpu_core::pool::profile_offers(&members, node.pool(&key)) {
                let label = profile_label(&offer.name);
                if !seen.insert(label.clone()) {
                    continue;
                }
                gpu_available
                    .get_or_create(&GpuProfile {
                        node: n(),
                        gpu: esc(&gpu),
                        profile: esc(&label),
                    })
                    .set(i64::from(offer.free));
            }
        }
        for pool in &node.mediated_devices.pools {
            for (state, v) in [("total", pool.total_mib), ("used", pool.used_mib)] {
                pool_fb
                    .get_or_create(&PoolLabels {
                        node: n(),
                        pool: pool.gpu.to_string(),
                        state: state.into(),
                    })
                    .set(gauge_value(v));
            }
            if let Some(total) = pool.mig_slices_total {
                for (state, v) in [
                    ("total", total),
                    ("used", pool.mig_slices_used.unwrap_or(0)),
                ] {
                    pool_mig
                        .get_or_create(&PoolLabels {
                            node: n(),
                            pool: pool.gpu.to_string(),
                            state: state.into(),
                        })
                        .set(i64::from(v));
                }
            }
        }

        for status in [AllocationStatus::Pending, AllocationStatus::Created] {
            let on_node: Vec<&Allocation> = allocations
                .iter()
                .filter(|a| a.node == node.node && a.status == status)
                .collect();
            allocs
                .get_or_create(&NodeStatus {
                    node: n(),
                    status: match status {
                        AllocationStatus::Pending => "pending".into(),
                        AllocationStatus::Created => "created".into(),
                    },
                })
                .set(gauge_value(on_node.len() as u64));
        }
        pending_vram
            .get_or_create(&NodeState {
                node: n(),
                state: "pending".into(),
            })
            .set(gauge_value(pending_mib(node, allocations)));
    }

    registry.register(
        "gpuslice_gpu_vram_mib",
        "GPU memory of the node in MiB: total, and allocated (in-use whole GPUs, vGPU framebuffers, pending allocations)",
        vram,
    );
    registry.register(
        "gpuslice_gpu_devices",
        "Physical GPUs of the node by health verdict",
        devices,
    );
    registry.register(
        "gpuslice_vgpu_available_instances",
        "vGPU instances of a profile that can still be created on one parent (capped by the GPU's framebuffer pool); the parents of one GPU share that pool, so these per-parent values do not add up: sum gpuslice_gpu_vgpu_available_instances for what the GPUs can still hold",
        available,
    );
    registry.register(
        "gpuslice_gpu_vgpu_available_instances",
        "vGPU instances of a profile that can still be created on one GPU (or virtual parent), all its parents together, capped by its framebuffer pool; these add up across GPUs",
        gpu_available,
    );
    registry.register(
        "gpuslice_gpu_state",
        "1 for the GPU's current whole-GPU state (free, in-use, blocked), 0 for the others",
        gpu_state,
    );
    registry.register(
        "gpuslice_gpu_health",
        "1 for the GPU's current health verdict, 0 for the others",
        gpu_health,
    );
    registry.register(
        "gpuslice_gpu_memory_mib",
        "Memory of one GPU in MiB, when known",
        gpu_memory,
    );
    registry.register(
        "gpuslice_vgpu_pool_framebuffer_mib",
        "Framebuffer of a GPU's vGPU pool in MiB: total and used by existing instances",
        pool_fb,
    );
    registry.register(
        "gpuslice_vgpu_pool_mig_slices",
        "MIG slices of a GPU's vGPU pool: total and used by MIG-backed instances",
        pool_mig,
    );
    registry.register(
        "gpuslice_vgpu_instances",
        "Existing vGPU instances on a parent",
        instances,
    );
    registry.register(
        "gpuslice_allocations",
        "Machine allocations on the node by status (pending: placed, not created yet)",
        allocs,
    );
    registry.register(
        "gpuslice_allocation_vram_mib",
        "GPU memory in MiB reserved by pending allocations on the node",
        pending_vram,
    );

    let mut out = String::new();
    encode(&mut out, &registry)?;
    Ok(sort_series(&out))
}

/// Sorts the samples of each family: the library keeps series in a hash map, and a stable order
/// makes scrapes comparable (the exposition format leaves the order within a family free).
fn sort_series(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut samples: Vec<&str> = Vec::new();
    let flush = |samples: &mut Vec<&str>, out: &mut String| {
        samples.sort_unstable();
        for s in samples.drain(..) {
            out.push_str(s);
            out.push('\n');
        }
    };
    for line in text.lines() {
        if line.starts_with('#') {
            flush(&mut samples, &mut out);
            out.push_str(line);
            out.push('\n');
        } else if !line.is_empty() {
            samples.push(line);
        }
    }
    flush(&mut samples, &mut out);
    out
}

/// [`render`] with its (never expected) formatting error as an [`crate::IntegrationError`]: the
/// call the CLI and the bindings share.
///
/// # Errors
/// Only an encoder formatting error.
pub fn text(nodes: &[NodeTopology], allocations: &[Allocation]) -> crate::Result<String> {
    render(nodes, allocations)
        .map_err(|e| crate::IntegrationError::render("metrics", e.to_string()))
}
