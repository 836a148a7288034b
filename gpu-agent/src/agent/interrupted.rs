//! A write of an earlier process that did not finish (its intent record left `started` in
//! `var/lib/gpuslice/node/intent.json`): found at start, undone where it is safe
//! ([`gpu_node::Node::recover`]), logged, and shown on `/healthz` as `interruptedWrite`.

use gpu_node::recover::Recovery;
use gpu_sysfs::Host;

use super::{Agent, AgentConfig};

impl Agent {
    /// Recovers the node's interrupted write, if any, and says what was done, before the host
    /// is first read. A recovery that cannot run (the lock, an unreadable record) is logged and
    /// the agent starts anyway.
    pub(super) fn recover_interrupted(host: &dyn Host, config: &AgentConfig) -> Option<Recovery> {
        let node = gpu_node::Node::new(host, &config.discover);
        let node = node.lock_timeout(Some(config.lock_timeout));
        // A fabric partition the write activated is deactivated through Fabric Manager.
        let on = gpu_node::fabric::FabricNode {
            node,
            source: config.fabric.clone(),
        };
        Self::restore_fabric(&on);
        let found = match gpu_node::fabric::recover(on) {
            Ok(found) => found?,
            Err(e) => {
                crate::log!(
                    "gpuslice agent: cannot check the node's intent record: {}",
                    gpu_core::error_chain(&e)
                );
                return None;
            }
        };
        crate::log!("gpuslice agent: warning: {}", found.message);
        for r in &found.rolled_back {
            crate::log!("gpuslice agent: undone: {r}");
        }
        for k in &found.kept {
            crate::log!("gpuslice agent: kept: {k}");
        }
        Some(found)
    }

    /// After a Fabric Manager restart, FM is told which partitions gpuslice activated
    /// ([`gpu_node::fabric::restore_activated`]); what cannot be told is logged.
    fn restore_fabric(on: &gpu_node::fabric::FabricNode<'_>) {
        match gpu_node::fabric::restore_activated(on.clone()) {
            Ok(Some(ids)) => crate::log!(
                "gpuslice agent: told Fabric Manager the partitions gpuslice activated: {ids:?}"
            ),
            Ok(None) => {}
            Err(e) => crate::log!(
                "gpuslice agent: cannot give Fabric Manager its active partitions: {}",
                gpu_core::error_chain(&e)
            ),
        }
    }

    /// The interrupted write found at start, and what was done about it.
    pub fn interrupted(&self) -> Option<&Recovery> {
        self.interrupted.as_ref()
    }
}
