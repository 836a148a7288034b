//! QEMU `-device` arguments and libvirt `<hostdev>` elements for the devices a VM takes.
//!
//! A vGPU in the mdev framework goes to the VM by its UUID; a whole GPU (with the companion
//! functions of its slot) and an NVIDIA vendor-VFIO VF go by PCI address. The snippets themselves
//! come from the actuation layer (`gpu_sysfs::actuate::handoff`), which also returns them from
//! create and bind; this module picks the devices of an allocation or an address and joins them.
//!
//! It is also the one place that checks a hand-off against the node: [`check_allocation`]
//! (the allocation is for this node and names GPUs and parents it has, in the framework it uses:
//! every export, `export vm` and the bindings' `qemu_args`) and [`check_devices`] (each device
//! exists now and no other VM holds it: refused, or only warned about with `force`; a device
//! that is not free, such as a GPU still on its host driver, is warned about).

use crate::error::{IntegrationError, Result, fail};
use gpu_core::{
    AllocatedDevice, Allocation, MdevUuid, NodeTopology, ParentId, PciAddress, VgpuFramework,
};
use gpu_sysfs::Host;
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

/// The one check that `allocation` fits `node`: it is for that node, and every device it names
/// is there as it says (a GPU the node has; a vGPU parent the node has, in the same framework).
/// An allocation made for another node or read against the wrong inventory is an error, never
/// a guess.
///
/// # Errors
/// [`IntegrationError::Invalid`] for another node or a framework mismatch,
/// [`IntegrationError::NotFound`] for a GPU or parent the node does not have.
pub fn check_allocation(allocation: &Allocation, node: &NodeTopology) -> Result<()> {
    check_allocation_into(allocation, node, false, &mut Vec::new())
}

/// [`check_allocation`]; with `force`, a GPU or parent the node does not have is a warning.
fn check_allocation_into(
    allocation: &Allocation,
    node: &NodeTopology,
    force: bool,
    warnings: &mut Vec<String>,
) -> Result<()> {
    let mut missing = |what: String| -> Result<()> {
        if force {
            warnings.push(format!("{what} (handed off anyway: --force)"));
            Ok(())
        } else {
            Err(crate::error::IntegrationError::NotFound {
                what: "allocation".to_owned(),
                why: what,
            })
        }
    };
    if allocation.node != node.node {
        fail!(
            Invalid, allocation.machine;
            "the allocation of Machine {} is on node {}, not {}",
            allocation.machine,
            allocation.node,
            node.node
        );
    }
    for d in &allocation.devices {
        match d {
            AllocatedDevice::Gpu {
                request, address, ..
            } => {
                if node.gpu_by_address(address).is_none() {
                    missing(format!(
                        "request {request}: GPU {address} is not on node {}",
                        node.node
                    ))?;
                }
            }
            AllocatedDevice::Vgpu {
                request,
                parent,
                framework,
                ..
            } => {
                let Some(p) = node
                    .mediated_devices
                    .parents
                    .iter()
                    .find(|p| &p.id == parent)
                else {
                    missing(format!(
                        "request {request}: vGPU parent {parent} is not on node {}",
                        node.node
                    ))?;
                    continue;
                };
                if p.framework != *framework {
                    fail!(
                        Invalid, format!("request {request}");
                        "request {request}: the allocation puts a {} vGPU on {parent}, but that \
                         parent is {} on node {}",
                        framework.as_str(),
                        p.framework.as_str(),
                        node.node
                    );
                }
            }
        }
    }
    Ok(())
}

/// The QEMU arguments (`-device vfio-pci,...`) that hand an allocation's devices to a VM on
/// `node`, the call the bindings' `qemu_args` makes: [`check_allocation`], then the arguments.
///
/// # Errors
/// As [`check_allocation`].
pub fn allocation_qemu_args(allocation: &Allocation, node: &NodeTopology) -> Result<Vec<String>> {
    check_allocation(allocation, node)?;
    Ok(qemu_args(&allocation_devices(allocation)))
}

/// An allocation's devices, checked for a hand-off now: [`check_allocation`], then
/// [`check_devices`]. Returns the devices and the warnings to show.
///
/// # Errors
/// As [`check_allocation`] and [`check_devices`].
pub fn allocation_handoff(
    allocation: &Allocation,
    node: &NodeTopology,
    host: Option<&dyn Host>,
    force: bool,
) -> Result<(Vec<VmDevice>, Vec<String>)> {
    let mut warnings = Vec::new();
    check_allocation_into(allocation, node, force, &mut warnings)?;
    let devices = allocation_devices(allocation);
    warnings.extend(check_devices(node, &devices, host, force)?);
    Ok((devices, warnings))
}

/// Whether `devices` can go to a VM now, by what `node` shows (and, with `host`, the processes
/// that hold devices open): a device that does not exist (an mdev UUID that is no instance, an
/// address that is neither a GPU, a companion function nor a VF, a VF without a vGPU type) or
/// that another owner has (an open VFIO node, a GPU hosting vGPUs or SR-IOV VFs) is refused, or
/// with `force` only warned about; a blocked GPU is always refused. A GPU that is not free for a
/// VM yet (still on its host driver) is warned about. Returns the warnings.
///
/// # Errors
/// [`IntegrationError::NotFound`] for a device that does not exist,
/// [`IntegrationError::Host`] (`in-use`) for one another owner has,
/// [`IntegrationError::Refused`] for a blocked GPU or a VF without a vGPU type.
pub fn check_devices(
    node: &NodeTopology,
    devices: &[VmDevice],
    host: Option<&dyn Host>,
    force: bool,
) -> Result<Vec<String>> {
    let mut warnings = Vec::new();
    let refuse = |e: IntegrationError, warnings: &mut Vec<String>| -> Result<()> {
        if force {
            warnings.push(format!("{e} (handed off anyway: --force)"));
            Ok(())
        } else {
            Err(e)
        }
    };
    let in_use = |why: String| IntegrationError::InUse {
        what: "device".to_owned(),
        why,
    };
    let holder = |dir: String| host.and_then(|h| gpu_sysfs::actuate::inuse::holder_of(h, &dir));
    for d in devices {
        match d {
            VmDevice::Mdev { uuid } => {
                let instance = node
                    .mediated_devices
                    .parents
                    .iter()
                    .flat_map(|p| p.instances.iter())
                    .find(|i| i.uuid == Some(*uuid));
                let Some(instance) = instance else {
                    refuse(
                        crate::error::error!(NotFound, uuid;
                            "mdev {uuid} is not a vGPU instance on node {}; create it first \
                             (gpuslice vgpu create)",
                            node.node
                        ),
                        &mut warnings,
                    )?;
                    continue;
                };
                if let Some(h) = holder(format!("sys/bus/mdev/devices/{uuid}")) {
                    refuse(
                        in_use(format!(
                            "mdev {uuid} is in use by {h} (its VFIO device {} is open): another \
                             VM has it",
                            h.node
                        )),
                        &mut warnings,
                    )?;
                } else if instance.in_use == Some(true) {
                    refuse(
                        in_use(format!("mdev {uuid} is in use: another VM has it open")),
                        &mut warnings,
                    )?;
                }
            }
            VmDevice::Pci { address } => {
                check_pci(
                    node,
                    address,
                    &holder,
                    &mut |e, w| refuse(e, w),
                    &mut warnings,
                )?;
            }
        }
    }
    Ok(warnings)
}

type Refuse<'a> = dyn FnMut(IntegrationError, &mut Vec<String>) -> Result<()> + 'a;

fn check_pci(
    node: &NodeTopology,
    address: &PciAddress,
    holder: &dyn Fn(String) -> Option<gpu_sysfs::actuate::inuse::Holder>,
    refuse: &mut Refuse<'_>,
    warnings: &mut Vec<String>,
) -> Result<()> {
    let in_use = |why: String| IntegrationError::InUse {
        what: "device".to_owned(),
        why,
    };
    if let Some(h) = holder(format!("sys/bus/pci/devices/{address}")) {
        refuse(
            in_use(format!(
                "{address} is in use by {h} ({} is open): another VM has it",
                h.node
            )),
            warnings,
        )?;
    }
    if let Some(gpu) = node.gpu_by_address(address) {
        refuse_blocked(gpu, address)?;
        let vgpus: usize = node
            .mediated_devices
            .parents
            .iter()
            .filter(|p| p.gpu == Some(*address))
            .map(|p| p.instances.len())
            .sum();
        if vgpus > 0 {
            refuse(
                in_use(format!(
                    "GPU {} ({address}) hosts {vgpus} live vGPU{}: passing it through whole would \
                     take them from their VMs",
                    gpu.name,
                    if vgpus == 1 { "" } else { "s" }
                )),
                warnings,
            )?;
        } else if gpu.driver.as_deref() != Some("vfio-pci") {
            let why = match gpu.state {
                gpu_core::GpuState::InUse => gpu
                    .state_reason
                    .clone()
                    .unwrap_or_else(|| "in use".to_owned()),
                _ => format!(
                    "on its host driver {}",
                    gpu.driver.as_deref().unwrap_or("(none)")
                ),
            };
            warnings.push(format!(
                "GPU {} ({address}) is not free for a VM yet ({why}); bind it first (gpuslice gpu \
                 bind {address})",
                gpu.name
            ));
        }
        return Ok(());
    }
    let companion = node
        .gpus
        .iter()
        .any(|g| g.functions.iter().any(|f| f.address == *address));
    if companion {
        return Ok(());
    }
    let vf = node
        .mediated_devices
        .parents
        .iter()
        .find(|p| p.id == ParentId::Pci(*address) && p.framework == VgpuFramework::VendorVfio);
    match vf {
        None => refuse(
            crate::error::error!(NotFound, address;
                "{address} is neither a GPU nor a vendor-VFIO VF on node {}",
                node.node
            ),
            warnings,
        ),
        Some(vf) if vf.instances.is_empty() => refuse(
            crate::error::error!(Refused, address;
                "VF {address} has no vGPU type set; create one first (gpuslice vgpu create)"
            ),
            warnings,
        ),
        Some(_) => Ok(()),
    }
}

/// The devices for an address on `node`: a GPU with its companion functions, or a vendor-VFIO VF.
///
/// # Errors
/// When the address is neither a GPU nor a vendor-VFIO VF of `node`, or the GPU is blocked.
pub fn address_devices(node: &NodeTopology, address: &PciAddress) -> Result<Vec<VmDevice>> {
    if let Some(gpu) = node.gpu_by_address(address) {
        refuse_blocked(gpu, address)?;
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
            crate::error::error!(NotFound, address;
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

/// A blocked GPU (its IOMMU group shared with a device that cannot go along, ...) never goes to
/// a VM, `--force` or not.
fn refuse_blocked(gpu: &gpu_core::Gpu, address: &PciAddress) -> Result<()> {
    if gpu.state == gpu_core::GpuState::Blocked {
        fail!(
            Refused, address;
            "GPU {} ({address}) cannot go to a VM: {}",
            gpu.name,
            gpu.state_reason.as_deref().unwrap_or("it is blocked")
        );
    }
    Ok(())
}
