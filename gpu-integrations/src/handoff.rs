//! QEMU `-device` arguments and libvirt `<hostdev>` elements for the devices a VM takes.
//!
//! A vGPU in the mdev framework goes to the VM by its UUID; a whole GPU (with the companion
//! functions of its slot) and an NVIDIA vendor-VFIO VF go by PCI address. The snippets themselves
//! come from the actuation layer (`gpu_sysfs::actuate::handoff`), which also returns them from
//! create and bind; this module picks the devices of an allocation or an address and joins them.

use crate::error::{Result, error, fail};
use gpu_core::{
    AllocatedDevice, Allocation, MdevUuid, NodeTopology, ParentId, PciAddress, VgpuFramework,
};
use gpu_sysfs::actuate::Handoff;
use serde::Serialize;

/// One device a VM takes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum VmDevice {
    /// An mdev instance, by UUID.
    Mdev {
        /// Its UUID.
        uuid: MdevUuid,
    },
    /// A PCI function: a whole GPU, one of its companion functions, or a vendor-VFIO VF.
    Pci {
        /// Its address.
        address: PciAddress,
    },
}

/// The devices of one allocation, in request order, companion functions after their GPU.
pub fn allocation_devices(allocation: &Allocation) -> Vec<VmDevice> {
    let mut out = Vec::new();
    for d in &allocation.devices {
        match d {
            AllocatedDevice::Gpu {
                address, functions, ..
            } => {
                out.push(VmDevice::Pci { address: *address });
                for f in functions.iter().filter(|f| *f != address) {
                    out.push(VmDevice::Pci { address: *f });
                }
            }
            AllocatedDevice::Vgpu {
                framework: VgpuFramework::Mdev,
                uuid,
                ..
            } => out.push(VmDevice::Mdev { uuid: *uuid }),
            AllocatedDevice::Vgpu {
                framework: VgpuFramework::VendorVfio,
                parent,
                ..
            } => match parent {
                ParentId::Pci(a) => out.push(VmDevice::Pci { address: *a }),
                // A vendor-VFIO parent is always a VF; a named one cannot go to a VM.
                ParentId::Named(_) => {}
            },
        }
    }
    out
}

/// The QEMU arguments and the libvirt XML that hand `devices` to a VM, together (the
/// `vmHandoff` of the agent's answers, and part of `dra prepare`'s).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct VmHandoff {
    /// QEMU arguments for all devices.
    pub qemu: Vec<String>,
    /// libvirt XML for all devices.
    pub libvirt: String,
}

impl VmHandoff {
    /// The hand-off of `devices`.
    pub fn of(devices: &[VmDevice]) -> Self {
        VmHandoff {
            qemu: qemu_args(devices),
            libvirt: libvirt_xml(devices),
        }
    }
}

/// The allocations a document holds: one `Allocation`, a list of them, or an object with
/// `allocations` (a fleet, `place` output) or `allocation`; with `machine`, only that Machine's.
///
/// # Errors
/// A document that is not JSON/YAML, holds no allocation object, or has an allocation of the
/// wrong shape (the message names the decoder's finding).
pub fn allocations_in(
    text: &str,
    machine: Option<&str>,
) -> std::result::Result<Vec<Allocation>, gpu_core::CoreError> {
    let value: serde_json::Value = gpu_core::decode_text("allocation", text)?;
    let decode = |message: String| gpu_core::CoreError::Decode {
        what: "allocation".to_owned(),
        message,
    };
    let list = match &value {
        serde_json::Value::Array(items) => items.clone(),
        serde_json::Value::Object(map) => match (map.get("allocations"), map.get("allocation")) {
            (Some(serde_json::Value::Array(items)), _) => items.clone(),
            (_, Some(one)) => vec![one.clone()],
            _ => vec![value.clone()],
        },
        _ => return Err(decode("the document holds no allocation".to_owned())),
    };
    let mut allocations: Vec<Allocation> = list
        .into_iter()
        .map(serde_json::from_value)
        .collect::<std::result::Result<_, _>>()
        .map_err(|e| decode(e.to_string()))?;
    if let Some(m) = machine {
        allocations.retain(|a| a.machine == m);
    }
    Ok(allocations)
}

/// The QEMU arguments (`-device vfio-pci,...`) that hand an allocation's devices to a VM on
/// `node`, the call the CLI's `export qemu --allocation` and the bindings' `qemu_args` share.
///
/// # Errors
/// When the allocation belongs to another node, or names a GPU `node` does not have.
pub fn allocation_qemu_args(allocation: &Allocation, node: &NodeTopology) -> Result<Vec<String>> {
    if allocation.node != node.node {
        fail!(
            Invalid, allocation.machine;
            "the allocation of {} is on node {}, not {}",
            allocation.machine,
            allocation.node,
            node.node
        );
    }
    for d in &allocation.devices {
        if let AllocatedDevice::Gpu { address, .. } = d {
            if node.gpu_by_address(address).is_none() {
                fail!(
                    NotFound, address;
                    "the allocation of {} names GPU {address}, which node {} does not have",
                    allocation.machine,
                    node.node
                );
            }
        }
    }
    Ok(qemu_args(&allocation_devices(allocation)))
}

/// The devices for an address on `node`: a GPU with its companion functions, or a vendor-VFIO VF.
///
/// # Errors
/// When the address is neither a GPU nor a vendor-VFIO VF of `node`, or the GPU is blocked.
pub fn address_devices(node: &NodeTopology, address: &PciAddress) -> Result<Vec<VmDevice>> {
    if let Some(gpu) = node.gpu_by_address(address) {
        if gpu.state == gpu_core::GpuState::Blocked {
            fail!(
                Refused, address;
                "GPU {} ({address}) cannot go to a VM: {}",
                gpu.name,
                gpu.state_reason.as_deref().unwrap_or("it is blocked")
            );
        }
        let mut out = vec![VmDevice::Pci { address: *address }];
        out.extend(
            gpu.functions
                .iter()
                .filter(|f| f.address != *address)
                .map(|f| VmDevice::Pci { address: f.address }),
        );
        return Ok(out);
    }
    let vf = node
        .mediated_devices
        .parents
        .iter()
        .find(|p| p.id == ParentId::Pci(*address) && p.framework == VgpuFramework::VendorVfio)
        .ok_or_else(|| {
            error!(NotFound, address;
                "{address} is neither a GPU nor a vendor-VFIO VF on node {}",
                node.node
            )
        })?;
    if vf.instances.is_empty() {
        fail!(
            Refused, address;
            "VF {address} has no vGPU type set; create one first (gpuslice vgpu create)"
        );
    }
    Ok(vec![VmDevice::Pci { address: *address }])
}

/// The actuation layer's snippets for one device (one place writes them for every front-end).
fn snippets(d: &VmDevice) -> Handoff {
    match d {
        VmDevice::Mdev { uuid } => Handoff::mdev(uuid),
        VmDevice::Pci { address } => Handoff::pci(address),
    }
}

/// The QEMU arguments (`-device`, value, ...) for `devices`.
pub fn qemu_args(devices: &[VmDevice]) -> Vec<String> {
    let mut args = Vec::with_capacity(devices.len() * 2);
    for d in devices {
        let h = snippets(d);
        match h.qemu.split_once(' ') {
            Some((flag, value)) => {
                args.push(flag.to_owned());
                args.push(value.to_owned());
            }
            None => args.push(h.qemu),
        }
    }
    args
}

/// The QEMU arguments as shell lines, one `-device VALUE` per line.
pub fn qemu_text(devices: &[VmDevice]) -> String {
    devices.iter().map(|d| snippets(d).qemu + "\n").collect()
}

/// The libvirt XML for `devices`: one bare `<hostdev>` (what `virsh attach-device` takes), or a
/// `<devices>` element holding several, to paste into a domain definition.
pub fn libvirt_xml(devices: &[VmDevice]) -> String {
    match devices {
        [one] => snippets(one).libvirt + "\n",
        many => {
            let mut out = String::from("<devices>\n");
            for d in many {
                out.push_str("  ");
                out.push_str(&snippets(d).libvirt);
                out.push('\n');
            }
            out.push_str("</devices>\n");
            out
        }
    }
}
