//! Keeping the agent's promises on each resync: what it made through the API and the host lost
//! since (a reload of the vGPU manager, a reboot, a removal by hand) is made again by the same
//! reconcile the start runs, with a `promises-restored` event naming it; a promise it cannot
//! keep is said once per change (`promises-not-kept`), not on every resync.

use std::sync::atomic::Ordering;

use gpu_sysfs::actuate;

use super::Agent;
use super::reconcile::Outcome;
use crate::events::EventKind;
use crate::state::{Device, Phase};

/// What the last resync said of the promises it could not keep, so that it is said once per
/// change. Held by the resync's loop.
#[derive(Debug, Default)]
pub struct KeptPromises {
    said: Vec<String>,
}

impl Agent {
    /// Checks every created promise against the host; when one is missing, reconciles (under the
    /// host lock, through the node's one writer, as at start) and says what it made again and
    /// what it could not. Quiet, and writes nothing, when every promise is in place. Blocking.
    pub fn keep_promises(&self, kept: &mut KeptPromises) {
        let Ok(state) = self.load() else {
            return;
        };
        let host = self.host.as_ref();
        let created = || state.promises.iter().filter(|p| p.phase == Phase::Created);
        // The host's mdevs are listed once, and only when a promise is one.
        let mdevs = created()
            .any(|p| matches!(p.device, Device::Mdev { .. }))
            .then(|| actuate::list_instances(host).ok())
            .flatten();
        let lost = created().any(|p| match &p.device {
            Device::Mdev { uuid, .. } => mdevs
                .as_ref()
                .is_some_and(|l| !l.iter().any(|i| i.uuid == *uuid)),
            Device::VendorVfio { vf, type_num } => {
                actuate::current_type(host, vf).is_ok_and(|t| t != *type_num)
            }
        });
        if !lost {
            if !kept.said.is_empty() {
                crate::log!("gpuslice agent: every promise is kept again");
                kept.said.clear();
            }
            return;
        }
        let report = match self.reconcile_blocking() {
            Ok(r) => r,
            Err(e) => {
                crate::log!("gpuslice agent: promises: {}", e.message);
                return;
            }
        };
        let made: Vec<String> = report
            .iter()
            .filter(|r| r.outcome == Outcome::Recreated)
            .map(|r| r.promise.device.id())
            .collect();
        if !made.is_empty() {
            self.stats()
                .promises_restored
                .fetch_add(1, Ordering::Relaxed);
            crate::log!(
                "gpuslice agent: promises restored: {} made again",
                made.join(", ")
            );
            self.events().publish(
                EventKind::PromisesRestored,
                serde_json::json!({ "restored": made }),
            );
        }
        let not_kept: Vec<String> = report
            .iter()
            .filter(|r| matches!(r.outcome, Outcome::Failed | Outcome::Conflict))
            .map(|r| {
                format!(
                    "{}: {}",
                    r.promise.device.id(),
                    r.message.as_deref().unwrap_or(r.outcome.as_str())
                )
            })
            .collect();
        if not_kept != kept.said && !not_kept.is_empty() {
            crate::log!("gpuslice agent: promises not kept: {}", not_kept.join("; "));
            self.events().publish(
                EventKind::PromisesNotKept,
                serde_json::json!({ "notKept": not_kept }),
            );
        }
        kept.said = not_kept;
    }
}
