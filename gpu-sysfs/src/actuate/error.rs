//! The errors of actuation, and the one place where the kernel's raw errno values get a meaning.

use std::io;

use gpu_core::CoreError;

/// Linux errno values the kernel returns from the sysfs writes actuation makes.
pub mod errno {
    /// Operation not permitted (a VF that already has a vGPU type).
    pub const EPERM: i32 = 1;
    /// No such file or directory.
    pub const ENOENT: i32 = 2;
    /// I/O error (an NVIDIA vGPU type that does not fit on the GPU).
    pub const EIO: i32 = 5;
    /// Permission denied.
    pub const EACCES: i32 = 13;
    /// Device or resource busy (binding a bound device, SR-IOV already enabled).
    pub const EBUSY: i32 = 16;
    /// File exists (duplicate mdev UUID).
    pub const EEXIST: i32 = 17;
    /// No such device (bind to a driver that does not match the device).
    pub const ENODEV: i32 = 19;
    /// Invalid argument (malformed UUID or type number).
    pub const EINVAL: i32 = 22;
    /// No space left on device (mdev pool exhausted).
    pub const ENOSPC: i32 = 28;
    /// Result out of range (more VFs than `sriov_totalvfs`).
    pub const ERANGE: i32 = 34;
    /// Too many users (the `mdpy` sample driver's "pool exhausted").
    pub const EUSERS: i32 = 87;

    /// The symbolic name of an errno value (`EEXIST`), or `errno N` for others.
    pub fn name(code: i32) -> String {
        let n = match code {
            EPERM => "EPERM",
            ENOENT => "ENOENT",
            EIO => "EIO",
            EACCES => "EACCES",
            EBUSY => "EBUSY",
            EEXIST => "EEXIST",
            ENODEV => "ENODEV",
            EINVAL => "EINVAL",
            ENOSPC => "ENOSPC",
            ERANGE => "ERANGE",
            EUSERS => "EUSERS",
            other => return format!("errno {other}"),
        };
        n.to_owned()
    }
}

/// Why an actuation step failed. Every variant names the sysfs path, device or program concerned,
/// so the message can be shown to an operator as is.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ActuateError {
    /// An argument was not a valid identity (UUID, PCI address, type ID); nothing was written.
    #[error(transparent)]
    Invalid(#[from] CoreError),
    /// A device, parent, type or file that the operation needs is not on this host.
    #[error("{what} not found (no {path})")]
    NotFound {
        /// What was looked for (`mdev parent mbochs`, `PCI device 0000:01:00.0`).
        what: String,
        /// The root-relative path that is missing.
        path: String,
    },
    /// A profile was neither a type ID nor a type name of the parent.
    #[error("{parent} has no vGPU type {profile:?}; it offers: {offered}")]
    UnknownProfile {
        /// The parent device.
        parent: String,
        /// The profile as given.
        profile: String,
        /// The types the parent offers (`ID (name)`, comma-separated).
        offered: String,
    },
    /// A read of host state failed.
    #[error("cannot read {path}")]
    Read {
        /// The root-relative path.
        path: String,
        /// The I/O error.
        #[source]
        source: io::Error,
    },
    /// `EEXIST`: the object already exists (an mdev UUID is taken, on any parent).
    #[error("{path}: already exists (EEXIST){detail}")]
    Exists {
        /// The path written.
        path: String,
        /// More context (`: mdev 1234… has type mbochs-large, not mbochs-small`), or empty.
        detail: String,
    },
    /// `ENOSPC`/`EUSERS`: the parent's pool has no room left for this type.
    #[error("{path}: no capacity left for this type ({errno})")]
    Exhausted {
        /// The path written.
        path: String,
        /// `ENOSPC` or `EUSERS`.
        errno: String,
    },
    /// `EINVAL`: the kernel rejected the value written.
    #[error("{path}: the kernel rejected {value:?} (EINVAL)")]
    InvalidArgument {
        /// The path written.
        path: String,
        /// The value written.
        value: String,
    },
    /// `EBUSY`: the device is busy (already bound, SR-IOV already enabled).
    #[error("{path}: device busy (EBUSY)")]
    Busy {
        /// The path written.
        path: String,
    },
    /// `EPERM`/`EACCES`: the write is not permitted (a VF that already has a vGPU type, or not root).
    #[error("{path}: operation not permitted ({errno})")]
    NotPermitted {
        /// The path written.
        path: String,
        /// `EPERM` or `EACCES`.
        errno: String,
    },
    /// `ENODEV`: the driver does not take this device.
    #[error("{path}: no such device for this driver (ENODEV)")]
    NoDevice {
        /// The path written.
        path: String,
    },
    /// `EIO` from the driver: for an NVIDIA vGPU type, the type cannot be placed on the GPU.
    #[error("{path}: the driver refused {value:?} (EIO; a vGPU type that does not fit the GPU)")]
    DriverRefused {
        /// The path written.
        path: String,
        /// The value written.
        value: String,
    },
    /// Any other errno, kept raw for values a newer kernel or driver may produce.
    #[error("{path}: write of {value:?} failed ({errno})")]
    Unexpected {
        /// The path written.
        path: String,
        /// The value written.
        value: String,
        /// The errno name, or the I/O error kind when there is no errno.
        errno: String,
        /// The I/O error.
        #[source]
        source: io::Error,
    },
    /// An mdev UUID is taken by an instance of another type or parent.
    #[error(
        "mdev {uuid} already exists as {existing} on {existing_parent}, not {requested} on {requested_parent}"
    )]
    ExistsOtherType {
        /// The UUID.
        uuid: String,
        /// Type of the existing instance.
        existing: String,
        /// Parent of the existing instance.
        existing_parent: String,
        /// Requested type.
        requested: String,
        /// Requested parent.
        requested_parent: String,
    },
    /// A vendor-VFIO type is not in the VF's `creatable_vgpu_types` right now.
    #[error(
        "{vf}: vGPU type {type_id} cannot be created now (GPU full, or other vGPUs on it have another size); creatable: {creatable}"
    )]
    NotCreatable {
        /// The VF.
        vf: String,
        /// The type number.
        type_id: String,
        /// What the VF lists as creatable (`none` when empty).
        creatable: String,
    },
    /// The device's VFIO node is open by a process: a VM is probably using it.
    #[error(
        "{device} is in use by {holder} (its VFIO device {node} is open); stop the VM first or pass --force"
    )]
    InUse {
        /// The device (mdev UUID or PCI address).
        device: String,
        /// The process holding it (`pid 4242 (qemu-system-x86)`).
        holder: String,
        /// The `/dev/vfio` node held open.
        node: String,
    },
    /// SR-IOV cannot be turned off: one of the PF's VFs holds a vGPU or is open by a process.
    #[error("{pf}: SR-IOV stays enabled: {why}; remove its vGPUs (and stop the VM using it) first")]
    VfInUse {
        /// The physical function.
        pf: String,
        /// Which VF, and what it holds (`VF 0000:26:00.4 holds vGPU type 1155`).
        why: String,
    },
    /// After `drivers_probe` (which reports success even when probing failed) the device is not
    /// bound to the expected driver.
    #[error(
        "{device}: {driver} did not bind after drivers_probe (driver now: {found}); check dmesg"
    )]
    ProbeFailed {
        /// The PCI function.
        device: String,
        /// The driver expected (`vfio-pci`, or `a host driver`).
        driver: String,
        /// The driver found (`none` when unbound).
        found: String,
    },
    /// The GPU shares its IOMMU group with endpoints outside the card, so it cannot go to a VM alone.
    #[error(
        "{device}: IOMMU group {group} also holds {others}, which are not part of the card; a VM can only take the whole group"
    )]
    GroupNotViable {
        /// The GPU.
        device: String,
        /// The IOMMU group number.
        group: String,
        /// The other endpoints (`0000:01:02.0 (driver e1000)`, comma-separated).
        others: String,
    },
    /// The device has no IOMMU group: the IOMMU is off, so vfio-pci cannot take it.
    #[error(
        "{device} has no IOMMU group: enable the IOMMU (intel_iommu=on / amd_iommu=on) to use vfio-pci"
    )]
    NoIommu {
        /// The PCI function.
        device: String,
    },
    /// The device is a VF or otherwise not something this operation applies to.
    #[error("{device}: {why}")]
    Unsupported {
        /// The device.
        device: String,
        /// Why the operation does not apply.
        why: String,
    },
    /// A whole GPU another way of sharing holds (mdev instances on it or its VFs, SR-IOV VFs
    /// enabled): a conflict with what the host holds now, not a bad request.
    #[error("{device}: {why}")]
    Shared {
        /// The GPU.
        device: String,
        /// What holds it and how to free it.
        why: String,
    },
    /// A create named a parent that is neither an mdev parent nor an NVIDIA vendor-VFIO VF or
    /// the GPU of such VFs.
    #[error(
        "{parent} is neither an mdev parent nor an NVIDIA vendor-VFIO VF or GPU with VFs (for vendor-VFIO, run `gpuslice sriov enable {gpu}` first)"
    )]
    NotAParent {
        /// The parent as given.
        parent: String,
        /// The GPU it names.
        gpu: String,
    },
    /// Every vendor-VFIO VF of the GPU has a type already, or none can take this one now.
    #[error("no free VF of {gpu} can take vGPU type {profile} now")]
    NoFreeVf {
        /// The physical GPU.
        gpu: String,
        /// The profile as given.
        profile: String,
    },
    /// A host program ran past its timeout and was killed.
    #[error("{program} did not finish within {seconds} s and was killed{stderr}")]
    Timeout {
        /// The command line.
        program: String,
        /// The timeout.
        seconds: u64,
        /// `: <stderr>` when it printed something, else empty.
        stderr: String,
    },
    /// A host program could not be started or exited with a failure status.
    #[error("{program} failed ({status}){stderr}")]
    CommandFailed {
        /// The command line.
        program: String,
        /// `exit status N`, `killed by a signal` or the spawn error.
        status: String,
        /// `: <stderr>` when it printed something, else empty.
        stderr: String,
    },
    /// `sriov-manage` reported success but the PF has no VFs.
    #[error(
        "{pf}: {program} exited 0 but sriov_numvfs is {numvfs}; SR-IOV was not enabled{output}"
    )]
    SriovNotEnabled {
        /// The PF.
        pf: String,
        /// The command line.
        program: String,
        /// The `sriov_numvfs` value read afterwards.
        numvfs: String,
        /// `: <stderr or stdout>` when the program printed something, else empty.
        output: String,
    },
    /// A state read back after a successful write is not what the write should have made.
    #[error("{path}: wrote {wrote:?} but the kernel now shows {found:?}")]
    NotApplied {
        /// The path checked.
        path: String,
        /// The value written.
        wrote: String,
        /// What was found.
        found: String,
    },
    /// A step failed, and undoing the steps done before it failed too: the host is left changed.
    #[error("{source}; rolling back also failed, left changed: {leftover}")]
    RollbackIncomplete {
        /// The failure that started the rollback.
        #[source]
        source: Box<ActuateError>,
        /// What could not be restored.
        leftover: String,
    },
}

impl ActuateError {
    /// The one translation of a failed sysfs write into its meaning.
    pub fn from_write(path: &str, value: &[u8], err: io::Error) -> Self {
        // Shown as the host path an operator would type.
        let path = format!("/{}", path.trim_start_matches('/'));
        let value = String::from_utf8_lossy(value).trim_end().to_owned();
        match err.raw_os_error() {
            Some(errno::EEXIST) => ActuateError::Exists {
                path,
                detail: String::new(),
            },
            Some(code @ (errno::ENOSPC | errno::EUSERS)) => ActuateError::Exhausted {
                path,
                errno: errno::name(code),
            },
            Some(errno::EINVAL) => ActuateError::InvalidArgument { path, value },
            Some(errno::EBUSY) => ActuateError::Busy { path },
            Some(code @ (errno::EPERM | errno::EACCES)) => ActuateError::NotPermitted {
                path,
                errno: errno::name(code),
            },
            Some(errno::ENODEV) => ActuateError::NoDevice { path },
            Some(errno::EIO) => ActuateError::DriverRefused { path, value },
            Some(code) => ActuateError::Unexpected {
                path,
                value,
                errno: errno::name(code),
                source: err,
            },
            None => ActuateError::Unexpected {
                path,
                value,
                errno: format!("{:?}", err.kind()),
                source: err,
            },
        }
    }

    /// A failed read of `path`.
    pub fn read(path: &str, source: io::Error) -> Self {
        ActuateError::Read {
            path: format!("/{}", path.trim_start_matches('/')),
            source,
        }
    }

    /// A stable, machine-readable name of the failure (`exists`, `exhausted`, `in-use`, ...), for
    /// programs that drive the CLI (`-o json` errors carry it as `kind`) and for the bindings.
    pub fn kind(&self) -> gpu_core::ErrorKind {
        use gpu_core::ErrorKind as K;
        match self {
            ActuateError::Invalid(_) => K::InvalidArgument,
            ActuateError::NotFound { .. } => K::NotFound,
            ActuateError::UnknownProfile { .. } => K::UnknownProfile,
            ActuateError::Read { .. } => K::ReadFailed,
            ActuateError::Exists { .. } => K::Exists,
            ActuateError::Exhausted { .. } => K::Exhausted,
            ActuateError::InvalidArgument { .. } => K::InvalidArgument,
            ActuateError::Busy { .. } => K::Busy,
            ActuateError::NotPermitted { .. } => K::NotPermitted,
            ActuateError::NoDevice { .. } => K::NoDevice,
            ActuateError::DriverRefused { .. } => K::DriverRefused,
            ActuateError::Unexpected { .. } => K::Unexpected,
            ActuateError::ExistsOtherType { .. } => K::ExistsOtherType,
            ActuateError::NotCreatable { .. } => K::NotCreatable,
            ActuateError::InUse { .. } | ActuateError::VfInUse { .. } => K::InUse,
            ActuateError::ProbeFailed { .. } => K::ProbeFailed,
            ActuateError::GroupNotViable { .. } => K::GroupNotViable,
            ActuateError::NoIommu { .. } => K::NoIommu,
            ActuateError::Unsupported { .. } | ActuateError::NotAParent { .. } => K::Unsupported,
            ActuateError::Shared { .. } => K::Conflict,
            ActuateError::NoFreeVf { .. } => K::Exhausted,
            ActuateError::Timeout { .. } => K::Timeout,
            ActuateError::CommandFailed { .. } => K::CommandFailed,
            ActuateError::SriovNotEnabled { .. } => K::SriovNotEnabled,
            ActuateError::NotApplied { .. } => K::NotApplied,
            ActuateError::RollbackIncomplete { .. } => K::RollbackIncomplete,
        }
    }

    /// The errno this error stands for, when it came from a kernel write.
    pub fn errno(&self) -> Option<i32> {
        Some(match self {
            ActuateError::Exists { .. } => errno::EEXIST,
            ActuateError::Exhausted { errno: e, .. } if e == "EUSERS" => errno::EUSERS,
            ActuateError::Exhausted { .. } => errno::ENOSPC,
            ActuateError::InvalidArgument { .. } => errno::EINVAL,
            ActuateError::Busy { .. } => errno::EBUSY,
            ActuateError::NotPermitted { errno: e, .. } if e == "EACCES" => errno::EACCES,
            ActuateError::NotPermitted { .. } => errno::EPERM,
            ActuateError::NoDevice { .. } => errno::ENODEV,
            ActuateError::DriverRefused { .. } => errno::EIO,
            ActuateError::Unexpected { source, .. } => return source.raw_os_error(),
            ActuateError::RollbackIncomplete { source, .. } => return source.errno(),
            _ => return None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_errno_gets_its_meaning_and_keeps_the_path() {
        let e = ActuateError::from_write(
            "sys/x/create",
            b"abc\n",
            io::Error::from_raw_os_error(errno::EEXIST),
        );
        assert!(matches!(e, ActuateError::Exists { .. }));
        assert_eq!(e.to_string(), "/sys/x/create: already exists (EEXIST)");
        let e = ActuateError::from_write("p", b"u", io::Error::from_raw_os_error(errno::EUSERS));
        assert_eq!(e.to_string(), "/p: no capacity left for this type (EUSERS)");
        assert_eq!(e.errno(), Some(errno::EUSERS));
        let e = ActuateError::from_write("p", b"7", io::Error::from_raw_os_error(errno::EIO));
        assert_eq!(e.errno(), Some(errno::EIO));
        let e = ActuateError::from_write("p", b"7", io::Error::from_raw_os_error(71));
        assert_eq!(e.to_string(), "/p: write of \"7\" failed (errno 71)");
        assert_eq!(e.errno(), Some(71));
    }
}
