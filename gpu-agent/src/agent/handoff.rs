//! What the agent hands a VM: the QEMU arguments and libvirt XML of a device
//! (`gpu_integrations::handoff`, the same as `gpuslice export vm`), answered as `vmHandoff`.

use gpu_core::{MdevUuid, PciAddress};
use gpu_integrations::handoff::{self, VmDevice, VmHandoff};

use super::Agent;

/// A device to hand to a VM.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HandoffTarget {
    /// An mdev instance.
    Mdev(MdevUuid),
    /// A PCI function (a whole GPU, a vendor-VFIO VF).
    Pci(PciAddress),
}

impl Agent {
    /// The `vmHandoff` of `target` on the served topology, or `{"error": ...}` when it cannot be
    /// handed over (a blocked GPU, an address the topology does not have).
    pub(crate) fn vm_handoff(&self, target: &HandoffTarget) -> serde_json::Value {
        let snap = self.snapshot();
        let devices = match target {
            HandoffTarget::Mdev(uuid) => Ok(vec![VmDevice::Mdev { uuid: *uuid }]),
            HandoffTarget::Pci(a) => handoff::address_devices(&snap.topology, a),
        };
        match devices {
            Ok(d) => serde_json::to_value(VmHandoff::of(&d))
                .unwrap_or_else(|e| serde_json::json!({ "error": e.to_string() })),
            Err(e) => serde_json::json!({ "error": crate::error::chain(&e) }),
        }
    }
}
