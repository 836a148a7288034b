#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! A time-sliced vGPU inside a MIG GPU instance on the node: an instance holds up to the count
//! the driver lists; one more in a full GPU makes a new instance through the MIG writer when
//! asked (recorded as gpuslice's), else is refused naming each instance and what it can take.

use gpu_core::PciAddress;
use gpu_core::mig::MigGeometry;
use gpu_node::Node;
use gpu_node::mig::MigError;
use gpu_node::mixed::MixedError;
use gpu_node::mixed_mig::instance_for;
use gpu_nvml::fake::{FakeGpu, FakeNvml, FakeVgpuType};
use gpu_nvml::{MigMode, NvmlDevices, Placement};
use gpu_sysfs::discover::DiscoverOptions;
use gpu_sysfs::testing::FakeKernel;

fn gpu() -> PciAddress {
    "0000:26:00.0".parse().unwrap()
}

/// An H100 (seven slices) in MIG mode whose driver time-slices type 7 two to a 1g instance
/// (profile ID 19); one 1g instance, not gpuslice's.
fn nvml() -> FakeNvml {
    let g = MigGeometry::for_device(0x2330).unwrap();
    let types = vec![
        FakeVgpuType::new(7, "NVIDIA DC-1-8C", 8192, 1, &[])
            .mig_backed(19)
            .time_sliced_in_instance(2),
    ];
    let n = FakeNvml::new().with_gpu(
        gpu(),
        FakeGpu::mig(g)
            .with_mig_mode(MigMode::Enabled)
            .with_vgpu_types(types),
    );
    n.create_gpu_instance(&gpu(), 19, Placement { start: 6, size: 1 })
        .unwrap();
    n
}

#[test]
fn a_full_instance_gets_a_new_one_on_request_and_is_refused_naming_each_instance_otherwise() {
    let k = FakeKernel::vendor_vfio_host(0x2330, 80 * 1024, &[], 0).unwrap();
    let n = nvml();
    let opts = DiscoverOptions::new("node-a");
    let node = Node::new(&k, &opts);
    let mig = node.mig(&n);
    let place = |make: bool| {
        let (c, made) = instance_for(&mig, &n, &gpu(), 7, "1g.10gb", make, false)?;
        n.start_vgpu(&gpu(), 7, Some(c.placement_id), Some(c.gpu_instance))
            .unwrap();
        Ok::<_, MigError>((c.gpu_instance, made))
    };
    let (first, made) = place(false).unwrap();
    assert!(made.is_none());
    assert_eq!(place(false).unwrap(), (first, None), "two fit the instance");

    // Full, not asked to make one: refused naming the instance and its free placements.
    let writes = n.writes().len();
    let e = place(false).unwrap_err();
    assert!(
        matches!(&e, MigError::Node(b) if matches!(&**b, gpu_node::NodeError::Mixed(m) if matches!(**m, MixedError::NoInstanceRoom { .. }))),
        "{e:?}"
    );
    assert!(
        e.to_string().contains(&format!("instance {first}: 0 free")),
        "{e}"
    );
    assert_eq!(n.writes().len(), writes, "nothing written");

    // Asked: a new 1g instance made through the MIG writer, recorded as gpuslice's.
    let (second, made) = place(true).unwrap();
    let made = made.expect("a new instance");
    assert_ne!(second, first);
    assert_eq!((made.id, made.profile.as_str()), (second, "1g.10gb"));
    assert_eq!(made.made_by, "gpuslice");
    assert_eq!(n.gpu_instances(&gpu()).unwrap().len(), 2);
    // The new one is filled before another is opened.
    assert_eq!(place(true).unwrap(), (second, None));
}
