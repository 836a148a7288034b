//! The one writer: every change to the host runs here, after the agent's writer lock and the
//! host's layout lock, and every change is recorded in the promises before and after.

use std::sync::Arc;

use gpu_core::ErrorKind;
use gpu_sysfs::apply::LayoutLock;

use super::Agent;
use crate::error::ApiError;
use crate::state::{Device, Owner, Phase, Promise, StateFile};

impl Agent {
    /// Runs `f` as the one writer: after the agent's writer lock (async) and, when `host_lock`,
    /// the host's layout lock (on the blocking thread), then refreshes the snapshot.
    pub(super) async fn write<T, F>(self: &Arc<Self>, host_lock: bool, f: F) -> Result<T, ApiError>
    where
        T: Send + 'static,
        F: FnOnce(&Agent) -> Result<T, ApiError> + Send + 'static,
    {
        let _w = self.writer.lock().await;
        let me = Arc::clone(self);
        tokio::task::spawn_blocking(move || {
            let _lock = if host_lock {
                Some(me.layout_lock()?)
            } else {
                None
            };
            let out = f(&me);
            if let Err(e) = me.refresh() {
                crate::log!("gpuslice agent: cannot read the host after a write: {e}");
            }
            out
        })
        .await
        .map_err(|e| ApiError::new(ErrorKind::Other, format!("the write did not finish: {e}")))?
    }

    pub(super) fn layout_lock(&self) -> Result<LayoutLock, ApiError> {
        let root = self
            .host
            .root_dir()
            .ok_or_else(|| ApiError::new(ErrorKind::HostError, "the host has no root directory"))?;
        LayoutLock::acquire(root, Some(self.config.lock_timeout), &mut |p| {
            crate::log!(
                "gpuslice agent: waiting for {} (another gpuslice vgpu apply)",
                p.display()
            );
        })
        .map_err(|e| ApiError::from_apply(&e))
    }

    pub(super) fn load(&self) -> Result<StateFile, ApiError> {
        self.store.load()
    }

    /// Records `device` as pending, runs `create`, then records what was made as created; a
    /// failed create takes its pending record back out. A recorded device of the same identity
    /// but another parent or type is refused before anything is written.
    pub(super) fn with_promise<T>(
        &self,
        device: Device,
        owner: Owner,
        profile: &str,
        create: impl FnOnce() -> Result<(T, Device), ApiError>,
    ) -> Result<T, ApiError> {
        let mut state = self.load()?;
        let id = device.id();
        let existing = state.promises.iter().position(|p| p.device.id() == id);
        if let Some(i) = existing {
            let p = &state.promises[i];
            if !same_target(&p.device, &device) && !self.picked_on_gpu(&p.device, &device) {
                return Err(ApiError::new(
                    ErrorKind::ExistsOtherType,
                    format!(
                        "{id} is already promised as {} (profile {}); remove it first",
                        describe(&p.device),
                        p.profile
                    ),
                ));
            }
        } else {
            state.promises.push(Promise {
                device,
                owner,
                profile: profile.to_owned(),
                phase: Phase::Pending,
            });
            self.store.save(&state)?;
        }
        match create() {
            Ok((made, actual)) => {
                if let Some(p) = state.promises.iter_mut().find(|p| p.device.id() == id) {
                    p.device = actual;
                    p.phase = Phase::Created;
                }
                self.store.save(&state)?;
                Ok(made)
            }
            Err(e) => {
                if existing.is_none() {
                    state.promises.retain(|p| p.device.id() != id);
                    self.store.save(&state)?;
                }
                Err(e)
            }
        }
    }
}

fn same_target(a: &Device, b: &Device) -> bool {
    match (a, b) {
        (
            Device::Mdev {
                type_id: t1,
                parent: p1,
                ..
            },
            Device::Mdev {
                type_id: t2,
                parent: p2,
                ..
            },
        ) => t1 == t2 && p1 == p2,
        (Device::VendorVfio { type_num: a, .. }, Device::VendorVfio { type_num: b, .. }) => a == b,
        _ => false,
    }
}

fn describe(d: &Device) -> String {
    match d {
        Device::Mdev {
            parent, type_id, ..
        } => format!("{type_id} on {parent}"),
        Device::VendorVfio { vf, type_num } => format!("type {type_num} on VF {vf}"),
    }
}
