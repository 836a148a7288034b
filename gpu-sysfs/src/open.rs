//! Opening what a front-end's `root` names: a directory standing for the host's `/`, used as
//! is, or a `*.umockdev` recording, replayed into a private temporary tree. The CLI's `--root`
//! and the bindings' `root` arguments all come through here.

use std::ops::Deref;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::SysfsError;
use crate::host::{CommandOutput, Host, RealHost};
use crate::umockdev::{self, Replay};

/// The host a root names, kept open for as long as it is needed (a replayed recording's tree is
/// removed on drop).
#[derive(Debug)]
pub struct OpenedRoot {
    host: RealHost,
    recording: bool,
    /// Keeps a replayed recording's temporary tree alive.
    _replay: Option<Replay>,
}

impl OpenedRoot {
    /// The host.
    pub fn host(&self) -> &RealHost {
        &self.host
    }

    /// True when the root was a recording: what is written to its tree is thrown away.
    pub fn is_recording(&self) -> bool {
        self.recording
    }
}

/// True when `root` names a `*.umockdev` recording rather than a directory.
pub fn is_recording(root: &Path) -> bool {
    root.is_file() && root.extension().is_some_and(|e| e == "umockdev")
}

/// Opens `root`: a directory standing for `/`, or a `*.umockdev` recording.
///
/// # Errors
/// [`SysfsError::Io`] for a root that does not exist or cannot be read,
/// [`SysfsError::InvalidRoot`] for a file that is not a recording, and the replay's errors for a
/// malformed recording (the message names the file and line).
pub fn open_root(root: &Path) -> Result<OpenedRoot, SysfsError> {
    let shown = root.display().to_string();
    if is_recording(root) {
        let replay = umockdev::materialize(root)?;
        let host = RealHost::new(replay.root()).map_err(|e| SysfsError::io(shown, e))?;
        return Ok(OpenedRoot {
            host,
            recording: true,
            _replay: Some(replay),
        });
    }
    if root.is_file() {
        return Err(SysfsError::InvalidRoot {
            path: shown,
            why: "a file, but not a `*.umockdev` recording; give a directory standing for `/`"
                .to_owned(),
        });
    }
    let host = match std::fs::metadata(root) {
        Err(e) => return Err(SysfsError::io(shown, e)),
        Ok(_) => RealHost::new(root).map_err(|e| SysfsError::io(shown, e))?,
    };
    Ok(OpenedRoot {
        host,
        recording: false,
        _replay: None,
    })
}

/// An opened root is a host: every primitive goes to the tree it opened.
impl Host for OpenedRoot {
    fn read(&self, path: &str) -> std::io::Result<Vec<u8>> {
        self.host.read(path)
    }
    fn read_bounded(&self, path: &str, max: usize) -> std::io::Result<Vec<u8>> {
        self.host.read_bounded(path, max)
    }
    fn write(&self, path: &str, data: &[u8]) -> std::io::Result<()> {
        self.host.write(path, data)
    }
    fn list(&self, dir: &str) -> std::io::Result<Vec<String>> {
        self.host.list(dir)
    }
    fn read_link(&self, path: &str) -> std::io::Result<PathBuf> {
        self.host.read_link(path)
    }
    fn exists(&self, path: &str) -> bool {
        self.host.exists(path)
    }
    fn run(
        &self,
        program: &str,
        args: &[String],
        timeout: Duration,
    ) -> std::io::Result<CommandOutput> {
        self.host.run(program, args, timeout)
    }
    fn root_dir(&self) -> Option<&Path> {
        self.host.root_dir()
    }
    fn write_atomic(&self, path: &str, data: &[u8]) -> std::io::Result<()> {
        self.host.write_atomic(path, data)
    }
    fn create_dir_all(&self, path: &str) -> std::io::Result<()> {
        self.host.create_dir_all(path)
    }
}

impl Deref for OpenedRoot {
    type Target = RealHost;
    fn deref(&self) -> &Self::Target {
        &self.host
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_root_is_a_host_error_naming_the_root() {
        let e = open_root(Path::new("/nonexistent/gpuslice-open-test")).unwrap_err();
        assert_eq!(e.kind(), gpu_core::ErrorKind::HostError);
        assert!(
            e.to_string().contains("/nonexistent/gpuslice-open-test"),
            "{e}"
        );
        assert_eq!(e.errno(), Some(2));
    }

    #[test]
    fn a_plain_file_is_refused_as_a_root() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("notes.txt");
        std::fs::write(&f, "x").unwrap();
        let e = open_root(&f).unwrap_err();
        assert!(
            e.to_string().contains("not a `*.umockdev` recording"),
            "{e}"
        );
    }
}
