#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! Properties of placement on small fleets generated valid by construction: what the driver
//! reports agrees with the pools, instances occupy VFs, allocations are made by the solver itself.

use std::collections::BTreeMap;

use gpu_core::nvidia::strip_prefix;
use gpu_core::{
    AllocatedDevice, Allocation, DeviceRequest, Fleet, Gpu, GpuState, Health, HealthState,
    Instance, Machine, MdevUuid, MiB, NodeTopology, ParentId, Pool, Profile, VgpuFramework,
    VgpuTypeId,
};
use gpu_sched::testing::{nvidia_gpu, vf_address};
use gpu_sched::{FleetState, Policy};
use proptest::prelude::*;

// ------------------------------------------------------------------ generators

#[derive(Debug, Clone)]
enum GpuSpec {
    Whole {
        amd: bool,
        big: bool,
        numa: u32,
        state: GpuState,
        health: HealthState,
    },
    TimeSliced {
        vfs: u32,
        size: u64,
        existing: u32,
        health: HealthState,
    },
    Mig {
        vfs: u32,
        existing: Vec<u8>,
        health: HealthState,
    },
}

fn health() -> impl Strategy<Value = HealthState> {
    prop_oneof![
        4 => Just(HealthState::Healthy),
        1 => Just(HealthState::Degraded),
        1 => Just(HealthState::Unhealthy),
        1 => Just(HealthState::Unknown),
    ]
}

fn gpu_spec() -> impl Strategy<Value = GpuSpec> {
    prop_oneof![
        (
            any::<bool>(),
            any::<bool>(),
            0u32..2,
            prop_oneof![
                4 => Just(GpuState::Free),
                1 => Just(GpuState::InUse),
                1 => Just(GpuState::Blocked)
            ],
            health()
        )
            .prop_map(|(amd, big, numa, state, health)| GpuSpec::Whole {
                amd,
                big,
                numa,
                state,
                health
            }),
        (
            1u32..4,
            prop_oneof![Just(1024u64), Just(2048), Just(4096)],
            0u32..4,
            health()
        )
            .prop_map(|(vfs, size, existing, health)| GpuSpec::TimeSliced {
                vfs,
                size,
                existing: existing.min(vfs).min((16384 / size) as u32),
                health
            }),
        (
            1u32..5,
            proptest::collection::vec(prop_oneof![Just(1u8), Just(2), Just(3)], 0..3),
            health()
        )
            .prop_map(|(vfs, mut existing, health)| {
                // Existing instances each hold a VF and fit in 7 slices.
                existing.truncate(vfs as usize);
                while existing.iter().map(|s| u32::from(*s)).sum::<u32>() > 7 {
                    existing.pop();
                }
                GpuSpec::Mig {
                    vfs,
                    existing,
                    health,
                }
            }),
    ]
}

fn prof(id: &str, name: &str, fb: u64, avail: u32, mig: Option<u8>) -> Profile {
    Profile {
        id: VgpuTypeId::from_str_unchecked(id),
        name: name.into(),
        framebuffer_mib: Some(fb),
        max_instances: None,
        available_instances: avail,
        reported_instances: Some(avail),
        device_api: "vfio-pci".into(),
        mig_slices: mig,
        mig_memory_gib: None,
        description: None,
    }
}

const TS_TYPES: [(&str, &str, u64); 4] = [
    ("nvidia-744", "NVIDIA A2-1Q", 1024),
    ("nvidia-745", "NVIDIA A2-2Q", 2048),
    ("nvidia-746", "NVIDIA A2-4Q", 4096),
    ("nvidia-748", "NVIDIA A2-16Q", 16384),
];
const MIG_TYPES: [(&str, &str, u64, u8); 4] = [
    ("1414", "NVIDIA H200X-1-18C", 18432, 1),
    ("1418", "NVIDIA H200X-2-35C", 35840, 2),
    ("1421", "NVIDIA H200X-3-71C", 72704, 3),
    ("1427", "NVIDIA H200X-7-141C", 144384, 7),
];

fn build_node(name: &str, specs: &[GpuSpec], mbochs: Option<(u32, u32, u32)>) -> NodeTopology {
    let mut n = NodeTopology::new(name);
    let mut nv = 0;
    let mut amd = 0;
    for (i, spec) in specs.iter().enumerate() {
        let bus = 0x10 + 0x10 * i as u32;
        let gname = |amd_card: bool, nv: &mut u32, amdc: &mut u32| {
            if amd_card {
                *amdc += 1;
                format!("radeon{}", *amdc - 1)
            } else {
                *nv += 1;
                format!("nvidia{}", *nv - 1)
            }
        };
        match spec {
            GpuSpec::Whole {
                amd: is_amd,
                big,
                numa,
                state,
                health,
            } => {
                let name = gname(*is_amd, &mut nv, &mut amd);
                let mut g = nvidia_gpu(
                    &name,
                    bus,
                    0x2330,
                    if *big { "H100" } else { "T4" },
                    if *big { 81920 } else { 16384 },
                );
                if *is_amd {
                    g.vendor_id = gpu_core::PciId(0x1002);
                    g.vendor = gpu_core::Vendor::Amd;
                    g.model = "Instinct MI210".into();
                }
                g.numa_node = Some(*numa);
                g.state = *state;
                g.health = Health {
                    state: *health,
                    reasons: vec![],
                };
                n.gpus.push(g);
            }
            GpuSpec::TimeSliced {
                vfs,
                size,
                existing,
                health,
            } => {
                let name = gname(false, &mut nv, &mut amd);
                let mut g = nvidia_gpu(&name, bus, 0x25b6, "A2", 16384);
                // GPUs alternate between two NUMA nodes, for aligned vGPU requests.
                g.numa_node = Some(u32::from(i % 2 == 1));
                g.health.state = *health;
                g.state = if *existing > 0 {
                    GpuState::InUse
                } else {
                    GpuState::Free
                };
                let pf = g.address;
                let used = u64::from(*existing) * size;
                let mut parents = Vec::new();
                for v in 0..*vfs {
                    let vf = vf_address(bus, v);
                    parents.push(ParentId::Pci(vf));
                    let taken = v < *existing;
                    let ty = TS_TYPES.iter().find(|t| t.2 == *size).unwrap();
                    let profiles = TS_TYPES
                        .iter()
                        .map(|(id, nm, fb)| {
                            let fits =
                                !taken && 16384 - used >= *fb && (*existing == 0 || *fb == *size);
                            prof(id, nm, *fb, u32::from(fits), None)
                        })
                        .collect();
                    let instances = if taken {
                        vec![Instance {
                            uuid: Some(MdevUuid::for_machine(name.as_str(), "old", v)),
                            address: None,
                            profile: VgpuTypeId::from_str_unchecked(ty.0),
                            profile_name: Some(ty.1.into()),
                            framebuffer_mib: Some(*size),
                            in_use: Some(true),
                            placement_id: None,
                        }]
                    } else {
                        vec![]
                    };
                    n.mediated_devices.parents.push(gpu_core::Parent {
                        id: ParentId::Pci(vf),
                        gpu: Some(pf),
                        framework: VgpuFramework::Mdev,
                        health: Health {
                            state: *health,
                            reasons: vec![],
                        },
                        profiles,
                        instances,
                        warnings: vec![],
                    });
                }
                n.mediated_devices.pools.push(Pool {
                    gpu: ParentId::Pci(pf),
                    parents,
                    total_mib: 16384,
                    used_mib: used,
                    size_locked_mib: (*existing > 0).then_some(*size),
                    mixed_size: false,
                    mig_slices_total: None,
                    mig_slices_used: None,
                    mig_slots: None,
                });
                n.gpus.push(g);
            }
            GpuSpec::Mig {
                vfs,
                existing,
                health,
            } => {
                let name = gname(false, &mut nv, &mut amd);
                let mut g = nvidia_gpu(&name, bus, 0x2335, "H200", 144384);
                // GPUs alternate between two NUMA nodes, for aligned vGPU requests.
                g.numa_node = Some(u32::from(i % 2 == 1));
                g.health.state = *health;
                g.state = GpuState::InUse;
                let pf = g.address;
                let used: u8 = existing.iter().sum();
                let mut parents = Vec::new();
                for v in 0..*vfs {
                    let vf = vf_address(bus, v);
                    parents.push(ParentId::Pci(vf));
                    let inst = existing.get(v as usize);
                    let profiles = MIG_TYPES
                        .iter()
                        .map(|(id, nm, fb, s)| {
                            let fits = inst.is_none() && used + s <= 7;
                            prof(id, nm, *fb, u32::from(fits), Some(*s))
                        })
                        .collect();
                    let instances = inst
                        .map(|s| {
                            let t = MIG_TYPES.iter().find(|t| t.3 == *s).unwrap();
                            vec![Instance {
                                uuid: None,
                                address: Some(vf),
                                profile: VgpuTypeId::from_str_unchecked(t.0),
                                profile_name: Some(t.1.into()),
                                framebuffer_mib: Some(t.2),
                                in_use: Some(true),
                                placement_id: None,
                            }]
                        })
                        .unwrap_or_default();
                    n.mediated_devices.parents.push(gpu_core::Parent {
                        id: ParentId::Pci(vf),
                        gpu: Some(pf),
                        framework: VgpuFramework::VendorVfio,
                        health: Health {
                            state: *health,
                            reasons: vec![],
                        },
                        profiles,
                        instances,
                        warnings: vec![],
                    });
                }
                n.mediated_devices.pools.push(Pool {
                    gpu: ParentId::Pci(pf),
                    parents,
                    total_mib: 144384,
                    used_mib: 0,
                    size_locked_mib: None,
                    mixed_size: false,
                    mig_slices_total: Some(7),
                    mig_slices_used: Some(used),
                    mig_slots: None,
                });
                n.gpus.push(g);
            }
        }
    }
    if let Some((s, m, l)) = mbochs {
        let used = u64::from(4 * s + 16 * m + 64 * l);
        let left = 256 - used;
        let id = ParentId::Named("mbochs".into());
        let mut instances = Vec::new();
        for (count, ty) in [
            (s, "mbochs-small"),
            (m, "mbochs-medium"),
            (l, "mbochs-large"),
        ] {
            for k in 0..count {
                instances.push(Instance {
                    uuid: Some(MdevUuid::for_machine("host", ty, k)),
                    address: None,
                    profile: VgpuTypeId::from_str_unchecked(ty),
                    profile_name: None,
                    framebuffer_mib: None,
                    in_use: None,
                    placement_id: None,
                });
            }
        }
        n.mediated_devices.parents.push(gpu_core::Parent {
            id: id.clone(),
            gpu: None,
            framework: VgpuFramework::Mdev,
            health: Health::healthy(),
            profiles: vec![
                prof("mbochs-small", "mbochs-small", 4, (left / 4) as u32, None),
                prof(
                    "mbochs-medium",
                    "mbochs-medium",
                    16,
                    (left / 16) as u32,
                    None,
                ),
                prof("mbochs-large", "mbochs-large", 64, (left / 64) as u32, None),
            ],
            instances,
            warnings: vec![],
        });
        n.mediated_devices.pools.push(Pool {
            gpu: id.clone(),
            parents: vec![id],
            total_mib: 256,
            used_mib: used,
            size_locked_mib: None,
            mixed_size: true,
            mig_slices_total: None,
            mig_slices_used: None,
            mig_slots: None,
        });
    }
    n
}

fn mbochs_usage() -> impl Strategy<Value = Option<(u32, u32, u32)>> {
    proptest::option::weighted(0.4, (0u32..8, 0u32..4, 0u32..3)).prop_map(|o| {
        o.map(|(s, m, l)| {
            let (mut s, mut m, mut l) = (s, m, l);
            while 4 * s + 16 * m + 64 * l > 256 {
                if l > 0 {
                    l -= 1
                } else if m > 0 {
                    m -= 1
                } else {
                    s -= 1
                }
            }
            (s, m, l)
        })
    })
}

/// An NVSwitch fabric over a node's GPUs: FM's mode (0 none, 1 shared NVSwitch, 2 bare
/// metal, 3 unreachable) and which partitions are degraded (a bit per partition).
#[derive(Debug, Clone)]
struct FabricSpec {
    mode: u8,
    degraded: u32,
}

fn fabric_spec() -> impl Strategy<Value = FabricSpec> {
    (
        prop_oneof![3 => Just(0u8), 3 => Just(1), 1 => Just(2), 1 => Just(3)],
        prop_oneof![3 => Just(0u32), 1 => any::<u32>()],
    )
        .prop_map(|(mode, degraded)| FabricSpec { mode, degraded })
}

/// Partitions over the node's GPUs in address order: one per GPU, the pairs (0, 1) and
/// (2, 3), and one of all of them when there are three or more, like a small baseboard.
fn with_fabric(mut n: NodeTopology, f: &FabricSpec) -> NodeTopology {
    use gpu_core::{Fabric, FabricManager, FabricMode, Partition};
    if f.mode == 0 || n.gpus.is_empty() {
        return n;
    }
    let g: Vec<(String, gpu_core::PciAddress)> =
        n.gpus.iter().map(|g| (g.name.clone(), g.address)).collect();
    let mut sets: Vec<Vec<usize>> = (0..g.len()).map(|i| vec![i]).collect();
    sets.extend((0..g.len() / 2).map(|k| vec![2 * k, 2 * k + 1]));
    if g.len() >= 3 {
        sets.push((0..g.len()).collect());
    }
    let partitions = sets
        .into_iter()
        .enumerate()
        .map(|(id, set)| Partition {
            id: id as u32,
            gpus: set.iter().map(|&i| g[i].0.clone()).collect(),
            addresses: set.iter().map(|&i| g[i].1).collect(),
            module_ids: vec![],
            nvlinks: None,
            active: false,
            degraded: (f.degraded & (1 << id) != 0).then(|| "NVLink failed".to_owned()),
        })
        .collect();
    let fabric_manager = match f.mode {
        1 => FabricManager::reachable(FabricMode::SharedNvswitch),
        2 => FabricManager::reachable(FabricMode::BareMetal),
        _ => FabricManager::unreachable("not running"),
    };
    n.fabric = Some(Fabric {
        nvswitches: vec![],
        partitions: if f.mode == 3 { vec![] } else { partitions },
        fabric_manager,
    });
    n
}

fn node(name: &'static str) -> impl Strategy<Value = NodeTopology> {
    (
        proptest::collection::vec(gpu_spec(), 0..4),
        mbochs_usage(),
        fabric_spec(),
    )
        .prop_map(move |(specs, mb, f)| with_fabric(build_node(name, &specs, mb), &f))
}

fn nodes() -> impl Strategy<Value = Vec<NodeTopology>> {
    prop_oneof![
        node("n0").prop_map(|a| vec![a]),
        (node("n0"), node("n1")).prop_map(|(a, b)| vec![a, b]),
        (node("n0"), node("n1"), node("n2")).prop_map(|(a, b, c)| vec![a, b, c]),
    ]
}

const PROFILES: [&str; 13] = [
    "A2-1Q",
    "GRID A2-2Q",
    "nvidia-746",
    "NVIDIA A2-16Q",
    "H200X-1-18C",
    "h200x-2-35c",
    "H200X-3-71C",
    "H200X-7-141C",
    "mbochs-small",
    "mbochs-medium",
    "mbochs-large",
    "1418",
    "A2-8Q",
];

fn request() -> impl Strategy<Value = DeviceRequest> {
    prop_oneof![
        (
            proptest::sample::select(&PROFILES[..]),
            1u32..5,
            proptest::option::weighted(0.2, Just("nvidia".to_owned())),
            proptest::option::weighted(0.2, prop_oneof![Just(2048u64), Just(20480)]),
            proptest::bool::weighted(0.25),
        )
            .prop_map(|(p, count, vendor, min, numa)| DeviceRequest {
                name: "v".into(),
                profile: Some(p.to_owned()),
                count: Some(count),
                vendor,
                min_memory: min.map(MiB),
                alignment: numa.then_some(gpu_core::Alignment::Numa),
                ..DeviceRequest::default()
            }),
        (
            1u32..4,
            proptest::option::weighted(
                0.3,
                prop_oneof![Just("nvidia".to_owned()), Just("amd".to_owned())]
            ),
            proptest::option::weighted(0.2, Just("H100".to_owned())),
            proptest::option::weighted(0.2, Just(40960u64)),
            any::<bool>(),
            proptest::option::weighted(
                0.3,
                prop_oneof![
                    Just(vec!["nvidia0".to_owned()]),
                    Just(vec!["nvidia".to_owned()]),
                    Just(vec!["nvidia1".to_owned(), "nvidia".to_owned()]),
                    Just(vec!["radeon".to_owned()]),
                ]
            ),
            any::<bool>(),
        )
            .prop_map(
                |(count, vendor, model, min, numa, gpus, accel)| DeviceRequest {
                    name: "w".into(),
                    count: Some(gpus.as_ref().map_or(count, |g| count.max(g.len() as u32))),
                    vendor,
                    model,
                    min_memory: min.map(MiB),
                    alignment: numa.then_some(gpu_core::Alignment::Numa),
                    gpus: gpus.unwrap_or_default(),
                    class: if accel {
                        gpu_core::DeviceClass::Accelerator
                    } else {
                        gpu_core::DeviceClass::Gpu
                    },
                    ..DeviceRequest::default()
                }
            ),
    ]
}

fn single(name: &str, r: DeviceRequest) -> Machine {
    Machine {
        name: name.into(),
        devices: vec![r],
        ..Machine::default()
    }
}

fn machine(i: usize) -> impl Strategy<Value = Machine> {
    prop_oneof![
        3 => request().prop_map(move |r| single(&format!("m{i}"), r)),
        1 => (request(), request()).prop_map(move |(a, mut b)| {
            b.name = format!("{}2", b.name);
            Machine {
                name: format!("m{i}"),
                devices: vec![a, b],
                ..Machine::default()
            }
        }),
    ]
}

fn machines() -> impl Strategy<Value = Vec<Machine>> {
    proptest::collection::vec(0usize..1, 1..7).prop_flat_map(|v| {
        v.iter()
            .enumerate()
            .map(|(i, _)| machine(i))
            .collect::<Vec<_>>()
    })
}

fn policy() -> impl Strategy<Value = Policy> {
    prop_oneof![
        Just(Policy::Binpack),
        Just(Policy::Spread),
        Just(Policy::FirstFit)
    ]
}

fn state(nodes: Vec<NodeTopology>) -> FleetState {
    FleetState::new(Fleet {
        nodes,
        ..Fleet::default()
    })
    .unwrap()
}

// ------------------------------------------------------------------ independent checks

fn lcm(values: impl Iterator<Item = u32>) -> u64 {
    let gcd = |mut a: u64, mut b: u64| {
        while b != 0 {
            (a, b) = (b, a % b);
        }
        a
    };
    values
        .filter(|v| *v > 0)
        .fold(1u64, |l, v| l / gcd(l, u64::from(v)) * u64::from(v))
}

fn parent_health(n: &NodeTopology, p: &gpu_core::Parent) -> HealthState {
    let g = p.gpu.and_then(|a| n.gpu_by_address(&a));
    g.map_or(p.health.state, |g| g.health.state.worst(p.health.state))
}

/// Checks every allocation against the snapshot with plain arithmetic: no GPU held twice or
/// both whole and as vGPU host, no parent or pool past its capacity, nothing Unhealthy.
fn check_no_overcommit(f: &Fleet) -> Result<(), String> {
    for n in &f.nodes {
        let allocs: Vec<&Allocation> = f.allocations.iter().filter(|a| a.node == n.node).collect();
        let mut held: BTreeMap<String, u32> = BTreeMap::new();
        let mut per_parent: BTreeMap<String, Vec<VgpuTypeId>> = BTreeMap::new();
        for a in &allocs {
            for d in &a.devices {
                match d {
                    AllocatedDevice::Gpu { address, name, .. } => {
                        let g = n.gpu_by_address(address).ok_or("unknown GPU")?;
                        if g.health.state == HealthState::Unhealthy {
                            return Err(format!("{name} is Unhealthy but allocated"));
                        }
                        if g.state != GpuState::Free {
                            return Err(format!("{name} is {} but allocated whole", g.state));
                        }
                        *held.entry(address.to_string()).or_default() += 1;
                    }
                    AllocatedDevice::Vgpu {
                        parent, profile, ..
                    } => {
                        let p = n.parent(parent).ok_or("unknown parent")?;
                        if parent_health(n, p) == HealthState::Unhealthy {
                            return Err(format!("vGPU on Unhealthy parent {parent}"));
                        }
                        per_parent
                            .entry(parent.to_string())
                            .or_default()
                            .push(profile.clone());
                    }
                }
            }
        }
        if let Some((g, c)) = held.iter().find(|(_, c)| **c > 1) {
            return Err(format!("GPU {g} held {c} times"));
        }
        let mut pools: BTreeMap<String, Pool> = n
            .mediated_devices
            .pools
            .iter()
            .map(|p| (p.gpu.to_string(), p.clone()))
            .collect();
        for (pid, types) in &per_parent {
            let p = n
                .mediated_devices
                .parents
                .iter()
                .find(|p| p.id.to_string() == *pid)
                .unwrap();
            if let Some(g) = p.gpu {
                if held.contains_key(&g.to_string()) {
                    return Err(format!("GPU {g} is held whole and hosts vGPUs"));
                }
            }
            let l = lcm(p.profiles.iter().map(|x| x.available_instances));
            let mut units = 0u64;
            for t in types {
                let pr = p.profiles.iter().find(|x| x.id == *t).unwrap();
                if pr.available_instances == 0 {
                    return Err(format!("{t} on {pid} reported 0 available"));
                }
                units += l / u64::from(pr.available_instances);
                if let Some(pool) = pools.get_mut(&p.pool_key().to_string()) {
                    pool.check(pr)
                        .map_err(|m| format!("pool of {pid} over-committed: {m}"))?;
                    pool.charge(pr);
                }
            }
            let most = largest_count(p);
            if types.len() > most as usize {
                return Err(format!(
                    "parent {pid} holds {} vGPUs; its largest count was {most}",
                    types.len()
                ));
            }
            // The proportional share is the rule only for a parent whose memory is not known: a
            // pool counts by memory, as the kernel does (mbochs: 176 MiB free holds one small and
            // two large, though 44 small or 2 large alone would read as 1 + 44 > 44 shares).
            if !pools.contains_key(&p.pool_key().to_string()) && units > l {
                return Err(format!("parent {pid} over-committed: {units}/{l} units"));
            }
        }
    }
    Ok(())
}

/// The most instances one parent can hold: the kernel counts each type from what is left, so
/// no parent holds more than its largest count (a VF that takes one vGPU reads 1 for every type).
fn largest_count(p: &gpu_core::Parent) -> u32 {
    p.profiles
        .iter()
        .map(|x| x.available_instances)
        .max()
        .unwrap_or(0)
}

type Slot = (usize, usize);

/// What the oracle has handed out so far on one node.
#[derive(Default, Clone)]
struct Taken {
    whole: Vec<gpu_core::PciAddress>,
    vgpus: Vec<Slot>,
    /// Where the Machine's own whole GPUs begin in `whole` (before: other allocations').
    own: usize,
}

/// Whether a Machine fits a node, by trying every combination of devices for every request.
fn oracle_fits_machine(n: &NodeTopology, f: &Fleet, reqs: &[DeviceRequest]) -> bool {
    let allocs: Vec<&Allocation> = f.allocations.iter().filter(|a| a.node == n.node).collect();
    // Instances charged by allocations (none is in the snapshot: the solver made them).
    let existing: Vec<Slot> = allocs
        .iter()
        .flat_map(|a| a.devices.iter())
        .filter_map(|d| match d {
            AllocatedDevice::Vgpu {
                parent, profile, ..
            } => {
                let pi = n
                    .mediated_devices
                    .parents
                    .iter()
                    .position(|p| p.id == *parent)
                    .unwrap();
                let p = &n.mediated_devices.parents[pi];
                Some((
                    pi,
                    p.profiles.iter().position(|x| x.id == *profile).unwrap(),
                ))
            }
            AllocatedDevice::Gpu { .. } => None,
        })
        .collect();
    let mut held: Vec<gpu_core::PciAddress> = allocs
        .iter()
        .flat_map(|a| a.devices.iter())
        .filter_map(|d| match d {
            AllocatedDevice::Gpu { address, .. } => Some(*address),
            AllocatedDevice::Vgpu { .. } => None,
        })
        .collect();
    held.sort();
    let own = held.len();
    let mut taken = Taken {
        whole: held,
        vgpus: existing,
        own,
    };
    go(n, reqs, &mut taken)
}

fn identity_ok(r: &DeviceRequest, g: Option<&Gpu>, size: Option<u64>) -> bool {
    if let Some(v) = &r.vendor {
        let want = gpu_core::Vendor::parse_loose(v).unwrap();
        if g.is_none_or(|g| g.vendor != want) {
            return false;
        }
    }
    if r.class == gpu_core::DeviceClass::Accelerator && g.is_none_or(|g| !g.class.is_compute()) {
        return false;
    }
    if let Some(m) = &r.model {
        if g.is_none_or(|g| !g.model.to_lowercase().contains(&m.to_lowercase())) {
            return false;
        }
    }
    if let Some(min) = r.min_memory {
        if size.is_none_or(|s| s < min.0) {
            return false;
        }
    }
    true
}

/// Every vGPU handed out so far, with the new ones, within parent units and pools.
fn vgpus_valid(n: &NodeTopology, all: &[Slot]) -> bool {
    let mut units: BTreeMap<usize, u64> = BTreeMap::new();
    let mut pools: BTreeMap<String, Pool> = n
        .mediated_devices
        .pools
        .iter()
        .map(|p| (p.gpu.to_string(), p.clone()))
        .collect();
    for &(pi, ti) in all {
        let p = &n.mediated_devices.parents[pi];
        let pr = &p.profiles[ti];
        if pr.available_instances == 0 {
            return false;
        }
        // A parent alone in a pool that sizes every type is bounded by the pool and each
        // type's count (mbochs with its sizes read); others by their units.
        let pooled = n
            .pool(&p.pool_key())
            .is_some_and(|pl| pl.parents.len() == 1)
            && p.profiles
                .iter()
                .filter(|x| x.device_api == "vfio-pci")
                .all(|x| x.framebuffer_mib.is_some() && x.mig_slices.is_none());
        if pooled {
            let same = all.iter().filter(|s| **s == (pi, ti)).count();
            if same > pr.available_instances as usize {
                return false;
            }
            if all.iter().filter(|s| s.0 == pi).count() > largest_count(p) as usize {
                return false;
            }
        } else {
            let l = lcm(p.profiles.iter().map(|x| x.available_instances));
            let u = units.entry(pi).or_default();
            *u += l / u64::from(pr.available_instances);
            if *u > l {
                return false;
            }
        }
        if let Some(pool) = pools.get_mut(&p.pool_key().to_string()) {
            if pool.check(pr).is_err() {
                return false;
            }
            pool.charge(pr);
        }
    }
    true
}

fn go(n: &NodeTopology, reqs: &[DeviceRequest], taken: &mut Taken) -> bool {
    let Some((r, rest)) = reqs.split_first() else {
        // The Machine's whole GPUs, of every request, are one set on an NVSwitch node.
        let mine: Vec<&Gpu> = taken.whole[taken.own..]
            .iter()
            .filter_map(|a| n.gpu_by_address(a))
            .collect();
        return mine.is_empty() || fabric_allows(n, &mine);
    };
    let want = r.wanted() as usize;
    let hosts_vgpu = |g: &Gpu, taken: &Taken| {
        n.mediated_devices
            .parents
            .iter()
            .any(|p| p.gpu == Some(g.address) && !p.instances.is_empty())
            || taken
                .vgpus
                .iter()
                .any(|(pi, _)| n.mediated_devices.parents[*pi].gpu == Some(g.address))
    };
    if let Some(text) = &r.profile {
        let t = strip_prefix(text).to_lowercase();
        let mut slots: Vec<Slot> = Vec::new();
        for (pi, p) in n.mediated_devices.parents.iter().enumerate() {
            let g = p.gpu.and_then(|a| n.gpu_by_address(&a));
            if parent_health(n, p) == HealthState::Unhealthy
                || g.is_some_and(|g| taken.whole.contains(&g.address))
            {
                continue;
            }
            for (ti, pr) in p.profiles.iter().enumerate() {
                let matches = pr.id.as_str().to_lowercase() == t
                    || strip_prefix(&pr.name).to_lowercase() == t;
                if matches && identity_ok(r, g, pr.framebuffer_mib) {
                    slots.push((pi, ti));
                }
            }
        }
        // Multisets of `want` slots, by non-decreasing index.
        fn rec(
            n: &NodeTopology,
            slots: &[Slot],
            start: usize,
            left: usize,
            taken: &mut Taken,
            rest: &[DeviceRequest],
        ) -> bool {
            if left == 0 {
                return go(n, rest, taken);
            }
            for i in start..slots.len() {
                taken.vgpus.push(slots[i]);
                if vgpus_valid(n, &taken.vgpus) && rec(n, slots, i, left - 1, taken, rest) {
                    return true;
                }
                taken.vgpus.pop();
            }
            false
        }
        if r.alignment.is_none() {
            return rec(n, &slots, 0, want, taken, rest);
        }
        // Aligned: all instances on GPUs of one NUMA node (parents without a GPU: no node).
        let numa_of = |s: &Slot| {
            n.mediated_devices.parents[s.0]
                .gpu
                .and_then(|a| n.gpu_by_address(&a))
                .and_then(|g| g.numa_node)
        };
        let mut nodes: Vec<Option<u32>> = slots.iter().map(numa_of).collect();
        nodes.sort_unstable();
        nodes.dedup();
        return nodes.into_iter().any(|x| {
            let on: Vec<Slot> = slots.iter().copied().filter(|s| numa_of(s) == x).collect();
            rec(n, &on, 0, want, taken, rest)
        });
    }
    let exact: Vec<&String> = r
        .gpus
        .iter()
        .filter(|g| g.chars().any(|c| c.is_ascii_digit()))
        .collect();
    let families: Vec<&String> = r
        .gpus
        .iter()
        .filter(|g| !g.chars().any(|c| c.is_ascii_digit()))
        .collect();
    let cands: Vec<&Gpu> = n
        .gpus
        .iter()
        .filter(|g| {
            (r.gpus.is_empty()
                || exact.contains(&&g.name)
                || families
                    .iter()
                    .any(|f| g.name.trim_end_matches(|c: char| c.is_ascii_digit()) == f.as_str()))
                && identity_ok(r, Some(g), g.memory_mib)
                && g.state == GpuState::Free
                && g.health.state != HealthState::Unhealthy
                && !taken.whole.contains(&g.address)
                && !hosts_vgpu(g, taken)
        })
        .collect();
    let k = cands.len();
    for mask in 0u32..(1 << k) {
        let chosen: Vec<&Gpu> = (0..k)
            .filter(|i| mask & (1 << i) != 0)
            .map(|i| cands[i])
            .collect();
        let ok = chosen.len() == want
            && exact.iter().all(|e| chosen.iter().any(|g| g.name == **e))
            && (r.alignment.is_none() || chosen.iter().all(|g| g.numa_node == chosen[0].numa_node));
        if !ok {
            continue;
        }
        let before = taken.whole.len();
        taken.whole.extend(chosen.iter().map(|g| g.address));
        if go(n, rest, taken) {
            return true;
        }
        taken.whole.truncate(before);
    }
    false
}

/// NVIDIA's rule on an NVSwitch node that activates partitions: a VM's set of GPUs is exactly
/// one healthy partition; without Fabric Manager, no set of several GPUs.
fn fabric_allows(n: &NodeTopology, chosen: &[&Gpu]) -> bool {
    let Some(f) = n.fabric.as_ref().filter(|f| f.requires_partitions()) else {
        return true;
    };
    if !f.fabric_manager.is_reachable() {
        return chosen.len() <= 1;
    }
    let addrs: Vec<gpu_core::PciAddress> = chosen.iter().map(|g| g.address).collect();
    f.partitions
        .iter()
        .any(|p| p.is_healthy() && p.has_exactly(&addrs))
}

fn place_all(s: &mut FleetState, ms: &[Machine], policy: Policy) -> Vec<bool> {
    ms.iter().map(|m| s.place(m, policy).is_ok()).collect()
}

fn config() -> ProptestConfig {
    ProptestConfig {
        cases: std::env::var("PROPTEST_CASES")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(192),
        failure_persistence: Some(Box::new(
            proptest::test_runner::FileFailurePersistence::Direct(
                "proptest-regressions/properties.txt",
            ),
        )),
        ..ProptestConfig::default()
    }
}

// ------------------------------------------------------------------ properties

proptest! {
    #![proptest_config(config())]

    #[test]
    fn placements_never_over_commit_or_use_unhealthy_gpus(
        nodes in nodes(), ms in machines(), policy in policy()
    ) {
        let mut s = state(nodes);
        place_all(&mut s, &ms, policy);
        let f = s.to_fleet();
        prop_assert_eq!(check_no_overcommit(&f), Ok(()));
        // Reloading the fleet from its data charges the same.
        let again = FleetState::new(f.clone()).unwrap();
        prop_assert_eq!(check_no_overcommit(&again.to_fleet()), Ok(()));
    }

    #[test]
    fn whole_gpu_sets_on_nvswitch_nodes_are_healthy_partitions(
        nodes in nodes(), ms in machines(), policy in policy()
    ) {
        let mut s = state(nodes);
        for m in &ms {
            let Ok(a) = s.place(m, policy) else { continue };
            let n = s.node(&a.node).unwrap();
            for r in &m.devices {
                let set: Vec<&Gpu> = a
                    .devices
                    .iter()
                    .filter(|d| d.request() == r.name)
                    .filter_map(|d| match d {
                        AllocatedDevice::Gpu { address, .. } => n.gpu_by_address(address),
                        AllocatedDevice::Vgpu { .. } => None,
                    })
                    .collect();
                if !set.is_empty() {
                    prop_assert!(fabric_allows(&n, &set), "{:?} on {}", set.iter().map(|g| &g.name).collect::<Vec<_>>(), n.node);
                }
            }
        }
    }

    #[test]
    fn the_compact_state_gives_back_the_topologies_it_was_given(nodes in nodes()) {
        let mut want = nodes.clone();
        want.sort_by(|a, b| a.node.cmp(&b.node));
        let s = state(nodes);
        prop_assert_eq!(s.nodes().collect::<Vec<_>>(), want.clone());
        for n in &want {
            prop_assert_eq!(s.node(&n.node), Some(n.clone()));
        }
    }

    #[test]
    fn a_state_rebuilt_from_its_own_document_places_and_refuses_alike(
        nodes in nodes(), ms in machines(), more in machines(), policy in policy()
    ) {
        let mut live = state(nodes);
        for m in &ms {
            let _ = live.place(m, policy);
        }
        let mut copy = FleetState::new(live.to_fleet()).unwrap();
        for m in &more {
            let a = live.place(m, policy).map_err(|e| e.to_string());
            let b = copy.place(m, policy).map_err(|e| e.to_string());
            prop_assert_eq!(a, b);
        }
    }

    #[test]
    fn a_machine_gets_all_its_devices_on_one_node_or_nothing(
        nodes in nodes(), ms in machines(), policy in policy()
    ) {
        let mut s = state(nodes);
        for m in &ms {
            let before = s.allocations();
            match s.place(m, policy) {
                Ok(a) => {
                    let wanted: u32 = m.devices.iter().map(DeviceRequest::wanted).sum();
                    prop_assert_eq!(a.devices.len() as u32, wanted);
                    prop_assert!(s.nodes().any(|n| n.node == a.node));
                    for r in &m.devices {
                        let got = a.devices.iter().filter(|d| d.request() == r.name).count();
                        prop_assert_eq!(got as u32, r.wanted());
                    }
                }
                Err(_) => prop_assert_eq!(s.allocations(), before),
            }
        }
    }

    #[test]
    fn placement_is_deterministic(nodes in nodes(), ms in machines(), policy in policy()) {
        let mut a = state(nodes.clone());
        let mut b = state(nodes);
        for m in &ms {
            prop_assert_eq!(a.place(m, policy), b.place(m, policy));
        }
        prop_assert_eq!(a.to_fleet(), b.to_fleet());
    }

    #[test]
    fn feasibility_agrees_with_a_brute_force_oracle(
        nodes in nodes(), before in machines(), r in request(), policy in policy()
    ) {
        let mut s = state(nodes);
        place_all(&mut s, &before, policy);
        let f = s.to_fleet();
        let m = single("probe", r.clone());
        let oracle = f.nodes.iter().any(|n| oracle_fits_machine(n, &f, std::slice::from_ref(&r)));
        let got = s.try_place(&m, policy);
        prop_assert_eq!(got.is_ok(), oracle, "solver {:?}", got);
    }

    #[test]
    fn feasibility_of_two_request_machines_agrees_with_the_oracle(
        nodes in nodes(), before in machines(), a in request(), b in request(), policy in policy()
    ) {
        let mut s = state(nodes);
        place_all(&mut s, &before, policy);
        let f = s.to_fleet();
        let mut b = b;
        b.name = "second".into();
        let reqs = vec![a, b];
        let m = Machine { name: "probe".into(), devices: reqs.clone(), ..Machine::default() };
        let oracle = f.nodes.iter().any(|n| oracle_fits_machine(n, &f, &reqs));
        let got = s.try_place(&m, policy);
        prop_assert_eq!(got.is_ok(), oracle, "solver {:?}", got);
    }

    #[test]
    fn more_capacity_never_turns_a_success_into_a_refusal(
        nodes in nodes(), extra in node("zz-extra"), before in machines(), m in machine(99),
        policy in policy()
    ) {
        let mut s = state(nodes.clone());
        place_all(&mut s, &before, policy);
        if s.try_place(&m, policy).is_ok() {
            let mut bigger = s.clone();
            bigger.add_node(extra).unwrap();
            prop_assert!(bigger.try_place(&m, policy).is_ok());
        }
    }

    #[test]
    fn releasing_a_machine_never_breaks_others(
        nodes in nodes(), before in machines(), probe in machine(99), which in 0usize..8,
        policy in policy()
    ) {
        let mut s = state(nodes);
        place_all(&mut s, &before, policy);
        let placed = s.allocations();
        if placed.is_empty() {
            return Ok(());
        }
        let gone = &placed[which % placed.len()].machine;
        let fits_before = s.try_place(&probe, policy).is_ok();
        s.release(gone).unwrap();
        let mut rest = placed.clone();
        rest.retain(|a| &a.machine != gone);
        prop_assert_eq!(s.allocations(), rest);
        prop_assert_eq!(check_no_overcommit(&s.to_fleet()), Ok(()));
        if fits_before {
            prop_assert!(s.try_place(&probe, policy).is_ok());
        }
    }

    #[test]
    fn reordering_nodes_and_gpus_does_not_change_feasibility(
        nodes in nodes(), ms in machines(), policy in policy()
    ) {
        let a = state(nodes.clone());
        let mut shuffled = nodes;
        shuffled.reverse();
        for n in &mut shuffled {
            n.gpus.reverse();
            n.mediated_devices.parents.reverse();
            n.mediated_devices.pools.reverse();
        }
        let b = state(shuffled);
        for m in &ms {
            prop_assert_eq!(a.try_place(m, policy).is_ok(), b.try_place(m, policy).is_ok());
        }
    }
}

// ------------------------------------------------------------------ fast refusals

/// A fleet of copies of up to three random nodes under their own names (so that many nodes
/// share a state, as in a real estate), in shuffled order.
fn replicated_nodes() -> impl Strategy<Value = Vec<NodeTopology>> {
    (
        proptest::collection::vec(node("proto"), 1..4),
        proptest::collection::vec(0usize..3, 2..9),
    )
        .prop_map(|(protos, picks)| {
            picks
                .iter()
                .enumerate()
                .map(|(i, &p)| {
                    let mut n = protos[p % protos.len()].clone();
                    n.node = format!("n{:02}", (i * 7) % 11);
                    n
                })
                .collect::<Vec<_>>()
        })
        .prop_map(|mut v| {
            v.sort_by(|a, b| a.node.cmp(&b.node));
            v.dedup_by(|a, b| a.node == b.node);
            v
        })
}

/// One step of a fleet's life: a placement or the release of the `k`-th placed Machine.
#[derive(Debug, Clone)]
enum Step {
    Place(Machine),
    Release(usize),
}

fn steps() -> impl Strategy<Value = Vec<Step>> {
    proptest::collection::vec(
        prop_oneof![
            3 => (0usize..1000).prop_flat_map(machine).prop_map(Step::Place),
            1 => (0usize..8).prop_map(Step::Release),
        ],
        1..12,
    )
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn a_refusal_says_what_asking_every_node_says(
        nodes in replicated_nodes(), life in steps(), probes in proptest::collection::vec(machine(500), 1..4),
        policy in policy(), extra in node("zz-extra"), gone in 0usize..8
    ) {
        let mut s = state(nodes);
        let check = |s: &FleetState| -> Result<(), TestCaseError> {
            for m in &probes {
                if let Err(gpu_sched::SchedError::Unsatisfiable(r)) = s.try_place(m, policy) {
                    let full = s.refusal_by_full_scan(m, policy).unwrap();
                    prop_assert_eq!(r.nodes(), full.nodes());
                    prop_assert_eq!(r.nodes_total, full.nodes_total);
                    prop_assert_eq!(r.render(), full.render());
                    prop_assert_eq!(&r, &full);
                }
            }
            Ok(())
        };
        check(&s)?;
        for step in &life {
            apply(&mut s, std::slice::from_ref(step), policy);
            check(&s)?;
        }
        // New snapshots and removed nodes are re-filed too.
        s.add_node(extra).unwrap();
        check(&s)?;
        let names: Vec<String> = s.nodes().map(|n| n.node).collect();
        s.remove_node(&names[gone % names.len()]).unwrap();
        check(&s)?;
        let again: Vec<NodeTopology> = s.nodes().collect();
        s.add_node(again[0].clone()).unwrap();
        check(&s)?;
    }

    #[test]
    fn a_refusal_survives_its_json_document(
        nodes in replicated_nodes(), probe in machine(7), policy in policy()
    ) {
        let s = state(nodes);
        if let Err(gpu_sched::SchedError::Unsatisfiable(r)) = s.try_place(&probe, policy) {
            let text = serde_json::to_string(&r).unwrap();
            let back: gpu_sched::Refusal = serde_json::from_str(&text).unwrap();
            prop_assert_eq!(&back, &r);
            let doc: serde_json::Value = serde_json::from_str(&text).unwrap();
            prop_assert_eq!(doc["nodes"].as_array().map(Vec::len), Some(r.refused_count()));
        }
    }
}

// ------------------------------------------------------------------ compact fleet documents

proptest! {
    #![proptest_config(config())]

    #[test]
    fn a_compact_fleet_reads_back_as_the_same_fleet_state_as_the_full_one(
        nodes in replicated_nodes(), life in steps(), policy in policy(), json in any::<bool>()
    ) {
        let mut s = state(nodes);
        for step in &life {
            match step {
                Step::Place(m) => {
                    let _ = s.place(m, policy);
                }
                Step::Release(k) => {
                    let placed = s.allocations();
                    if !placed.is_empty() {
                        s.release(&placed[k % placed.len()].machine).unwrap();
                    }
                }
            }
        }
        let fleet = s.to_fleet();
        let compact = fleet.to_text(json).unwrap();
        let full = fleet.to_text_full(json).unwrap();
        let from_compact = Fleet::from_text(&compact).unwrap();
        let from_full = Fleet::from_text(&full).unwrap();
        prop_assert_eq!(&from_compact, &fleet);
        prop_assert_eq!(&from_compact, &from_full);
        let a = FleetState::new(from_compact).unwrap().to_fleet();
        let b = FleetState::new(from_full).unwrap().to_fleet();
        prop_assert_eq!(&a, &b);
        // Nodes that share a topology with GPUs are written once; the compact form is never
        // longer than the full one (a topology too small to be worth a shape is written out).
        prop_assert!(compact.len() <= full.len());
        let shared = fleet.nodes.len() - {
            let mut seen: Vec<&NodeTopology> = Vec::new();
            for n in fleet.nodes.iter().filter(|n| !n.gpus.is_empty()) {
                if !seen.iter().any(|m| m.gpus == n.gpus && m.mediated_devices == n.mediated_devices && m.warnings == n.warnings) {
                    seen.push(n);
                }
            }
            seen.len()
        } - fleet.nodes.iter().filter(|n| n.gpus.is_empty()).count();
        if shared > 0 {
            prop_assert!(compact.contains("shapes"), "{}", compact);
            prop_assert!(compact.len() < full.len());
        }
    }
}

#[test]
fn a_node_naming_an_unknown_shape_is_refused_with_its_name() {
    let doc = r#"{"shapes": {"a2": {"gpus": []}}, "nodes": [{"node": "n1", "shape": "l40s"}]}"#;
    let e = Fleet::from_text(doc).unwrap_err().to_string();
    assert!(
        e.contains(r#"node "n1""#) && e.contains(r#"no shape "l40s""#),
        "{e}"
    );
    let doc = r#"{"shapes": {"a2": {}}, "nodes": [{"node": "n1", "shape": "a2", "gpus": []}]}"#;
    let e = Fleet::from_text(doc).unwrap_err().to_string();
    assert!(e.contains("gives no gpus"), "{e}");
}

// ------------------------------------------------------------------ grouped refusals

proptest! {
    #![proptest_config(config())]

    #[test]
    fn a_grouped_refusal_expands_to_the_full_per_node_one(
        nodes in replicated_nodes(), life in steps(), probes in proptest::collection::vec(machine(500), 1..4),
        policy in policy()
    ) {
        let mut s = state(nodes);
        apply(&mut s, &life, policy);
        let mut kept: Vec<(gpu_sched::Refusal, Vec<gpu_sched::NodeRefusal>, Vec<gpu_sched::RefusalGroup>)> = Vec::new();
        for m in &probes {
            let Err(gpu_sched::SchedError::Unsatisfiable(r)) = s.try_place(m, policy) else {
                continue;
            };
            let full = s.refusal_by_full_scan(m, policy).unwrap();
            kept.push((r.clone(), full.nodes(), r.summary()));
            let summary = r.summary();
            // Expanding every group gives back every node with its reasons, in node order.
            let mut expanded: Vec<gpu_sched::NodeRefusal> = Vec::new();
            for (i, g) in summary.iter().enumerate() {
                let names = r.group_nodes(i);
                prop_assert_eq!(names.len(), g.node_count);
                prop_assert_eq!(&names[..g.first_nodes.len()], &g.first_nodes[..]);
                prop_assert_eq!(g.first_nodes.len(), g.node_count.min(gpu_sched::FIRST_NODES));
                expanded.extend(names.into_iter().map(|node| gpu_sched::NodeRefusal {
                    node,
                    reasons: g.reasons.clone(),
                }));
            }
            let order: Vec<String> = s.nodes().map(|n| n.node).collect();
            expanded.sort_by_key(|n| order.iter().position(|o| *o == n.node));
            prop_assert_eq!(&expanded, &full.nodes());
            // Groups are distinct, most nodes first; the report carries them and, on request only,
            // the nodes.
            for w in summary.windows(2) {
                prop_assert!(w[0].node_count >= w[1].node_count);
                prop_assert_ne!(&w[0].reasons, &w[1].reasons);
            }
            let brief = r.report(false);
            prop_assert!(brief.nodes.is_none());
            prop_assert_eq!(brief.nodes_refused, full.refused_count());
            prop_assert_eq!(&brief.groups, &summary);
            prop_assert_eq!(r.report(true).nodes, Some(full.nodes()));
        }
        // A refusal kept while the fleet changes (placements, releases, a new snapshot, a node
        // removed) still says what the fleet said when it refused.
        apply(&mut s, &life, policy);
        let names: Vec<String> = s.nodes().map(|n| n.node).collect();
        s.remove_node(&names[0]).unwrap();
        let mut renamed = s.nodes().next().unwrap();
        renamed.node = "zz-new".into();
        s.add_node(renamed).unwrap();
        for m in &probes {
            let _ = s.try_place(m, policy);
        }
        for (r, nodes, summary) in &kept {
            prop_assert_eq!(&r.nodes(), nodes);
            prop_assert_eq!(&r.summary(), summary);
            prop_assert_eq!(r.refused_count(), nodes.len());
        }
    }
}

/// Runs a fleet's life: placements, and releases of the `k`-th placed Machine.
fn apply(s: &mut FleetState, life: &[Step], policy: Policy) {
    for step in life {
        match step {
            Step::Place(m) => {
                let _ = s.place(m, policy);
            }
            Step::Release(k) => {
                let placed = s.allocations();
                if !placed.is_empty() {
                    s.release(&placed[k % placed.len()].machine).unwrap();
                }
            }
        }
    }
}
