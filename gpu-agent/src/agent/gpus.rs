//! `POST /v1/gpus/{gpu}/bind` and `/release`: whole GPUs for passthrough.

use std::sync::Arc;

use gpu_core::{GpuRef, PciAddress};

use super::Agent;
use super::handoff::HandoffTarget;
use super::request::no_path;
use crate::error::ApiError;
use crate::events::EventKind;

impl Agent {
    fn resolve_gpu(&self, gpu: &str) -> Result<PciAddress, ApiError> {
        no_path("gpu", gpu)?;
        let name = match GpuRef::parse_one(gpu).map_err(|e| ApiError::from_core("gpu", &e))? {
            GpuRef::Address(a) => return Ok(a),
            named => named.to_string(),
        };
        let snap = self.snapshot();
        snap.topology
            .gpu_address_by_name(&name)
            .map_err(|e| ApiError::not_found(e.to_string()))
    }

    /// `POST /v1/gpus/{name|bdf}/bind` and `/release`. A bind of a GPU the served topology
    /// grades Unhealthy is refused unless `force` (`?force=true`), as `gpuslice gpu bind` does
    /// ([`gpu_core::Health::check_handout`]); a Degraded one is bound with a warning in the
    /// answer's `warnings`. For a release, `force` releases a GPU a process holds.
    ///
    /// # Errors
    /// Unknown GPUs, an Unhealthy GPU (`unhealthy`, 409), refusals of the actuation layer.
    pub async fn bind(
        self: &Arc<Self>,
        gpu: String,
        bind: bool,
        force: bool,
    ) -> Result<serde_json::Value, ApiError> {
        let addr = self.resolve_gpu(&gpu)?;
        let health_warning = if bind {
            let snap = self.snapshot();
            (snap.topology)
                .check_gpu_handout(&addr, force, "?force=true")
                .map_err(|e| ApiError::new(e.kind(), e.to_string()))?
        } else {
            None
        };
        let me = Arc::clone(self);
        let mut value = self
            .write(false, move |a| {
                let node = a.node();
                let r = if bind {
                    node.bind_gpu(&addr).map_err(bind_refusal)?
                } else {
                    node.release_gpu(&addr, force)?
                };
                Ok(serde_json::to_value(&r).unwrap_or_default())
            })
            .await?;
        let kind = if bind {
            EventKind::GpuBound
        } else {
            EventKind::GpuReleased
        };
        let rev = me
            .bus
            .publish(kind, serde_json::json!({ "gpu": addr.to_string() }));
        if let Some(o) = value.as_object_mut() {
            o.insert("revision".to_owned(), rev.into());
            if let Some(w) = health_warning {
                match o
                    .get_mut("warnings")
                    .and_then(serde_json::Value::as_array_mut)
                {
                    Some(list) => list.push(w.into()),
                    None => {
                        o.insert("warnings".to_owned(), vec![w].into());
                    }
                }
            }
            if bind {
                o.insert(
                    "vmHandoff".to_owned(),
                    me.vm_handoff(&HandoffTarget::Pci(addr)),
                );
            }
        }
        Ok(value)
    }
}

/// The body of `POST /v1/gpus/bind` and `/release`: `{"gpus": ["nvidia0", "0000:3a:00.0"],
/// "force": false}`.
#[derive(Debug, Clone, serde::Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SetRequest {
    /// The GPUs, by name or PCI address.
    pub gpus: Vec<String>,
    /// Bind Unhealthy GPUs; release GPUs a process holds.
    #[serde(default)]
    pub force: bool,
    /// Fabric Manager in vGPU mode: instead of binding the GPUs, give a VF of each a vGPU of
    /// this type (time-sliced, the whole framebuffer) and activate the partition with those VFs
    /// ([`gpu_node::fabric::create_vgpu_set`]); on release, deactivate it and clear the VFs.
    #[serde(default)]
    pub profile: Option<String>,
}

impl Agent {
    /// `POST /v1/gpus/bind` (`bind`) and `/release`: the GPUs of `req` as one set
    /// ([`gpu_node::fabric::bind_set`], [`gpu_node::fabric::release_set`]): on an NVSwitch host
    /// exactly one partition's members, activated with the bind and deactivated after the
    /// release; a set that is no partition is refused before any write, naming those that would
    /// do. Unhealthy GPUs are refused unless `force`, as for one GPU.
    ///
    /// # Errors
    /// An empty or unknown GPU, an Unhealthy GPU, the fabric's refusals (`invalid-request`,
    /// `in-use`, `no-device`), the actuation layer's.
    pub async fn bind_set(
        self: &Arc<Self>,
        req: SetRequest,
        bind: bool,
    ) -> Result<serde_json::Value, ApiError> {
        if req.gpus.is_empty() {
            return Err(ApiError::new(
                gpu_core::ErrorKind::InvalidArgument,
                "gpus: at least one GPU is needed",
            ));
        }
        let addrs = req
            .gpus
            .iter()
            .map(|g| self.resolve_gpu(g))
            .collect::<Result<Vec<_>, _>>()?;
        if bind {
            let snap = self.snapshot();
            for addr in &addrs {
                if let Some(g) = snap.topology.gpu_by_address(addr) {
                    g.health
                        .check_handout(&addr.to_string(), req.force, "\"force\": true")
                        .map_err(|e| ApiError::new(e.kind(), e.to_string()))?;
                }
            }
        }
        let force = req.force;
        let profile = req.profile.clone();
        let names = req.gpus.clone();
        let me = Arc::clone(self);
        let value = self
            .write(false, move |a| {
                let on = gpu_node::fabric::FabricNode {
                    node: a.node(),
                    source: a.config.fabric.clone(),
                };
                let refused = |e: gpu_node::fabric::FabricError| {
                    ApiError::new(gpu_core::ClassifiedError::kind(&e), e.to_string())
                };
                let done = match (&profile, bind) {
                    (Some(p), true) => serde_json::to_value(
                        gpu_node::fabric::create_vgpu_set(on, &names, p).map_err(refused)?,
                    ),
                    (Some(_), false) => serde_json::to_value(
                        gpu_node::fabric::remove_vgpu_set(on, &names, force).map_err(refused)?,
                    ),
                    (None, true) => serde_json::to_value(
                        gpu_node::fabric::bind_set(on, &addrs).map_err(refused)?,
                    ),
                    (None, false) => serde_json::to_value(
                        gpu_node::fabric::release_set(on, &addrs, force).map_err(refused)?,
                    ),
                };
                Ok(done.unwrap_or_default())
            })
            .await?;
        let kind = if bind {
            EventKind::GpuBound
        } else {
            EventKind::GpuReleased
        };
        let gpus: Vec<String> = req.gpus.clone();
        let rev = me.bus.publish(kind, serde_json::json!({ "gpus": gpus }));
        let mut value = value;
        if let Some(o) = value.as_object_mut() {
            o.insert("revision".to_owned(), rev.into());
        }
        Ok(value)
    }
}

/// A refused bind as the API answers it. A physical GPU that is shared as vGPUs (mdev instances
/// on it or its VFs, SR-IOV VFs enabled) is refused by the actuation layer as a conflict with
/// what the host holds now (409 `conflict`, as `gpuslice gpu bind` says it), said with the GPU's
/// address once. A VF given as a GPU stays the request's fault (400).
fn bind_refusal(e: gpu_node::NodeError) -> ApiError {
    use gpu_sysfs::actuate::ActuateError;
    if let gpu_node::NodeError::Bind { gpu, source } = &e {
        if let ActuateError::Shared { why, .. } = source.as_ref() {
            return ApiError::new(
                gpu_core::ErrorKind::Conflict,
                format!("cannot bind {gpu} to vfio-pci: it {why}"),
            );
        }
    }
    ApiError::from(e)
}
