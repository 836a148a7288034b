//! Proptest generators for the model, valid by construction (feature `testing`).

use proptest::prelude::*;

use crate::address::PciAddress;
use crate::allocation::{AllocatedDevice, Allocation, AllocationStatus};
use crate::fleet::Fleet;
use crate::health::{Health, HealthState};
use crate::ids::{MdevUuid, ParentId, VgpuTypeId};
use crate::request::{Alignment, DeviceClass, DeviceRequest, Machine};
use crate::topology::*;
use crate::vendor::Vendor;

/// The proptest cases per fuzz target: `GPUSLICE_FUZZ_CASES` when set to a number (a long run,
/// see the README), else `default` (what a plain `cargo test` runs).
pub fn fuzz_cases(default: u32) -> u32 {
    std::env::var("GPUSLICE_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Any PCI address, including wide domains.
pub fn pci_address() -> impl Strategy<Value = PciAddress> {
    (
        prop_oneof![Just(0u32), 0u32..0x2_0000],
        any::<u8>(),
        0u8..0x20,
        0u8..8,
    )
        .prop_map(|(d, b, dev, f)| PciAddress::new(d, b, dev, f).unwrap_or_else(|_| unreachable!()))
}

/// Any mdev UUID.
pub fn mdev_uuid() -> impl Strategy<Value = MdevUuid> {
    ("[a-z]{1,8}", "[a-z]{1,8}", 0u32..100).prop_map(|(m, r, i)| MdevUuid::for_machine(&m, &r, i))
}

/// A type ID of either framework.
pub fn type_id() -> impl Strategy<Value = VgpuTypeId> {
    prop_oneof![
        "nvidia-[0-9]{1,4}",
        "[0-9]{3,4}",
        "mbochs-(small|medium|large)"
    ]
    .prop_map(|s| VgpuTypeId::from_str_unchecked(&s))
}

/// A health verdict.
pub fn health() -> impl Strategy<Value = Health> {
    (
        prop_oneof![
            Just(HealthState::Healthy),
            Just(HealthState::Degraded),
            Just(HealthState::Unhealthy),
            Just(HealthState::Unknown)
        ],
        proptest::collection::vec("[a-z ]{1,12}", 0..3),
    )
        .prop_map(|(state, reasons)| Health { state, reasons })
}

fn opt<T: std::fmt::Debug + Clone + 'static>(
    s: impl Strategy<Value = T> + 'static,
) -> BoxedStrategy<Option<T>> {
    proptest::option::of(s).boxed()
}

/// A GPU.
pub fn gpu() -> impl Strategy<Value = Gpu> {
    (
        pci_address(),
        prop_oneof![Just(0x10deu16), Just(0x1002), Just(0x8086), any::<u16>()],
        any::<u16>(),
        prop_oneof![Just(0x030000u32), Just(0x030200), Just(0x120000)],
        prop_oneof![
            Just(GpuState::Free),
            Just(GpuState::InUse),
            Just(GpuState::Blocked)
        ],
        opt(0u32..4),
        opt(0u32..200),
        opt(1024u64..200_000),
        health(),
        opt(prop_oneof![
            Just(VgpuFramework::Mdev),
            Just(VgpuFramework::VendorVfio)
        ]),
        opt(proptest::collection::vec(pci_address(), 0..4)),
    )
        .prop_map(|(a, v, d, c, state, numa, grp, mem, health, fw, vfs)| {
            let mut g = Gpu::new("", a, v, d, c);
            g.name = format!("{}0", Vendor::from_pci_id(v).family());
            g.state = state;
            g.state_reason = (state == GpuState::Blocked).then(|| "shares IOMMU group".to_owned());
            g.numa_node = numa;
            g.iommu_group = grp;
            g.memory_mib = mem;
            g.health = health;
            g.vgpu_framework = fw;
            g.model = "Model X".into();
            g.driver = Some("nvidia".into());
            g.sriov = vfs.map(|vfs| Sriov {
                total_vfs: 16,
                num_vfs: vfs.len() as u32,
                vfs,
                vf_device_id: None,
                ..Sriov::default()
            });
            g.functions = vec![Function {
                address: a,
                class: ClassCode(0x040300),
                device_id: PciId(0x1aef),
                driver: None,
            }];
            g
        })
}

/// A profile.
pub fn profile() -> impl Strategy<Value = Profile> {
    (
        type_id(),
        "[A-Za-z0-9 -]{1,16}",
        opt(256u64..100_000),
        opt(1u32..32),
        0u32..32,
        opt(1u8..8),
    )
        .prop_map(|(id, name, fb, max, avail, mig)| Profile {
            id,
            name,
            framebuffer_mib: fb,
            max_instances: max,
            available_instances: avail,
            reported_instances: Some(avail),
            device_api: "vfio-pci".into(),
            mig_slices: mig,
            mig_memory_gib: mig.map(|m| u32::from(m) * 10),
            description: None,
        })
}

/// A parent.
pub fn parent() -> impl Strategy<Value = Parent> {
    (
        prop_oneof![
            pci_address().prop_map(ParentId::Pci),
            "[a-z]{3,8}".prop_map(ParentId::Named)
        ],
        opt(pci_address()),
        prop_oneof![Just(VgpuFramework::Mdev), Just(VgpuFramework::VendorVfio)],
        health(),
        proptest::collection::vec(profile(), 0..4),
        proptest::collection::vec((mdev_uuid(), type_id()), 0..3),
    )
        .prop_map(|(id, gpu, framework, health, profiles, inst)| Parent {
            id,
            gpu,
            framework,
            health,
            profiles,
            instances: inst
                .into_iter()
                .map(|(u, p)| Instance {
                    uuid: Some(u),
                    address: None,
                    profile: p,
                    profile_name: None,
                    framebuffer_mib: None,
                    in_use: Some(false),
                    placement_id: None,
                })
                .collect(),
            warnings: vec![],
        })
}

/// A pool.
pub fn pool() -> impl Strategy<Value = Pool> {
    (
        pci_address(),
        0u64..200_000,
        0u64..200_000,
        opt(512u64..50_000),
        any::<bool>(),
        opt(1u8..8),
    )
        .prop_map(|(g, total, used, locked, mixed, mig)| Pool {
            gpu: ParentId::Pci(g),
            parents: vec![ParentId::Pci(g)],
            total_mib: total,
            used_mib: used.min(total),
            size_locked_mib: locked,
            mixed_size: mixed,
            mig_slices_total: mig.map(|_| 7),
            mig_slices_used: mig,
            mig_slots: None,
        })
}

/// A node topology.
pub fn topology() -> impl Strategy<Value = NodeTopology> {
    (
        "[a-z][a-z0-9-]{0,10}",
        proptest::collection::vec(gpu(), 0..4),
        proptest::collection::vec(parent(), 0..3),
        proptest::collection::vec(pool(), 0..2),
    )
        .prop_map(|(node, gpus, parents, pools)| NodeTopology {
            node,
            gpus,
            mediated_devices: MediatedDevices { parents, pools },
            warnings: vec![],
            fabric: None,
        })
}

/// A device request.
pub fn device_request() -> impl Strategy<Value = DeviceRequest> {
    (
        "[a-z]{1,8}",
        prop_oneof![Just(DeviceClass::Gpu), Just(DeviceClass::Accelerator)],
        opt(prop_oneof![
            Just("nvidia".to_owned()),
            Just("amd".to_owned())
        ]),
        opt("[A-Z0-9]{2,5}"),
        opt(1u32..8),
        opt((1u64..200).prop_map(|g| crate::ids::MiB(g * 1024))),
        any::<bool>(),
    )
        .prop_map(
            |(name, class, vendor, model, count, min_memory, numa)| DeviceRequest {
                name,
                class,
                vendor,
                model,
                profile: None,
                virtual_function: None,
                count,
                gpus: vec![],
                min_memory,
                alignment: numa.then_some(Alignment::Numa),
                template: None,
            },
        )
}

/// A Machine.
pub fn machine() -> impl Strategy<Value = Machine> {
    (
        "[a-z][a-z0-9-]{0,10}",
        proptest::collection::vec(device_request(), 1..3),
    )
        .prop_map(|(name, mut devices)| {
            for (i, d) in devices.iter_mut().enumerate() {
                d.name = format!("{}{i}", d.name);
            }
            Machine {
                name,
                devices,
                ..Machine::default()
            }
        })
}

/// An allocation.
pub fn allocation() -> impl Strategy<Value = Allocation> {
    (
        "[a-z]{1,8}",
        "[a-z]{1,8}",
        any::<bool>(),
        pci_address(),
        mdev_uuid(),
        type_id(),
        opt(256u64..50_000),
    )
        .prop_map(
            |(machine, node, created, addr, uuid, profile, fb)| Allocation {
                machine,
                node,
                status: if created {
                    AllocationStatus::Created
                } else {
                    AllocationStatus::Pending
                },
                devices: vec![
                    AllocatedDevice::Gpu {
                        request: "pass".into(),
                        name: "nvidia0".into(),
                        address: addr,
                        functions: vec![addr],
                        memory_mib: fb,
                    },
                    AllocatedDevice::Vgpu {
                        request: "gpu".into(),
                        index: 0,
                        parent: ParentId::Pci(addr),
                        gpu: Some(addr),
                        framework: VgpuFramework::Mdev,
                        profile,
                        profile_name: "NVIDIA A2-4Q".into(),
                        framebuffer_mib: fb,
                        mig_slices: None,
                        uuid,
                        gpu_instance_start: None,
                        placement_id: None,
                    },
                ],
            },
        )
}

/// A fleet.
pub fn fleet() -> impl Strategy<Value = Fleet> {
    (
        proptest::collection::vec(topology(), 0..3),
        proptest::collection::vec(allocation(), 0..3),
    )
        .prop_map(|(nodes, allocations)| Fleet {
            nodes,
            allocations,
            templates: Default::default(),
        })
}
