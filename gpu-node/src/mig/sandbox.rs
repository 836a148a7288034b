//! The fake NVML of a sandbox host's tree: every NVIDIA GPU whose MIG geometry gpu-core knows
//! (by PCI device ID) is MIG-capable, MIG mode on where its recorded pool offers MIG-backed vGPU
//! types (what the driver lists only in MIG mode), else off, with no GPU instances; every other
//! NVIDIA GPU whose vendor-VFIO pool offers time-sliced types (the bundled L40S) supports
//! mixed-size vGPUs, starting in same-size mode, its types placed on the fake kernel's lattice
//! (`FakeKernel::mixed_placements`: an **assumption**, NVIDIA publishes no placement table,
//! docs/partitions.md); the saved state (`nvml.json`) then puts back what commands changed
//! since (MIG modes, GPU instances, the size mode).

use gpu_core::PciAddress;
use gpu_core::mig::MigGeometry;
use gpu_core::nvidia::VgpuTypeName;
use gpu_nvml::fake::{FakeGpu, FakeNvml, FakeVgpuType};
use gpu_nvml::{MigMode, VgpuMode};
use gpu_sysfs::OpenedRoot;

/// The fake NVML of the sandbox `opened`'s tree.
pub fn fake_of(opened: &OpenedRoot) -> FakeNvml {
    let host = opened.host();
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
            if let Some(gpu) = mixed_size_gpu(opened, &addr) {
                fake = fake.with_gpu(addr, gpu);
            }
            continue;
        };
        let mode = if offers_mig_types(opened, &addr) {
            MigMode::Enabled
        } else {
            MigMode::Disabled
        };
        fake = fake.with_gpu(addr, FakeGpu::mig(g).with_mig_mode(mode));
    }
    fake
}

/// A GPU without MIG whose sandbox pool offers time-sliced types: mixed-size capable, in
/// same-size mode, each type at the kernel's placements (its memory: the largest type's).
fn mixed_size_gpu(opened: &OpenedRoot, pf: &PciAddress) -> Option<FakeGpu> {
    let placements = opened.sandbox()?.kernel().mixed_placements(pf);
    let types: Vec<FakeVgpuType> = placements
        .iter()
        .filter_map(|(id, name, size, ids)| {
            let fb = VgpuTypeName::parse(name).ok()?.framebuffer_mib();
            Some(FakeVgpuType::new(*id, name, fb, *size, ids))
        })
        .collect();
    let memory = types.iter().filter_map(|t| t.info.framebuffer_mib).max()?;
    Some(
        FakeGpu::new(memory)
            .with_vgpu_types(types)
            .mixed_size(VgpuMode::Homogeneous),
    )
}

/// Whether the sandbox's vendor-VFIO pool of `pf` (the types its recording's VFs listed, kept
/// in `sandbox.json`) holds MIG-backed types: what the driver lists only in MIG mode. The pool,
/// not the VFs' lists now, so that the base state does not change when SR-IOV is disabled.
fn offers_mig_types(opened: &OpenedRoot, pf: &PciAddress) -> bool {
    let Some(sandbox) = opened.sandbox() else {
        return false;
    };
    sandbox.kernel().pools().iter().any(|p| match p {
        gpu_sysfs::testing::FakePool::VendorVfio { pf: at, types, .. } if at == pf => types
            .iter()
            .any(|(_, n)| VgpuTypeName::parse(n).is_ok_and(|t| t.mig_slices.is_some())),
        _ => false,
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
    let nvml = fake_of(opened)
        .saved_in(dir)
        .map_err(|e| super::MigError::NoNvml { why: e.to_string() })?;
    nvml.reset(gpu).map_err(super::MigError::nvml(*gpu))
}
