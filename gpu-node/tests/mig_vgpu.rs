#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! Time-sliced vGPUs inside MIG GPU instances, on the fake NVML: an instance holds up to the
//! count the driver lists, an instance is filled before another is opened, and a GPU whose
//! instances are full is refused naming each one.

use gpu_core::PciAddress;
use gpu_core::mig::MigGeometry;
use gpu_node::mig_vgpu;
use gpu_node::mixed::MixedError;
use gpu_nvml::fake::{FakeGpu, FakeNvml, FakeVgpuType};
use gpu_nvml::{MigMode, NvmlDevices, Placement};

fn gpu() -> PciAddress {
    "0000:41:00.0".parse().unwrap()
}

/// A seven-slice GPU in MIG mode whose driver time-slices a 1g type three to an instance
/// (type 7, profile ID 19 = 1g) and a 2g type once (type 8, profile ID 15); two 1g instances.
fn gpu_with_two_1g_instances(per_instance: u32) -> FakeNvml {
    let g = MigGeometry::for_device(0x2330).unwrap();
    let types = vec![
        FakeVgpuType::new(7, "NVIDIA DC-1-8C", 8192, 1, &[])
            .mig_backed(19)
            .time_sliced_in_instance(per_instance),
        FakeVgpuType::new(8, "NVIDIA DC-2-20C", 20480, 1, &[]).mig_backed(15),
    ];
    let n = FakeNvml::new().with_gpu(
        gpu(),
        FakeGpu::mig(g)
            .with_mig_mode(MigMode::Enabled)
            .with_vgpu_types(types),
    );
    for start in [6, 5] {
        n.create_gpu_instance(&gpu(), 19, Placement { start, size: 1 })
            .unwrap();
    }
    n
}

/// Chooses and starts (the kernel's part, played by the fake) one vGPU of `type_id`.
fn place(n: &FakeNvml, type_id: u32) -> Result<u32, MixedError> {
    let c = mig_vgpu::choose_instance(n, &gpu(), type_id)?;
    n.start_vgpu(&gpu(), type_id, Some(c.placement_id), Some(c.gpu_instance))
        .unwrap();
    Ok(c.gpu_instance)
}

#[test]
fn an_instance_holds_up_to_the_count_the_driver_lists_and_is_filled_before_the_next() {
    let n = gpu_with_two_1g_instances(3);
    let first = place(&n, 7).unwrap();
    assert_eq!(
        place(&n, 7).unwrap(),
        first,
        "the same instance is filled first"
    );
    assert_eq!(place(&n, 7).unwrap(), first);
    let second = place(&n, 7).unwrap();
    assert_ne!(second, first, "the fourth goes to the other instance");
    assert_eq!(place(&n, 7).unwrap(), second);
    assert_eq!(place(&n, 7).unwrap(), second);
    let e = place(&n, 7).unwrap_err();
    assert!(
        matches!(e, MixedError::NoInstanceRoom { type_id: 7, .. }),
        "{e:?}"
    );
    let text = e.to_string();
    assert!(
        text.contains("instance 1: 0 free") && text.contains("instance 2: 0 free"),
        "{text}"
    );
    assert_eq!(n.active_vgpus(&gpu()).unwrap().len(), 6);
}

#[test]
fn without_time_slicing_an_instance_holds_one_vgpu() {
    let n = gpu_with_two_1g_instances(1);
    let a = place(&n, 7).unwrap();
    let b = place(&n, 7).unwrap();
    assert_ne!(a, b);
    assert!(place(&n, 7).is_err());
}

#[test]
fn a_type_with_no_instance_of_its_profile_is_refused_and_says_so() {
    let n = gpu_with_two_1g_instances(3);
    let e = mig_vgpu::choose_instance(&n, &gpu(), 8).unwrap_err();
    assert!(e.to_string().contains("no GPU instance"), "{e}");
    assert_eq!(
        gpu_core::error::ClassifiedError::kind(&e),
        gpu_core::ErrorKind::Exhausted
    );
}
