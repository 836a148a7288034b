//! Which GPU instances gpuslice made: `run/gpuslice/mig-instances.json` under the root, written
//! through the host's atomic writer. GPU instances do not outlive a reboot, and `/run` is
//! cleared at boot, so the record never outlives what it names. An entry counts only while an
//! instance with the same ID, profile and placement exists, so a record left by a crash never
//! hands gpuslice someone else's instance.

use gpu_core::PciAddress;
use gpu_nvml::GpuInstance;
use gpu_sysfs::Host;
use serde::{Deserialize, Serialize};

/// The record, under the root.
pub const OWNED_FILE: &str = "run/gpuslice/mig-instances.json";
const MAX_BYTES: usize = 256 * 1024;

/// One GPU instance gpuslice made.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct OwnedInstance {
    /// Its GPU.
    pub gpu: PciAddress,
    /// NVML's ID of it.
    pub id: u32,
    /// Its profile ID.
    pub profile_id: u32,
    /// First memory slice.
    pub start: u32,
    /// Memory slices.
    pub size: u32,
    /// What it was made for (`vgpu create`, `mig apply`).
    pub made_for: String,
}

impl OwnedInstance {
    /// True when `gi` on `gpu` is this instance.
    pub fn is(&self, gpu: &PciAddress, gi: &GpuInstance) -> bool {
        self.gpu == *gpu
            && self.id == gi.id
            && self.profile_id == gi.profile_id
            && self.start == gi.placement.start
            && self.size == gi.placement.size
    }
}

/// The record as read (empty when missing or unreadable: then gpuslice owns nothing, the safe
/// side).
pub fn read(host: &dyn Host) -> Vec<OwnedInstance> {
    host.read_bounded(OWNED_FILE, MAX_BYTES)
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or_default()
}

/// Writes the record.
///
/// # Errors
/// The I/O error.
pub fn write(host: &dyn Host, owned: &[OwnedInstance]) -> std::io::Result<()> {
    let text = serde_json::to_vec_pretty(owned).map_err(std::io::Error::other)?;
    host.write_atomic(OWNED_FILE, &text)
}

/// Whether gpuslice made `gi` on `gpu`.
pub fn made_by_us(owned: &[OwnedInstance], gpu: &PciAddress, gi: &GpuInstance) -> bool {
    owned.iter().any(|o| o.is(gpu, gi))
}

/// What `mig apply` records as the reason it made an instance.
pub const MADE_BY_MIG_APPLY: &str = "mig apply";

/// Whether gpuslice made `gi` on `gpu` for vGPUs (`vgpu create`, a layout), not by `mig
/// apply`: only those go with the vGPUs.
pub fn made_for_vgpus(owned: &[OwnedInstance], gpu: &PciAddress, gi: &GpuInstance) -> bool {
    owned
        .iter()
        .any(|o| o.is(gpu, gi) && o.made_for != MADE_BY_MIG_APPLY)
}
