//! Stall detection: which host reads are in flight and since when, and the GPU a read that
//! does not answer belongs to, served as Unknown meanwhile.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use gpu_core::PciAddress;
use gpu_sysfs::observed::{HostOp, Observed, Observer};

use super::Agent;
use super::snapshot::rendered;
use crate::events::EventKind;

/// Which reads are in flight and since when, so the watchdog can name a file that does not
/// answer (a hung driver attribute, a FIFO) while the rest is served. Writes are not tracked: a
/// write is actuation (enabling VFs may take seconds), not a read.
#[derive(Debug, Default)]
pub struct InFlightReads {
    next: AtomicU64,
    in_flight: Mutex<HashMap<u64, InFlight>>,
}

/// A [`Host`](gpu_sysfs::Host) whose reads and listings the agent tracks ([`InFlightReads`]);
/// every other call goes straight to the wrapped host.
pub type TrackedHost = Observed<InFlightReads>;

#[derive(Debug)]
struct InFlight {
    path: String,
    since: Instant,
    reported: bool,
}

/// An in-flight read, removed when the read returns.
pub struct Guard<'a> {
    reads: &'a InFlightReads,
    id: u64,
}

impl Drop for Guard<'_> {
    fn drop(&mut self) {
        self.reads.map().remove(&self.id);
    }
}

impl Observer for InFlightReads {
    type Guard<'a> = Guard<'a>;

    fn before<'a>(&'a self, _op: HostOp, path: &str) -> Guard<'a> {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        self.map().insert(
            id,
            InFlight {
                path: path.to_owned(),
                since: Instant::now(),
                reported: false,
            },
        );
        Guard { reads: self, id }
    }
}

impl InFlightReads {
    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<u64, InFlight>> {
        self.in_flight
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The reads in flight for longer than `deadline` and not returned before: each path with
    /// how long it has waited, each once.
    pub fn overdue(&self, deadline: Duration) -> Vec<(String, Duration)> {
        let mut out = Vec::new();
        for f in self.map().values_mut() {
            let waited = f.since.elapsed();
            if !f.reported && waited >= deadline {
                f.reported = true;
                out.push((f.path.clone(), waited));
            }
        }
        out
    }
}

impl Agent {
    /// The reads in flight longer than `deadline`, not reported before (each once).
    pub(crate) fn tracked(&self) -> &TrackedHost {
        &self.tracked
    }

    /// Marks the GPU a stalled read belongs to Unknown in the served snapshot (the rest of the
    /// host is served as last read), and publishes that.
    pub(crate) fn mark_stalled(&self, path: &str, waited: Duration) {
        let addr = path.split('/').find_map(|c| c.parse::<PciAddress>().ok());
        let reason = format!(
            "sysfs file {path} did not answer within {} ms",
            waited.as_millis()
        );
        self.stats.read_timed_out();
        let served = self.snapshot();
        let mut topology = served.topology.clone();
        let gpu = addr.and_then(|a| {
            topology.gpus.iter_mut().find(|g| {
                g.address == a
                    || g.functions.iter().any(|f| f.address == a)
                    || g.sriov.as_ref().is_some_and(|s| s.vfs.contains(&a))
            })
        });
        let mut data = serde_json::json!({
            "path": path,
            "address": addr,
            "waitedMs": u64::try_from(waited.as_millis()).unwrap_or(u64::MAX),
        });
        let Some(g) = gpu else {
            self.bus.publish(EventKind::ReadTimedOut, data);
            return;
        };
        let previous = g.health.clone();
        g.health = gpu_core::Health {
            state: gpu_core::HealthState::Unknown,
            reasons: vec![reason.clone()],
        };
        let (name, address, health) = (g.name.clone(), g.address, g.health.clone());
        if let Some(o) = data.as_object_mut() {
            o.insert("gpu".to_owned(), name.clone().into());
        }
        let changed = serde_json::json!({
            "gpu": name,
            "address": address,
            "health": health,
            "previous": previous,
            "reason": reason,
        });
        let reports = served.health.clone();
        self.bus.publish_all(
            vec![
                (EventKind::ReadTimedOut, data),
                (EventKind::HealthChanged, changed),
            ],
            |rev| {
                let next = rendered(rev, topology, reports);
                *self
                    .cache
                    .write()
                    .unwrap_or_else(std::sync::PoisonError::into_inner) = next;
            },
        );
    }
}
