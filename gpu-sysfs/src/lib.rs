//! Linux sysfs discovery and actuation for gpuslice.

pub mod host;

pub use host::{CommandOutput, Host, RealHost};
