//! Carrying out a layout's steps one by one, with the journal that undoes them: the executor
//! behind [`super::apply_layout_locked`].

use super::*;

/// Why the plan could not be made again after SR-IOV was enabled.
#[derive(Debug, thiserror::Error)]
pub(super) enum Replan {
    #[error("discovering the host after enabling SR-IOV: {0}")]
    Discover(SysfsError),
    #[error("{0}")]
    Plan(LayoutError),
}

/// A change a rollback could not undo: what is left on the host, and why.
#[derive(Debug, thiserror::Error)]
#[error("{left}: {source}")]
struct UndoFailed {
    left: String,
    source: UndoCause,
}

/// The failed write behind an [`UndoFailed`].
#[derive(Debug, thiserror::Error)]
enum UndoCause {
    #[error("{0}")]
    Actuate(Box<ActuateError>),
    #[error("{0}")]
    Write(std::io::Error),
}

/// A change and how to undo it.
#[derive(Debug, Clone)]
pub(super) enum Undo {
    RemoveCreated(MdevUuid),
    Recreate(MdevCreate),
    ClearSet(PciAddress),
    Retype(PciAddress, u32),
    DisableSriov(PciAddress),
}

pub(super) struct Run<'a> {
    pub(super) host: &'a dyn Host,
    pub(super) opts: &'a ApplyOptions,
    pub(super) journal: Vec<Undo>,
    pub(super) changes: Vec<Change>,
    pub(super) memory: Option<RememberedNames>,
}

impl Run<'_> {
    pub(super) fn step(&mut self, step: &Step) -> Result<(), ActuateError> {
        match step {
            Step::EnableSriov { gpu } => {
                let done = enable_sriov(self.host, gpu, &self.opts.sriov)?;
                if done.changed {
                    self.journal.push(Undo::DisableSriov(*gpu));
                    self.changes.push(Change {
                        op: "enable-sriov",
                        gpu: ParentId::Pci(*gpu),
                        device: gpu.to_string(),
                        type_id: None,
                    });
                }
            }
            Step::Remove { gpu, instance } => self.remove(gpu, instance)?,
            Step::Create { gpu, instance } => self.create(gpu, instance)?,
        }
        Ok(())
    }

    fn vf(instance: &PlannedInstance) -> Result<PciAddress, ActuateError> {
        instance
            .parent
            .pci()
            .ok_or_else(|| ActuateError::Unsupported {
                device: instance.parent.to_string(),
                why: "a vendor-VFIO instance must be a VF address".to_owned(),
            })
    }

    fn remove(&mut self, gpu: &ParentId, instance: &PlannedInstance) -> Result<(), ActuateError> {
        let force = self.opts.force;
        match (instance.framework, instance.uuid) {
            (VgpuFramework::Mdev, Some(uuid)) => {
                let r = remove_mdev(self.host, &uuid, force)?;
                if r.changed {
                    let type_id = r.type_id.or_else(|| instance.type_id.clone());
                    if let Some(t) = &type_id {
                        self.journal.push(Undo::Recreate(MdevCreate {
                            parent: r.parent.unwrap_or_else(|| instance.parent.clone()),
                            type_id: t.clone(),
                            uuid,
                        }));
                    }
                    self.changes.push(Change {
                        op: "remove",
                        gpu: gpu.clone(),
                        device: uuid.to_string(),
                        type_id,
                    });
                }
            }
            _ => {
                let vf = Self::vf(instance)?;
                let r = clear_vf(self.host, &vf, force)?;
                if r.changed {
                    if let Some(n) = r.previous.as_ref().and_then(VgpuTypeId::vendor_vfio_number) {
                        self.journal.push(Undo::Retype(vf, n));
                    }
                    self.changes.push(Change {
                        op: "remove",
                        gpu: gpu.clone(),
                        device: vf.to_string(),
                        type_id: r.previous,
                    });
                }
            }
        }
        Ok(())
    }

    fn create(&mut self, gpu: &ParentId, instance: &PlannedInstance) -> Result<(), ActuateError> {
        match instance.framework {
            VgpuFramework::Mdev => {
                let (Some(uuid), Some(type_id)) = (instance.uuid, instance.type_id.clone()) else {
                    return Err(ActuateError::Unsupported {
                        device: instance.parent.to_string(),
                        why: "the plan gave an mdev creation no UUID or type".to_owned(),
                    });
                };
                let req = MdevCreate {
                    parent: instance.parent.clone(),
                    type_id: type_id.clone(),
                    uuid,
                };
                if matches!(instance.parent, ParentId::Named(_)) {
                    self.check_room(&req)?;
                }
                let made = create_mdev(self.host, &req)?;
                if made.changed {
                    self.journal.push(Undo::RemoveCreated(uuid));
                    self.changes.push(Change {
                        op: "create",
                        gpu: gpu.clone(),
                        device: uuid.to_string(),
                        type_id: Some(type_id),
                    });
                }
            }
            VgpuFramework::VendorVfio => {
                let vf = Self::vf(instance)?;
                let num = match instance
                    .type_id
                    .as_ref()
                    .and_then(VgpuTypeId::vendor_vfio_number)
                {
                    Some(n) => n,
                    None => self.resolve_vf_type(&vf, instance)?,
                };
                let set = set_vf_type(self.host, &vf, num, self.opts.force)?;
                let name = set.type_name.as_deref().or(instance.type_name.as_deref());
                if let (Some(m), Some(name), Some(_)) =
                    (self.memory.as_mut(), name, self.host.root_dir())
                {
                    if m.remember(num, name) {
                        let _ = m.save(self.host);
                    }
                }
                if set.changed {
                    self.journal.push(Undo::ClearSet(vf));
                    self.changes.push(Change {
                        op: "create",
                        gpu: gpu.clone(),
                        device: vf.to_string(),
                        type_id: Some(set.type_id),
                    });
                }
            }
        }
        Ok(())
    }

    /// On a virtual parent the plan could only bound the pool: the driver's count of the type,
    /// read right before the write, says whether one more fits. An instance that is already
    /// there (a re-run) needs no room.
    fn check_room(&self, req: &MdevCreate) -> Result<(), ActuateError> {
        if self
            .host
            .exists(&format!("sys/bus/mdev/devices/{}", req.uuid))
        {
            return Ok(());
        }
        let path = format!(
            "sys/class/mdev_bus/{}/mdev_supported_types/{}/available_instances",
            req.parent, req.type_id
        );
        let text = self
            .host
            .read_string(&path)
            .map_err(|e| ActuateError::read(&path, e))?;
        match text.trim().parse::<u32>() {
            Ok(0) => Err(ActuateError::Exhausted {
                path: format!("/{path}"),
                errno: "the driver reports 0 available; nothing written".to_owned(),
            }),
            Ok(_) => Ok(()),
            Err(_) => Err(ActuateError::Unsupported {
                device: req.parent.to_string(),
                why: format!("/{path} reads {:?}, not a count", text.trim()),
            }),
        }
    }

    /// A type the driver did not list while the GPU was full: its ID by name, from what the VF
    /// lists now that the surplus is gone (exact name first, then without a MIG suffix).
    fn resolve_vf_type(
        &self,
        vf: &PciAddress,
        instance: &PlannedInstance,
    ) -> Result<u32, ActuateError> {
        let want = instance.type_name.clone().unwrap_or_default();
        let types = creatable_types(self.host, vf)?;
        // The exact name first, across the VF's list and the remembered names: a suffix is
        // stripped only when no source knows the exact name (a remembered exact type the VF
        // does not list is not offered, never replaced by its base type).
        let remembered = self.memory.as_ref().and_then(|m| m.id_of_exact(&want));
        let base = match remembered {
            Some(_) => None,
            None => VgpuTypeName::parse(&want)
                .ok()
                .map(|n| n.base().to_string()),
        };
        types
            .iter()
            .find(|(_, n)| names_match(n, &want))
            .or_else(|| {
                let r = remembered?;
                types.iter().find(|(id, _)| *id == r)
            })
            .or_else(|| {
                let b = base.as_deref()?;
                types.iter().find(|(_, n)| names_match(n, b))
            })
            .map(|(id, _)| *id)
            .ok_or_else(|| ActuateError::UnknownProfile {
                parent: vf.to_string(),
                profile: want,
                offered: types
                    .iter()
                    .map(|(id, n)| format!("{id} ({n})"))
                    .collect::<Vec<_>>()
                    .join(", "),
            })
    }

    fn undo(&self, u: &Undo) -> Result<String, UndoFailed> {
        let host = self.host;
        let failed = |left: String| {
            move |e: ActuateError| UndoFailed {
                left,
                source: UndoCause::Actuate(Box::new(e)),
            }
        };
        match u {
            Undo::RemoveCreated(uuid) => remove_mdev(host, uuid, true)
                .map(|_| format!("removed mdev {uuid} again"))
                .map_err(failed(format!("mdev {uuid} is still there"))),
            Undo::Recreate(req) => create_mdev(host, req)
                .map(|_| {
                    format!(
                        "re-created mdev {} ({}) on {}",
                        req.uuid, req.type_id, req.parent
                    )
                })
                .map_err(failed(format!(
                    "mdev {} ({}) on {} could not be re-created",
                    req.uuid, req.type_id, req.parent
                ))),
            Undo::ClearSet(vf) => clear_vf(host, vf, true)
                .map(|_| format!("cleared VF {vf} again"))
                .map_err(failed(format!("VF {vf} keeps its new type"))),
            Undo::Retype(vf, n) => set_vf_type(host, vf, *n, true)
                .map(|_| format!("gave VF {vf} its type {n} back"))
                .map_err(failed(format!("VF {vf} lost its type {n}"))),
            Undo::DisableSriov(pf) => {
                let path = format!("sys/bus/pci/devices/{pf}/sriov_numvfs");
                host.write(&path, b"0")
                    .map(|()| format!("disabled SR-IOV on {pf} again"))
                    .map_err(|e| UndoFailed {
                        left: format!("SR-IOV stays enabled on {pf}"),
                        source: UndoCause::Write(e),
                    })
            }
        }
    }

    /// Undoes the journal (most recent first) and builds the failure.
    pub(super) fn fail(
        &mut self,
        plan: Plan,
        failure: String,
        events: &mut dyn FnMut(ApplyEvent<'_>),
    ) -> ApplyError {
        events(ApplyEvent::RollingBack {
            changes: self.journal.len(),
        });
        let mut undone = Vec::new();
        let mut leftover = Vec::new();
        for u in self.journal.iter().rev() {
            match self.undo(u) {
                Ok(s) => undone.push(s),
                Err(e) => leftover.push(e.to_string()),
            }
        }
        let complete = leftover.is_empty();
        ApplyError::Failed {
            report: Box::new(ApplyReport {
                status: if complete {
                    ApplyStatus::RolledBack
                } else {
                    ApplyStatus::RollbackIncomplete
                },
                plan,
                changes: std::mem::take(&mut self.changes),
                failure: Some(failure),
                rollback: Some(Rollback {
                    complete,
                    undone,
                    leftover,
                }),
            }),
        }
    }
}
