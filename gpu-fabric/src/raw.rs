//! `libnvfm` loaded at run time: the C structs of NVIDIA's public Fabric Manager API
//! (`nv_fm_types.h`, `nv_fm_agent.h`), declared here from their documented layout, and one
//! `unsafe` block per foreign call. Struct versions follow `MAKE_FM_PARAM_VERSION(type, ver)`:
//! `sizeof(type) | ver << 24`. A function the loaded library lacks is `FunctionNotFound`,
//! naming it.

// The crate's only unsafe code: loading the library and one block per foreign call.
#![allow(unsafe_code)]

use std::os::raw::{c_int, c_uint, c_void};
use std::path::Path;

use gpu_core::PciAddress;

use crate::error::{FmError, FmErrorKind};
use crate::types::{FailedDevice, FmGpu, FmPartition, NvlinkFailures, parse_bus_id};

/// `FM_MAX_STR_LENGTH`.
const MAX_STR: usize = 256;
/// `FM_UUID_BUFFER_SIZE`.
const UUID_LEN: usize = 80;
/// `FM_DEVICE_PCI_BUS_ID_BUFFER_SIZE`.
const BUS_ID_LEN: usize = 32;
/// `FM_MAX_NUM_GPUS`.
const MAX_GPUS: usize = 16;
/// `FM_MAX_NUM_NVSWITCHES`.
const MAX_SWITCHES: usize = 12;
/// `FM_MAX_FABRIC_PARTITIONS`.
const MAX_PARTITIONS: usize = 64;
/// `FM_MAX_NUM_NVLINK_PORTS`.
const MAX_PORTS: usize = 64;

/// `MAKE_FM_PARAM_VERSION` of a struct of `T` at version `ver`.
fn version<T>(ver: u32) -> c_uint {
    (std::mem::size_of::<T>() as u32) | (ver << 24)
}

/// `fmConnectParams_v1`.
#[repr(C)]
struct ConnectParams {
    version: c_uint,
    address_info: [u8; MAX_STR],
    timeout_ms: c_uint,
    address_is_unix_socket: c_uint,
}

/// `fmFabricPartitionGpuInfo_t`.
#[repr(C)]
#[derive(Clone, Copy)]
struct GpuInfo {
    physical_id: c_uint,
    uuid: [u8; UUID_LEN],
    pci_bus_id: [u8; BUS_ID_LEN],
    num_nvlinks_available: c_uint,
    max_num_nvlinks: c_uint,
    nvlink_line_rate_mbps: c_uint,
}

/// `fmFabricPartitionInfo_t`.
#[repr(C)]
#[derive(Clone, Copy)]
struct PartitionInfo {
    partition_id: c_uint,
    is_active: c_uint,
    num_gpus: c_uint,
    gpu_info: [GpuInfo; MAX_GPUS],
}

/// `fmFabricPartitionList_v2` (its version number is 1).
#[repr(C)]
struct PartitionList {
    version: c_uint,
    num_partitions: c_uint,
    max_num_partitions: c_uint,
    partition_info: [PartitionInfo; MAX_PARTITIONS],
}

/// `fmActivatedFabricPartitionList_v1`.
#[repr(C)]
struct ActivatedList {
    version: c_uint,
    num_partitions: c_uint,
    partition_ids: [c_uint; MAX_PARTITIONS],
}

/// `fmNvlinkFailedDeviceInfo_t`.
#[repr(C)]
#[derive(Clone, Copy)]
struct FailedInfo {
    uuid: [u8; UUID_LEN],
    pci_bus_id: [u8; BUS_ID_LEN],
    num_ports: c_uint,
    port_num: [c_uint; MAX_PORTS],
}

/// `fmNvlinkFailedDevices_v1`.
#[repr(C)]
struct FailedDevices {
    version: c_uint,
    num_gpus: c_uint,
    num_switches: c_uint,
    gpu_info: [FailedInfo; MAX_GPUS],
    switch_info: [FailedInfo; MAX_SWITCHES],
}

/// `fmPciDevice_t`.
#[repr(C)]
#[derive(Clone, Copy)]
struct PciDevice {
    domain: c_uint,
    bus: c_uint,
    device: c_uint,
    function: c_uint,
}

const GPU_ZERO: GpuInfo = GpuInfo {
    physical_id: 0,
    uuid: [0; UUID_LEN],
    pci_bus_id: [0; BUS_ID_LEN],
    num_nvlinks_available: 0,
    max_num_nvlinks: 0,
    nvlink_line_rate_mbps: 0,
};
const PARTITION_ZERO: PartitionInfo = PartitionInfo {
    partition_id: 0,
    is_active: 0,
    num_gpus: 0,
    gpu_info: [GPU_ZERO; MAX_GPUS],
};
const FAILED_ZERO: FailedInfo = FailedInfo {
    uuid: [0; UUID_LEN],
    pci_bus_id: [0; BUS_ID_LEN],
    num_ports: 0,
    port_num: [0; MAX_PORTS],
};

type Handle = *mut c_void;
type FnVoid = unsafe extern "C" fn() -> c_int;
type FnConnect = unsafe extern "C" fn(*mut ConnectParams, *mut Handle) -> c_int;
type FnHandle = unsafe extern "C" fn(Handle) -> c_int;
type FnPartitions = unsafe extern "C" fn(Handle, *mut PartitionList) -> c_int;
type FnId = unsafe extern "C" fn(Handle, c_uint) -> c_int;
type FnWithVfs = unsafe extern "C" fn(Handle, c_uint, *mut PciDevice, c_uint) -> c_int;
type FnActivated = unsafe extern "C" fn(Handle, *mut ActivatedList) -> c_int;
type FnFailed = unsafe extern "C" fn(Handle, *mut FailedDevices) -> c_int;

/// The functions gpuslice calls, each `None` where the library does not export it.
struct Api {
    init: Option<FnVoid>,
    shutdown: Option<FnVoid>,
    connect: Option<FnConnect>,
    disconnect: Option<FnHandle>,
    partitions: Option<FnPartitions>,
    activate: Option<FnId>,
    activate_with_vfs: Option<FnWithVfs>,
    deactivate: Option<FnId>,
    set_activated: Option<FnActivated>,
    failed: Option<FnFailed>,
}

/// The loaded library, connected to one Fabric Manager.
pub(crate) struct Connection {
    // Kept loaded while the function pointers in `api` are used.
    _lib: libloading::Library,
    api: Api,
    /// The `fmHandle_t` `fmConnect` gave, as an integer so the connection is `Send`.
    handle: usize,
}

/// A symbol of `lib` by its documented name, `None` when it is missing.
fn sym<T: Copy>(lib: &libloading::Library, name: &[u8]) -> Option<T> {
    // SAFETY: every `T` used below is the function type `nv_fm_agent.h` documents for that
    // name; the pointer is used only while `lib` stays loaded (it lives in `Connection`).
    unsafe { lib.get::<T>(name).ok().map(|s| *s) }
}

fn missing(call: &'static str) -> FmError {
    FmError::new(call, FmErrorKind::FunctionNotFound)
}

fn text(bytes: &[u8]) -> String {
    let end = bytes.iter().position(|b| *b == 0).unwrap_or(bytes.len());
    String::from_utf8_lossy(&bytes[..end]).into_owned()
}

impl Connection {
    /// Loads `library`, initializes it (`fmLibInit`) and connects (`fmConnect`) to `address`
    /// (a TCP address or, with `unix_socket`, a socket path).
    pub(crate) fn open(
        library: &Path,
        address: &str,
        unix_socket: bool,
        timeout_ms: u32,
    ) -> Result<Connection, FmError> {
        // SAFETY: loading runs the library's initializers; libnvfm's do no more than any
        // shared library's (it is NVIDIA's client library, or a test's stand-in).
        let lib = unsafe { libloading::Library::new(library) }.map_err(|e| {
            FmError::new(
                "dlopen",
                FmErrorKind::Unavailable(format!("{} could not be loaded: {e}", library.display())),
            )
        })?;
        let api = Api {
            init: sym(&lib, b"fmLibInit\0"),
            shutdown: sym(&lib, b"fmLibShutdown\0"),
            connect: sym(&lib, b"fmConnect\0"),
            disconnect: sym(&lib, b"fmDisconnect\0"),
            partitions: sym(&lib, b"fmGetSupportedFabricPartitions\0"),
            activate: sym(&lib, b"fmActivateFabricPartition\0"),
            activate_with_vfs: sym(&lib, b"fmActivateFabricPartitionWithVFs\0"),
            deactivate: sym(&lib, b"fmDeactivateFabricPartition\0"),
            set_activated: sym(&lib, b"fmSetActivatedFabricPartitions\0"),
            failed: sym(&lib, b"fmGetNvlinkFailedDevices\0"),
        };
        let init = api.init.ok_or_else(|| missing("fmLibInit"))?;
        let connect = api.connect.ok_or_else(|| missing("fmConnect"))?;
        // SAFETY: documented signature, no arguments.
        FmError::check("fmLibInit", unsafe { init() })?;
        let mut params = ConnectParams {
            version: version::<ConnectParams>(1),
            address_info: [0; MAX_STR],
            timeout_ms,
            address_is_unix_socket: c_uint::from(unix_socket),
        };
        let bytes = address.as_bytes();
        if bytes.len() >= MAX_STR || bytes.contains(&0) {
            return Err(FmError::new("fmConnect", FmErrorKind::BadParam));
        }
        params.address_info[..bytes.len()].copy_from_slice(bytes);
        let mut handle: Handle = std::ptr::null_mut();
        // SAFETY: `params` is a live, initialized `fmConnectParams_v1` with its version set;
        // `handle` is a live out pointer.
        let code = unsafe { connect(&mut params, &mut handle) };
        let mut conn = Connection {
            _lib: lib,
            api,
            handle: handle as usize,
        };
        if let Err(e) = FmError::check("fmConnect", code) {
            // Dropping `conn` shuts the library down; there is no handle to disconnect.
            conn.handle = 0;
            return Err(e);
        }
        Ok(conn)
    }

    fn handle(&self) -> Handle {
        self.handle as Handle
    }

    pub(crate) fn partitions(&self) -> Result<Vec<FmPartition>, FmError> {
        const CALL: &str = "fmGetSupportedFabricPartitions";
        let f = self.api.partitions.ok_or_else(|| missing(CALL))?;
        let mut list = Box::new(PartitionList {
            version: version::<PartitionList>(1),
            num_partitions: 0,
            max_num_partitions: 0,
            partition_info: [PARTITION_ZERO; MAX_PARTITIONS],
        });
        // SAFETY: live handle from `fmConnect`; `list` is a live, versioned
        // `fmFabricPartitionList_v2` FM fills.
        FmError::check(CALL, unsafe { f(self.handle(), &mut *list) })?;
        let n = (list.num_partitions as usize).min(MAX_PARTITIONS);
        Ok(list.partition_info[..n]
            .iter()
            .map(|p| FmPartition {
                id: p.partition_id,
                active: p.is_active != 0,
                gpus: p.gpu_info[..(p.num_gpus as usize).min(MAX_GPUS)]
                    .iter()
                    .map(|g| FmGpu {
                        physical_id: g.physical_id,
                        uuid: text(&g.uuid),
                        pci_bus_id: parse_bus_id(&text(&g.pci_bus_id)),
                        nvlinks: g.num_nvlinks_available,
                        max_nvlinks: g.max_num_nvlinks,
                        line_rate_mbps: g.nvlink_line_rate_mbps,
                    })
                    .collect(),
            })
            .collect())
    }

    pub(crate) fn activate(&self, id: u32) -> Result<(), FmError> {
        const CALL: &str = "fmActivateFabricPartition";
        let f = self.api.activate.ok_or_else(|| missing(CALL))?;
        // SAFETY: live handle; plain integer argument.
        FmError::check(CALL, unsafe { f(self.handle(), id) })
    }

    pub(crate) fn activate_with_vfs(&self, id: u32, vfs: &[PciAddress]) -> Result<(), FmError> {
        const CALL: &str = "fmActivateFabricPartitionWithVFs";
        let f = self.api.activate_with_vfs.ok_or_else(|| missing(CALL))?;
        let mut list: Vec<PciDevice> = vfs
            .iter()
            .map(|a| PciDevice {
                domain: a.domain(),
                bus: c_uint::from(a.bus()),
                device: c_uint::from(a.device()),
                function: c_uint::from(a.function()),
            })
            .collect();
        let n =
            c_uint::try_from(list.len()).map_err(|_| FmError::new(CALL, FmErrorKind::BadParam))?;
        // SAFETY: live handle; `list` holds `n` live `fmPciDevice_t`s FM only reads.
        FmError::check(CALL, unsafe { f(self.handle(), id, list.as_mut_ptr(), n) })
    }

    pub(crate) fn deactivate(&self, id: u32) -> Result<(), FmError> {
        const CALL: &str = "fmDeactivateFabricPartition";
        let f = self.api.deactivate.ok_or_else(|| missing(CALL))?;
        // SAFETY: live handle; plain integer argument.
        FmError::check(CALL, unsafe { f(self.handle(), id) })
    }

    pub(crate) fn set_activated(&self, ids: &[u32]) -> Result<(), FmError> {
        const CALL: &str = "fmSetActivatedFabricPartitions";
        let f = self.api.set_activated.ok_or_else(|| missing(CALL))?;
        if ids.len() > MAX_PARTITIONS {
            return Err(FmError::new(CALL, FmErrorKind::BadParam));
        }
        let mut list = ActivatedList {
            version: version::<ActivatedList>(1),
            num_partitions: ids.len() as c_uint,
            partition_ids: [0; MAX_PARTITIONS],
        };
        list.partition_ids[..ids.len()].copy_from_slice(ids);
        // SAFETY: live handle; `list` is a live, versioned `fmActivatedFabricPartitionList_v1`.
        FmError::check(CALL, unsafe { f(self.handle(), &mut list) })
    }

    pub(crate) fn nvlink_failed_devices(&self) -> Result<NvlinkFailures, FmError> {
        const CALL: &str = "fmGetNvlinkFailedDevices";
        let f = self.api.failed.ok_or_else(|| missing(CALL))?;
        let mut list = Box::new(FailedDevices {
            version: version::<FailedDevices>(1),
            num_gpus: 0,
            num_switches: 0,
            gpu_info: [FAILED_ZERO; MAX_GPUS],
            switch_info: [FAILED_ZERO; MAX_SWITCHES],
        });
        // SAFETY: live handle; `list` is a live, versioned `fmNvlinkFailedDevices_v1`.
        FmError::check(CALL, unsafe { f(self.handle(), &mut *list) })?;
        let device = |d: &FailedInfo| FailedDevice {
            uuid: text(&d.uuid),
            pci_bus_id: parse_bus_id(&text(&d.pci_bus_id)),
            ports: d.port_num[..(d.num_ports as usize).min(MAX_PORTS)].to_vec(),
        };
        Ok(NvlinkFailures {
            gpus: list.gpu_info[..(list.num_gpus as usize).min(MAX_GPUS)]
                .iter()
                .map(device)
                .collect(),
            switches: list.switch_info[..(list.num_switches as usize).min(MAX_SWITCHES)]
                .iter()
                .map(device)
                .collect(),
        })
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        if self.handle != 0
            && let Some(f) = self.api.disconnect
        {
            // SAFETY: the handle `fmConnect` gave, disconnected once. Its answer cannot be
            // acted on while dropping.
            let _ = unsafe { f(self.handle()) };
        }
        if let Some(f) = self.api.shutdown {
            // SAFETY: documented signature; the library was initialized in `open`.
            let _ = unsafe { f() };
        }
    }
}
