#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! A time-sliced vGPU inside a MIG GPU instance on the node: an instance holds up to the count
//! the driver lists; one more in a full GPU makes a new instance through the MIG writer when
//! asked (recorded as gpuslice's), else is refused naming each instance and what it can take.
//! Through `vgpu create`'s door ([`gpu_node::mixed_door::create_with_nvml`]) the second vGPU
//! joins the first one's instance instead of a new instance being made per vGPU (Blackwell RTX
//! PRO: one instance holds several vGPUs, as many as the driver lists).

use gpu_core::mig::MigGeometry;
use gpu_core::{ParentId, PciAddress};
use gpu_node::mig::MigError;
use gpu_node::mixed::MixedError;
use gpu_node::mixed_door::create_with_nvml;
use gpu_node::mixed_mig::instance_for;
use gpu_node::{Node, NodeError};
use gpu_nvml::fake::{FakeGpu, FakeNvml, FakeVgpuType};
use gpu_nvml::{MigMode, NvmlDevices, Placement};
use gpu_sysfs::discover::DiscoverOptions;
use gpu_sysfs::testing::FakeKernel;

/// The caller's error (its contents shown by `unwrap` only).
#[derive(Debug)]
#[allow(dead_code)]
enum E {
    Node(Box<NodeError>),
    Mig(Box<MigError>),
}

impl From<NodeError> for E {
    fn from(e: NodeError) -> Self {
        E::Node(Box::new(e))
    }
}

impl From<MigError> for E {
    fn from(e: MigError) -> Self {
        E::Mig(Box::new(e))
    }
}

fn gpu() -> PciAddress {
    "0000:26:00.0".parse().unwrap()
}

/// An H100 (seven slices) in MIG mode whose driver time-slices type 7 two to a 1g instance
/// (profile ID 19; the count is the driver's, given by the test); no GPU instance yet.
fn nvml_without_instance() -> FakeNvml {
    let g = MigGeometry::for_device(0x2330).unwrap();
    let types = vec![
        FakeVgpuType::new(7, "NVIDIA DC-1-8C", 8192, 1, &[])
            .mig_backed(19)
            .time_sliced_in_instance(2),
    ];
    FakeNvml::new().with_gpu(
        gpu(),
        FakeGpu::mig(g)
            .with_mig_mode(MigMode::Enabled)
            .with_vgpu_types(types),
    )
}

/// [`nvml_without_instance`] with one 1g instance, not gpuslice's.
fn nvml() -> FakeNvml {
    let n = nvml_without_instance();
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

#[test]
fn a_vgpu_time_sliced_inside_instances_fills_its_instance_before_another_is_made() {
    let k = FakeKernel::vendor_vfio_host(0x2330, 80 * 1024, &[(7, "NVIDIA DC-1-8C")], 8).unwrap();
    let n = nvml_without_instance();
    let opts = DiscoverOptions::new("node-a");
    let node = Node::new(&k, &opts);
    let create = || {
        create_with_nvml::<E>(
            &node,
            &n,
            &ParentId::Pci(gpu()),
            "DC-1-8C",
            false,
            false,
            |_| Ok(gpu()),
            |_| Ok(None),
        )
    };
    // The VM's start, which NVML sees: in the instance the driver lists room in.
    let start = || {
        let gi = n
            .gpu_instances(&gpu())
            .unwrap()
            .into_iter()
            .find_map(|gi| {
                let p = n
                    .gpu_instance_vgpu_creatable_placements(&gpu(), gi.id, 7)
                    .ok()?;
                Some((gi.id, *p.placement_ids.first()?))
            })
            .unwrap();
        n.start_vgpu(&gpu(), 7, Some(gi.1), Some(gi.0)).unwrap();
    };
    let (_, made) = create().unwrap();
    assert!(made.is_some(), "the first vGPU's instance is made");
    start();
    let (_, made) = create().unwrap();
    assert!(made.is_none(), "the second joins the first one's instance");
    assert_eq!(n.gpu_instances(&gpu()).unwrap().len(), 1);
    start();
    // Full (the driver lists no more room in it): a new instance.
    let (_, made) = create().unwrap();
    assert!(made.is_some(), "a new instance once the first is full");
    assert_eq!(n.gpu_instances(&gpu()).unwrap().len(), 2);
}

/// A layout asking four vGPUs of a type the driver time-slices two to an instance, with one
/// empty instance of its profile there: one more instance is derived, not one per vGPU (what
/// NVIDIA's vgpu-device-manager derives, wrong on Blackwell).
#[test]
fn a_layout_derives_instances_by_what_one_instance_holds_not_one_per_vgpu() {
    use gpu_nvml::Placement;
    let k = FakeKernel::vendor_vfio_host(0x2330, 80 * 1024, &[(7, "NVIDIA DC-1-8C")], 8).unwrap();
    let n = nvml_without_instance();
    n.create_gpu_instance(&gpu(), 19, Placement { start: 6, size: 1 })
        .unwrap();
    let opts = DiscoverOptions::new("node-a");
    let node = Node::new(&k, &opts);
    let mig = node.mig(&n);
    let wants = std::collections::BTreeMap::from([(gpu(), vec![("DC-1-8C".to_owned(), 4)])]);
    let per_vgpu = mig.layout_needs(&wants).unwrap();
    assert_eq!(
        per_vgpu[0].make.len(),
        3,
        "one instance per vGPU, less the one there"
    );
    let counted = gpu_node::mixed_mig::instance_counts(&n, &wants);
    assert_eq!(counted[&gpu()], vec![("DC-1-8C".to_owned(), 2)]);
    let needs = mig.layout_needs(&counted).unwrap();
    assert_eq!(needs[0].make, vec!["1g.10gb".to_owned()]);
}
