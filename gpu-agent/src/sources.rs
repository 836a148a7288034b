//! Opening the agent's event sources: the kernel's uevent socket and NVML's XID / double-bit ECC
//! events, with the rules for when each is used. The front-end (`gpuslice agent`) only says what
//! the user asked for.

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
