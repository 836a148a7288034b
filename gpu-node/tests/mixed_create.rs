#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! Mixed-size vGPUs through the one writer: `Node::create_vgpu` on the fake kernel (an L40S in
//! the vendor-specific VFIO framework) with the fake NVML answering for the same GPU. The test
//! plays the driver's part between the two fakes: once NVML reports mixed-size mode the kernel
//! lists every size, and a vGPU whose type is set starts at the first placement NVML lists as
//! creatable (gpuslice does not write the placement).

use gpu_core::{ClassifiedError, ErrorKind, ParentId, PciAddress};
use gpu_node::mig::MigError;
use gpu_node::mixed::MixedError;
use gpu_node::{Node, NodeError};
use gpu_nvml::fake::{FakeGpu, FakeNvml, FakeVgpuType};
use gpu_nvml::{NvmlDevices, VgpuMode};
use gpu_sysfs::actuate::Created;
use gpu_sysfs::discover::DiscoverOptions;
use gpu_sysfs::testing::FakeKernel;

const PF: &str = "0000:26:00.0";
const Q24: u32 = 1155;
const Q12: u32 = 1153;
const Q6: u32 = 1151;

fn pf() -> PciAddress {
    PF.parse().unwrap()
}

/// NVML's view of the fake kernel's L40S (same type IDs): 24Q at 0/24, 12Q at every 12, 6Q at
/// every 6, on 48 slots; same-size mode, best effort scheduler.
fn nvml() -> FakeNvml {
    let types = vec![
        FakeVgpuType::new(Q24, "NVIDIA L40S-24Q", 24576, 24, &[0, 24]),
        FakeVgpuType::new(Q12, "NVIDIA L40S-12Q", 12288, 12, &[0, 12, 24, 36]),
        FakeVgpuType::new(
            Q6,
            "NVIDIA L40S-6Q",
            6144,
            6,
            &[0, 6, 12, 18, 24, 30, 36, 42],
        ),
    ];
    FakeNvml::new().with_gpu(
        pf(),
        FakeGpu::new(46068)
            .with_vgpu_types(types)
            .mixed_size(VgpuMode::Homogeneous),
    )
}

/// The L40S-24Q alone, at 0 and 24 of 48 slots.
fn only_24q() -> Vec<FakeVgpuType> {
    vec![FakeVgpuType::new(
        Q24,
        "NVIDIA L40S-24Q",
        24576,
        24,
        &[0, 24],
    )]
}

fn no_names(n: &str) -> Result<PciAddress, NodeError> {
    panic!("{n:?} should not need resolving by name")
}

fn create(node: &Node<'_>, profile: &str) -> Result<Created, NodeError> {
    node.create_vgpu(&ParentId::Pci(pf()), profile, false, no_names, |_| Ok(None))
}

/// The driver's part after a type was written: the kernel follows NVML's mode, and the vGPU
/// starts at the first creatable placement.
fn driver_starts(k: &FakeKernel, n: &FakeNvml, type_id: u32) {
    if n.vgpu_heterogeneous_mode(&pf()).unwrap() == VgpuMode::Heterogeneous {
        k.set_mixed_size(pf()).unwrap();
    }
    let mode = n.vgpu_heterogeneous_mode(&pf()).unwrap();
    let free = n
        .vgpu_type_creatable_placements(&pf(), type_id, mode)
        .unwrap();
    n.start_vgpu(&pf(), type_id, free.placement_ids.first().copied(), None)
        .unwrap();
}

fn vf_types(k: &FakeKernel) -> Vec<String> {
    (4..8)
        .map(|f| {
            std::fs::read_to_string(k.root().join(format!(
                "sys/bus/pci/devices/0000:26:00.{f}/nvidia/current_vgpu_type"
            )))
            .unwrap_or_default()
        })
        .collect()
}

#[test]
fn two_sizes_land_on_one_gpu_through_the_node_the_mode_switched_once_and_an_overfull_mix_is_refused()
 {
    let k = FakeKernel::l40s_vendor_vfio_host(4).unwrap();
    let n = nvml();
    let opts = DiscoverOptions::new("node-a");
    let node = Node::new(&k, &opts)
        .with_mixed_sizes(&n)
        .mixed_sizes_on_request(true);
    // The kernel's side of the mode the create turns on before its type write (the two fakes
    // do not talk): VFs report their placements from the first type on.
    k.set_mixed_size(pf()).unwrap();

    let Created::VendorVfio(big) = create(&node, "NVIDIA L40S-24Q").unwrap() else {
        panic!("expected a vendor-VFIO vGPU");
    };
    assert_eq!(
        n.writes(),
        vec![format!(
            "nvmlDeviceSetVgpuHeterogeneousMode {PF} Heterogeneous"
        )],
        "the idle GPU is turned to mixed-size mode before its first type"
    );
    assert_eq!(big.type_id.vendor_vfio_number(), Some(Q24));
    driver_starts(&k, &n, Q24);

    let Created::VendorVfio(small) = create(&node, "NVIDIA L40S-12Q").unwrap() else {
        panic!("expected a vendor-VFIO vGPU");
    };
    assert_eq!(small.type_id.vendor_vfio_number(), Some(Q12));
    assert_ne!(small.vf, big.vf);
    driver_starts(&k, &n, Q12);
    assert_eq!(
        n.writes().len(),
        1,
        "the mode is switched once: {:?}",
        n.writes()
    );

    // 24 + 12 of 48 slots held: no half is free for a second 24Q (the framebuffer alone
    // would not say why).
    let kernel_before = (k.writes().len(), vf_types(&k));
    let nvml_before = n.writes();
    let e = create(&node, "NVIDIA L40S-24Q").unwrap_err();
    assert!(
        matches!(&e, NodeError::Mixed(m) if matches!(**m, MixedError::NoPlacement { type_id: Q24, size: 24, .. })),
        "{e:?}"
    );
    assert_eq!(e.kind(), ErrorKind::Exhausted);
    let text = e.to_string();
    assert!(text.contains("placements [0, 24]"), "{text}");
    assert!(text.contains("NVIDIA L40S-12Q (1153) at [36]"), "{text}");
    assert_eq!(
        (k.writes().len(), vf_types(&k)),
        kernel_before,
        "nothing written"
    );
    assert_eq!(n.writes(), nvml_before, "nothing written to NVML");

    // A 6Q still fits in the slots left, through the same writer.
    create(&node, "NVIDIA L40S-6Q").unwrap();
    assert_eq!(n.writes().len(), 1);
}

#[test]
fn without_nvml_a_gpu_keeps_one_size() {
    let k = FakeKernel::l40s_vendor_vfio_host(4).unwrap();
    let opts = DiscoverOptions::new("node-a");
    let node = Node::new(&k, &opts);
    create(&node, "NVIDIA L40S-24Q").unwrap();
    let e = create(&node, "NVIDIA L40S-12Q").unwrap_err();
    assert!(
        matches!(&e, NodeError::Mixed(m) if matches!(**m, MixedError::OneSize { .. })),
        "{e:?}"
    );
    let text = gpu_core::error_chain(&e);
    assert!(
        text.starts_with("0000:26:00.0 has no vGPU type \"NVIDIA L40S-12Q\""),
        "the create's own refusal first: {text}"
    );
    assert!(
        text.contains("holds vGPUs of another size (24576 MiB)") && text.contains("without NVML"),
        "{text}"
    );
    assert_eq!(
        e.kind(),
        ErrorKind::UnknownProfile,
        "the refusal's own kind"
    );
}

#[test]
fn another_size_beside_running_vgpus_on_a_same_size_gpu_is_refused_before_any_write() {
    let k = FakeKernel::l40s_vendor_vfio_host(4).unwrap();
    let n = nvml().failing(
        "nvmlDeviceSetVgpuHeterogeneousMode",
        gpu_nvml::NvmlErrorKind::NoPermission,
    );
    let opts = DiscoverOptions::new("node-a");
    // The first vGPU made without NVML: the GPU stays in same-size mode.
    Node::new(&k, &opts)
        .create_vgpu(
            &ParentId::Pci(pf()),
            "NVIDIA L40S-24Q",
            false,
            no_names,
            |_| Ok(None),
        )
        .unwrap();
    let node = Node::new(&k, &opts).with_mixed_sizes(&n);
    let before = k.writes().len();
    let e = create(&node, "NVIDIA L40S-12Q").unwrap_err();
    assert!(
        matches!(&e, NodeError::Mixed(m) if matches!(**m, MixedError::InUse { running: 1, .. })),
        "{e:?}"
    );
    assert_eq!(e.kind(), ErrorKind::InUse);
    assert_eq!(k.writes().len(), before);
    assert!(n.writes().is_empty());
}

#[test]
fn an_idle_same_size_gpu_is_switched_only_when_asked_and_keeps_one_size_otherwise() {
    let k = FakeKernel::l40s_vendor_vfio_host(4).unwrap();
    let n = nvml();
    let opts = DiscoverOptions::new("node-a");
    // NVML given, mixed sizes not asked for: the mode stays, the one-size rule holds.
    let node = Node::new(&k, &opts).with_mixed_sizes(&n);
    create(&node, "NVIDIA L40S-24Q").unwrap();
    assert!(n.writes().is_empty(), "not asked: {:?}", n.writes());
    assert_eq!(
        n.vgpu_heterogeneous_mode(&pf()).unwrap(),
        VgpuMode::Homogeneous
    );
    driver_starts(&k, &n, Q24);
    let before = k.writes().len();
    let e = create(&node, "NVIDIA L40S-12Q").unwrap_err();
    assert!(
        matches!(&e, NodeError::Mixed(m) if matches!(**m, MixedError::InUse { running: 1, .. })),
        "{e:?}"
    );
    assert_eq!(k.writes().len(), before, "nothing written");
    assert!(n.writes().is_empty());
    // Asking now is too late: a vGPU runs, the mode changes only on an idle GPU.
    let asked = node.mixed_sizes_on_request(true);
    let e = create(&asked, "NVIDIA L40S-12Q").unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InUse, "{e}");
    assert!(n.writes().is_empty());
}

/// A create of an L40S-24Q asked for mixed sizes with `n` as NVML: refused with nothing
/// written to the kernel or NVML; the refusal.
fn refused_when_asked(n: &FakeNvml) -> NodeError {
    let k = FakeKernel::l40s_vendor_vfio_host(4).unwrap();
    let opts = DiscoverOptions::new("node-a");
    let node = Node::new(&k, &opts)
        .with_mixed_sizes(n)
        .mixed_sizes_on_request(true);
    let before = k.writes().len();
    let e = create(&node, "NVIDIA L40S-24Q").unwrap_err();
    assert_eq!(k.writes().len(), before, "nothing written");
    assert!(n.writes().is_empty());
    e
}

#[test]
fn asking_for_mixed_sizes_under_fixed_share_is_refused_naming_the_scheduler_and_the_allowed_ones() {
    let n = FakeNvml::new().with_gpu(
        pf(),
        FakeGpu::new(46068)
            .with_vgpu_types(only_24q())
            .mixed_size(VgpuMode::Homogeneous)
            .with_scheduler(gpu_nvml::VgpuScheduler::FixedShare),
    );
    let e = refused_when_asked(&n);
    assert!(
        matches!(&e, NodeError::Mixed(m) if matches!(**m, MixedError::Scheduler { .. })),
        "{e:?}"
    );
    let text = e.to_string();
    assert!(
        text.contains("runs the fixed share vGPU scheduler")
            && text.contains("only under best effort or equal share"),
        "{text}"
    );
    assert_eq!(e.kind(), ErrorKind::NotCreatable);
    // Not asked: the create goes on under the one-size rule, the mode untouched.
    let k = FakeKernel::l40s_vendor_vfio_host(4).unwrap();
    let opts = DiscoverOptions::new("node-a");
    create(
        &Node::new(&k, &opts).with_mixed_sizes(&n),
        "NVIDIA L40S-24Q",
    )
    .unwrap();
    assert!(n.writes().is_empty());
}

#[test]
fn asking_for_mixed_sizes_of_a_gpu_nvml_gives_no_mode_is_refused_before_any_write() {
    // No mixed-size support: NVML answers NOT_SUPPORTED.
    let n = FakeNvml::new().with_gpu(pf(), FakeGpu::new(46068).with_vgpu_types(only_24q()));
    let e = refused_when_asked(&n);
    assert!(
        matches!(&e, NodeError::Mixed(m) if matches!(**m, MixedError::Unsupported { .. })),
        "{e:?}"
    );
}

#[test]
fn the_door_refuses_mixed_sizes_where_the_root_has_no_nvml() {
    let k = FakeKernel::l40s_vendor_vfio_host(4).unwrap();
    let opened = gpu_sysfs::open_root(k.root()).unwrap();
    let opts = DiscoverOptions::new("node-a");
    let node = Node::new(&k, &opts);
    let before = k.writes().len();
    let names = |n: &str| -> Result<PciAddress, MigError> { Ok(no_names(n)?) };
    let e = gpu_node::mixed_door::create_on_request::<MigError>(
        &node,
        &opened,
        &ParentId::Pci(pf()),
        "NVIDIA L40S-24Q",
        false,
        true,
        names,
        |_| Ok(None),
    )
    .unwrap_err();
    assert!(
        matches!(&e, MigError::Node(n) if matches!(&**n, NodeError::Mixed(m) if matches!(**m, MixedError::NoNvml { .. }))),
        "{e:?}"
    );
    assert!(
        e.to_string().starts_with("mixed-size vGPUs need NVML"),
        "{e}"
    );
    assert_eq!(k.writes().len(), before);
    // Not asked: the create goes on as before.
    gpu_node::mixed_door::create_on_request::<MigError>(
        &node,
        &opened,
        &ParentId::Pci(pf()),
        "NVIDIA L40S-24Q",
        false,
        false,
        names,
        |_| Ok(None),
    )
    .unwrap();
}

#[test]
fn on_a_gpu_already_in_mixed_size_mode_each_placement_is_read_back_and_shown_without_being_asked() {
    let k = FakeKernel::l40s_vendor_vfio_host(4).unwrap();
    let n = nvml();
    n.set_vgpu_heterogeneous_mode(&pf(), VgpuMode::Heterogeneous)
        .unwrap();
    k.set_mixed_size(pf()).unwrap();
    let writes = n.writes().len();
    let opts = DiscoverOptions::new("node-a");
    // Not asked for: the mode is already on, so sizes mix.
    let node = Node::new(&k, &opts).with_mixed_sizes(&n);
    let placed = |c: Created| match c {
        Created::VendorVfio(set) => (set.vf, set.placement_id),
        other => panic!("expected a vendor-VFIO vGPU: {other:?}"),
    };
    let (big, at_big) = placed(create(&node, "NVIDIA L40S-24Q").unwrap());
    let (small, at_small) = placed(create(&node, "NVIDIA L40S-12Q").unwrap());
    assert_eq!(
        (at_big, at_small),
        (Some(0), Some(24)),
        "read back from the VFs"
    );
    assert_eq!(n.writes().len(), writes, "the mode was not written again");

    // Shown by `vgpu list` and `topology`.
    let listing = node.list_vgpus().unwrap();
    let shown: Vec<_> = listing
        .vendor_vfio
        .iter()
        .map(|v| (v.vf, v.placement_id))
        .collect();
    assert_eq!(shown, vec![(big, Some(0)), (small, Some(24))]);
    let t = gpu_sysfs::discover::discover(&k, &opts).unwrap();
    let json = serde_json::to_value(&t).unwrap().to_string();
    assert!(
        json.contains("\"placementId\":0") && json.contains("\"placementId\":24"),
        "{json}"
    );

    // 0..24 and 24..36 held: a second 24Q has no free half, refused naming what is left.
    let before = k.writes().len();
    let e = create(&node, "NVIDIA L40S-24Q").unwrap_err();
    let text = e.to_string();
    assert!(
        text.contains("placements [0, 24], none free")
            && text.contains("NVIDIA L40S-12Q (1153) at [36]"),
        "{text}"
    );
    assert_eq!(k.writes().len(), before, "nothing written");

    // A cleared VF reports no placement, and its slots are free again.
    node.remove_vgpu(&gpu_node::VgpuId::Vf(big), false).unwrap();
    let listing = node.list_vgpus().unwrap();
    assert_eq!(listing.vendor_vfio.len(), 1);
    let (_, again) = placed(create(&node, "NVIDIA L40S-24Q").unwrap());
    assert_eq!(again, Some(0));
}
