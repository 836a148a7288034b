//! What a VM monitor needs to take a device: the QEMU `-device` argument and the libvirt
//! `<hostdev>` element, for an mdev (by UUID) or a PCI function (a whole GPU, its audio function,
//! or an NVIDIA vendor-VFIO VF).

use gpu_core::{MdevUuid, PciAddress};
use serde::{Deserialize, Serialize};

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
}

impl Handoff {
    /// The snippets of an mdev.
    pub fn mdev(uuid: &MdevUuid) -> Self {
        Handoff {
            qemu: qemu_mdev(uuid),
            libvirt: libvirt_mdev(uuid),
        }
    }

    /// The snippets of a PCI function.
    pub fn pci(addr: &PciAddress) -> Self {
        Handoff {
            qemu: qemu_pci(addr),
            libvirt: libvirt_pci(addr),
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
