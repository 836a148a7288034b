//! The real Fabric Manager: NVIDIA's client library `libnvfm` loaded at run time and connected
//! to the FM service (TCP `127.0.0.1` on FM's command port by default, or a Unix socket).

use std::path::{Path, PathBuf};
use std::sync::Mutex;

use gpu_core::PciAddress;
use gpu_core::fabric::FabricMode;

use crate::error::{FmError, FmErrorKind};
use crate::manager::FabricManager;
use crate::raw::Connection;
use crate::types::{FmPartition, NvlinkFailures};

/// The library NVIDIA's Fabric Manager package installs (`libnvfm.so.1`).
pub const DEFAULT_LIBRARY: &str = "libnvfm.so.1";
/// Where FM listens for its API by default (`FM_CMD_BIND_INTERFACE`; the library adds FM's
/// default command port, 6666).
pub const DEFAULT_ADDRESS: &str = "127.0.0.1";
/// FM's configuration file, where `FABRIC_MODE` is set.
pub const CONFIG_FILE: &str = "usr/share/nvidia/nvswitch/fabricmanager.cfg";

/// How to reach Fabric Manager.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FmConfig {
    /// The client library; [`DEFAULT_LIBRARY`] (found by the loader) when `None`.
    pub library: Option<PathBuf>,
    /// FM's address (`IP[:PORT]`), or a socket path with `unix_socket`; [`DEFAULT_ADDRESS`]
    /// when `None`.
    pub address: Option<String>,
    /// `address` is a Unix domain socket (`FM_CMD_UNIX_SOCKET_PATH`).
    pub unix_socket: bool,
    /// How long `fmConnect` waits.
    pub timeout_ms: u32,
    /// The mode FM runs in, read from its configuration ([`FabricMode`]; FM's API does not
    /// report it).
    pub mode: FabricMode,
}

impl Default for FmConfig {
    fn default() -> Self {
        FmConfig {
            library: None,
            address: None,
            unix_socket: false,
            timeout_ms: 2000,
            mode: FabricMode::SharedNvswitch,
        }
    }
}

/// The environment variable naming the client library (default [`DEFAULT_LIBRARY`]).
pub const LIBRARY_ENV: &str = "GPUSLICE_FM_LIBRARY";
/// The environment variable naming FM's address (default [`DEFAULT_ADDRESS`]); a value
/// starting with `/` is a Unix domain socket.
pub const ADDRESS_ENV: &str = "GPUSLICE_FM_ADDRESS";

impl FmConfig {
    /// The default configuration with the library and address the environment names
    /// ([`LIBRARY_ENV`], [`ADDRESS_ENV`]) and `mode`.
    pub fn from_env(mode: FabricMode) -> Self {
        let address = std::env::var(ADDRESS_ENV).ok().filter(|a| !a.is_empty());
        FmConfig {
            library: std::env::var_os(LIBRARY_ENV)
                .filter(|l| !l.is_empty())
                .map(PathBuf::from),
            unix_socket: address.as_deref().is_some_and(|a| a.starts_with('/')),
            address,
            mode,
            ..FmConfig::default()
        }
    }
}

/// The mode `FABRIC_MODE=N` sets in FM's configuration text (`fabricmanager.cfg`); bare metal
/// (FM's default) when the key is absent.
///
/// # Errors
/// The line, when its value is not a mode this version knows.
pub fn mode_from_config(text: &str) -> Result<FabricMode, String> {
    let value = text
        .lines()
        .rev()
        .map(str::trim)
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.split_once('='))
        .filter(|(k, _)| k.trim() == "FABRIC_MODE")
        .map(|(_, v)| v.trim())
        .next();
    match value {
        None => Ok(FabricMode::BareMetal),
        Some(v) => v
            .parse::<u32>()
            .ok()
            .and_then(FabricMode::from_fabric_mode)
            .ok_or_else(|| format!("FABRIC_MODE={v} is not 0, 1 or 2")),
    }
}

/// Fabric Manager through `libnvfm`. One connection, its calls one at a time.
pub struct FmLibrary {
    conn: Mutex<Connection>,
    mode: FabricMode,
}

impl std::fmt::Debug for FmLibrary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FmLibrary")
            .field("mode", &self.mode)
            .finish()
    }
}

impl FmLibrary {
    /// Loads the library and connects to FM.
    ///
    /// # Errors
    /// `Unavailable` (library missing), `FunctionNotFound` (not a libnvfm),
    /// `ConnectionNotValid` (FM not running or not listening there), FM's other answers.
    pub fn open(config: &FmConfig) -> Result<FmLibrary, FmError> {
        let library = config
            .library
            .as_deref()
            .unwrap_or(Path::new(DEFAULT_LIBRARY));
        let address = config.address.as_deref().unwrap_or(DEFAULT_ADDRESS);
        let conn = Connection::open(library, address, config.unix_socket, config.timeout_ms)?;
        Ok(FmLibrary {
            conn: Mutex::new(conn),
            mode: config.mode,
        })
    }

    fn with<T>(
        &self,
        call: &'static str,
        f: impl FnOnce(&Connection) -> Result<T, FmError>,
    ) -> Result<T, FmError> {
        let conn = self
            .conn
            .lock()
            .map_err(|_| FmError::new(call, FmErrorKind::Generic))?;
        f(&conn)
    }
}

impl FabricManager for FmLibrary {
    fn mode(&self) -> FabricMode {
        self.mode
    }

    fn partitions(&self) -> Result<Vec<FmPartition>, FmError> {
        self.with("fmGetSupportedFabricPartitions", Connection::partitions)
    }

    fn activate(&self, id: u32) -> Result<(), FmError> {
        self.with("fmActivateFabricPartition", |c| c.activate(id))
    }

    fn activate_with_vfs(&self, id: u32, vfs: &[PciAddress]) -> Result<(), FmError> {
        self.with("fmActivateFabricPartitionWithVFs", |c| {
            c.activate_with_vfs(id, vfs)
        })
    }

    fn deactivate(&self, id: u32) -> Result<(), FmError> {
        self.with("fmDeactivateFabricPartition", |c| c.deactivate(id))
    }

    fn set_activated(&self, ids: &[u32]) -> Result<(), FmError> {
        self.with("fmSetActivatedFabricPartitions", |c| c.set_activated(ids))
    }

    fn nvlink_failed_devices(&self) -> Result<NvlinkFailures, FmError> {
        self.with(
            "fmGetNvlinkFailedDevices",
            Connection::nvlink_failed_devices,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_mode_is_read_from_fabric_mode_and_defaults_to_bare_metal() {
        assert_eq!(mode_from_config("LOG_LEVEL=4\n"), Ok(FabricMode::BareMetal));
        assert_eq!(
            mode_from_config("# FABRIC_MODE=2\nFABRIC_MODE=1\n"),
            Ok(FabricMode::SharedNvswitch)
        );
        assert_eq!(mode_from_config("FABRIC_MODE = 2"), Ok(FabricMode::Vgpu));
        assert!(mode_from_config("FABRIC_MODE=7").is_err());
    }
}
