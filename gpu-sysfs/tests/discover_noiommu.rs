//! Hosts without an IOMMU: the groups VFIO makes for mdevs must not read as an IOMMU.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use gpu_core::GpuState;
use gpu_sysfs::Host;
use gpu_sysfs::discover::{DiscoverOptions, discover};
use gpu_sysfs::testing::{FakeKernel, PciSpec, TreeBuilder};

fn host_without_iommu() -> FakeKernel {
    let mut b = TreeBuilder::new();
    b.pci(
        "0000:00:02.0",
        PciSpec::new(0x1234, 0x1111, 0x030000).driver("bochs-drm"),
    );
    gpu_sysfs::testing::fake_kernel::add_sample_mdev_drivers(&mut b);
    FakeKernel::new(b.finish().unwrap())
        .unwrap()
        .with_sample_pools()
}

fn gpu_reason(k: &FakeKernel) -> (GpuState, String) {
    let t = discover(k, &DiscoverOptions::new("lab")).unwrap();
    let g = t
        .gpus
        .iter()
        .find(|g| g.address.to_string() == "0000:00:02.0")
        .unwrap();
    (g.state, g.state_reason.clone().unwrap_or_default())
}

#[test]
fn a_gpu_without_an_iommu_is_blocked_as_iommu_disabled() {
    let k = host_without_iommu();
    assert_eq!(
        gpu_reason(&k),
        (
            GpuState::Blocked,
            "no IOMMU group: IOMMU disabled".to_owned()
        )
    );
}

#[test]
fn an_mdev_group_does_not_make_the_host_look_like_it_has_an_iommu() {
    let k = host_without_iommu();
    k.write(
        "sys/class/mdev_bus/mbochs/mdev_supported_types/mbochs-small/create",
        b"de306c9f-a714-4373-a290-dc15d4e49b71",
    )
    .unwrap();
    assert!(
        !k.list("sys/kernel/iommu_groups").unwrap().is_empty(),
        "the mdev got a VFIO group"
    );
    assert_eq!(
        gpu_reason(&k),
        (
            GpuState::Blocked,
            "no IOMMU group: IOMMU disabled".to_owned()
        )
    );
}

#[test]
fn a_device_outside_the_iommu_on_a_host_with_one_is_named_so() {
    let mut b = TreeBuilder::new();
    b.pci(
        "0000:00:02.0",
        PciSpec::new(0x1234, 0x1111, 0x030000).driver("bochs-drm"),
    );
    b.pci(
        "0000:00:03.0",
        PciSpec::new(0x1234, 0x1111, 0x030000)
            .driver("bochs-drm")
            .group(2),
    );
    let k = FakeKernel::new(b.finish().unwrap()).unwrap();
    assert_eq!(
        gpu_reason(&k),
        (
            GpuState::Blocked,
            "no IOMMU group: the device is not behind an IOMMU".to_owned()
        )
    );
}
