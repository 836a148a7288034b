//! The fake's state machine, one NVML rule per test.

use gpu_core::PciAddress;
use gpu_core::mig::MigGeometry;

use super::*;

const H100: &str = "0000:18:00.0";
const L40S: &str = "0000:3b:00.0";

fn addr(s: &str) -> PciAddress {
    s.parse().unwrap()
}

fn h100_geometry() -> &'static MigGeometry {
    MigGeometry::for_device(0x2330).unwrap()
}

/// An H100 SXM5 80GB, MIG mode off.
fn h100() -> FakeNvml {
    FakeNvml::new().with_gpu(addr(H100), FakeGpu::mig(h100_geometry()))
}

/// An H100 in MIG mode.
fn h100_mig() -> FakeNvml {
    FakeNvml::new().with_gpu(
        addr(H100),
        FakeGpu::mig(h100_geometry()).with_mig_mode(MigMode::Enabled),
    )
}

fn at(start: u32, size: u32) -> Placement {
    Placement { start, size }
}

/// An L40S with mixed-size support: 24Q (two 24 GB halves: size 24 at 0 and 24) and 12Q (size
/// 12 at 0, 12, 24, 36), in homogeneous mode.
fn l40s() -> FakeNvml {
    let types = vec![
        FakeVgpuType::new(1, "NVIDIA L40S-24Q", 24576, 24, &[0, 24]),
        FakeVgpuType::new(2, "NVIDIA L40S-12Q", 12288, 12, &[0, 12, 24, 36]),
    ];
    FakeNvml::new().with_gpu(
        addr(L40S),
        FakeGpu::new(46068)
            .with_vgpu_types(types)
            .mixed_size(VgpuMode::Homogeneous),
    )
}

#[test]
fn a_gpu_without_mig_answers_not_supported_to_every_mig_call() {
    let n = FakeNvml::new().with_gpu(addr(L40S), FakeGpu::new(46068));
    let gpu = addr(L40S);
    assert_eq!(
        n.mig_mode(&gpu).unwrap_err().kind,
        NvmlErrorKind::NotSupported
    );
    assert_eq!(
        n.set_mig_mode(&gpu, MigMode::Enabled).unwrap_err().kind,
        NvmlErrorKind::NotSupported
    );
    assert_eq!(
        n.gpu_instances(&gpu).unwrap_err().kind,
        NvmlErrorKind::NotSupported
    );
    assert!(n.writes().is_empty());
}

#[test]
fn enabling_mig_on_an_idle_gpu_takes_effect_at_once() {
    let n = h100();
    let gpu = addr(H100);
    assert_eq!(
        n.set_mig_mode(&gpu, MigMode::Enabled).unwrap(),
        MigActivation::Active
    );
    assert_eq!(
        n.mig_mode(&gpu).unwrap(),
        MigModes::settled(MigMode::Enabled)
    );
    assert_eq!(n.gpu_instances(&gpu).unwrap(), []);
    assert_eq!(n.writes(), [format!("nvmlDeviceSetMigMode {H100} Enabled")]);
}

#[test]
fn enabling_mig_while_a_vgpu_or_process_uses_the_gpu_stays_pending_with_in_use() {
    let n = h100();
    let gpu = addr(H100);
    n.start_process(&gpu).unwrap();
    assert_eq!(
        n.set_mig_mode(&gpu, MigMode::Enabled).unwrap(),
        MigActivation::Pending(NvmlErrorKind::InUse)
    );
    let modes = n.mig_mode(&gpu).unwrap();
    assert_eq!(modes.current, MigMode::Disabled);
    assert_eq!(modes.describe(), "pending reset");
    // No GPU instance can be made before the mode is in force.
    assert_eq!(
        n.create_gpu_instance(&gpu, 0, at(0, 8)).unwrap_err().kind,
        NvmlErrorKind::NotSupported
    );
    // A reset of a busy GPU is refused; once idle, the reset brings the mode into force.
    assert_eq!(n.reset(&gpu).unwrap_err().kind, NvmlErrorKind::InUse);
    n.end_processes(&gpu).unwrap();
    n.reset(&gpu).unwrap();
    assert_eq!(
        n.mig_mode(&gpu).unwrap(),
        MigModes::settled(MigMode::Enabled)
    );
}

#[test]
fn on_a_gpu_needing_a_reset_the_mode_is_pending_with_reset_required() {
    let n = FakeNvml::new().with_gpu(addr(H100), FakeGpu::mig(h100_geometry()).needing_reset());
    let gpu = addr(H100);
    assert_eq!(
        n.set_mig_mode(&gpu, MigMode::Enabled).unwrap(),
        MigActivation::Pending(NvmlErrorKind::ResetRequired)
    );
    assert!(n.mig_mode(&gpu).unwrap().is_pending());
    n.reset(&gpu).unwrap();
    assert!(!n.mig_mode(&gpu).unwrap().is_pending());
}

#[test]
fn the_profiles_are_gpu_cores_geometry_with_nvmls_ids() {
    let n = h100_mig();
    let profiles = n.gpu_instance_profiles(&addr(H100)).unwrap();
    let ids: Vec<(u32, u32, u32)> = profiles
        .iter()
        .map(|p| (p.id, p.slice_count, p.instance_count))
        .collect();
    assert_eq!(
        ids,
        [
            (19, 1, 7),
            (15, 1, 4),
            (14, 2, 3),
            (9, 3, 2),
            (5, 4, 1),
            (0, 7, 1)
        ]
    );
}

#[test]
fn possible_placements_are_listed_even_with_mig_off() {
    let n = h100();
    let p = n.gpu_instance_possible_placements(&addr(H100), 9).unwrap();
    assert_eq!(p, [at(0, 4), at(4, 4)]);
    assert_eq!(
        n.gpu_instance_possible_placements(&addr(H100), 77)
            .unwrap_err()
            .kind,
        NvmlErrorKind::InvalidArgument
    );
}

#[test]
fn creating_an_instance_over_a_used_slice_is_refused_like_nvml() {
    let n = h100_mig();
    let gpu = addr(H100);
    let one = n.create_gpu_instance(&gpu, 19, at(4, 1)).unwrap();
    assert_eq!((one.id, one.slice_count), (1, 1));
    // A 3g at 4 would hold slices 4..8, slice 4 among them.
    let e = n.create_gpu_instance(&gpu, 9, at(4, 4)).unwrap_err();
    assert_eq!(e.kind, NvmlErrorKind::InsufficientResources);
    assert_eq!(e.call, "nvmlDeviceCreateGpuInstanceWithPlacement");
    // At 0 it fits.
    let three = n.create_gpu_instance(&gpu, 9, at(0, 4)).unwrap();
    assert_eq!(
        n.gpu_instances(&gpu).unwrap(),
        [three, one],
        "listed by start"
    );
}

#[test]
fn a_placement_the_profile_may_not_take_is_an_invalid_argument() {
    let n = h100_mig();
    let gpu = addr(H100);
    // A 3g may start at 0 or 4 only; a 2g's size is 2.
    for (profile, p) in [(9, at(2, 4)), (14, at(0, 1)), (42, at(0, 1))] {
        assert_eq!(
            n.create_gpu_instance(&gpu, profile, p).unwrap_err().kind,
            NvmlErrorKind::InvalidArgument,
            "{profile} {p:?}"
        );
    }
    assert!(n.writes().is_empty());
}

#[test]
fn a_profile_past_its_instance_count_is_refused_for_resources() {
    let n = h100_mig();
    let gpu = addr(H100);
    // 1g.20gb (ID 15): four at 0/2/4/6 fill the GPU; a 1g.10gb then finds no slice.
    for s in [0, 2, 4, 6] {
        n.create_gpu_instance(&gpu, 15, at(s, 2)).unwrap();
    }
    assert_eq!(
        n.create_gpu_instance(&gpu, 19, at(1, 1)).unwrap_err().kind,
        NvmlErrorKind::InsufficientResources
    );
}

#[test]
fn destroying_an_instance_a_vgpu_runs_in_is_refused_with_in_use() {
    let types = vec![FakeVgpuType::new(1066, "NVIDIA H100XM-3-40C", 40960, 0, &[]).mig_backed(9)];
    let n = FakeNvml::new().with_gpu(
        addr(H100),
        FakeGpu::mig(h100_geometry())
            .with_mig_mode(MigMode::Enabled)
            .with_vgpu_types(types),
    );
    let gpu = addr(H100);
    // A MIG-backed type needs an instance of its profile.
    assert_eq!(
        n.start_vgpu(&gpu, 1066, None, Some(1)).unwrap_err().kind,
        NvmlErrorKind::NotFound
    );
    let gi = n.create_gpu_instance(&gpu, 9, at(0, 4)).unwrap();
    let vgpu = n.start_vgpu(&gpu, 1066, None, Some(gi.id)).unwrap();
    let e = n.destroy_gpu_instance(&gpu, gi.id).unwrap_err();
    assert_eq!(
        (e.call, e.kind),
        ("nvmlGpuInstanceDestroy", NvmlErrorKind::InUse)
    );
    // And MIG mode cannot be turned off under it.
    assert_eq!(
        n.set_mig_mode(&gpu, MigMode::Disabled).unwrap_err().kind,
        NvmlErrorKind::InUse
    );
    n.stop_vgpu(&gpu, vgpu).unwrap();
    n.destroy_gpu_instance(&gpu, gi.id).unwrap();
    assert_eq!(n.gpu_instances(&gpu).unwrap(), []);
    assert_eq!(
        n.destroy_gpu_instance(&gpu, gi.id).unwrap_err().kind,
        NvmlErrorKind::NotFound
    );
    assert_eq!(
        n.set_mig_mode(&gpu, MigMode::Disabled).unwrap(),
        MigActivation::Active
    );
}

#[test]
fn mixed_size_mode_is_set_only_while_no_vgpu_exists() {
    let n = l40s();
    let gpu = addr(L40S);
    assert_eq!(
        n.vgpu_heterogeneous_mode(&gpu).unwrap(),
        VgpuMode::Homogeneous
    );
    let v = n.start_vgpu(&gpu, 2, Some(0), None).unwrap();
    assert_eq!(
        n.set_vgpu_heterogeneous_mode(&gpu, VgpuMode::Heterogeneous)
            .unwrap_err()
            .kind,
        NvmlErrorKind::InUse
    );
    n.stop_vgpu(&gpu, v).unwrap();
    n.set_vgpu_heterogeneous_mode(&gpu, VgpuMode::Heterogeneous)
        .unwrap();
    assert_eq!(
        n.vgpu_heterogeneous_mode(&gpu).unwrap(),
        VgpuMode::Heterogeneous
    );
}

#[test]
fn in_mixed_size_mode_a_placement_holds_its_slots_for_every_type() {
    let n = l40s();
    let gpu = addr(L40S);
    n.set_vgpu_heterogeneous_mode(&gpu, VgpuMode::Heterogeneous)
        .unwrap();
    let h = VgpuMode::Heterogeneous;
    // A 12Q at 12 holds slots 12..24: the 24Q at 0 (0..24) is gone, the one at 24 stays; the
    // 12Q keeps 0, 24 and 36.
    n.start_vgpu(&gpu, 2, Some(12), None).unwrap();
    let big = n.vgpu_type_creatable_placements(&gpu, 1, h).unwrap();
    assert_eq!((big.placement_size, big.placement_ids), (24, vec![24]));
    let small = n.vgpu_type_creatable_placements(&gpu, 2, h).unwrap();
    assert_eq!(small.placement_ids, [0, 24, 36]);
    // Supported placements do not change with what runs.
    assert_eq!(
        n.vgpu_type_supported_placements(&gpu, 1, h)
            .unwrap()
            .placement_ids,
        [0, 24]
    );
    // A 24Q at 0 overlaps the 12Q and is refused; at 24 it fits, and the mix is listed.
    assert_eq!(
        n.start_vgpu(&gpu, 1, Some(0), None).unwrap_err().kind,
        NvmlErrorKind::InsufficientResources
    );
    n.start_vgpu(&gpu, 1, Some(24), None).unwrap();
    let active: Vec<(u32, Option<u32>)> = n
        .active_vgpus(&gpu)
        .unwrap()
        .iter()
        .map(|v| (v.type_id, v.placement_id))
        .collect();
    assert_eq!(active, [(2, Some(12)), (1, Some(24))]);
}

#[test]
fn in_homogeneous_mode_a_second_size_finds_no_placement() {
    let n = l40s();
    let gpu = addr(L40S);
    let m = VgpuMode::Homogeneous;
    n.start_vgpu(&gpu, 2, Some(0), None).unwrap();
    assert_eq!(
        n.vgpu_type_creatable_placements(&gpu, 1, m)
            .unwrap()
            .placement_ids,
        Vec::<u32>::new()
    );
    assert_eq!(
        n.vgpu_type_creatable_placements(&gpu, 2, m)
            .unwrap()
            .placement_ids,
        [12, 24, 36]
    );
    assert_eq!(
        n.start_vgpu(&gpu, 1, None, None).unwrap_err().kind,
        NvmlErrorKind::InsufficientResources
    );
}

#[test]
fn in_mig_mode_the_mixed_size_calls_answer_not_supported() {
    let types = vec![FakeVgpuType::new(1, "NVIDIA H100XM-80C", 81920, 8, &[0])];
    let n = FakeNvml::new().with_gpu(
        addr(H100),
        FakeGpu::mig(h100_geometry())
            .with_mig_mode(MigMode::Enabled)
            .with_vgpu_types(types)
            .mixed_size(VgpuMode::Homogeneous),
    );
    let gpu = addr(H100);
    let h = VgpuMode::Heterogeneous;
    for e in [
        n.vgpu_heterogeneous_mode(&gpu).map(|_| ()).unwrap_err(),
        n.set_vgpu_heterogeneous_mode(&gpu, h).unwrap_err(),
        n.vgpu_type_creatable_placements(&gpu, 1, h)
            .map(|_| ())
            .unwrap_err(),
    ] {
        assert_eq!(e.kind, NvmlErrorKind::NotSupported, "{e}");
    }
}

#[test]
fn unknown_lost_and_failing_gpus_answer_as_nvml_does() {
    let n = h100()
        .with_gpu(addr("0000:43:00.0"), FakeGpu::new(1024).lost())
        .failing("nvmlDeviceGetModuleId", NvmlErrorKind::NoPermission);
    let nowhere = n.mig_mode(&addr("0000:99:00.0")).unwrap_err();
    assert_eq!(
        (nowhere.call, nowhere.kind),
        (LOOKUP, NvmlErrorKind::NotFound)
    );
    assert_eq!(
        n.health_reads(&addr("0000:43:00.0")).unwrap_err().kind,
        NvmlErrorKind::GpuLost
    );
    assert_eq!(
        n.module_id(&addr(H100)).unwrap_err().kind,
        NvmlErrorKind::NoPermission
    );
}

#[test]
fn module_ids_are_read_on_nvswitch_boards_only() {
    let n = h100().with_gpu(addr(L40S), FakeGpu::new(1024).with_module_id(3));
    assert_eq!(n.module_id(&addr(L40S)).unwrap(), 3);
    assert_eq!(
        n.module_id(&addr(H100)).unwrap_err().kind,
        NvmlErrorKind::NotSupported
    );
}

#[test]
fn mig_backed_vgpus_of_different_sizes_share_a_gpu_one_per_instance() {
    let types = vec![
        FakeVgpuType::new(1061, "NVIDIA H100XM-1-10C", 10240, 0, &[]).mig_backed(19),
        FakeVgpuType::new(1066, "NVIDIA H100XM-3-40C", 40960, 0, &[]).mig_backed(9),
        FakeVgpuType::new(1070, "NVIDIA H100XM-80C", 81920, 8, &[0]),
    ];
    let n = FakeNvml::new().with_gpu(
        addr(H100),
        FakeGpu::mig(h100_geometry())
            .with_mig_mode(MigMode::Enabled)
            .with_vgpu_types(types),
    );
    let gpu = addr(H100);
    let three = n.create_gpu_instance(&gpu, 9, at(0, 4)).unwrap();
    let one = n.create_gpu_instance(&gpu, 19, at(4, 1)).unwrap();
    n.start_vgpu(&gpu, 1066, None, Some(three.id)).unwrap();
    n.start_vgpu(&gpu, 1061, None, Some(one.id)).unwrap();
    assert_eq!(
        n.start_vgpu(&gpu, 1061, None, Some(one.id))
            .unwrap_err()
            .kind,
        NvmlErrorKind::InsufficientResources
    );
    // A time-sliced type does not run while the GPU is in MIG mode.
    assert_eq!(
        n.start_vgpu(&gpu, 1070, Some(0), None).unwrap_err().kind,
        NvmlErrorKind::NotSupported
    );
    assert_eq!(n.active_vgpus(&gpu).unwrap().len(), 2);
}
