//! NVSwitches: the NVIDIA PCI functions of class "bridge, other" (`0x0680xx`) that join an HGX
//! baseboard's GPUs over NVLink. Discovery reads only sysfs, so it knows the switches exist
//! but not Fabric Manager's partitions: it says Fabric Manager was not asked, and the
//! composition above (`gpu_health::fabric`) fills in what FM answers.

use gpu_core::PciAddress;
use gpu_core::fabric::{Fabric, FabricManager};

use super::pci::PciTable;

/// NVIDIA's PCI vendor ID.
const NVIDIA: u16 = 0x10de;
/// PCI class "bridge, other" (base 0x06, sub-class 0x80): what NVSwitches report.
const BRIDGE_OTHER: u32 = 0x0680;

/// Why a fabric found by discovery alone has no partitions.
pub const NOT_ASKED: &str = "Fabric Manager was not asked (sysfs alone does not list partitions)";

/// The NVSwitch functions among the host's PCI functions, in address order. A function a
/// GPU's `virtfnN` link already named is that GPU's VF, not a switch (NVSwitches have no
/// SR-IOV): its class is not read, so the VFs of a vGPU host cost no read here.
pub(super) fn nvswitches(table: &mut PciTable<'_>) -> Vec<PciAddress> {
    let mut out = Vec::new();
    for a in table.addresses() {
        if table.known_vf(&a) {
            continue;
        }
        if table.class(&a).is_some_and(|c| c.0 >> 8 == BRIDGE_OTHER)
            && table.vendor(&a) == Some(NVIDIA)
        {
            out.push(a);
        }
    }
    out
}

/// The fabric of a node with `switches`, `None` without any.
pub(super) fn discovered(switches: Vec<PciAddress>) -> Option<Fabric> {
    (!switches.is_empty()).then(|| Fabric {
        nvswitches: switches,
        fabric_manager: FabricManager::unreachable(NOT_ASKED),
        partitions: vec![],
    })
}
