//! The NVML a MIG command talks to, chosen the way every front-end shares: the driver's
//! library on this machine's `/` (or a named one), the saved fake of a sandbox host
//! (`sandbox:DIR`, kept in `DIR/nvml.json`), and none for a recording or a copied tree.

use gpu_health::NvmlSource;
use gpu_nvml::{NvmlDevices, NvmlLibrary};
use gpu_sysfs::OpenedRoot;

use super::MigError;

/// The NVML of `opened` under `source`.
///
/// # Errors
/// [`MigError::NoNvml`] saying why there is none.
pub fn open_nvml(
    opened: &OpenedRoot,
    source: &NvmlSource,
) -> Result<Box<dyn NvmlDevices>, MigError> {
    if let Some(dir) = opened.sandbox_dir() {
        return sandbox_nvml(opened, dir);
    }
    let library = match source {
        NvmlSource::Off => {
            return Err(MigError::NoNvml {
                why: "--no-nvml".to_owned(),
            });
        }
        NvmlSource::Library(p) => Some(p.as_path()),
        NvmlSource::LocalOnly if opened.is_local_host() => None,
        NvmlSource::LocalOnly => {
            return Err(MigError::NoNvml {
                why: "the root is not this machine: a recording or a copied tree has no driver \
                      (try a sandbox: `gpuslice sandbox init`)"
                    .to_owned(),
            });
        }
    };
    let lib = NvmlLibrary::open_now(library);
    lib.wait()
        .map_err(|e| MigError::NoNvml { why: e.to_string() })?;
    Ok(Box::new(lib))
}

#[cfg(feature = "sandbox")]
fn sandbox_nvml(
    opened: &OpenedRoot,
    dir: &std::path::Path,
) -> Result<Box<dyn NvmlDevices>, MigError> {
    super::sandbox::fake_of(opened)
        .saved_in(dir)
        .map(|n| Box::new(n) as Box<dyn NvmlDevices>)
        .map_err(|e| MigError::NoNvml {
            why: format!("the sandbox's {}: {e}", gpu_nvml::fake::persist::NVML_FILE),
        })
}

#[cfg(not(feature = "sandbox"))]
fn sandbox_nvml(
    _opened: &OpenedRoot,
    _dir: &std::path::Path,
) -> Result<Box<dyn NvmlDevices>, MigError> {
    Err(MigError::NoNvml {
        why: "this build has no sandbox NVML".to_owned(),
    })
}
