//! NVML for gpuslice, read and written through one trait.
//!
//! NVIDIA's management library answers what sysfs cannot: a GPU's ECC counts and temperatures,
//! the vGPU types it supports, its MIG mode and GPU instances with their placements on the
//! GPU's memory slices, the placements of mixed-size ("heterogeneous") vGPUs, and the module ID
//! Fabric Manager names a GPU by on an NVSwitch baseboard. It also changes them: MIG mode on or
//! off (pending a reset on some hosts), GPU instances created at a placement or destroyed, the
//! vGPU size mode switched.
//!
//! Everything goes through [`NvmlDevices`], addressed by the GPU's PCI address:
//!
//! - [`NvmlLibrary`] is the real one: `libnvidia-ml.so.1` loaded at run time (a host without it
//!   is a value, [`NvmlUnavailable`], never a link failure or a panic), nvml-wrapper's safe
//!   calls where it has them and raw calls, in one small module, where it does not;
//! - `fake::FakeNvml` (feature `testing`) answers as the driver does, on gpu-core's MIG
//!   geometry, so the writers above can be tested, and tried in the sandbox, without a GPU.
//!
//! A failed call is an [`NvmlError`]: the call's name and an [`NvmlErrorKind`] translated from
//! NVML's return code in one place ([`NvmlErrorKind::from_code`]), with `Unexpected` for codes
//! a newer driver may add. The rules the fake follows, and the NVIDIA documentation each comes
//! from, are in `docs/partitions.md`.

mod devices;
mod error;
mod raw;
mod real;
mod types;

#[cfg(any(test, feature = "testing"))]
pub mod fake;
#[cfg(feature = "testing")]
pub mod stub;

pub use devices::NvmlDevices;
pub use error::{NvmlError, NvmlErrorKind, NvmlUnavailable};
pub use real::{CONTROL_DEVICE, DEFAULT_LIBRARY, NvmlLibrary, open_library};
pub use types::{
    ActiveVgpu, GpuInstance, GpuInstanceProfile, HealthReads, MigActivation, MigMode, MigModes,
    Placement, RemappedRows, VgpuMode, VgpuPlacements, VgpuScheduler, VgpuTypeInfo,
};
