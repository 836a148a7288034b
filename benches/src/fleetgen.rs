//! Fleets for the placement benches, built from the node builders of `gpu-sched`.
//!
//! The mix stands for a real estate: a quarter each of NVIDIA A2 hosts sharing GPUs as SR-IOV
//! mdev vGPUs, L40S hosts in the vendor-specific VFIO framework, H200 hosts with MIG-backed
//! vGPUs, and 8-GPU passthrough hosts. Every host has 8 GPUs.

use gpu_core::{DeviceRequest, Fleet, Machine, NodeTopology};
use gpu_sched::testing::{a2_node, h200_node, l40s_node, whole_node};

/// GPUs per node.
pub const GPUS_PER_NODE: usize = 8;

/// Node `i` of the mixed fleet (A2, L40S, H200, whole, in turn). A2 and L40S GPUs enable 4 VFs
/// each (enough for their 4 GiB and 8 GiB profiles), H200s 7 (one per MIG slice).
pub fn mixed_node(i: usize) -> NodeTopology {
    let name = format!("node-{i:06}");
    match i % 4 {
        0 => a2_node(&name, GPUS_PER_NODE, 4),
        1 => l40s_node(&name, GPUS_PER_NODE, 4),
        2 => h200_node(&name, GPUS_PER_NODE, 7),
        _ => whole_node(&name, GPUS_PER_NODE),
    }
}

/// A fleet of `n` mixed nodes.
pub fn mixed_fleet(n: usize) -> Fleet {
    Fleet {
        nodes: (0..n).map(mixed_node).collect(),
        ..Fleet::default()
    }
}

/// A fleet of `n` passthrough nodes with 8 whole GPUs each.
pub fn whole_fleet(n: usize) -> Fleet {
    Fleet {
        nodes: (0..n)
            .map(|i| whole_node(&format!("node-{i:06}"), GPUS_PER_NODE))
            .collect(),
        ..Fleet::default()
    }
}

fn one(name: String, request: DeviceRequest) -> Machine {
    Machine {
        name,
        devices: vec![request],
        ..Machine::default()
    }
}

/// The Machine of `place/10k_nodes/refusal`: more A2-4Q vGPUs than any node holds, so every
/// node is asked why not.
pub fn too_big_machine() -> Machine {
    one(
        "too-big".into(),
        DeviceRequest {
            name: "gpu".into(),
            profile: Some("A2-4Q".into()),
            count: Some(64),
            ..DeviceRequest::default()
        },
    )
}

/// The `i`-th Machine of a workload of typical requests, ten kinds in turn: three A2-4Q
/// desktops, three L40S-8Q workstations, three one-slice H200 inference vGPUs and one whole
/// GPU. A fleet of `n` mixed nodes holds `n * 10` of them.
pub fn workload_machine(i: usize) -> Machine {
    let vgpu = |profile: &str| DeviceRequest {
        name: "gpu".into(),
        profile: Some(profile.into()),
        ..DeviceRequest::default()
    };
    let request = match i % 10 {
        0..=2 => vgpu("NVIDIA A2-4Q"),
        3..=5 => vgpu("L40S-8Q"),
        6..=8 => vgpu("H200X-1-18C"),
        _ => DeviceRequest {
            name: "gpu".into(),
            vendor: Some("nvidia".into()),
            model: Some("H100".into()),
            ..DeviceRequest::default()
        },
    };
    one(format!("vm-{i:07}"), request)
}

/// A Machine asking for 8 whole GPUs.
pub fn eight_gpu_machine(i: usize) -> Machine {
    one(
        format!("big-{i:07}"),
        DeviceRequest {
            name: "gpus".into(),
            vendor: Some("nvidia".into()),
            count: Some(8),
            ..DeviceRequest::default()
        },
    )
}

/// A fleet of `n` H200 nodes (8 GPUs, 7 VFs each) offering MIG-backed vGPUs.
pub fn h200_fleet(n: usize) -> Fleet {
    Fleet {
        nodes: (0..n)
            .map(|i| gpu_sched::testing::h200_node(&format!("node-{i:06}"), GPUS_PER_NODE, 7))
            .collect(),
        ..Fleet::default()
    }
}

/// A Machine asking for 56 one-slice MIG-backed vGPUs: every slice of an 8-GPU H200 node.
pub fn all_slices_machine(i: usize) -> Machine {
    one(
        format!("slices-{i:07}"),
        DeviceRequest {
            name: "mig".into(),
            profile: Some("H200X-1-18C".into()),
            count: Some(56),
            ..DeviceRequest::default()
        },
    )
}

/// Node `i` of the churn fleet: as [`mixed_node`], with the VFs the drivers create by default
/// (16 per A2, 32 per L40S: one per instance of the smallest type), so that the number of VFs
/// never caps small vGPUs below what the framebuffer holds.
pub fn churn_node(i: usize) -> NodeTopology {
    let name = format!("node-{i:06}");
    match i % 4 {
        0 => a2_node(&name, GPUS_PER_NODE, 16),
        1 => l40s_node(&name, GPUS_PER_NODE, 32),
        2 => h200_node(&name, GPUS_PER_NODE, 7),
        _ => whole_node(&name, GPUS_PER_NODE),
    }
}

/// A churn fleet of `n` nodes.
pub fn churn_fleet(n: usize) -> Fleet {
    Fleet {
        nodes: (0..n).map(churn_node).collect(),
        ..Fleet::default()
    }
}
