//! Reusable fakes (feature `testing`): a builder of fake sysfs trees made of real files and
//! symlinks, laid out as the kernel lays out `/sys`. The builder and the fake kernel are also
//! built with feature `sandbox` alone: the sandbox host runs on them.

pub mod builder;
#[cfg(feature = "testing")]
pub mod counting;
#[cfg(feature = "testing")]
pub mod doctor_hosts;
pub mod fake_kernel;
#[cfg(feature = "testing")]
pub mod fixtures;
#[cfg(feature = "testing")]
pub mod golden;
#[cfg(feature = "testing")]
pub mod mig_nvml;

pub use builder::{MdevTypeSpec, PciSpec, TreeBuilder};
#[cfg(feature = "testing")]
pub use counting::CountingHost;
pub use fake_kernel::{
    Entry, FakeKernel, FakeMig, FakePool, Reloaded, SriovManage, WriteRecord, snapshot,
};
#[cfg(feature = "testing")]
pub use golden::assert_golden;
