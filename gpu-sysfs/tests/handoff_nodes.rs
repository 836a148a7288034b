//! The device nodes a VM needs come with every hand-off: the group's node and the container, the
//! VFIO cdev and iommufd where the kernel made one, the no-IOMMU node in no-IOMMU mode.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use gpu_core::{MdevUuid, PciAddress};
use gpu_sysfs::actuate::{self, handoff};
use gpu_sysfs::testing::{FakeKernel, PciSpec, TreeBuilder};
use gpu_sysfs::{Host, RealHost};

fn pci(s: &str) -> PciAddress {
    s.parse().unwrap()
}

#[test]
fn a_vf_given_a_type_hands_off_its_group_node_and_the_container() {
    let k = FakeKernel::l40s_vendor_vfio_host(4).unwrap();
    let vf = pci("0000:26:00.5");
    let group = k
        .read_link("sys/bus/pci/devices/0000:26:00.5/iommu_group")
        .unwrap();
    let group = group.file_name().unwrap().to_string_lossy().into_owned();
    let set = actuate::set_vf_type(&k, &vf, 1155, false).unwrap();
    assert_eq!(
        set.handoff.device_nodes,
        ["/dev/vfio/vfio".to_owned(), format!("/dev/vfio/{group}")]
    );
    let json = serde_json::to_value(&set.handoff).unwrap();
    assert_eq!(json["deviceNodes"][0], "/dev/vfio/vfio");
}

#[test]
fn an_mdev_hands_off_its_emulated_groups_node_and_its_cdev() {
    let k = FakeKernel::sample_mdev_drivers().unwrap();
    let uuid = MdevUuid::for_machine("vm1", "gpu", 0);
    let made = actuate::create_mdev(
        &k,
        &actuate::MdevCreate {
            parent: gpu_core::ParentId::Named("mbochs".into()),
            type_id: gpu_core::VgpuTypeId::from_str_unchecked("mbochs-small"),
            uuid,
        },
    );
    let Ok(made) = made else {
        panic!("create failed: {made:?}");
    };
    let group = k
        .read_link(&format!("sys/bus/mdev/devices/{uuid}/iommu_group"))
        .unwrap();
    let group = group.file_name().unwrap().to_string_lossy().into_owned();
    // An mdev's group is one VFIO emulates (named vfio-noiommu, but its node is the plain
    // number), and the 6.1 kernel also makes a cdev for the instance.
    let cdev = k
        .list(&format!("sys/bus/mdev/devices/{uuid}/vfio-dev"))
        .unwrap();
    assert_eq!(
        made.handoff.device_nodes,
        [
            "/dev/vfio/vfio".to_owned(),
            format!("/dev/vfio/{group}"),
            "/dev/iommu".to_owned(),
            format!("/dev/vfio/devices/{}", cdev[0]),
        ]
    );
}

#[test]
fn a_cdev_adds_iommufd_and_a_pci_device_in_no_iommu_mode_has_the_noiommu_node() {
    let mut b = TreeBuilder::new();
    b.pci(
        "0000:17:00.0",
        PciSpec::new(0x10de, 0x26b1, 0x030000)
            .driver("vfio-pci")
            .group(12),
    )
    .mkdir("sys/devices/pci0000:00/0000:17:00.0/vfio-dev/vfio3")
    .pci(
        "0000:3b:00.0",
        PciSpec::new(0x1002, 0x740f, 0x038000)
            .driver("vfio-pci")
            .group(0),
    )
    .file("sys/kernel/iommu_groups/0/name", "vfio-noiommu\n")
    .pci(
        "0000:5e:00.0",
        PciSpec::new(0x10de, 0x1eb8, 0x030200).driver("nvidia"),
    );
    let t = b.finish().unwrap();
    let host = RealHost::new(t.root()).unwrap();
    assert_eq!(
        handoff::pci_device_nodes(&host, &pci("0000:17:00.0")),
        [
            "/dev/vfio/vfio",
            "/dev/vfio/12",
            "/dev/iommu",
            "/dev/vfio/devices/vfio3"
        ]
    );
    assert_eq!(
        handoff::pci_device_nodes(&host, &pci("0000:3b:00.0")),
        ["/dev/vfio/vfio", "/dev/vfio/noiommu-0"]
    );
    assert!(
        handoff::pci_device_nodes(&host, &pci("0000:5e:00.0")).is_empty(),
        "no group, no node"
    );
}
