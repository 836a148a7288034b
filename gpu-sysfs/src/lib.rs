//! Linux sysfs discovery and actuation for gpuslice.

pub mod host;
#[cfg(feature = "testing")]
pub mod testing;

pub use host::{CommandOutput, Host, RealHost};
