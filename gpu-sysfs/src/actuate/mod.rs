//! Actuation: making on the host what placement decided.
//!
//! Every operation is plain logic over a [`Host`], so it runs the same against the real `/sys`,
//! a fake tree, or the fake kernel of the `testing` feature:
//!
//! - [`mdev`]: create an mdev instance of a type on a parent under a given (stable) UUID (or on
//!   whichever VF of an SR-IOV card has room), and remove it, refusing to remove one a VM holds
//!   open;
//! - [`vendor`]: NVIDIA vendor-specific VFIO, where a VF takes one vGPU type through
//!   `nvidia/current_vgpu_type`;
//! - [`sriov`]: enable SR-IOV with NVIDIA's `sriov-manage`, bounded by a timeout and checked
//!   afterwards, because the script can hang or exit 0 without doing anything; and disable it,
//!   refused while a VF holds a vGPU or is open;
//! - [`bind`]: move a whole GPU with its companion functions to `vfio-pci` and back, checking the
//!   `driver` link after `drivers_probe` (which reports success even when probing failed) and
//!   undoing every step already made when a later one fails;
//! - [`create`]: what a create of a profile on a parent makes (mdev or vendor-VFIO, which VF);
//! - [`inuse`]: whether a device's VFIO node is open by a process;
//! - [`handoff`]: the QEMU and libvirt snippets that hand a device to a VM.
//!
//! Errors are [`ActuateError`]s naming the path and the meaning of the kernel's errno; they
//! convert into the crate's [`crate::SysfsError`]. Operations that change the host are idempotent
//! (asking again for what exists reports `changed: false` and writes nothing), and multi-step ones
//! undo their earlier steps when a later one fails.

pub mod bind;
pub mod create;
pub mod error;
pub mod handoff;
pub mod inuse;
pub mod mdev;
pub mod sriov;
pub mod vendor;

use std::io;

pub use bind::{FunctionChange, GpuBinding, bind_gpu, card_functions, release_gpu};
pub use create::{CreateTarget, Created, create_target, create_vgpu, machine_uuid};
pub use error::ActuateError;
pub use handoff::Handoff;
pub use inuse::{Holder, NodeHolders, held_topology, holder_of, node_holders};
pub use mdev::{
    MdevCreate, MdevInstance, MdevRemoved, create_mdev, create_mdev_on_gpu, create_mdevs,
    list_instances, mdev_parent_on_gpu, mdev_types, remove_mdev, resolve_mdev_profile,
    unreachable_instance,
};
pub use sriov::{
    SRIOV_MANAGE, SriovDisabled, SriovEnabled, SriovOptions, disable_sriov, enable_sriov,
};
pub use vendor::{
    VfCleared, VfInstance, VfTypeSet, clear_vf, creatable_types, current_type, free_vf_avoiding,
    free_vf_for, is_vendor_vfio_vf, list_vf_instances, resolve_gpu_profile, resolve_vf_profile,
    set_vf_type, vfs_of,
};

use crate::host::Host;

/// Every vGPU instance on a host: mdev instances and vendor-VFIO VFs with a type (what
/// `gpuslice vgpu list -o json` and the agent's `GET /v1/vgpus` show).
#[derive(Debug, Clone, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct VgpuListing {
    /// The mdev instances.
    pub mdevs: Vec<MdevInstance>,
    /// The vendor-VFIO VFs that have a type.
    pub vendor_vfio: Vec<VfInstance>,
    /// Entries that name an instance which cannot be reached (a link leading outside the root,
    /// a parent that cannot be read): said, not left out silently.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
}

/// Lists every vGPU instance on `host`.
///
/// # Errors
/// The errors of [`list_instances`] and [`list_vf_instances`].
pub fn list_vgpus(host: &dyn Host) -> Result<VgpuListing> {
    let mdevs = list_instances(host)?;
    let warnings = host
        .list("sys/bus/mdev/devices")
        .unwrap_or_default()
        .iter()
        .filter_map(|e| e.parse::<gpu_core::MdevUuid>().ok())
        .filter(|u| !mdevs.iter().any(|m| m.uuid == *u))
        .filter_map(|u| unreachable_instance(host, &u))
        .collect();
    Ok(VgpuListing {
        mdevs,
        vendor_vfio: list_vf_instances(host)?,
        warnings,
    })
}

/// Result type of actuation.
pub type Result<T, E = ActuateError> = std::result::Result<T, E>;

/// `sys/bus/pci/devices/<addr>`.
pub(crate) fn pci_dir(addr: &gpu_core::PciAddress) -> String {
    format!("sys/bus/pci/devices/{addr}")
}

/// Writes `data` to `path`, translating a failure through [`ActuateError::from_write`].
pub(crate) fn write(host: &dyn Host, path: &str, data: &[u8]) -> Result<()> {
    host.write(path, data)
        .map_err(|e| ActuateError::from_write(path, data, e))
}

/// Reads a trimmed attribute; `None` when it does not exist.
pub(crate) fn read_opt(host: &dyn Host, path: &str) -> Result<Option<String>> {
    match host.read_string(path) {
        Ok(s) => Ok(Some(s)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(ActuateError::read(path, e)),
    }
}

/// Reads a trimmed attribute that must exist.
pub(crate) fn read_req(host: &dyn Host, path: &str) -> Result<String> {
    host.read_string(path)
        .map_err(|e| ActuateError::read(path, e))
}

/// The last component of a symlink's target (`driver` → `vfio-pci`); `None` when there is no link.
pub(crate) fn link_name(host: &dyn Host, path: &str) -> Option<String> {
    let target = host.read_link(path).ok()?;
    target.file_name().map(|n| n.to_string_lossy().into_owned())
}

/// The driver a PCI function is bound to, if any.
pub(crate) fn pci_driver(host: &dyn Host, addr: &gpu_core::PciAddress) -> Option<String> {
    link_name(host, &format!("{}/driver", pci_dir(addr)))
}

/// Fails with [`ActuateError::NotFound`] unless the PCI function exists.
pub(crate) fn require_pci(host: &dyn Host, addr: &gpu_core::PciAddress) -> Result<String> {
    let dir = pci_dir(addr);
    if host.exists(&dir) {
        Ok(dir)
    } else {
        Err(ActuateError::NotFound {
            what: format!("PCI device {addr}"),
            path: format!("/{dir}"),
        })
    }
}
