//! The fake NVML of a sandbox host's tree: every NVIDIA GPU whose MIG geometry gpu-core knows
//! (by PCI device ID) is MIG-capable, MIG mode on where its VFs offer or hold MIG-backed vGPU
//! types (what the driver lists only in MIG mode), else off, with no GPU instances; the saved
//! state (`nvml.json`) then puts back what commands changed since.

use gpu_core::PciAddress;
use gpu_core::mig::MigGeometry;
use gpu_core::nvidia::VgpuTypeName;
use gpu_nvml::MigMode;
use gpu_nvml::fake::{FakeGpu, FakeNvml};
use gpu_sysfs::Host;

/// The fake NVML of `host`'s tree.
pub fn fake_of(host: &dyn Host) -> FakeNvml {
    let mut fake = FakeNvml::new();
    for d in host.list("sys/bus/pci/devices").unwrap_or_default() {
        let Ok(addr) = d.parse::<PciAddress>() else {
            continue;
        };
        let read = |f: &str| {
            host.read_string(&format!("sys/bus/pci/devices/{addr}/{f}"))
                .ok()
                .and_then(|s| u16::from_str_radix(s.trim().trim_start_matches("0x"), 16).ok())
        };
        if read("vendor") != Some(0x10de)
            || host.exists(&format!("sys/bus/pci/devices/{addr}/physfn"))
        {
            continue;
        }
        let Some(g) = read("device").and_then(MigGeometry::for_device) else {
            continue;
        };
        let mode = if offers_mig_types(host, &addr) {
            MigMode::Enabled
        } else {
            MigMode::Disabled
        };
        fake = fake.with_gpu(addr, FakeGpu::mig(g).with_mig_mode(mode));
    }
    fake
}

fn offers_mig_types(host: &dyn Host, pf: &PciAddress) -> bool {
    gpu_sysfs::actuate::vfs_of(host, pf).iter().any(|vf| {
        host.read_string(&format!(
            "sys/bus/pci/devices/{vf}/nvidia/creatable_vgpu_types"
        ))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split_once(':').map(|(_, n)| n.trim().to_owned()))
        .any(|n| VgpuTypeName::parse(&n).is_ok_and(|t| t.mig_slices.is_some()))
    })
}

/// Resets `gpu` of the sandbox `opened` (`gpuslice sandbox reset`): a MIG mode pending a reset
/// comes into force.
///
/// # Errors
/// [`super::MigError::NoNvml`] off a sandbox; [`super::MigError::Nvml`]: `IN_USE` while a
/// vGPU or process runs, `NOT_FOUND` for a GPU the sandbox's NVML lacks.
pub fn reset(opened: &gpu_sysfs::OpenedRoot, gpu: &PciAddress) -> Result<(), super::MigError> {
    let Some(dir) = opened.sandbox_dir() else {
        return Err(super::MigError::NoNvml {
            why: "not a sandbox".to_owned(),
        });
    };
    let nvml = fake_of(opened.host())
        .saved_in(dir)
        .map_err(|e| super::MigError::NoNvml { why: e.to_string() })?;
    nvml.reset(gpu).map_err(super::MigError::nvml(*gpu))
}
