//! The one writer: every change to the host runs here, after the agent's writer lock and the
//! host's layout lock, through the node's writer ([`gpu_node::Node`]), and every change is
//! recorded in the promises before and after.

use std::sync::Arc;

use gpu_core::ErrorKind;
use gpu_sysfs::discover::Change;

use super::Agent;
use crate::error::ApiError;
use crate::state::{Device, Owner, Phase, Promise, StateFile};

/// What a write changed on the host, so that the read after it covers exactly that.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Touched {
    /// Nothing on the host (an answer from a record): the snapshot stays as it is.
    Nothing,
    /// These devices only: they are read again and spliced into the snapshot
    /// ([`Agent::refresh_devices`]), or the whole host when the narrow read cannot place them.
    Devices(Vec<Change>),
    /// Not known (a failure midway, an undo): the whole host is read again.
    Host,
}

impl Agent {
    /// Runs `f` as the one writer: after the agent's writer lock (async) and, when `host_lock`,
    /// the host's layout lock (on the blocking thread), then refreshes the snapshot.
    pub(crate) async fn write<T, F>(self: &Arc<Self>, host_lock: bool, f: F) -> Result<T, ApiError>
    where
        T: Send + 'static,
        F: FnOnce(&Agent) -> Result<T, ApiError> + Send + 'static,
    {
        self.write_touching(host_lock, move |agent| (f(agent), Touched::Host))
            .await
    }

    /// As [`Agent::write`], for a write that says what it changed on the host: the read after
    /// it covers only that ([`Touched`]), still before the writer lock is released, so the
    /// next write plans on a snapshot that includes this one.
    pub(crate) async fn write_touching<T, F>(
        self: &Arc<Self>,
        host_lock: bool,
        f: F,
    ) -> Result<T, ApiError>
    where
        T: Send + 'static,
        F: FnOnce(&Agent) -> (Result<T, ApiError>, Touched) + Send + 'static,
    {
        let _w = self.writer.lock().await;
        let me = Arc::clone(self);
        tokio::task::spawn_blocking(move || {
            let _lock = if host_lock {
                Some(me.layout_lock()?)
            } else {
                None
            };
            let (out, touched) = f(&me);
            let read = match &touched {
                Touched::Nothing => Ok(0),
                Touched::Devices(changes) if !changes.is_empty() => me.refresh_devices(changes),
                Touched::Devices(_) | Touched::Host => me.refresh(),
            };
            if let Err(e) = read {
                crate::log!("gpuslice agent: cannot read the host after a write: {e}");
            }
            out
        })
        .await
        .map_err(|e| ApiError::new(ErrorKind::Other, format!("the write did not finish: {e}")))?
    }

    /// The node's one writer ([`gpu_node::Node`]) on the agent's host: every change the agent
    /// makes goes through it, under the host-wide lock it takes (waiting at most the
    /// configured lock timeout).
    pub(crate) fn node(&self) -> gpu_node::Node<'_> {
        fn waiting(lock: &std::path::Path) {
            crate::log!(
                "gpuslice agent: waiting for {} (another gpuslice writer)",
                lock.display()
            );
        }
        const WAITING: gpu_node::node::LockWaiting<'static> = &waiting;
        gpu_node::Node::new(self.host.as_ref(), &self.config.discover)
            .lock_timeout(Some(self.config.lock_timeout))
            .on_lock_wait(WAITING)
    }

    /// The host-wide write lock, held by a caller across steps of its own (reconcile, a DRA
    /// prepare), taken through the node's writer.
    pub(super) fn layout_lock(&self) -> Result<gpu_node::WriteLock, ApiError> {
        Ok(self.node().acquire()?)
    }

    pub(super) fn load(&self) -> Result<StateFile, ApiError> {
        self.store.load()
    }

    /// Records `device` as pending, runs `create`, then records what was made as created.
    ///
    /// The intent is durable before the host changes: when `pending` cannot be recorded the
    /// create is refused with nothing changed. A failed create takes its pending record back
    /// out (when even that fails, the error says the next start will try the create again). A
    /// `created` record that fails does not make the answer lie: the device exists, the answer
    /// says so with a warning (the second value), and the next start finishes the record. A
    /// recorded device of the same identity but another parent or type is refused before
    /// anything is written.
    pub(super) fn with_promise<T>(
        &self,
        device: Device,
        owner: Owner,
        profile: &str,
        create: impl FnOnce() -> Result<(T, Device), ApiError>,
    ) -> Result<(T, Option<String>), ApiError> {
        let _state = self.store.lock()?;
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
            self.store
                .save(&state)
                .map_err(|e| e.context(format!("{id}: nothing was created")))?;
        }
        match create() {
            Ok((made, actual)) => {
                if let Some(p) = state.promises.iter_mut().find(|p| p.device.id() == id) {
                    p.device = actual;
                    p.phase = Phase::Created;
                }
                let warning = self.store.save(&state).err().map(|e| {
                    crate::log!("gpuslice agent: {id} was created; {}", e.message);
                    format!(
                        "{id} was created, but its record could not be updated ({}); the next \
                         start of the agent finishes it",
                        e.message
                    )
                });
                Ok((made, warning))
            }
            Err(e) => {
                if existing.is_none() {
                    state.promises.retain(|p| p.device.id() != id);
                    if let Err(s) = self.store.save(&state) {
                        crate::log!("gpuslice agent: {id}: {}", s.message);
                        return Err(e.context(format!(
                            "{id}: nothing was created, but its pending record could not be \
                             taken back ({}); the next start of the agent tries this create again",
                            s.message
                        )));
                    }
                }
                Err(e)
            }
        }
    }

    /// Records the removal of `id` (when promised) as `removing`, runs `remove`, then forgets
    /// the promise. Returns what `remove` gave, a warning, and whether `id` was promised.
    ///
    /// The intent is durable before the host changes: when `removing` cannot be recorded (a
    /// full or read-only disk) the removal is refused with nothing changed. A failed removal
    /// puts the promise back as it was. When the promise cannot be forgotten after the device
    /// is gone, the answer says the removal happened (the warning) and the next start finishes
    /// the record; a restart never re-creates a device recorded as `removing`.
    pub(super) fn with_removal<T>(
        &self,
        id: &str,
        remove: impl FnOnce() -> Result<T, ApiError>,
    ) -> Result<(T, Option<String>, bool), ApiError> {
        let _state = self.store.lock()?;
        let mut state = self.load()?;
        let promised = state.promises.iter().position(|p| p.device.id() == id);
        let previous = promised.map(|i| state.promises[i].phase);
        if let Some(i) = promised {
            state.promises[i].phase = Phase::Removing;
            self.store.save(&state).map_err(|e| {
                e.context(format!(
                    "cannot record the removal of {id}; nothing was removed"
                ))
            })?;
        }
        match remove() {
            Ok(out) => {
                let mut warning = None;
                if promised.is_some() {
                    state.promises.retain(|p| p.device.id() != id);
                    if let Err(e) = self.store.save(&state) {
                        crate::log!("gpuslice agent: {id} was removed; {}", e.message);
                        warning = Some(format!(
                            "{id} was removed, but its promise could not be forgotten ({}); it \
                             is recorded as removing, and the next start of the agent finishes it \
                             (it is never re-created)",
                            e.message
                        ));
                    }
                }
                Ok((out, warning, promised.is_some()))
            }
            Err(e) => {
                if let (Some(i), Some(phase)) = (promised, previous) {
                    state.promises[i].phase = phase;
                    if let Err(s) = self.store.save(&state) {
                        crate::log!("gpuslice agent: {id}: {}", s.message);
                        return Err(e.context(format!(
                            "{id} was not removed, but its record stays `removing` ({}); the next \
                             start of the agent finds it still there and keeps its promise",
                            s.message
                        )));
                    }
                }
                Err(e)
            }
        }
    }
}

impl From<gpu_node::NodeError> for ApiError {
    /// A failure of the node's writer, classified as the step below it is; a layout that cannot
    /// be planned is the request's fault (400).
    fn from(e: gpu_node::NodeError) -> Self {
        match e.apply() {
            Some(a) => ApiError::from_apply(a),
            None => ApiError::from_error(&e),
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
