//! The pure model of gpuslice.
//!
//! A host exposes GPUs as PCI functions. Each can be handed to a virtual machine whole (through
//! vfio-pci, together with the companion functions of its slot such as HD audio) or shared as
//! vGPUs. Sharing uses one of two frameworks: the kernel's mediated devices (mdev: a *parent*
//! offers *types*, each instance is named by a UUID) or NVIDIA's vendor-specific VFIO on
//! Ada/Hopper/Blackwell (each SR-IOV virtual function takes one type and goes to the VM itself).
//! In both, the types of one physical GPU draw from one framebuffer *pool*: NVIDIA counts per
//! VF overstate what fits, and time-sliced vGPUs on one GPU must all have the same size.
//!
//! This crate holds the model of all that, with validated identities ([`PciAddress`],
//! [`MdevUuid`], [`VgpuTypeId`], [`MiB`]), and its JSON/YAML wire format (camelCase keys). It never
//! touches the filesystem: discovery (`gpu-sysfs`), health (`gpu-health`) and placement
//! (`gpu-sched`) build on it.

pub mod address;
pub mod allocation;
pub mod error;
pub mod fleet;
pub mod health;
pub mod ids;
pub mod kind;
pub mod layout;
pub mod nvidia;
pub mod pool;
pub mod request;
pub mod topology;
pub mod vendor;

#[cfg(any(test, feature = "testing"))]
pub mod testing;

pub use address::PciAddress;
pub use allocation::{AllocatedDevice, Allocation, AllocationStatus};
pub use error::{ConfigDocError, CoreError};
pub use fleet::Fleet;
pub use health::{Health, HealthState};
pub use ids::{MdevUuid, MiB, ParentId, VgpuTypeId};
pub use kind::{ErrorFamily, ErrorKind};
pub use request::{Alignment, DeviceClass, DeviceRequest, Machine};
pub use topology::{
    ClassCode, Function, Gpu, GpuState, Instance, Link, MediatedDevices, NodeTopology, Parent,
    PciId, Pool, Profile, Sriov, VgpuFramework,
};
pub use vendor::Vendor;

/// Decodes JSON or YAML text into `T`, naming `what` in the error.
///
/// # Errors
/// [`CoreError::Decode`] with the decoder's message (line and column included).
pub fn decode_text<T: serde::de::DeserializeOwned>(what: &str, text: &str) -> Result<T, CoreError> {
    let trimmed = text.trim_start();
    let res = if trimmed.starts_with('{') || trimmed.starts_with('[') {
        serde_json::from_str(text).map_err(|e| e.to_string())
    } else {
        serde_yaml_ng::from_str(text).map_err(|e| e.to_string())
    };
    res.map_err(|message| CoreError::Decode {
        what: what.to_owned(),
        message,
    })
}

/// Checks a node, machine or request name: 1–253 characters of `[A-Za-z0-9._-]`, not starting
/// with `.` or `-`.
///
/// # Errors
/// [`CoreError::InvalidName`] naming the input.
pub fn validate_name(name: &str) -> Result<(), CoreError> {
    let bad = |why| CoreError::InvalidName {
        input: name.to_owned(),
        why,
    };
    if name.is_empty() {
        return Err(bad("empty"));
    }
    if name.len() > 253 {
        return Err(bad("longer than 253 characters"));
    }
    if name.starts_with('.') || name.starts_with('-') {
        return Err(bad("must not start with '.' or '-'"));
    }
    if !name
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
    {
        return Err(bad("only letters, digits, '-', '_' and '.' are allowed"));
    }
    Ok(())
}
