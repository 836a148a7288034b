#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! Mixed-size vGPUs by placement, on the fake NVML: the mode, the scheduler, the placement
//! chosen on the one slot model, refusals that name the type and what is left, and the read-back.

use gpu_core::PciAddress;
use gpu_core::error::ClassifiedError;
use gpu_node::mixed::{self, MixedError};
use gpu_nvml::fake::{FakeGpu, FakeNvml, FakeVgpuType};
use gpu_nvml::{NvmlDevices, VgpuMode, VgpuScheduler};

const L40S: &str = "0000:3b:00.0";

fn gpu() -> PciAddress {
    L40S.parse().unwrap()
}

/// An L40S whose driver lists, in mixed-size mode, 24Q at 0/24 (24 slots), 12Q at 0/12/24/36
/// (12 slots) and 6Q at every 6 (6 slots): 48 slots in all.
fn l40s_gpu(mode: VgpuMode) -> FakeGpu {
    let types = vec![
        FakeVgpuType::new(1, "NVIDIA L40S-24Q", 24576, 24, &[0, 24]),
        FakeVgpuType::new(2, "NVIDIA L40S-12Q", 12288, 12, &[0, 12, 24, 36]),
        FakeVgpuType::new(
            3,
            "NVIDIA L40S-6Q",
            6144,
            6,
            &[0, 6, 12, 18, 24, 30, 36, 42],
        ),
    ];
    FakeGpu::new(46068).with_vgpu_types(types).mixed_size(mode)
}

fn l40s(mode: VgpuMode) -> FakeNvml {
    FakeNvml::new().with_gpu(gpu(), l40s_gpu(mode))
}

/// Plans, turns the mode on, and starts the vGPU where the plan says (the kernel's part, played
/// by the fake): what `vgpu create` does on such a GPU.
fn place(n: &FakeNvml, type_id: u32) -> Result<u32, MixedError> {
    let p = mixed::plan(n, &gpu(), type_id)?;
    mixed::turn_on(n, &p)?;
    n.start_vgpu(&gpu(), type_id, Some(p.placement_id), None)
        .expect("the fake takes the chosen placement");
    mixed::check_placed(n, &p)?;
    Ok(p.placement_id)
}

#[test]
fn an_idle_same_size_gpu_is_turned_to_mixed_size_before_the_first_vgpu() {
    let n = l40s(VgpuMode::Homogeneous);
    let p = mixed::plan(&n, &gpu(), 2).unwrap();
    assert!(p.turn_mode_on);
    assert!(n.writes().is_empty(), "planning writes nothing");
    mixed::turn_on(&n, &p).unwrap();
    assert_eq!(
        n.vgpu_heterogeneous_mode(&gpu()).unwrap(),
        VgpuMode::Heterogeneous
    );
    assert_eq!(n.writes().len(), 1, "{:?}", n.writes());
}

#[test]
fn vgpus_of_three_sizes_share_one_gpu_and_the_small_ones_keep_the_large_one_possible() {
    let n = l40s(VgpuMode::Homogeneous);
    // A 6Q first (slot 0: both ends cost the same); then a 12Q. First-fit would put the 12Q
    // at 24 and leave no half for a 24Q; keep-most puts it beside the 6Q, in the same half.
    let six = place(&n, 3).unwrap();
    assert_eq!(six, 0);
    let twelve = place(&n, 2).unwrap();
    assert_eq!(twelve, 12, "the 12Q goes beside the 6Q, in the same half");
    let twenty_four = place(&n, 1).unwrap();
    assert_eq!(twenty_four, 24, "the right half is still whole for a 24Q");
    let placements: Vec<_> = n
        .active_vgpus(&gpu())
        .unwrap()
        .iter()
        .map(|v| (v.type_id, v.placement_id))
        .collect();
    assert_eq!(placements, vec![(3, Some(0)), (2, Some(12)), (1, Some(24))]);
}

#[test]
fn a_mix_that_does_not_fit_is_refused_naming_the_type_and_the_placements_left() {
    let n = l40s(VgpuMode::Homogeneous);
    place(&n, 1).unwrap();
    place(&n, 2).unwrap();
    // 24 + 12 slots held: a second 24Q has no free half.
    let before = n.writes();
    let e = mixed::plan(&n, &gpu(), 1).unwrap_err();
    let text = e.to_string();
    assert!(
        matches!(
            e,
            MixedError::NoPlacement {
                type_id: 1,
                size: 24,
                ..
            }
        ),
        "{e:?}"
    );
    assert!(text.contains("placements [0, 24]"), "{text}");
    assert!(text.contains("NVIDIA L40S-12Q (2) at [36]"), "{text}");
    assert!(text.contains("NVIDIA L40S-6Q (3) at [36, 42]"), "{text}");
    assert_eq!(e.kind(), gpu_core::ErrorKind::Exhausted);
    assert_eq!(n.writes(), before, "a refusal writes nothing");
}

#[test]
fn a_same_size_gpu_with_vgpus_running_is_not_switched() {
    let n = l40s(VgpuMode::Homogeneous);
    n.start_vgpu(&gpu(), 2, Some(0), None).unwrap();
    let e = mixed::plan(&n, &gpu(), 1).unwrap_err();
    assert!(matches!(e, MixedError::InUse { running: 1, .. }), "{e:?}");
    assert_eq!(e.kind(), gpu_core::ErrorKind::InUse);
    assert!(n.writes().is_empty());
}

#[test]
fn fixed_share_is_refused_and_named_best_effort_and_equal_share_are_accepted() {
    for (scheduler, ok) in [
        (VgpuScheduler::BestEffort, true),
        (VgpuScheduler::EqualShare, true),
        (VgpuScheduler::FixedShare, false),
        (VgpuScheduler::Unknown(0), false),
    ] {
        let n = FakeNvml::new().with_gpu(
            gpu(),
            l40s_gpu(VgpuMode::Homogeneous).with_scheduler(scheduler),
        );
        let r = mixed::plan(&n, &gpu(), 2);
        assert_eq!(r.is_ok(), ok, "{scheduler}: {r:?}");
        if let Err(e) = r {
            assert!(e.to_string().contains(&scheduler.to_string()), "{e}");
            assert!(e.to_string().contains("best effort or equal share"), "{e}");
        }
        assert!(n.writes().is_empty());
    }
}

#[test]
fn a_scheduler_nvml_cannot_read_is_not_guessed() {
    let n = l40s(VgpuMode::Homogeneous).failing(
        "nvmlDeviceGetVgpuSchedulerState",
        gpu_nvml::NvmlErrorKind::FunctionNotFound,
    );
    let e = mixed::plan(&n, &gpu(), 2).unwrap_err();
    assert!(matches!(e, MixedError::SchedulerUnknown { .. }), "{e:?}");
}

#[test]
fn a_gpu_without_mixed_size_support_keeps_the_same_size_rule() {
    let types = vec![FakeVgpuType::new(
        1,
        "NVIDIA A2-4Q",
        4096,
        4,
        &[0, 4, 8, 12],
    )];
    let n = FakeNvml::new().with_gpu(gpu(), FakeGpu::new(16384).with_vgpu_types(types));
    let e = mixed::plan(&n, &gpu(), 1).unwrap_err();
    assert!(matches!(e, MixedError::Unsupported { .. }), "{e:?}");
    assert!(e.to_string().contains("one size"), "{e}");
}

#[test]
fn a_vgpu_the_driver_put_elsewhere_is_reported_on_read_back() {
    let n = l40s(VgpuMode::Heterogeneous);
    let p = mixed::plan(&n, &gpu(), 3).unwrap();
    let elsewhere = if p.placement_id == 0 { 6 } else { 0 };
    n.start_vgpu(&gpu(), 3, Some(elsewhere), None).unwrap();
    let e = mixed::check_placed(&n, &p).unwrap_err();
    assert!(
        matches!(e, MixedError::ReadBack { found: Some(f), .. } if f == elsewhere),
        "{e:?}"
    );
}

#[test]
fn on_a_gpu_already_in_mixed_size_mode_running_vgpus_hold_their_slots_and_nothing_is_switched() {
    let n = l40s(VgpuMode::Heterogeneous);
    n.start_vgpu(&gpu(), 2, Some(36), None).unwrap();
    let p = mixed::plan(&n, &gpu(), 1).unwrap();
    assert_eq!(
        p.placement_id, 0,
        "the 24Q half 24..48 is broken by the 12Q at 36"
    );
    assert!(!p.turn_mode_on);
    mixed::turn_on(&n, &p).unwrap();
    assert!(n.writes().is_empty(), "{:?}", n.writes());
}
