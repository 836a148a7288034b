//! Opening what the agent reads from outside its host: the kernel's uevent socket and NVML's
//! XID / double-bit ECC events (with the rules for when each is used), and the files the user
//! names (the token file, the watched layout). The front-end (`gpuslice agent`) only says what
//! the user asked for.

use std::io;
use std::path::Path;
use std::sync::Arc;

use crate::uevent::{NetlinkSource, UeventSource};

/// Whether the agent listens to the kernel's uevents.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UeventMode {
    /// Only on the live host (`--root /`), and carrying on with the resync when the socket
    /// cannot be opened.
    Auto,
    /// Always; failing to open the socket is an error.
    On,
    /// Never: only the periodic resync.
    Off,
}

/// A `--uevents` value that is none of `auto`, `on`, `off`.
#[derive(Debug, thiserror::Error)]
#[error("{0:?} is not a uevent mode: auto, on or off")]
pub struct UnknownUeventMode(String);

impl std::str::FromStr for UeventMode {
    type Err = UnknownUeventMode;

    /// `auto`, `on` or `off`, as `gpuslice agent --uevents` takes them.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "auto" => Ok(UeventMode::Auto),
            "on" => Ok(UeventMode::On),
            "off" => Ok(UeventMode::Off),
            other => Err(UnknownUeventMode(other.to_owned())),
        }
    }
}

/// Opens the uevent socket as `mode` asks; `live` says the root is the local `/`. Open it before
/// the first read of the host, so that every device change from then on is queued.
///
/// # Errors
/// `UeventMode::On` and the socket cannot be opened.
pub fn open_uevents(
    mode: UeventMode,
    live: bool,
) -> Result<Option<Box<dyn UeventSource>>, std::io::Error> {
    if mode == UeventMode::Off || (mode == UeventMode::Auto && !live) {
        return Ok(None);
    }
    match NetlinkSource::open() {
        Ok(s) => {
            log!("gpuslice agent: listening to kernel uevents");
            Ok(Some(Box::new(s)))
        }
        Err(e) if mode == UeventMode::On => Err(e),
        Err(e) => {
            log!("gpuslice agent: no kernel uevents ({e}); relying on the resync");
            Ok(None)
        }
    }
}

/// NVML's critical XID and double-bit ECC events, on the live host only (NVML describes this
/// machine's GPUs) and unless NVML is turned off. When they can be received, `health` gets the
/// verdict store that folds them into every later read. Where NVML is missing the agent says so
/// and grades health on each read as before.
pub fn open_gpu_events(
    live: bool,
    nvml_off: bool,
    health: &mut gpu_health::HealthOptions,
) -> Option<Box<dyn gpu_health::GpuEventSource>> {
    if !live || nvml_off {
        return None;
    }
    match gpu_health::NvmlEventSource::open(None) {
        Ok(s) => {
            log!(
                "gpuslice agent: watching NVML XID and ECC events on {} GPU(s)",
                s.watched.len()
            );
            health.events = Some(Arc::new(gpu_health::EventVerdicts::default()));
            Some(Box::new(s))
        }
        Err(e) => {
            log!("gpuslice agent: no NVML events ({e}); health is read on each resync");
            None
        }
    }
}

/// Reads a file the user named as the host layer reads every file it does not trust: links
/// followed to the file they name, opened without blocking, refused when it is not a regular
/// file (a FIFO would block for good, a device never ends), never read past `max` bytes.
///
/// # Errors
/// `NotFound` when there is no file; `InvalidData` for a file that is not regular or is larger
/// than `max`; the I/O error otherwise. Each names the file.
pub fn read_file(path: &Path, max: usize) -> io::Result<Vec<u8>> {
    let named = |e: io::Error| io::Error::new(e.kind(), format!("{}: {e}", path.display()));
    // The link chain is resolved without opening the file (opening a FIFO would block).
    let real = std::fs::canonicalize(path).map_err(named)?;
    let (Some(dir), Some(name)) = (real.parent(), real.file_name()) else {
        return Err(named(io::Error::new(
            io::ErrorKind::InvalidInput,
            "names no file",
        )));
    };
    let host = gpu_sysfs::RealHost::new(dir).map_err(named)?;
    gpu_sysfs::Host::read_bounded(&host, &name.to_string_lossy(), max).map_err(named)
}
