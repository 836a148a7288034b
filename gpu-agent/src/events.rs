//! Revisions and the change stream behind `GET /v1/events`.
//!
//! Every change the agent learns of gets the next revision (starting at 1) and is kept in a
//! bounded ring, so a client that reconnects with `?since=N` gets what it missed. A client too
//! far behind (its revision fell out of the ring) gets one `resync` event telling it to read the
//! topology again. Any source may publish: the agent's own writes today, and the kernel's uevents,
//! health watchers and a watched layout file (issue 18) through the same [`EventBus::publish`].

use std::collections::VecDeque;
use std::sync::Mutex;

use serde::Serialize;
use tokio::sync::broadcast;

/// How many events a reconnecting client can catch up on.
pub const RING: usize = 1024;

/// What changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum EventKind {
    /// The topology document changed (a new one is served with this revision).
    TopologyChanged,
    /// A GPU's health verdict changed.
    HealthChanged,
    /// The agent created a vGPU.
    VgpuCreated,
    /// The agent removed a vGPU.
    VgpuRemoved,
    /// A GPU was bound to vfio-pci.
    GpuBound,
    /// A GPU was returned to its host driver.
    GpuReleased,
    /// A layout was applied.
    LayoutApplied,
    /// A placed Machine's devices were realized (`POST /v1/realize`): `machine`, `changed`.
    MachineRealized,
    /// The agent reconciled its recorded promises on start.
    Reconciled,
    /// The kernel announced a device change (a uevent: add, remove, bind, unbind, change).
    Uevent,
    /// A sysfs file did not answer within the read deadline; its GPU is served as Unknown.
    ReadTimedOut,
    /// A watched layout file could not be read or parsed; nothing was changed.
    LayoutRefused,
    /// A resync found the host had lost part of the watched layout (a driver reload, a
    /// reboot, a clear by hand) and made it again: what was missing.
    LayoutRestored,
    /// A resync found the host does not hold the watched layout and left it so (an instance
    /// in use, vGPUs the layout does not name, a refused write): what and why, once per change.
    LayoutNotInPlace,
    /// A resync found the host had lost devices the agent promised through its API (a driver
    /// reload, a reboot, a removal by hand) and made them again: `restored`, their IDs.
    PromisesRestored,
    /// A resync found promised devices missing that it could not make again: `notKept`, each
    /// with why; said once per change.
    PromisesNotKept,
    /// The client missed events that are no longer kept: read the topology again.
    Resync,
}

/// One change, as sent on the stream (one JSON object per line, or one SSE `data:`).
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Event {
    /// Its revision: strictly increasing over the agent's life.
    pub revision: u64,
    /// What changed.
    pub kind: EventKind,
    /// The details (the instance, the GPU, the report), depending on the kind.
    pub data: serde_json::Value,
}

#[derive(Debug)]
struct Ring {
    last: u64,
    events: VecDeque<Event>,
}

/// The revision counter, the ring of recent events and the live fan-out.
#[derive(Debug)]
pub struct EventBus {
    ring: Mutex<Ring>,
    sent: std::sync::atomic::AtomicU64,
    live: broadcast::Sender<Event>,
}

impl Default for EventBus {
    fn default() -> Self {
        Self::new()
    }
}

impl EventBus {
    /// A bus at revision 0.
    pub fn new() -> Self {
        let (live, _) = broadcast::channel(RING);
        EventBus {
            ring: Mutex::new(Ring {
                last: 0,
                events: VecDeque::with_capacity(RING),
            }),
            live,
            sent: std::sync::atomic::AtomicU64::new(0),
        }
    }

    /// How many events were delivered to live subscribers, counted once per subscriber.
    pub fn sent(&self) -> u64 {
        self.sent.load(std::sync::atomic::Ordering::Relaxed)
    }

    fn ring(&self) -> std::sync::MutexGuard<'_, Ring> {
        // A poisoned ring still holds whole events (pushes are single statements).
        self.ring
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The latest revision (0 before any change).
    pub fn revision(&self) -> u64 {
        self.ring().last
    }

    /// Gives the change the next revision, keeps it and sends it to every subscriber.
    pub fn publish(&self, kind: EventKind, data: serde_json::Value) -> u64 {
        let mut ring = self.ring();
        ring.last += 1;
        let event = Event {
            revision: ring.last,
            kind,
            data,
        };
        if ring.events.len() == RING {
            ring.events.pop_front();
        }
        ring.events.push_back(event.clone());
        // Sent under the ring's lock, so subscribers see revisions in order.
        if let Ok(n) = self.live.send(event) {
            self.sent.fetch_add(
                u64::try_from(n).unwrap_or(0),
                std::sync::atomic::Ordering::Relaxed,
            );
        }
        ring.last
    }

    /// Publishes `events` with consecutive revisions and, before any subscriber is sent one,
    /// runs `commit` with the last revision (the agent serves the snapshot of that revision
    /// there), so a client that reads the topology on an event never gets an older one.
    /// Returns the last revision (the current one when `events` is empty).
    pub fn publish_all(
        &self,
        events: Vec<(EventKind, serde_json::Value)>,
        commit: impl FnOnce(u64),
    ) -> u64 {
        let mut ring = self.ring();
        let mut out = Vec::with_capacity(events.len());
        for (kind, data) in events {
            ring.last += 1;
            let event = Event {
                revision: ring.last,
                kind,
                data,
            };
            if ring.events.len() == RING {
                ring.events.pop_front();
            }
            ring.events.push_back(event.clone());
            out.push(event);
        }
        commit(ring.last);
        for event in out {
            if let Ok(n) = self.live.send(event) {
                self.sent.fetch_add(
                    u64::try_from(n).unwrap_or(0),
                    std::sync::atomic::Ordering::Relaxed,
                );
            }
        }
        ring.last
    }

    /// The events after `since` still kept, and a receiver for the ones that follow: taken
    /// together under the lock, so nothing is missed or sent twice. When events after `since`
    /// were already dropped, the backlog starts with a `resync` event.
    pub fn subscribe(&self, since: u64) -> (Vec<Event>, broadcast::Receiver<Event>) {
        let ring = self.ring();
        let rx = self.live.subscribe();
        let oldest = ring.events.front().map_or(ring.last + 1, |e| e.revision);
        let mut backlog = Vec::new();
        if since + 1 < oldest && since < ring.last {
            backlog.push(Event {
                revision: ring.last,
                kind: EventKind::Resync,
                data: serde_json::json!({ "since": since, "oldestKept": oldest }),
            });
        } else {
            backlog.extend(ring.events.iter().filter(|e| e.revision > since).cloned());
        }
        (backlog, rx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn revisions_increase_and_a_client_gets_what_it_missed() {
        let bus = EventBus::new();
        assert_eq!(bus.revision(), 0);
        let a = bus.publish(EventKind::VgpuCreated, serde_json::json!({}));
        let b = bus.publish(EventKind::TopologyChanged, serde_json::json!({}));
        assert!(b > a);
        let (backlog, _) = bus.subscribe(a);
        let revs: Vec<u64> = backlog.iter().map(|e| e.revision).collect();
        assert_eq!(revs, vec![b]);
    }

    #[test]
    fn a_batch_is_committed_before_any_subscriber_hears_of_it() {
        let bus = EventBus::new();
        let (_, mut rx) = bus.subscribe(0);
        let committed = std::sync::atomic::AtomicU64::new(0);
        let last = bus.publish_all(
            vec![
                (EventKind::HealthChanged, serde_json::json!({})),
                (EventKind::TopologyChanged, serde_json::json!({})),
            ],
            |rev| {
                assert!(rx.try_recv().is_err(), "nothing sent before the commit");
                committed.store(rev, std::sync::atomic::Ordering::SeqCst);
            },
        );
        assert_eq!(last, 2);
        assert_eq!(committed.load(std::sync::atomic::Ordering::SeqCst), 2);
        let revs: Vec<u64> = std::iter::from_fn(|| rx.try_recv().ok())
            .map(|e| e.revision)
            .collect();
        assert_eq!(revs, vec![1, 2]);
    }

    #[test]
    fn a_client_too_far_behind_is_told_to_resync() {
        let bus = EventBus::new();
        for _ in 0..RING + 5 {
            bus.publish(EventKind::TopologyChanged, serde_json::json!({}));
        }
        let (backlog, _) = bus.subscribe(1);
        assert_eq!(backlog.len(), 1);
        assert_eq!(backlog[0].kind, EventKind::Resync);
        let (current, _) = bus.subscribe(bus.revision());
        assert!(current.is_empty());
    }
}
