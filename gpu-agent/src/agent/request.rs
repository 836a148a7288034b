//! What a caller may ask: the create request, and the checks every named field passes.

use serde::Deserialize;

use crate::error::ApiError;

/// `POST /v1/vgpus`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CreateRequest {
    /// An mdev parent, an NVIDIA vendor-VFIO VF, or a physical GPU (address or name).
    pub parent: String,
    /// The vGPU type: ID or name.
    pub profile: String,
    /// The Machine it is for (the UUID is derived from machine, request and index).
    #[serde(default)]
    pub machine: Option<String>,
    /// An explicit mdev UUID (instead of `machine`).
    #[serde(default)]
    pub uuid: Option<String>,
    /// With `machine`: the device request's name (default `gpu`).
    #[serde(default)]
    pub request: Option<String>,
    /// With `machine`: the device's index within the request (default 0).
    #[serde(default)]
    pub index: Option<u32>,
    /// Re-type a vendor-VFIO VF even when a process holds it open.
    #[serde(default)]
    pub force: bool,
    /// Turn the GPU to mixed-size vGPU mode first where it is idle and NVML allows it (a GPU
    /// already in that mode mixes sizes without it).
    #[serde(default)]
    pub mixed_sizes: bool,
}

/// Refuses a field that could name a path outside the device it should name.
pub(crate) fn no_path(field: &str, value: &str) -> Result<(), ApiError> {
    if value.contains('/') || value.contains('\\') || value.contains('\0') || value == ".." {
        return Err(ApiError::invalid(format!(
            "{field} {value:?} contains a path separator; give a device name, address or UUID"
        )));
    }
    Ok(())
}

impl ApiError {
    /// The same error with another HTTP status.
    pub fn with_status(mut self, status: u16) -> Self {
        self.status = status;
        self
    }
}
