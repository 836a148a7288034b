//! What a VM monitor needs to take a device: the QEMU `-device` argument and the libvirt
//! `<hostdev>` element, for an mdev (by UUID) or a PCI function (a whole GPU, its audio function,
//! or an NVIDIA vendor-VFIO VF), and the device nodes the VM's process must be allowed to open
//! (for a device cgroup, or a container's device list).
//!
//! VFIO gives a device to user space two ways: its IOMMU group's node `/dev/vfio/<group>`
//! (`/dev/vfio/noiommu-<group>` in no-IOMMU mode), opened with the container `/dev/vfio/vfio`;
//! or, on kernels with VFIO device cdevs, the device's own `/dev/vfio/devices/vfioN`, used with
//! `/dev/iommu` (iommufd). gpuslice lists every node the device has, so either way works.

use gpu_core::{MdevUuid, PciAddress};
use serde::{Deserialize, Serialize};

use crate::Host;

/// The VFIO container every group-based VM opens.
pub const VFIO_CONTAINER: &str = "/dev/vfio/vfio";
/// The iommufd node a cdev-based VM opens.
pub const IOMMUFD: &str = "/dev/iommu";

/// The device nodes of the device whose sysfs directory (root-relative) is `dev_dir`: the group's
/// node with the container, and the VFIO cdev with iommufd when the kernel made one. Empty when
/// the device has no IOMMU group (then no VM can take it).
///
/// VFIO names the groups it makes itself `vfio-noiommu`, both for an mdev's emulated group (node
/// `/dev/vfio/<group>`) and for a PCI device in no-IOMMU mode (node `/dev/vfio/noiommu-<group>`);
/// `emulated` says which (true for an mdev).
pub fn vfio_device_nodes(host: &dyn Host, dev_dir: &str, emulated: bool) -> Vec<String> {
    let mut out = Vec::new();
    let Ok(group_link) = host.read_link(&format!("{dev_dir}/iommu_group")) else {
        return out;
    };
    let Some(group) = group_link
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .filter(|g| !g.is_empty() && g.bytes().all(|b| b.is_ascii_digit()))
    else {
        return out;
    };
    let noiommu = !emulated
        && host
            .read_string(&format!("sys/kernel/iommu_groups/{group}/name"))
            .is_ok_and(|n| n == "vfio-noiommu");
    out.push(VFIO_CONTAINER.to_owned());
    out.push(if noiommu {
        format!("/dev/vfio/noiommu-{group}")
    } else {
        format!("/dev/vfio/{group}")
    });
    let cdevs: Vec<String> = host
        .list(&format!("{dev_dir}/vfio-dev"))
        .unwrap_or_default()
        .into_iter()
        .filter(|n| {
            n.strip_prefix("vfio")
                .is_some_and(|d| !d.is_empty() && d.bytes().all(|b| b.is_ascii_digit()))
        })
        .collect();
    if !cdevs.is_empty() {
        out.push(IOMMUFD.to_owned());
        out.extend(cdevs.into_iter().map(|c| format!("/dev/vfio/devices/{c}")));
    }
    out
}

/// The device nodes of a PCI function (a whole GPU, its audio function, a vendor-VFIO VF).
pub fn pci_device_nodes(host: &dyn Host, addr: &PciAddress) -> Vec<String> {
    vfio_device_nodes(host, &format!("sys/bus/pci/devices/{addr}"), false)
}

/// The device nodes of an mdev instance.
pub fn mdev_device_nodes(host: &dyn Host, uuid: &MdevUuid) -> Vec<String> {
    vfio_device_nodes(host, &format!("sys/bus/mdev/devices/{uuid}"), true)
}

/// The QEMU argument of an mdev: `-device vfio-pci,sysfsdev=/sys/bus/mdev/devices/<uuid>`.
pub fn qemu_mdev(uuid: &MdevUuid) -> String {
    format!("-device vfio-pci,sysfsdev=/sys/bus/mdev/devices/{uuid}")
}

/// The QEMU argument of a PCI function: `-device vfio-pci,host=<dddd:bb:dd.f>`.
pub fn qemu_pci(addr: &PciAddress) -> String {
    format!("-device vfio-pci,host={addr}")
}

/// The libvirt element of an mdev.
pub fn libvirt_mdev(uuid: &MdevUuid) -> String {
    format!(
        "<hostdev mode='subsystem' type='mdev' model='vfio-pci'><source><address uuid='{uuid}'/></source></hostdev>"
    )
}

/// The libvirt element of a PCI function, `managed='no'` because gpuslice (not libvirt) binds it.
pub fn libvirt_pci(addr: &PciAddress) -> String {
    format!(
        "<hostdev mode='subsystem' type='pci' managed='no'><source><address domain='0x{:04x}' bus='0x{:02x}' slot='0x{:02x}' function='0x{:x}'/></source></hostdev>",
        addr.domain(),
        addr.bus(),
        addr.device(),
        addr.function()
    )
}

/// Both snippets for one device.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Handoff {
    /// The QEMU `-device` argument.
    pub qemu: String,
    /// The libvirt `<hostdev>` element.
    pub libvirt: String,
    /// The device nodes the VM's process opens ([`vfio_device_nodes`]); empty when not looked
    /// up or when the device has no IOMMU group.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub device_nodes: Vec<String>,
}

impl Handoff {
    /// The snippets of an mdev.
    pub fn mdev(uuid: &MdevUuid) -> Self {
        Handoff {
            qemu: qemu_mdev(uuid),
            libvirt: libvirt_mdev(uuid),
            device_nodes: Vec::new(),
        }
    }

    /// The snippets of an mdev on `host`, with its device nodes.
    pub fn mdev_on(host: &dyn Host, uuid: &MdevUuid) -> Self {
        Handoff {
            device_nodes: mdev_device_nodes(host, uuid),
            ..Handoff::mdev(uuid)
        }
    }

    /// The snippets of a PCI function on `host`, with its device nodes.
    pub fn pci_on(host: &dyn Host, addr: &PciAddress) -> Self {
        Handoff {
            device_nodes: pci_device_nodes(host, addr),
            ..Handoff::pci(addr)
        }
    }

    /// The snippets of a PCI function.
    pub fn pci(addr: &PciAddress) -> Self {
        Handoff {
            qemu: qemu_pci(addr),
            libvirt: libvirt_pci(addr),
            device_nodes: Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn snippets_name_the_device_as_qemu_and_libvirt_expect() {
        let u: MdevUuid = "DE306C9F-A714-4373-A290-DC15D4E49B71".parse().unwrap();
        let h = Handoff::mdev(&u);
        assert_eq!(
            h.qemu,
            "-device vfio-pci,sysfsdev=/sys/bus/mdev/devices/de306c9f-a714-4373-a290-dc15d4e49b71"
        );
        assert!(h.libvirt.contains("type='mdev'"));
        assert!(
            h.libvirt
                .contains("<address uuid='de306c9f-a714-4373-a290-dc15d4e49b71'/>")
        );
        let a: PciAddress = "10000:3b:1f.7".parse().unwrap();
        let h = Handoff::pci(&a);
        assert_eq!(h.qemu, "-device vfio-pci,host=10000:3b:1f.7");
        assert_eq!(
            h.libvirt,
            "<hostdev mode='subsystem' type='pci' managed='no'><source><address domain='0x10000' bus='0x3b' slot='0x1f' function='0x7'/></source></hostdev>"
        );
    }
}
