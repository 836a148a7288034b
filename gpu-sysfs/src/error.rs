//! The one error type of this crate.
//!
//! Each variant is one failed operation and carries the root-relative path (or address, or
//! recording line) it concerns, so a message can be shown to an operator as is. I/O failures keep
//! the kernel's errno in their `#[source]`.

use std::io;

/// Errors of discovery, recording replay and actuation.
///
/// Non-exhaustive: actuation and newer kernels add variants.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SysfsError {
    /// A file or directory could not be read, written or listed.
    #[error("{path}")]
    Io {
        /// Root-relative path (or a local path for recordings and roots).
        path: String,
        /// The I/O error with the kernel's errno.
        #[source]
        source: io::Error,
    },
    /// The root directory cannot stand for a host's `/`.
    #[error("invalid host root {path}: {why}")]
    InvalidRoot {
        /// The root as given.
        path: String,
        /// What is wrong with it.
        why: String,
    },
    /// A file's content does not have the expected form.
    #[error("{file}:{line}: {why}")]
    Malformed {
        /// The file (root-relative path or local path).
        file: String,
        /// 1-based line number; `0` when the whole file is concerned.
        line: usize,
        /// What is wrong, quoting the offending text.
        why: String,
    },
    /// A value read from the host is not a valid model value (address, UUID, type ID, ...).
    #[error("{path}: {source}")]
    Model {
        /// Where the value came from.
        path: String,
        /// The model's validation error.
        #[source]
        source: gpu_core::CoreError,
    },
    /// An actuation step failed (create, remove, set type, SR-IOV, bind, release).
    #[error(transparent)]
    Actuate(#[from] crate::actuate::ActuateError),
}

impl SysfsError {
    /// An [`SysfsError::Io`] for `path`.
    pub fn io(path: impl Into<String>, source: io::Error) -> Self {
        SysfsError::Io {
            path: path.into(),
            source,
        }
    }

    /// A [`SysfsError::Malformed`] for `file` at `line`.
    pub fn malformed(file: impl Into<String>, line: usize, why: impl Into<String>) -> Self {
        SysfsError::Malformed {
            file: file.into(),
            line,
            why: why.into(),
        }
    }

    /// The kind of this error: the actuation kind for a failed actuation step, `host-error` for
    /// everything else that went wrong reading the host.
    pub fn kind(&self) -> gpu_core::ErrorKind {
        match self {
            SysfsError::Actuate(a) => a.kind(),
            _ => gpu_core::ErrorKind::HostError,
        }
    }

    /// The errno of an I/O failure, when there is one.
    pub fn errno(&self) -> Option<i32> {
        match self {
            SysfsError::Io { source, .. } => source.raw_os_error(),
            SysfsError::Actuate(e) => e.errno(),
            _ => None,
        }
    }
}

impl SysfsError {
    /// The path (or file) a failed read concerns, when there is one.
    pub fn path(&self) -> Option<&str> {
        match self {
            SysfsError::Io { path, .. }
            | SysfsError::InvalidRoot { path, .. }
            | SysfsError::Model { path, .. } => Some(path),
            SysfsError::Malformed { file, .. } => Some(file),
            SysfsError::Actuate(_) => None,
        }
    }
}

impl gpu_core::ClassifiedError for SysfsError {
    fn kind(&self) -> gpu_core::ErrorKind {
        self.kind()
    }

    fn errno(&self) -> Option<i32> {
        self.errno()
    }

    /// Where on the host: the path concerned and the errno.
    fn detail(&self) -> gpu_core::ErrorDetail {
        gpu_core::ErrorDetail::Host {
            path: self.path().map(str::to_owned),
            errno: self.errno(),
        }
    }
}

impl gpu_core::ClassifiedError for crate::actuate::ActuateError {
    fn kind(&self) -> gpu_core::ErrorKind {
        self.kind()
    }

    fn errno(&self) -> Option<i32> {
        self.errno()
    }
}

/// Result type of this crate.
pub type Result<T, E = SysfsError> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_name_the_path_and_keep_the_errno() {
        let e = SysfsError::io(
            "sys/bus/pci/devices/0000:08:00.4/nvidia/current_vgpu_type",
            io::Error::from_raw_os_error(1),
        );
        assert_eq!(
            e.to_string(),
            "sys/bus/pci/devices/0000:08:00.4/nvidia/current_vgpu_type"
        );
        assert_eq!(e.errno(), Some(1));
        let e = SysfsError::malformed("x/creatable_vgpu_types", 3, "expected `ID : name`");
        assert_eq!(
            e.to_string(),
            "x/creatable_vgpu_types:3: expected `ID : name`"
        );
        assert_eq!(e.errno(), None);
    }
}
