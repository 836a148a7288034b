//! `gpuslice sandbox hold`: a device of a sandbox held open as a VM would, named as a user names
//! it (a vGPU's UUID, a PCI address, a VFIO node).

use std::io;

use crate::OpenedRoot;

/// Why a sandbox device cannot be held; each names the device as given.
#[derive(Debug, thiserror::Error)]
pub enum HoldError {
    /// The root is not a sandbox.
    #[error("--root {root}: not a sandbox")]
    NotSandbox {
        /// The root as given.
        root: String,
    },
    /// Neither a UUID, a PCI address nor a VFIO node.
    #[error("device {device:?}: give a vGPU UUID, a PCI address (0000:08:00.4) or /dev/vfio/N")]
    Unrecognized {
        /// The device as given.
        device: String,
    },
    /// The sandbox has no such device.
    #[error("device {device}: not on this sandbox (no {path})")]
    NotHere {
        /// The device as given.
        device: String,
        /// Where it was looked for.
        path: String,
    },
    /// The fake kernel refused to open it.
    #[error("device {device}")]
    Open {
        /// The device as given.
        device: String,
        /// The fake kernel's answer.
        #[source]
        source: io::Error,
    },
    /// No holder of this sandbox has that process ID.
    #[error("process {pid}: not a holder on this sandbox")]
    NotHolder {
        /// The process ID given.
        pid: u32,
    },
    /// The fake kernel could not end the holder.
    #[error("process {pid}")]
    Close {
        /// The process ID given.
        pid: u32,
        /// The fake kernel's answer.
        #[source]
        source: io::Error,
    },
}

impl OpenedRoot {
    /// Holds `device` of this sandbox open (a vGPU's UUID, a PCI address, or `/dev/vfio/N`) as a
    /// VM would: the holder's process ID.
    ///
    /// # Errors
    /// A root that is not a sandbox, a device named in no known way or not on the sandbox, the
    /// fake kernel's refusal.
    pub fn hold(&self, device: &str) -> Result<u32, HoldError> {
        let Some(sandbox) = self.sandbox() else {
            let root = self.shown().to_owned();
            return Err(HoldError::NotSandbox { root });
        };
        let d = device;
        let path = if d.starts_with("/dev/vfio/") {
            d.to_owned()
        } else if d.parse::<gpu_core::MdevUuid>().is_ok() {
            format!("sys/bus/mdev/devices/{}", d.to_ascii_lowercase())
        } else if let Ok(addr) = d.parse::<gpu_core::PciAddress>() {
            format!("sys/bus/pci/devices/{addr}")
        } else {
            let device = d.to_owned();
            return Err(HoldError::Unrecognized { device });
        };
        if !path.starts_with("/dev/") && !self.host().exists(&path) {
            let (device, path) = (d.to_owned(), self.display_path(&path));
            return Err(HoldError::NotHere { device, path });
        }
        let device = d.to_owned();
        sandbox
            .open_device(&path)
            .map_err(|source| HoldError::Open { device, source })
    }

    /// Ends the holder `pid` made by [`OpenedRoot::hold`].
    ///
    /// # Errors
    /// A root that is not a sandbox, a process that is no holder, the fake kernel's refusal.
    pub fn unhold(&self, pid: u32) -> Result<(), HoldError> {
        let Some(sandbox) = self.sandbox() else {
            let root = self.shown().to_owned();
            return Err(HoldError::NotSandbox { root });
        };
        if !self.host().exists(&format!("proc/{pid}/fd")) {
            return Err(HoldError::NotHolder { pid });
        }
        (sandbox.close_device(pid)).map_err(|source| HoldError::Close { pid, source })
    }
}
