#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! The example fleet in `examples/fleet/` is built from the same node builders the tests use, and
//! must keep placing as its README says. `GPUSLICE_UPDATE_EXAMPLES=1` rewrites it.

use gpu_core::{
    AllocatedDevice, Allocation, AllocationStatus, DeviceRequest, Fleet, Health, HealthState,
    Machine,
};
use gpu_sched::testing::{a2_node, h200_node, mbochs_node, whole_node};
use gpu_sched::{FleetState, Policy};

fn example_fleet() -> Fleet {
    let mut h100 = whole_node("gpu-h100", 4);
    h100.gpus[1].health = Health {
        state: HealthState::Degraded,
        reasons: vec!["link x8 of x16".into()],
    };
    h100.gpus[3].health = Health {
        state: HealthState::Unhealthy,
        reasons: vec!["uncorrectable ECC errors".into()],
    };
    let g3 = &h100.gpus[3];
    let train = Allocation {
        machine: "train-1".into(),
        node: "gpu-h100".into(),
        status: AllocationStatus::Created,
        devices: vec![AllocatedDevice::Gpu {
            request: "gpu".into(),
            name: g3.name.clone(),
            address: g3.address,
            functions: g3.functions.iter().map(|f| f.address).collect(),
            memory_mib: g3.memory_mib,
        }],
    };
    let mut f = Fleet {
        nodes: vec![
            a2_node("gpu-a2", 1, 4),
            mbochs_node("gpu-mbochs"),
            h100,
            whole_node("gpu-h100-b", 2),
            h200_node("gpu-h200", 1, 4),
        ],
        allocations: vec![train],
        ..Fleet::default()
    };
    f.templates.insert(
        "desktop".into(),
        DeviceRequest {
            name: "desktop".into(),
            vendor: Some("nvidia".into()),
            profile: Some("A2-4Q".into()),
            ..DeviceRequest::default()
        },
    );
    f
}

fn examples_dir() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/fleet")
}

#[test]
fn the_example_fleet_file_matches_the_builders() {
    let want = serde_yaml_ng::to_string(&example_fleet()).unwrap();
    let path = examples_dir().join("fleet.yaml");
    if std::env::var_os("GPUSLICE_UPDATE_EXAMPLES").is_some() {
        std::fs::write(&path, &want).unwrap();
    }
    let have = std::fs::read_to_string(&path).unwrap();
    assert_eq!(have, want, "run with GPUSLICE_UPDATE_EXAMPLES=1 to refresh");
}

#[test]
fn the_example_machines_place_as_documented() {
    let mut s = FleetState::new(example_fleet()).unwrap();
    let read = |f: &str| {
        Machine::from_text(&std::fs::read_to_string(examples_dir().join(f)).unwrap()).unwrap()
    };
    assert_eq!(
        s.place(&read("desktop.yaml"), Policy::Binpack)
            .unwrap()
            .node,
        "gpu-a2"
    );
    assert_eq!(
        s.place(&read("inference-mig.yaml"), Policy::Binpack)
            .unwrap()
            .node,
        "gpu-h200"
    );
    let train = s
        .place_detailed(&read("training.yaml"), Policy::Binpack)
        .unwrap();
    assert_eq!(train.allocation.node, "gpu-h100-b");
    assert!(s.place(&read("too-big.yaml"), Policy::Binpack).is_err());
}
