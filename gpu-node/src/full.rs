//! A full pool or VF list explained from gpuslice's own model first: a create the kernel
//! refuses with `ENOSPC` (or that no free VF can take) is answered with what the GPU's pool
//! holds (`nvidia0's 16384 MiB pool holds 4 × 4096 MiB ...`), the kernel's errno after.

use gpu_core::{ClassifiedError, ErrorKind, ParentId};
use gpu_sysfs::Host;
use gpu_sysfs::discover::{DiscoverOptions, discover};

use crate::NodeError;

/// `e`, led by the model's account of the pool `at` draws from when `e` says it is full
/// (kind `exhausted`); `e` unchanged otherwise, or when the host cannot be read to say more.
pub(crate) fn explained(host: &dyn Host, at: &ParentId, profile: &str, e: NodeError) -> NodeError {
    if e.kind() != ErrorKind::Exhausted {
        return e;
    }
    let Ok(topo) = discover(host, &DiscoverOptions::new("node")) else {
        return e;
    };
    match gpu_core::explain::why_full(&topo, at, profile) {
        Some(why) => NodeError::Full {
            why,
            source: Box::new(e),
        },
        None => e,
    }
}
