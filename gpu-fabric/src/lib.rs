//! NVIDIA Fabric Manager for gpuslice, behind one trait.
//!
//! On HGX and DGX baseboards eight GPUs are joined by NVSwitches. A VM's GPUs reach each other
//! over NVLink only when Fabric Manager (FM) has *activated* a partition whose members are
//! exactly those GPUs: FM offers a fixed set of partitions per baseboard (on HGX 8-GPU boards
//! one of eight, two of four, four of two and eight of one), each naming its GPUs by physical
//! (module) ID and PCI bus ID. In shared NVSwitch mode whole GPUs go to VMs and a partition is
//! activated by its ID; in vGPU mode it is activated with one VF of each of its GPUs; in
//! bare-metal mode FM offers no partitions at all.
//!
//! Everything goes through [`FabricManager`]:
//!
//! - [`FmLibrary`] is the real one: NVIDIA's client library `libnvfm.so.1` loaded at run time
//!   (a host without it is a value, an [`FmError`] whose kind is `Unavailable`, never a link
//!   failure or a panic) and connected to FM at a configurable address;
//! - [`fake::FakeFabric`] answers as FM does (NVIDIA's HGX 8-GPU partition set, FM's return
//!   codes for a partition already active, not active, unknown, or asked for in the wrong
//!   mode), for tests and the sandbox, where its state is kept between processes.
//!
//! A failed call is an [`FmError`]: the call's name and an [`FmErrorKind`] translated from FM's
//! return code in one place ([`FmErrorKind::from_code`]). The rules, and the NVIDIA
//! documentation each comes from, are in `docs/fabric.md`.

mod error;
pub mod fake;
mod manager;
mod raw;
mod real;
mod types;

pub use error::{FmError, FmErrorKind};
pub use manager::FabricManager;
pub use real::{
    CONFIG_FILE, DEFAULT_ADDRESS, DEFAULT_LIBRARY, FmConfig, FmLibrary, mode_from_config,
};
pub use types::{FailedDevice, FmGpu, FmPartition, NvlinkFailures};
