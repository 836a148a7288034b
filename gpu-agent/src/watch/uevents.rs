//! Kernel uevents: each relevant one is published and, debounced, asks for a re-read of the
//! device it names.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use gpu_sysfs::discover::Change;

use super::{Requests, TICK, stopping};
use crate::agent::Agent;
use crate::events::EventKind;
use crate::uevent::{Reread, Uevent, UeventSource};

pub(super) fn uevent_loop(
    agent: &Arc<Agent>,
    source: &mut dyn UeventSource,
    requests: &Requests,
    debounce: Duration,
) {
    let mut due: Option<Instant> = None;
    let mut everything = false;
    let mut changes: Vec<Change> = Vec::new();
    while !stopping(agent) {
        let wait = due.map_or(TICK, |d| d.saturating_duration_since(Instant::now()));
        match source.next(wait.min(TICK)) {
            Ok(Some(msg)) => {
                agent.stats().uevents_seen.fetch_add(1, Ordering::Relaxed);
                match Uevent::parse(&msg) {
                    Ok(e) if e.is_relevant() => {
                        agent
                            .stats()
                            .uevents_relevant
                            .fetch_add(1, Ordering::Relaxed);
                        agent.events().publish(
                            EventKind::Uevent,
                            serde_json::json!({
                                "action": e.action,
                                "devpath": e.devpath,
                                "subsystem": e.subsystem(),
                                "driver": e.get("DRIVER"),
                                "address": e.pci_address(),
                                "mdev": e.get("MDEV_TYPE").map(|_| e.devpath.rsplit('/').next()),
                                "seqnum": e.get("SEQNUM").and_then(|s| s.parse::<u64>().ok()),
                            }),
                        );
                        match e.reread() {
                            Reread::Nothing => {}
                            Reread::Narrow(c) => changes.push(c),
                            Reread::Everything => everything = true,
                        }
                        due = Some(Instant::now() + debounce);
                    }
                    Ok(_) => {}
                    Err(_) => {
                        agent
                            .stats()
                            .uevents_malformed
                            .fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
            Ok(None) => {}
            Err(e) => {
                crate::log!("gpuslice agent: uevents: {e}; relying on the resync");
                return;
            }
        }
        if due.is_some_and(|d| Instant::now() >= d) {
            due = None;
            if everything {
                requests.request();
            } else if !changes.is_empty() {
                requests.request_narrow(changes.drain(..));
            }
            everything = false;
            changes.clear();
        }
    }
}
