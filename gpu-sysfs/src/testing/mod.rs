//! Reusable fakes (feature `testing`): a builder of fake sysfs trees made of real files and
//! symlinks, laid out as the kernel lays out `/sys`.

pub mod builder;
pub mod counting;
pub mod doctor_hosts;
pub mod fake_kernel;
pub mod fixtures;
pub mod golden;

pub use builder::{MdevTypeSpec, PciSpec, TreeBuilder};
pub use counting::CountingHost;
pub use fake_kernel::{Entry, FakeKernel, FakePool, SriovManage, WriteRecord, snapshot};
pub use golden::assert_golden;
