//! `POST /v1/vgpus`, `DELETE /v1/vgpus/{id}`, `GET /v1/vgpus`: vGPU instances and their hand-off,
//! made and removed by the node's writer ([`gpu_node::Node`]) under its lock, with the promise
//! recorded around the write.

use std::sync::Arc;

use gpu_core::{MdevUuid, ParentId};
use gpu_node::{Removed, Target, VgpuId};
use gpu_sysfs::actuate::{self, Created};

use super::Agent;
use super::handoff::HandoffTarget;
use super::request::{CreateRequest, no_path};
use crate::error::ApiError;
use crate::events::EventKind;
use crate::state::{Device, Owner};

impl Agent {
    /// `POST /v1/vgpus`.
    ///
    /// # Errors
    /// Invalid requests (nothing written), conflicts, exhausted pools, host errors.
    pub async fn create(
        self: &Arc<Self>,
        req: CreateRequest,
    ) -> Result<serde_json::Value, ApiError> {
        no_path("parent", &req.parent)?;
        no_path("profile", &req.profile)?;
        let parent: ParentId = req
            .parent
            .parse()
            .map_err(|e| ApiError::from_core("parent", &e))?;
        let owner = Owner {
            machine: req.machine.clone(),
            request: req
                .machine
                .as_ref()
                .map(|_| req.request.clone().unwrap_or_else(|| "gpu".to_owned())),
            index: req.machine.as_ref().map(|_| req.index.unwrap_or(0)),
        };
        let uuid = match (&req.uuid, &req.machine) {
            (Some(_), Some(_)) => {
                return Err(ApiError::invalid("give either uuid or machine, not both"));
            }
            (Some(u), None) => {
                no_path("uuid", u)?;
                if req.request.is_some() || req.index.is_some() {
                    return Err(ApiError::invalid("request and index go with machine"));
                }
                Some(
                    u.parse::<MdevUuid>()
                        .map_err(|e| ApiError::from_core("uuid", &e))?,
                )
            }
            (None, Some(m)) => {
                let r = owner.request.as_deref().unwrap_or("gpu");
                let u = actuate::machine_uuid(m, r, owner.index.unwrap_or(0))
                    .map_err(|(field, e)| ApiError::from_core(field, &e))?;
                Some(u)
            }
            (None, None) => None,
        };
        let me = Arc::clone(self);
        let out = self
            .write(false, move |a| a.create_locked(&req, parent, uuid, owner))
            .await?;
        let (kind, id, body) = out;
        let rev = me
            .bus
            .publish(kind_created(), serde_json::json!({ "id": id }));
        let mut body = body;
        if let Some(o) = body.as_object_mut() {
            o.insert("revision".to_owned(), rev.into());
        }
        let _ = kind;
        Ok(body)
    }

    fn create_locked(
        &self,
        req: &CreateRequest,
        parent: ParentId,
        uuid: Option<MdevUuid>,
        owner: Owner,
    ) -> Result<(&'static str, String, serde_json::Value), ApiError> {
        let node = self.node();
        let locked = node.lock()?;
        // MIG on request: the GPU instance of a MIG-backed type made first (gpu-node's one
        // function, as `vgpu create`), destroyed again when the vGPU is not made.
        let nvml = self.config.mig.as_ref().map(|m| m.0.as_ref());
        let made = match nvml {
            // A type the driver time-slices inside GPU instances: the instance with room first.
            Some(n) => match node.vgpu_in_instance_held(n, &parent, &req.profile)? {
                Some(made) => made,
                None => node.instance_for_request_held(n, &parent, &req.profile, |name| {
                    self.gpu_named(name)
                })?,
            },
            None => None,
        };
        let out = self.create_on(&locked, req, parent, uuid, owner);
        if let (Err(_), Some(n), Some((gpu, id))) = (&out, nvml, made) {
            node.undo_instance_held(n, &gpu, id);
        }
        out
    }

    fn gpu_named(&self, n: &str) -> Result<gpu_core::PciAddress, ApiError> {
        self.snapshot()
            .topology
            .gpu_by_name(n)
            .map(|g| g.address)
            .ok_or_else(|| {
                ApiError::not_found(format!(
                    "{n:?} is neither an mdev parent nor a GPU of this host"
                ))
            })
    }

    fn create_on(
        &self,
        locked: &gpu_node::Locked<'_, '_>,
        req: &CreateRequest,
        parent: ParentId,
        uuid: Option<MdevUuid>,
        owner: Owner,
    ) -> Result<(&'static str, String, serde_json::Value), ApiError> {
        // Mixed sizes: checked (and the mode turned on where asked) before the target is chosen.
        let mixed = self.mixed_before(locked, req, &parent)?;
        let target =
            locked.choose_target(&parent, &req.profile, uuid.as_ref(), |n| self.gpu_named(n))?;
        let (device, handoff, kind) = match &target {
            Target::Mdev { type_id, .. } => {
                let uuid = uuid.ok_or_else(|| {
                    ApiError::invalid("an mdev instance needs a name: give uuid or machine")
                })?;
                // Promised on the parent asked for; the record follows where it was made.
                let device = Device::Mdev {
                    uuid,
                    parent: parent.clone(),
                    type_id: type_id.clone(),
                };
                (device, HandoffTarget::Mdev(uuid), "mdev")
            }
            Target::VendorVfio { vf, type_num } => {
                if uuid.is_some() && req.machine.is_none() {
                    return Err(ApiError::invalid(
                        "uuid names mdev instances; a vendor-VFIO vGPU is named by its VF",
                    ));
                }
                let device = Device::VendorVfio {
                    vf: *vf,
                    type_num: *type_num,
                };
                (device, HandoffTarget::Pci(*vf), "vendorVfio")
            }
        };
        let id = device.id();
        let (made, warning) = self.with_promise(device.clone(), owner, &req.profile, || {
            let made = locked.create_vgpu(&target, uuid, req.force)?;
            if let Some(p) = &mixed {
                locked.mixed_placed(p, &made)?;
            }
            let actual = match &made {
                Created::Mdev(m) => Device::Mdev {
                    uuid: m.uuid,
                    parent: m.parent.clone(),
                    type_id: m.type_id.clone(),
                },
                Created::VendorVfio(_) => device.clone(),
            };
            Ok((made, actual))
        })?;
        let mut body = serde_json::to_value(&made).unwrap_or_default();
        if let Some(o) = body.as_object_mut() {
            o.insert("vmHandoff".to_owned(), self.vm_handoff(&handoff));
            if let Some(w) = warning {
                o.insert("warnings".to_owned(), vec![w].into());
            }
        }
        Ok((kind, id, body))
    }

    /// [`gpu_node::Locked::mixed_before`] with the agent's NVML; a request asking for mixed
    /// sizes on an agent without NVML is refused.
    fn mixed_before(
        &self,
        locked: &gpu_node::Locked<'_, '_>,
        req: &CreateRequest,
        parent: &ParentId,
    ) -> Result<Option<gpu_node::mixed::PlacementPlan>, ApiError> {
        match self.config.mig.as_ref().map(|m| m.0.as_ref()) {
            Some(nvml) => Ok(locked.mixed_before(nvml, parent, &req.profile, req.mixed_sizes)?),
            None if req.mixed_sizes => Err(gpu_node::NodeError::Mixed(Box::new(
                gpu_node::mixed::MixedError::NoNvml {
                    why: "the agent was started without it".to_owned(),
                },
            ))
            .into()),
            None => Ok(None),
        }
    }

    /// `DELETE /v1/vgpus/{uuid|vf}`: removes the instance (refused while a VM holds it, unless
    /// `force`) and forgets its promise.
    ///
    /// # Errors
    /// A target that is neither a UUID nor an address, `in-use`, host errors.
    pub async fn remove(
        self: &Arc<Self>,
        target: String,
        force: bool,
    ) -> Result<serde_json::Value, ApiError> {
        no_path("target", &target)?;
        let Some(what) = VgpuId::parse(&target) else {
            return Err(ApiError::invalid(format!(
                "{target:?} is neither an mdev UUID nor a PCI address"
            )));
        };
        let id = match what {
            VgpuId::Mdev(u) => u.to_string(),
            VgpuId::Vf(vf) => vf.to_string(),
        };
        let me = Arc::clone(self);
        let (value, warning) = self
            .write(false, move |a| {
                let node = a.node();
                let locked = node.lock()?;
                let (removed, warning, promised) =
                    a.with_removal(&id, || Ok(locked.remove_vgpu(&what, force)?))?;
                if !removed.changed() && !promised {
                    let missing = match &removed {
                        Removed::Mdev(r) => r.warning.as_ref().map(|w| format!(" ({w})")),
                        Removed::Vf(_) => None,
                    };
                    return Err(ApiError::not_found(format!(
                        "no vGPU {id} on this host, and none promised{}",
                        missing.unwrap_or_default()
                    )));
                }
                let value = serde_json::to_value(&removed).unwrap_or_default();
                Ok(((id, value), warning))
            })
            .await?;
        let ((id, mut value), warning) = (value, warning);
        let rev = me
            .bus
            .publish(EventKind::VgpuRemoved, serde_json::json!({ "id": id }));
        if let Some(o) = value.as_object_mut() {
            o.insert("revision".to_owned(), rev.into());
            if let Some(w) = warning {
                o.insert("warnings".to_owned(), vec![w].into());
            }
        }
        Ok(value)
    }

    /// `GET /v1/vgpus`: the instances on the host now, and the agent's promises.
    ///
    /// # Errors
    /// An unreadable host.
    pub fn list_blocking(&self) -> Result<serde_json::Value, ApiError> {
        let listing = self.node().list_vgpus()?;
        let state = self.load()?;
        let mut v = serde_json::json!({
            "revision": self.bus.revision(),
            "mdevs": listing.mdevs,
            "vendorVfio": listing.vendor_vfio,
            "promises": state.promises,
        });
        if let (Some(o), false) = (v.as_object_mut(), listing.warnings.is_empty()) {
            o.insert("warnings".to_owned(), listing.warnings.into());
        }
        Ok(v)
    }
}

fn kind_created() -> EventKind {
    EventKind::VgpuCreated
}
