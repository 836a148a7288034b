//! The plugin's unix sockets: a stale socket left by a crashed run is replaced, one that still
//! answers (another plugin serving the same driver) is refused, and each is removed when served
//! no more.

use std::io;
use std::os::unix::fs::FileTypeExt as _;
use std::path::{Path, PathBuf};

/// A bound socket; its file is removed when this is dropped.
#[derive(Debug)]
pub struct Bound {
    /// The listener.
    pub listener: Option<tokio::net::UnixListener>,
    /// Removes the file on drop.
    pub guard: Remove,
}

/// Removes a socket file when dropped.
#[derive(Debug)]
pub struct Remove(pub PathBuf);

impl Drop for Remove {
    fn drop(&mut self) {
        match std::fs::remove_file(&self.0) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => crate::log!("gpuslice agent: cannot remove {}: {e}", self.0.display()),
        }
    }
}

/// Binds `path` (creating its directory), replacing a stale socket. Call on the runtime.
///
/// # Errors
/// The directory cannot be made; `path` is something other than a socket, or a socket another
/// process still serves; the bind fails.
pub fn bind(path: &Path) -> io::Result<Bound> {
    let named = |e: io::Error| io::Error::new(e.kind(), format!("{}: {e}", path.display()));
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(named)?;
    }
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_socket() => {
            // Non-blocking, with a deadline: a process that bound it and never accepts does not
            // hang the start.
            let found =
                crate::liveness::probe(path, crate::liveness::PROBE_TIMEOUT).map_err(named)?;
            if found.is_held() {
                return Err(io::Error::new(
                    io::ErrorKind::AddrInUse,
                    format!(
                        "{}: {} (is a second plugin for this driver running?)",
                        path.display(),
                        found.describe()
                    ),
                ));
            }
            std::fs::remove_file(path).map_err(named)?;
        }
        Ok(_) => {
            return Err(io::Error::new(
                io::ErrorKind::AlreadyExists,
                format!(
                    "{}: exists and is not a socket; not replaced",
                    path.display()
                ),
            ));
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(named(e)),
    }
    let listener = tokio::net::UnixListener::bind(path).map_err(named)?;
    Ok(Bound {
        listener: Some(listener),
        guard: Remove(path.to_path_buf()),
    })
}

/// A gRPC channel to one of the plugin's unix sockets, as the kubelet opens one (the
/// authority is not looked at): for an orchestrator or a test that drives the plugin itself.
///
/// # Errors
/// The socket cannot be connected to.
pub async fn channel(path: PathBuf) -> Result<tonic::transport::Channel, tonic::transport::Error> {
    tonic::transport::Endpoint::from_static("http://plugin.invalid")
        .connect_with_connector(tower::service_fn(move |_: tonic::transport::Uri| {
            let path = path.clone();
            async move {
                Ok::<_, io::Error>(hyper_util::rt::TokioIo::new(
                    tokio::net::UnixStream::connect(path).await?,
                ))
            }
        }))
        .await
}
