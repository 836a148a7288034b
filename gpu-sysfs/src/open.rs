//! Opening what a front-end's `root` names: a directory standing for the host's `/`, used as
//! is; a `*.umockdev` recording, replayed into a private temporary tree; or `sandbox:DIR`, a
//! sandbox host kept in `DIR` with the fake kernel reacting to writes ([`crate::sandbox`],
//! feature `sandbox`). The CLI's `--root` and the bindings' `root` arguments all come through
//! here, and the opened root says once what it is: whether it is this machine's own `/`
//! ([`OpenedRoot::is_local_host`]), a recording, or a sandbox.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::SysfsError;
pub use crate::confine::{is_local_root, is_recording, is_sandbox};
use crate::host::{CommandOutput, Host, RealHost};
use crate::umockdev::{self, Replay};

/// What kind of host a root named.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RootKind {
    /// This machine's own `/`.
    Local,
    /// A directory standing for `/` (a copied or built tree): only what is written happens.
    Tree,
    /// A replayed `*.umockdev` recording: what is written to its tree is thrown away.
    Recording,
    /// A sandbox host (`sandbox:DIR`): the fake kernel reacts to writes, kept in `DIR`.
    Sandbox,
}

#[derive(Debug)]
enum Opened {
    Real(RealHost),
    #[cfg(feature = "sandbox")]
    Sandbox(Box<crate::sandbox::Sandbox>),
}

/// The host a root names, kept open for as long as it is needed (a replayed recording's tree is
/// removed on drop).
#[derive(Debug)]
pub struct OpenedRoot {
    host: Opened,
    kind: RootKind,
    /// The root as given, for messages.
    shown: String,
    /// Keeps a replayed recording's temporary tree alive.
    _replay: Option<Replay>,
}

impl OpenedRoot {
    /// The host.
    pub fn host(&self) -> &dyn Host {
        match &self.host {
            Opened::Real(h) => h,
            #[cfg(feature = "sandbox")]
            Opened::Sandbox(s) => s.as_ref(),
        }
    }

    /// What kind of host the root named.
    pub fn kind(&self) -> RootKind {
        self.kind
    }

    /// True when the root was a recording: what is written to its tree is thrown away.
    pub fn is_recording(&self) -> bool {
        self.kind == RootKind::Recording
    }

    /// True when the root is this machine's own `/`: the one answer to "is this the local
    /// host?" (NVML, uevents and the machine's processes describe it, and no other root).
    pub fn is_local_host(&self) -> bool {
        self.kind == RootKind::Local
    }

    /// The sandbox directory, when the root was `sandbox:DIR`.
    pub fn sandbox_dir(&self) -> Option<&Path> {
        match &self.host {
            #[cfg(feature = "sandbox")]
            Opened::Sandbox(s) => Some(s.dir()),
            _ => None,
        }
    }

    /// The opened sandbox, when the root was `sandbox:DIR`.
    #[cfg(feature = "sandbox")]
    pub fn sandbox(&self) -> Option<&crate::sandbox::Sandbox> {
        match &self.host {
            Opened::Sandbox(s) => Some(s),
            Opened::Real(_) => None,
        }
    }

    /// The root as it was given.
    pub fn shown(&self) -> &str {
        &self.shown
    }

    /// How a root-relative `path` is named to people: `/path` on the local host, the path under
    /// the tree elsewhere (`<tree>/sys/...`), so that no message names `/sys/...` as if it were
    /// this machine's.
    pub fn display_path(&self, path: &str) -> String {
        let rel = path.trim_start_matches('/');
        match (self.kind, self.host().root_dir()) {
            (RootKind::Local, _) | (_, None) => format!("/{rel}"),
            (RootKind::Recording, _) => format!("{}:/{rel}", self.shown),
            (_, Some(dir)) => dir.join(rel).display().to_string(),
        }
    }
}

/// Opens `root`: a directory standing for `/`, a `*.umockdev` recording, or `sandbox:DIR`.
///
/// # Errors
/// [`SysfsError::Io`] for a root that does not exist or cannot be read,
/// [`SysfsError::InvalidRoot`] for a file that is not a recording or a `sandbox:DIR` that is not
/// a sandbox (or a build without feature `sandbox`), and the replay's errors for a malformed
/// recording (the message names the file and line).
pub fn open_root(root: &Path) -> Result<OpenedRoot, SysfsError> {
    let shown = root.display().to_string();
    if is_sandbox(root) {
        return open_sandbox(root, shown);
    }
    if is_recording(root) {
        let replay = umockdev::materialize(root)?;
        let host = RealHost::new(replay.root()).map_err(|e| SysfsError::io(shown.clone(), e))?;
        return Ok(OpenedRoot {
            host: Opened::Real(host),
            kind: RootKind::Recording,
            shown,
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
        Ok(_) => RealHost::new(root).map_err(|e| SysfsError::io(shown.clone(), e))?,
    };
    let local = is_local_root(root);
    Ok(OpenedRoot {
        host: Opened::Real(host),
        kind: if local {
            RootKind::Local
        } else {
            RootKind::Tree
        },
        shown,
        _replay: None,
    })
}

#[cfg(feature = "sandbox")]
fn open_sandbox(root: &Path, shown: String) -> Result<OpenedRoot, SysfsError> {
    let dir = crate::sandbox::sandbox_dir(root).unwrap_or(root);
    let sandbox = crate::sandbox::open(dir)?;
    Ok(OpenedRoot {
        host: Opened::Sandbox(Box::new(sandbox)),
        kind: RootKind::Sandbox,
        shown,
        _replay: None,
    })
}

#[cfg(not(feature = "sandbox"))]
fn open_sandbox(_root: &Path, shown: String) -> Result<OpenedRoot, SysfsError> {
    Err(SysfsError::InvalidRoot {
        path: shown,
        why: "a sandbox, but this build of gpuslice has no sandbox support (gpu-sysfs feature \
              `sandbox`)"
            .to_owned(),
    })
}

/// An opened root is a host: every primitive goes to the host it opened.
impl Host for OpenedRoot {
    fn read(&self, path: &str) -> std::io::Result<Vec<u8>> {
        self.host().read(path)
    }
    fn read_bounded(&self, path: &str, max: usize) -> std::io::Result<Vec<u8>> {
        self.host().read_bounded(path, max)
    }
    fn write(&self, path: &str, data: &[u8]) -> std::io::Result<()> {
        self.host().write(path, data)
    }
    fn list(&self, dir: &str) -> std::io::Result<Vec<String>> {
        self.host().list(dir)
    }
    fn read_link(&self, path: &str) -> std::io::Result<PathBuf> {
        self.host().read_link(path)
    }
    fn exists(&self, path: &str) -> bool {
        self.host().exists(path)
    }
    fn run(
        &self,
        program: &str,
        args: &[String],
        timeout: Duration,
    ) -> std::io::Result<CommandOutput> {
        self.host().run(program, args, timeout)
    }
    fn root_dir(&self) -> Option<&Path> {
        self.host().root_dir()
    }
    fn recorded_vgpu_types(&self, gpu: &gpu_core::PciAddress) -> Option<Vec<(u32, String)>> {
        self.host().recorded_vgpu_types(gpu)
    }
    fn parallel_reads(&self) -> bool {
        self.host().parallel_reads()
    }
    fn write_atomic(&self, path: &str, data: &[u8]) -> std::io::Result<()> {
        self.host().write_atomic(path, data)
    }
    fn create_dir_all(&self, path: &str) -> std::io::Result<()> {
        self.host().create_dir_all(path)
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
    fn only_the_machines_own_root_is_the_local_host() {
        assert!(open_root(Path::new("/")).unwrap().is_local_host());
        assert!(is_local_root(Path::new("/.")));
        let dir = tempfile::tempdir().unwrap();
        let tree = open_root(dir.path()).unwrap();
        assert!(!tree.is_local_host());
        assert_eq!(tree.kind(), RootKind::Tree);
        assert!(!is_local_root(Path::new("sandbox:/")));
    }

    #[test]
    fn a_path_under_a_tree_is_named_where_it_is() {
        let dir = tempfile::tempdir().unwrap();
        let tree = open_root(dir.path()).unwrap();
        assert_eq!(
            tree.display_path("sys/bus/pci"),
            dir.path().join("sys/bus/pci").display().to_string()
        );
        assert_eq!(
            open_root(Path::new("/"))
                .unwrap()
                .display_path("sys/bus/pci"),
            "/sys/bus/pci"
        );
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
