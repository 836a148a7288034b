#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! NVSwitch partitions in DRA: each whole GPU names its partition of each size (NVIDIA's DRA
//! driver's attribute names), in every Kubernetes version's slices; a claim whose whole GPUs are
//! no partition is refused before anything is planned, naming the partitions that would do.

use gpu_core::{
    Fabric, FabricManager, FabricMode, Gpu, GpuState, NodeTopology, PciAddress,
    hgx8_default_partitions,
};
use gpu_integrations::dra::build::node_slices;
use gpu_integrations::dra::device_name::gpu_device_name;
use gpu_integrations::dra::model::{DeviceAllocationResult, DeviceAttribute, DeviceResult};
use gpu_integrations::dra::prepare::plan_prepare;
use gpu_integrations::dra::{DEFAULT_DRIVER, DraOptions, K8sVersion};

fn addr(i: usize) -> PciAddress {
    format!(
        "0000:{:02x}:00.0",
        [0x18, 0x2a, 0x3a, 0x5d, 0x9a, 0xab, 0xba, 0xdb][i]
    )
    .parse()
    .unwrap()
}

/// An HGX H100 node: eight free H100 SXM (modules 1-8 in address order), Fabric Manager in
/// `mode`, NVIDIA's default partitions.
fn hgx(mode: FabricMode) -> NodeTopology {
    let mut n = NodeTopology::new("hgx-1");
    for i in 0..8 {
        let mut g = Gpu::new(format!("nvidia{i}"), addr(i), 0x10de, 0x2330, 0x030200);
        g.state = GpuState::Free;
        g.memory_mib = Some(81559);
        g.iommu_group = Some(10 + i as u32);
        n.gpus.push(g);
    }
    let members: Vec<(String, PciAddress)> =
        n.gpus.iter().map(|g| (g.name.clone(), g.address)).collect();
    n.fabric = Some(Fabric {
        nvswitches: vec![],
        fabric_manager: FabricManager::reachable(mode),
        partitions: hgx8_default_partitions(&members).unwrap(),
    });
    n
}

fn int(d: &gpu_integrations::dra::model::Device, name: &str) -> Option<i64> {
    match d.attributes.get(name) {
        Some(DeviceAttribute::Int(v)) => Some(*v),
        None => None,
        other => panic!("{name}: {other:?}"),
    }
}

#[test]
fn every_whole_gpu_names_its_partition_of_each_size_in_every_version() {
    let node = hgx(FabricMode::SharedNvswitch);
    for version in [
        K8sVersion::V1_34,
        K8sVersion::V1_35,
        K8sVersion::V1_36,
        K8sVersion::V1_36_2,
        K8sVersion::V1_37,
    ] {
        let opts = DraOptions {
            version,
            ..DraOptions::default()
        };
        let slices = node_slices(&node, &opts).unwrap();
        let devices: Vec<_> = slices
            .slices
            .iter()
            .flat_map(|s| s.spec.devices.iter())
            .collect();
        // nvidia5 is module 6: partitions 13 (one GPU), 7 (modules 6, 8), 2 (1, 2, 5, 6), 1.
        let d = devices
            .iter()
            .find(|d| d.name == gpu_device_name(&addr(5)))
            .unwrap();
        assert_eq!(int(d, "gpuModuleID"), Some(6), "{version}");
        assert_eq!(int(d, "partition1"), Some(13));
        assert_eq!(int(d, "partition2"), Some(7));
        assert_eq!(int(d, "partition4"), Some(2));
        assert_eq!(int(d, "partition8"), Some(1));
        // The GPUs sharing a partition2 value are exactly that partition's members.
        let pair: Vec<&str> = devices
            .iter()
            .filter(|d| int(d, "partition2") == Some(7))
            .map(|d| d.name.as_str())
            .collect();
        assert_eq!(pair, [gpu_device_name(&addr(5)), gpu_device_name(&addr(7))]);
    }
}

#[test]
fn without_fabric_manager_no_partition_is_published() {
    let mut node = hgx(FabricMode::SharedNvswitch);
    let f = node.fabric.as_mut().unwrap();
    f.fabric_manager = FabricManager::unreachable("libnvfm.so.1 not found");
    f.partitions.clear();
    let slices = node_slices(&node, &DraOptions::default()).unwrap();
    for d in slices.slices.iter().flat_map(|s| s.spec.devices.iter()) {
        assert!(
            !d.attributes.keys().any(|k| k.starts_with("partition")),
            "{}",
            d.name
        );
    }
}

fn claim(node: &NodeTopology, gpus: &[usize]) -> DeviceAllocationResult {
    DeviceAllocationResult {
        results: gpus
            .iter()
            .map(|&i| DeviceResult {
                request: "gpus".into(),
                driver: DEFAULT_DRIVER.into(),
                pool: node.node.clone(),
                device: gpu_device_name(&addr(i)),
                share_id: None,
                consumed_capacity: Default::default(),
            })
            .collect(),
        config: vec![],
    }
}

#[test]
fn a_claim_of_one_partitions_gpus_is_planned() {
    let node = hgx(FabricMode::SharedNvswitch);
    let plan = plan_prepare(&claim(&node, &[0, 1, 4, 5]), "uid-1", DEFAULT_DRIVER, &node);
    assert_eq!(plan.unwrap().len(), 4);
    let plan = plan_prepare(&claim(&node, &[7, 5]), "uid-2", DEFAULT_DRIVER, &node).unwrap();
    let gpus = gpu_integrations::dra::prepare::bound_gpus(&plan);
    let p = gpu_integrations::dra::partition::claim_partition(&gpus, &node).unwrap();
    assert_eq!(p.map(|p| p.id), Some(7));
}

#[test]
fn a_claim_whose_gpus_are_no_partition_is_refused_naming_those_that_would_do() {
    let node = hgx(FabricMode::SharedNvswitch);
    let e = plan_prepare(&claim(&node, &[0, 1]), "uid-1", DEFAULT_DRIVER, &node).unwrap_err();
    assert_eq!(e.kind(), gpu_core::ErrorKind::InvalidRequest);
    assert_eq!(
        e.to_string(),
        "GPUs nvidia0, nvidia1 are no NVSwitch partition of this node (a VM's \
         GPUs talk over NVLink only as one activated partition); would do: partition 4 (nvidia0, \
         nvidia2), partition 5 (nvidia1, nvidia3), partition 6 (nvidia4, nvidia6), partition 7 \
         (nvidia5, nvidia7); nothing was changed"
    );
    // Three GPUs: no partition has three.
    let e = plan_prepare(&claim(&node, &[0, 1, 2]), "uid-1", DEFAULT_DRIVER, &node).unwrap_err();
    assert!(e.to_string().contains("would do: none"), "{e}");
}

#[test]
fn a_degraded_partition_or_an_unreachable_fabric_manager_refuses_several_gpus() {
    let mut node = hgx(FabricMode::SharedNvswitch);
    node.fabric.as_mut().unwrap().partitions[3].degraded = Some("NVLink 2 failed".into());
    let e = plan_prepare(&claim(&node, &[0, 2]), "u", DEFAULT_DRIVER, &node).unwrap_err();
    assert!(
        e.to_string()
            .contains("partition 4 (nvidia0, nvidia2) is degraded (NVLink 2 failed)"),
        "{e}"
    );
    let f = node.fabric.as_mut().unwrap();
    f.fabric_manager = FabricManager::unreachable("connection refused");
    f.partitions.clear();
    let e = plan_prepare(&claim(&node, &[0, 2]), "u", DEFAULT_DRIVER, &node).unwrap_err();
    assert!(
        e.to_string()
            .contains("Fabric Manager cannot be reached (connection refused)"),
        "{e}"
    );
    assert!(plan_prepare(&claim(&node, &[3]), "u", DEFAULT_DRIVER, &node).is_ok());
}

#[test]
fn bare_metal_mode_and_nodes_without_fabric_take_any_set() {
    let mut node = hgx(FabricMode::BareMetal);
    assert!(plan_prepare(&claim(&node, &[0, 1]), "u", DEFAULT_DRIVER, &node).is_ok());
    node.fabric = None;
    assert!(plan_prepare(&claim(&node, &[0, 1, 2]), "u", DEFAULT_DRIVER, &node).is_ok());
}

#[test]
fn the_example_hgx_claim_matches_an_attribute_every_whole_gpu_carries() {
    let path =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/dra/30-claims.yaml");
    let text = std::fs::read_to_string(path).unwrap();
    let docs: Vec<serde_json::Value> = serde_yaml_ng::Deserializer::from_str(&text)
        .map(|d| serde::Deserialize::deserialize(d).unwrap())
        .collect();
    let t = docs
        .iter()
        .find(|d| d["metadata"]["name"] == "hgx-four-gpus-one-partition")
        .unwrap();
    let devices = &t["spec"]["spec"]["devices"];
    assert_eq!(devices["requests"][0]["exactly"]["count"], 4);
    let attr = devices["constraints"][0]["matchAttribute"]
        .as_str()
        .unwrap();
    assert_eq!(attr, format!("{DEFAULT_DRIVER}/partition4"));
    // On the HGX node the GPUs sharing a value of it are four, and they are one partition.
    let node = hgx(FabricMode::SharedNvswitch);
    let slices = node_slices(&node, &DraOptions::default()).unwrap();
    let mut groups: std::collections::BTreeMap<i64, Vec<usize>> = Default::default();
    for d in slices.slices.iter().flat_map(|s| s.spec.devices.iter()) {
        let i = (0..8)
            .find(|&i| d.name == gpu_device_name(&addr(i)))
            .unwrap();
        groups
            .entry(int(d, "partition4").unwrap())
            .or_default()
            .push(i);
    }
    assert_eq!(groups.len(), 2);
    for members in groups.values() {
        let plan = plan_prepare(&claim(&node, members), "u", DEFAULT_DRIVER, &node);
        assert_eq!(plan.unwrap().len(), 4);
    }
}

fn allocation(node: &NodeTopology, gpus: &[usize]) -> gpu_core::Allocation {
    gpu_core::Allocation {
        machine: "vm1".into(),
        node: node.node.clone(),
        status: gpu_core::AllocationStatus::Pending,
        devices: gpus
            .iter()
            .map(|&i| gpu_core::AllocatedDevice::Gpu {
                request: "gpu".into(),
                name: format!("nvidia{i}"),
                address: addr(i),
                functions: vec![],
                memory_mib: Some(81559),
            })
            .collect(),
    }
}

#[test]
fn export_vm_notes_the_partition_and_the_guest_driver_fabric_manager_needs() {
    use gpu_integrations::kubevirt_vm::{dra_virtual_machine, virtual_machine};
    let mut node = hgx(FabricMode::SharedNvswitch);
    node.fabric.as_mut().unwrap().fabric_manager.version = Some("550.90.07".into());
    let a = allocation(&node, &[2, 3, 6, 7]);
    let vm = virtual_machine(&a, &node, None, "nvidia.com", None).unwrap();
    let notes = &vm.metadata.annotations;
    assert_eq!(notes["gpuslice.dev/nvswitch-partition"], "3");
    assert!(
        notes["gpuslice.dev/guest-driver"]
            .starts_with("NVIDIA driver 550.90.07, the version of the host's Fabric Manager"),
        "{notes:?}"
    );
    let (vm, _) = dra_virtual_machine(&a, &node, None, DEFAULT_DRIVER, None).unwrap();
    assert_eq!(
        vm.metadata.annotations["gpuslice.dev/nvswitch-partition"],
        "3"
    );
    // Without a fabric, nothing is noted.
    node.fabric = None;
    let vm = virtual_machine(&a, &node, None, "nvidia.com", None).unwrap();
    assert!(vm.metadata.annotations.is_empty());
}
