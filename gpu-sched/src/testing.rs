//! Node builders shaped like real hosts, for tests, examples and benchmarks (feature `testing`).
//!
//! Each builder returns a [`NodeTopology`] as discovery would report it for an idle host: the
//! kernel's mbochs sample parent, an NVIDIA A2 with SR-IOV VFs as mdev parents, an L40S and an
//! H200 with vendor-specific VFIO VFs (the H200 with MIG-backed types), and plain whole GPUs.
//! Counts follow the real drivers: every free VF reports one instance of each type, and the pool
//! of the physical GPU says how many truly fit.

use gpu_core::{
    ClassCode, Function, Gpu, GpuState, Health, MediatedDevices, NodeTopology, ParentId,
    PciAddress, PciId, Pool, Profile, Sriov, VgpuFramework, VgpuTypeId,
};

fn addr(bus: u32, device: u32, function: u32) -> PciAddress {
    PciAddress::new(
        0,
        (bus & 0xff) as u8,
        (device & 0x1f) as u8,
        (function & 7) as u8,
    )
    .unwrap_or_else(|_| unreachable!("bus, device and function are masked into range"))
}

/// The address of VF `i` of a PF at `bus:00.0` with `sriov_offset=4`, `sriov_stride=1`
/// (A2: 08:00.4 … 08:02.3).
pub fn vf_address(bus: u32, i: u32) -> PciAddress {
    let n = 4 + i;
    addr(bus, n / 8, n % 8)
}

fn profile(id: &str, name: &str, fb: u64, avail: u32, mig: Option<u8>) -> Profile {
    Profile {
        id: VgpuTypeId::from_str_unchecked(id),
        name: name.to_owned(),
        framebuffer_mib: Some(fb),
        max_instances: None,
        available_instances: avail,
        reported_instances: Some(avail),
        device_api: "vfio-pci".to_owned(),
        mig_slices: mig,
        mig_memory_gib: mig.map(|_| u32::try_from(fb / 1024).unwrap_or(u32::MAX)),
        description: None,
    }
}

/// A physical NVIDIA GPU at `bus:00.0` with its HD audio function.
pub fn nvidia_gpu(name: &str, bus: u32, device_id: u16, model: &str, memory_mib: u64) -> Gpu {
    let a = addr(bus, 0, 0);
    let mut g = Gpu::new(name, a, 0x10de, device_id, 0x030200);
    g.model = model.to_owned();
    g.memory_mib = Some(memory_mib);
    g.numa_node = Some(if bus < 0x80 { 0 } else { 1 });
    g.iommu_group = Some(bus);
    g.driver = Some("nvidia".to_owned());
    g.health = Health::healthy();
    g.functions = vec![Function {
        address: addr(bus, 0, 1),
        class: ClassCode(0x040300),
        device_id: PciId(0x22ba),
        driver: None,
    }];
    g
}

fn bus_of(i: usize) -> u32 {
    // Spread GPUs over both sockets: 4 below 0x80, 4 above, as on 8-GPU servers.
    let i = u32::try_from(i).unwrap_or(0);
    if i < 4 {
        0x10 + i * 0x10
    } else {
        0x90 + (i - 4) * 0x10
    }
}

/// A node with the kernel's `mbochs` sample driver: one virtual parent, a 256 MiB pool, types
/// small/medium/large of 4/16/64 MiB (64/16/4 available).
pub fn mbochs_node(node: &str) -> NodeTopology {
    let parent = ParentId::Named("mbochs".to_owned());
    let mut n = NodeTopology::new(node);
    n.mediated_devices = MediatedDevices {
        parents: vec![gpu_core::Parent {
            id: parent.clone(),
            gpu: None,
            framework: VgpuFramework::Mdev,
            health: Health::healthy(),
            profiles: vec![
                profile("mbochs-small", "mbochs-small", 4, 64, None),
                profile("mbochs-medium", "mbochs-medium", 16, 16, None),
                profile("mbochs-large", "mbochs-large", 64, 4, None),
            ],
            instances: vec![],
            warnings: vec![],
        }],
        pools: vec![Pool {
            gpu: parent.clone(),
            parents: vec![parent],
            total_mib: 256,
            used_mib: 0,
            size_locked_mib: None,
            // The same-size rule is NVIDIA's; mbochs types coexist (63/15/3 after one small).
            mixed_size: true,
            mig_slices_total: None,
            mig_slices_used: None,
            mig_slots: None,
        }],
    };
    n
}

#[allow(clippy::too_many_arguments)]
fn sriov_node(
    node: &str,
    gpus: usize,
    vfs: u32,
    framework: VgpuFramework,
    gpu: impl Fn(usize, u32) -> Gpu,
    types: &[Profile],
    total_mib: u64,
    mig: bool,
) -> NodeTopology {
    let mut n = NodeTopology::new(node);
    for i in 0..gpus {
        let bus = bus_of(i);
        let mut g = gpu(i, bus);
        let vf_addrs: Vec<PciAddress> = (0..vfs).map(|v| vf_address(bus, v)).collect();
        g.sriov = Some(Sriov {
            total_vfs: vfs,
            num_vfs: vfs,
            vfs: vf_addrs.clone(),
            vf_device_id: None,
            ..Sriov::default()
        });
        g.vgpu_framework = Some(framework);
        // With VFs enabled for vGPUs the card cannot be passed through whole.
        g.state = GpuState::InUse;
        g.state_reason = Some("SR-IOV VFs enabled for vGPUs".to_owned());
        let pf = g.address;
        let mut parents = Vec::new();
        for vf in vf_addrs {
            parents.push(ParentId::Pci(vf));
            n.mediated_devices.parents.push(gpu_core::Parent {
                id: ParentId::Pci(vf),
                gpu: Some(pf),
                framework,
                health: Health::healthy(),
                profiles: types.to_vec(),
                instances: vec![],
                warnings: vec![],
            });
        }
        n.mediated_devices.pools.push(Pool {
            gpu: ParentId::Pci(pf),
            parents,
            total_mib,
            used_mib: 0,
            size_locked_mib: None,
            mixed_size: false,
            mig_slices_total: mig.then_some(7),
            mig_slices_used: mig.then_some(0),
            mig_slots: None,
        });
        n.gpus.push(g);
    }
    n
}

/// The A2's time-sliced types (IDs of the 550 driver's mdev types).
pub fn a2_types() -> Vec<Profile> {
    [
        ("nvidia-744", "NVIDIA A2-1Q", 1024),
        ("nvidia-745", "NVIDIA A2-2Q", 2048),
        ("nvidia-746", "NVIDIA A2-4Q", 4096),
        ("nvidia-747", "NVIDIA A2-8Q", 8192),
        ("nvidia-748", "NVIDIA A2-16Q", 16384),
        ("nvidia-754", "NVIDIA A2-4C", 4096),
        ("nvidia-755", "NVIDIA A2-8C", 8192),
        ("nvidia-756", "NVIDIA A2-16C", 16384),
    ]
    .iter()
    .map(|(id, name, fb)| profile(id, name, *fb, 1, None))
    .collect()
}

/// A node with `gpus` NVIDIA A2 (16 GiB) in the mdev framework, `vfs` VFs each as parents.
pub fn a2_node(node: &str, gpus: usize, vfs: u32) -> NodeTopology {
    sriov_node(
        node,
        gpus,
        vfs,
        VgpuFramework::Mdev,
        |i, bus| nvidia_gpu(&format!("nvidia{i}"), bus, 0x25b6, "A2", 16384),
        &a2_types(),
        16384,
        false,
    )
}

/// The L40S's time-sliced types (vendor-VFIO IDs).
pub fn l40s_types() -> Vec<Profile> {
    [
        ("1147", "NVIDIA L40S-1Q", 1024),
        ("1148", "NVIDIA L40S-2Q", 2048),
        ("1150", "NVIDIA L40S-4Q", 4096),
        ("1152", "NVIDIA L40S-8Q", 8192),
        ("1154", "NVIDIA L40S-16Q", 16384),
        ("1155", "NVIDIA L40S-24Q", 24576),
        ("1156", "NVIDIA L40S-48Q", 49152),
    ]
    .iter()
    .map(|(id, name, fb)| profile(id, name, *fb, 1, None))
    .collect()
}

/// A node with `gpus` NVIDIA L40S (48 GiB) in the vendor-specific VFIO framework.
pub fn l40s_node(node: &str, gpus: usize, vfs: u32) -> NodeTopology {
    sriov_node(
        node,
        gpus,
        vfs,
        VgpuFramework::VendorVfio,
        |i, bus| nvidia_gpu(&format!("nvidia{i}"), bus, 0x26b9, "L40S", 49152),
        &l40s_types(),
        49152,
        false,
    )
}

/// The H200's MIG-backed types (vendor-VFIO IDs; 7 slices per GPU).
pub fn h200_types() -> Vec<Profile> {
    [
        ("1414", "NVIDIA H200X-1-18C", 18432, 1u8),
        ("1418", "NVIDIA H200X-2-35C", 35840, 2),
        ("1421", "NVIDIA H200X-3-71C", 72704, 3),
        ("1424", "NVIDIA H200X-4-71C", 72704, 4),
        ("1427", "NVIDIA H200X-7-141C", 144384, 7),
    ]
    .iter()
    .map(|(id, name, fb, s)| profile(id, name, *fb, 1, Some(*s)))
    .collect()
}

/// A node with `gpus` NVIDIA H200 (141 GB) offering MIG-backed vGPUs through `vfs` VFs each.
pub fn h200_node(node: &str, gpus: usize, vfs: u32) -> NodeTopology {
    sriov_node(
        node,
        gpus,
        vfs,
        VgpuFramework::VendorVfio,
        |i, bus| nvidia_gpu(&format!("nvidia{i}"), bus, 0x2335, "H200 SXM", 144384),
        &h200_types(),
        144384,
        true,
    )
}

/// A node with `gpus` whole NVIDIA H100 (80 GiB) for passthrough, half on each NUMA node.
pub fn whole_node(node: &str, gpus: usize) -> NodeTopology {
    let mut n = NodeTopology::new(node);
    for i in 0..gpus {
        let mut g = nvidia_gpu(&format!("nvidia{i}"), bus_of(i), 0x2330, "H100 SXM", 81920);
        g.driver = Some("vfio-pci".to_owned());
        g.state = GpuState::Free;
        n.gpus.push(g);
    }
    n
}

/// What `gpuslice place --save` records for `machine` (a Machine document) placed on `node`
/// alone with the default policy: the allocation, `pending`.
///
/// # Panics
/// When the document is not a Machine or it does not fit: a test's own input.
#[allow(clippy::expect_used)]
pub fn placed_on(node: NodeTopology, machine: serde_json::Value) -> gpu_core::Allocation {
    let fleet = gpu_core::Fleet {
        nodes: vec![node],
        allocations: Vec::new(),
        templates: Default::default(),
    };
    let mut state = crate::FleetState::new(fleet).expect("a fleet of one node");
    let m: gpu_core::Machine = serde_json::from_value(machine).expect("a Machine document");
    state
        .place(&m, crate::Policy::default())
        .expect("the Machine fits")
}

/// An HGX H100 8-GPU node for whole-GPU passthrough behind NVSwitches: [`whole_node`]'s eight
/// GPUs (module IDs 1-8 in address order), four NVSwitches, Fabric Manager reachable in shared
/// NVSwitch mode and NVIDIA's default partitions ([`gpu_core::hgx8_default_partitions`]), none
/// active.
pub fn hgx_node(node: &str) -> NodeTopology {
    let mut n = whole_node(node, 8);
    let members: Vec<(String, PciAddress)> =
        n.gpus.iter().map(|g| (g.name.clone(), g.address)).collect();
    n.fabric = Some(gpu_core::Fabric {
        nvswitches: (0..4).map(|i| addr(0x05 + i, 0, 0)).collect(),
        fabric_manager: gpu_core::FabricManager::reachable(gpu_core::FabricMode::SharedNvswitch),
        partitions: gpu_core::hgx8_default_partitions(&members).unwrap_or_default(),
    });
    n
}

/// A Machine asking for vGPUs: one request `r0`, `r1`, ... per `(profile, count)`.
///
/// # Panics
/// When a profile name makes the Machine's text invalid (a quote in it): test input only.
#[allow(clippy::expect_used)]
pub fn vgpu_machine(name: &str, wants: &[(&str, u32)]) -> gpu_core::Machine {
    let devices: Vec<String> = wants
        .iter()
        .enumerate()
        .map(|(i, (profile, count))| {
            format!("{{name: r{i}, profile: \"{profile}\", count: {count}}}")
        })
        .collect();
    gpu_core::Machine::from_text(&format!("name: {name}\ndevices: [{}]", devices.join(", ")))
        .expect("a valid Machine")
}
