//! `POST /v1/realize`: a placed Machine's devices made on this node in one call, as
//! `gpuslice realize --allocation FILE` makes them: [`gpu_node::Node::realize_graded`], the
//! health rule of a bind on the served topology, then the realize.

use std::sync::Arc;

use super::Agent;
use crate::error::ApiError;
use crate::events::EventKind;

/// How the request body is named in messages.
const BODY: &str = "(request body)";
/// How a client forces an Unhealthy GPU.
const FORCE: &str = "?force=true";

impl Agent {
    /// `POST /v1/realize[?machine=NAME][&force=true]`: the body is an allocation document (the
    /// JSON or YAML `gpuslice place` prints, one allocation or several, `machine` choosing one).
    /// A GPU the served topology grades Unhealthy is refused unless `force`; a Degraded one is
    /// used with a warning. The answer is what [`gpu_node::Node::realize`] answers (`changed`,
    /// `devices`, `handoff`, `warnings`), with the allocation as realized (`status: created`,
    /// what a scheduler records, as `gpu-sched`'s `mark_created` does) and the revision.
    ///
    /// # Errors
    /// An allocation that does not decode or is not for this node (400), an Unhealthy GPU
    /// (`unhealthy`, 409), the refusals of the realize (nothing changed) and its failed writes
    /// (undone).
    pub async fn realize(
        self: &Arc<Self>,
        body: &str,
        machine: Option<&str>,
        force: bool,
    ) -> Result<serde_json::Value, ApiError> {
        let allocation = gpu_node::handoff::one_allocation(body, machine, BODY.as_ref())
            .map_err(|e| ApiError::from_error(&e))?;
        let me = Arc::clone(self);
        let done = self
            .write(false, move |a| {
                let graded = &a.snapshot().topology;
                // With the agent's NVML: a MIG-backed vGPU's GPU instance is made on request.
                let nvml = a.config.mig.as_ref().map(|m| m.0.as_ref());
                let node = a.node().with_nvml(nvml);
                let done = node.realize_graded(&allocation, graded, force, FORCE);
                done.map_err(|e| ApiError::from_error(&e))
            })
            .await?;
        let mut value = serde_json::to_value(&done).unwrap_or_default();
        if let Some(o) = value.as_object_mut() {
            let rev = me.bus.publish(
                EventKind::MachineRealized,
                serde_json::json!({ "machine": done.done.machine, "changed": done.done.changed }),
            );
            o.insert("revision".to_owned(), rev.into());
        }
        Ok(value)
    }
}
