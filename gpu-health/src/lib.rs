//! GPU health for gpuslice: signals a host already has, graded into a verdict with reasons.
//!
//! A GPU can look fine to the scheduler and still be a poor place for a VM: its PCIe link may
//! have trained at half width, uncorrectable ECC errors may be climbing, or a row remapping may
//! have failed. This crate reads three groups of signals for every physical GPU:
//!
//! - **PCIe AER** counters from sysfs (`aer_dev_correctable`, `aer_dev_nonfatal`,
//!   `aer_dev_fatal`), see [`aer`];
//! - the **PCIe link** width and speed from sysfs, see [`link`];
//! - **driver telemetry** through the [`Telemetry`] trait: ECC counts, retired pages, row
//!   remapping, temperature against the GPU's thresholds, PCIe replays and memory size. The
//!   [`NvmlTelemetry`] adapter reads them through gpu-nvml's `NvmlDevices` (the trait NVML's
//!   writers use too: `libnvidia-ml.so.1` loaded at run time, or the fake); without the library
//!   those signals are Unknown, not an error.
//!
//! Each signal reads as a value, Unsupported or Unknown ([`Reading`]). A [`Policy`] (defaults in
//! code, overrides from a TOML or YAML file) grades them ([`grade()`]): Unhealthy, Degraded,
//! Healthy, or Unknown when nothing could be read, each verdict with short reasons
//! (`"link x8 of x16"`). Link *speed* is never judged (NVIDIA GPUs slow their link at idle), and
//! link *width* is judged against what that board should have: the device's own baseline, a
//! table of boards wired narrower than their chip, same-model peers, and only then the chip's
//! maximum (see `docs/health-policy.md`).
//!
//! A vGPU parent's health is its physical GPU's. [`node_topology`] composes discovery and
//! health into the `NodeTopology` the CLI and the bindings publish.

pub mod aer;
pub mod assess;
pub mod baseline;
mod compose;

pub mod error;
pub mod events;
pub mod fabric;
pub mod grade;
pub mod link;
pub mod nvml;
pub mod nvml_resolver;
pub mod policy;
pub mod progress;
pub mod reading;
pub mod telemetry;

pub use assess::{
    BaselineSource, GpuHealthReport, HealthOptions, apply, assess, assess_with_links,
    grade_topology, grade_topology_with_links, is_local_root, updated_baseline,
};
pub use baseline::{BASELINE_PATH, Baseline, DeviceBaseline};

pub use compose::{
    ComposedNode, NodeHealth, NodeRequest, NvmlSource, OpenedNode, ParentHealth, node_topology,
    node_topology_with_reports, open_node, open_node_host,
};
pub use error::HealthError;
pub use events::{
    ChannelEventSource, EventVerdicts, GpuEvent, GpuEventKind, GpuEventSource, NvmlEventSource,
    NvmlEventsUnavailable, XidPolicy,
};
pub use grade::{ExpectedWidth, Signals, WidthBasis, grade};
pub use nvml::{NvmlTelemetry, NvmlUnavailable};
pub use nvml_resolver::NvmlResolver;
pub use policy::{Limit, Policy};
pub use reading::Reading;
#[cfg(any(test, feature = "testing"))]
pub use telemetry::FakeTelemetry;
pub use telemetry::{GpuTelemetry, RowRemap, Telemetry};
