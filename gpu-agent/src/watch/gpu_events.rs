//! GPU events as they happen (NVML critical XIDs, double-bit ECC errors): each is graded by the
//! health policy's `xid` rules; a verdict is recorded in the health options' event verdicts and
//! the host is read again, so the GPU's new health is published (`health-changed`, with the
//! evacuation plan of the Machines on it when it turned Unhealthy) and stays in every later read.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use gpu_health::GpuEventSource;

use crate::agent::Agent;

/// How long one wait on the source lasts before the loop looks at the shutdown signal.
const WAIT: Duration = Duration::from_millis(200);

/// Reads `source` until the agent shuts down or the source ends; `refresh` asks for a read of
/// the whole host.
pub(super) fn run(agent: &Arc<Agent>, source: &mut dyn GpuEventSource, refresh: &dyn Fn()) {
    let Some(verdicts) = agent.config().health.events.clone() else {
        crate::log!(
            "gpuslice agent: GPU events ignored: the health options keep no event verdicts"
        );
        return;
    };
    while !*agent.shutdown_signal().borrow() {
        let event = match source.next(WAIT) {
            Ok(Some(e)) => e,
            Ok(None) => continue,
            Err(e) => {
                crate::log!("gpuslice agent: GPU events: {e}; relying on the resync");
                return;
            }
        };
        agent.stats().gpu_events.fetch_add(1, Ordering::Relaxed);
        match agent.config().health.policy.xid.grade(&event) {
            Some((state, reason)) => {
                crate::log!(
                    "gpuslice agent: {}: {reason}: {}",
                    event.address,
                    state.as_str()
                );
                verdicts.record(event.address, state, reason);
                refresh();
            }
            None => crate::log!(
                "gpuslice agent: {}: NVML reported {}; the policy gives it no verdict",
                event.address,
                event.describe()
            ),
        }
    }
}
