//! Reusable fakes (feature `testing`): a builder of fake sysfs trees made of real files and
//! symlinks, laid out as the kernel lays out `/sys`.

pub mod builder;

pub use builder::{MdevTypeSpec, PciSpec, TreeBuilder};
