//! The real `NvmlLibrary` against a stand-in `libnvidia-ml.so.1` compiled from
//! `data/nvml_writer_stub.c`: the raw partition calls (symbols, struct versions, buffer sizes,
//! return codes) run for real without a GPU.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::{Path, PathBuf};

use gpu_core::PciAddress;
use gpu_nvml::{
    ActiveVgpu, MigActivation, MigMode, MigModes, NvmlDevices, NvmlErrorKind, NvmlLibrary,
    Placement, VgpuMode, VgpuScheduler,
};

const H100: &str = "0000:18:00.0";
const L40S: &str = "0000:3b:00.0";

/// Builds the stub with extra `-D` flags ([`gpu_nvml::stub::build`]); `None` (and a SKIPPED
/// line) without a C compiler.
fn build_stub(defines: &[&str]) -> Option<(tempfile::TempDir, PathBuf)> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/nvml_writer_stub.c");
    gpu_nvml::stub::build(&src, defines).unwrap()
}

fn addr(s: &str) -> PciAddress {
    s.parse().unwrap()
}

fn at(start: u32, size: u32) -> Placement {
    Placement { start, size }
}

#[test]
fn mig_mode_is_enabled_and_gpu_instances_are_made_and_destroyed_through_nvml() {
    let Some((_dir, lib)) = build_stub(&[]) else {
        return;
    };
    let nvml = NvmlLibrary::open(Some(&lib)).unwrap();
    let gpu = addr(H100);
    assert_eq!(nvml.driver_version().as_deref(), Some("575.51.02"));
    assert_eq!(
        nvml.mig_mode(&gpu).unwrap(),
        MigModes::settled(MigMode::Disabled)
    );
    // Placements are listed with MIG mode off; profiles and instances are not.
    assert_eq!(
        nvml.gpu_instance_possible_placements(&gpu, 9).unwrap(),
        [at(0, 4), at(4, 4)]
    );
    assert_eq!(
        nvml.gpu_instances(&gpu).unwrap_err().kind,
        NvmlErrorKind::NotSupported
    );
    assert_eq!(
        nvml.set_mig_mode(&gpu, MigMode::Enabled).unwrap(),
        MigActivation::Active
    );
    let profiles = nvml.gpu_instance_profiles(&gpu).unwrap();
    assert_eq!(
        profiles.iter().map(|p| (p.index, p.id)).collect::<Vec<_>>(),
        [(0, 19), (2, 9)]
    );
    let one = nvml.create_gpu_instance(&gpu, 19, at(4, 1)).unwrap();
    assert_eq!(
        (one.profile_id, one.slice_count, one.placement),
        (19, 1, at(4, 1))
    );
    let e = nvml.create_gpu_instance(&gpu, 9, at(4, 4)).unwrap_err();
    assert_eq!(
        (e.call, e.kind),
        (
            "nvmlDeviceCreateGpuInstanceWithPlacement",
            NvmlErrorKind::InsufficientResources
        )
    );
    let three = nvml.create_gpu_instance(&gpu, 9, at(0, 4)).unwrap();
    assert_eq!(nvml.gpu_instances(&gpu).unwrap(), [three, one]);
    nvml.destroy_gpu_instance(&gpu, one.id).unwrap();
    assert_eq!(
        nvml.destroy_gpu_instance(&gpu, one.id).unwrap_err().kind,
        NvmlErrorKind::NotFound
    );
    assert_eq!(nvml.gpu_instances(&gpu).unwrap(), [three]);
    assert_eq!(nvml.module_id(&gpu).unwrap(), 5);
}

#[test]
fn a_mode_the_gpu_cannot_activate_now_reads_as_pending_with_its_reason() {
    let Some((_dir, lib)) = build_stub(&["STUB_ACTIVATION=16"]) else {
        return;
    };
    let nvml = NvmlLibrary::open(Some(&lib)).unwrap();
    let gpu = addr(H100);
    assert_eq!(
        nvml.set_mig_mode(&gpu, MigMode::Enabled).unwrap(),
        MigActivation::Pending(NvmlErrorKind::ResetRequired)
    );
    assert_eq!(nvml.mig_mode(&gpu).unwrap().describe(), "pending reset");
}

#[test]
fn mixed_size_mode_and_placements_are_read_with_versioned_structs() {
    let Some((_dir, lib)) = build_stub(&[]) else {
        return;
    };
    let nvml = NvmlLibrary::open(Some(&lib)).unwrap();
    let gpu = addr(L40S);
    // The stub answers ARGUMENT_VERSION_MISMATCH to a struct with the wrong version.
    assert_eq!(
        nvml.vgpu_heterogeneous_mode(&gpu).unwrap(),
        VgpuMode::Homogeneous
    );
    let h = VgpuMode::Heterogeneous;
    let supported = nvml.vgpu_type_supported_placements(&gpu, 2, h).unwrap();
    assert_eq!(
        (supported.placement_size, supported.placement_ids),
        (12, vec![0, 12, 24, 36])
    );
    let creatable = nvml.vgpu_type_creatable_placements(&gpu, 2, h).unwrap();
    assert_eq!(creatable.placement_ids, [0, 24, 36]);
    assert_eq!(
        nvml.active_vgpus(&gpu).unwrap(),
        [ActiveVgpu {
            instance: 7,
            type_id: 2,
            placement_id: Some(12)
        }]
    );
    let e = nvml.set_vgpu_heterogeneous_mode(&gpu, h).unwrap_err();
    assert_eq!(
        (e.call, e.kind),
        ("nvmlDeviceSetVgpuHeterogeneousMode", NvmlErrorKind::InUse)
    );
    assert_eq!(
        nvml.mig_mode(&gpu).unwrap_err().kind,
        NvmlErrorKind::NotSupported
    );
    assert_eq!(
        nvml.module_id(&gpu).unwrap_err().kind,
        NvmlErrorKind::NotSupported
    );
    let nowhere = nvml.module_id(&addr("0000:99:00.0")).unwrap_err();
    assert_eq!(
        (nowhere.call, nowhere.kind),
        ("nvmlDeviceGetHandleByPciBusId_v2", NvmlErrorKind::NotFound)
    );
}

#[test]
fn a_driver_without_the_write_calls_answers_function_not_found_naming_the_call() {
    let Some((_dir, lib)) = build_stub(&["STUB_NO_WRITES"]) else {
        return;
    };
    let nvml = NvmlLibrary::open(Some(&lib)).unwrap();
    let gpu = addr(H100);
    nvml.set_mig_mode(&gpu, MigMode::Enabled).unwrap();
    let e = nvml.create_gpu_instance(&gpu, 19, at(0, 1)).unwrap_err();
    assert_eq!(
        (e.call, e.kind),
        (
            "nvmlDeviceCreateGpuInstanceWithPlacement",
            NvmlErrorKind::FunctionNotFound
        )
    );
    let e = nvml
        .set_vgpu_heterogeneous_mode(&addr(L40S), VgpuMode::Heterogeneous)
        .unwrap_err();
    assert_eq!(e.kind, NvmlErrorKind::FunctionNotFound);
    // Reads still work.
    assert_eq!(nvml.gpu_instances(&gpu).unwrap(), []);
}

#[test]
fn a_library_that_does_not_exist_is_unavailable_for_every_call() {
    let dir = tempfile::tempdir().unwrap();
    let nvml = NvmlLibrary::open_now(Some(&dir.path().join("libnvidia-ml.so.1")));
    assert!(nvml.wait().is_err());
    let e = nvml
        .set_vgpu_heterogeneous_mode(&addr(L40S), VgpuMode::Heterogeneous)
        .unwrap_err();
    assert!(matches!(e.kind, NvmlErrorKind::Unavailable(_)), "{e}");
}

#[test]
fn the_scheduler_and_an_instances_creatable_vgpu_placements_are_read_through_nvml() {
    let Some((_dir, lib)) = build_stub(&[]) else {
        return;
    };
    let nvml = NvmlLibrary::open(Some(&lib)).unwrap();
    assert_eq!(
        nvml.vgpu_scheduler(&addr(L40S)).unwrap(),
        VgpuScheduler::EqualShare
    );
    assert_eq!(
        nvml.vgpu_scheduler(&addr(H100)).unwrap_err().kind,
        NvmlErrorKind::NotSupported
    );
    let gpu = addr(H100);
    nvml.set_mig_mode(&gpu, MigMode::Enabled).unwrap();
    let gi = nvml.create_gpu_instance(&gpu, 19, at(6, 1)).unwrap();
    // The stub answers INSUFFICIENT_SIZE to a short buffer and a version mismatch to a wrong
    // struct version: both are handled by the real loader.
    let p = nvml
        .gpu_instance_vgpu_creatable_placements(&gpu, gi.id, 70)
        .unwrap();
    assert_eq!((p.placement_size, p.placement_ids), (1, vec![1, 2]));
    let e = nvml
        .gpu_instance_vgpu_creatable_placements(&gpu, gi.id + 100, 70)
        .unwrap_err();
    assert_eq!(e.kind, NvmlErrorKind::NotFound);
}
