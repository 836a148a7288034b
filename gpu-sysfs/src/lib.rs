//! Linux sysfs discovery and actuation for gpuslice.

pub mod actuate;
pub mod apply;
pub mod discover;
pub mod error;
pub mod host;
pub mod resolver;
pub mod umockdev;
#[cfg(feature = "testing")]
pub mod testing;

pub use error::SysfsError;
pub use host::{CommandOutput, Host, RealHost};
