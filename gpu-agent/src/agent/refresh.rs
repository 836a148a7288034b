//! Reading the host again: the new snapshot, and the events that say what changed in it.

use std::sync::atomic::Ordering;

use gpu_core::NodeTopology;
use gpu_sysfs::discover::Change;

use super::Agent;
use super::snapshot::{NarrowRead, compose_topology, rendered};
use crate::error::ApiError;
use crate::events::EventKind;

impl Agent {
    pub(super) fn store_snapshot(&self, revision: u64) -> Result<(), ApiError> {
        let (topology, health) = compose_topology(self.host.as_ref(), &self.config)?;
        *self
            .cache
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) =
            rendered(revision, topology, health);
        Ok(())
    }

    /// Reads the host again; when the topology or a GPU's health differs from the cached one,
    /// publishes `health-changed` per GPU (with the reasons, and the evacuation plan of the
    /// Machines on a GPU that turned Unhealthy) and `topology-changed`, and serves the new
    /// snapshot with that revision. Blocking. Returns the revision served. Refreshes run one at
    /// a time; the cached snapshot is served throughout.
    ///
    /// # Errors
    /// Discovery failing; the cached snapshot is kept.
    pub fn refresh(&self) -> Result<u64, ApiError> {
        self.refresh_with(&|_, _, _| None)
    }

    /// Refreshes the devices in `changes` only, when the narrow read can place them in the
    /// cached snapshot (health re-graded when a PCI function changed, carried over otherwise),
    /// else the whole host; an empty `changes` reads the whole host. The read a uevent asks
    /// for, and the one after a write that knows what it touched.
    ///
    /// # Errors
    /// Discovery failing; the cached snapshot is kept.
    pub fn refresh_devices(&self, changes: &[Change]) -> Result<u64, ApiError> {
        if changes.is_empty() {
            return self.refresh();
        }
        self.refresh_with(&|host, config, cached| {
            let mut topology =
                gpu_sysfs::discover::rediscover(host, &config.discover, &cached.topology, changes)?;
            let health = if changes.iter().any(|c| matches!(c, Change::Pci(_))) {
                gpu_health::grade_topology(host, &mut topology, &config.health)
            } else {
                cached.health.clone()
            };
            self.stats.narrow_rereads.fetch_add(1, Ordering::Relaxed);
            Some((topology, health))
        })
    }

    /// As [`Agent::refresh`], but `narrow` may compose the new topology from the cached
    /// snapshot by re-reading only what changed (a uevent's device); when it gives `None` the
    /// whole host is read.
    ///
    /// # Errors
    /// Discovery failing; the cached snapshot is kept.
    pub fn refresh_with(&self, narrow: &NarrowRead<'_>) -> Result<u64, ApiError> {
        let _one = self
            .refresh_gate
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let started = std::time::Instant::now();
        let before = self.snapshot();
        let composed = match narrow(self.host.as_ref(), &self.config, &before) {
            Some(done) => Ok(done),
            None => compose_topology(self.host.as_ref(), &self.config),
        };
        self.stats
            .record_resync(started.elapsed(), composed.is_ok());
        let (topology, health) = composed?;
        if before.topology == topology && before.health == health {
            return Ok(before.revision);
        }
        let mut evacuation: Option<gpu_sched::EvacuationPlan> = None;
        let mut events = Vec::new();
        for g in &topology.gpus {
            let old = before.topology.gpus.iter().find(|o| o.address == g.address);
            if old.is_none_or(|b| b.health != g.health) {
                let mut data = serde_json::json!({
                    "gpu": g.name,
                    "address": g.address,
                    "health": g.health,
                    "previous": old.map(|b| &b.health),
                    "reason": if g.health.reasons.is_empty() {
                        "every signal that could be read is fine".to_owned()
                    } else {
                        g.health.reasons.join("; ")
                    },
                });
                let turned_unhealthy = g.health.state == gpu_core::HealthState::Unhealthy
                    && old.is_none_or(|b| b.health.state != gpu_core::HealthState::Unhealthy);
                if turned_unhealthy {
                    let plan = evacuation.get_or_insert_with(|| self.evacuation_for(&topology));
                    let machines = evacuation_of(plan, &g.name);
                    if let Some(o) = data.as_object_mut() {
                        o.insert("evacuation".to_owned(), machines);
                    }
                }
                events.push((EventKind::HealthChanged, data));
            }
        }
        events.push((
            EventKind::TopologyChanged,
            serde_json::json!({ "node": topology.node }),
        ));
        // The snapshot is served before any subscriber hears of its revision.
        let rev = self.bus.publish_all(events, |rev| {
            let next = rendered(rev, topology, health);
            *self
                .cache
                .write()
                .unwrap_or_else(std::sync::PoisonError::into_inner) = next;
        });
        Ok(rev)
    }

    /// The evacuation plan (`gpuslice plan evacuate`) of the Machines the agent's promises
    /// record on this node, planned on `topology` alone: destinations are other GPUs of the node.
    pub fn evacuation_for(&self, topology: &NodeTopology) -> gpu_sched::EvacuationPlan {
        let promises = self.load().map(|s| s.promises).unwrap_or_default();
        let allocations = super::machines::allocations_of(topology, &promises);
        let fleet = gpu_core::Fleet {
            nodes: vec![topology.clone()],
            allocations,
            templates: Default::default(),
        };
        match gpu_sched::FleetState::new(fleet) {
            Ok(state) => state.plan_evacuation(),
            Err(e) => {
                crate::log!("gpuslice agent: cannot plan an evacuation: {e}");
                gpu_sched::EvacuationPlan::default()
            }
        }
    }
}

/// The Machines of `plan` with a device on the GPU named `gpu`.
fn evacuation_of(plan: &gpu_sched::EvacuationPlan, gpu: &str) -> serde_json::Value {
    let via = format!("{gpu} via ");
    let machines: Vec<&gpu_sched::Evacuation> = plan
        .machines
        .iter()
        .filter(|m| {
            m.affected
                .iter()
                .any(|d| d.device == gpu || d.device.starts_with(&via))
        })
        .collect();
    serde_json::json!({
        "scope": "node",
        "machines": machines,
    })
}
