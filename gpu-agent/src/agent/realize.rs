//! `POST /v1/realize`: a placed Machine's devices made on this node in one call, as
//! `gpuslice realize --allocation FILE` makes them ([`gpu_node::Node::realize`]), after the
//! health rule of a bind ([`gpu_node::realize::check_health`]) on the served topology.

use std::sync::Arc;

use gpu_core::{Allocation, AllocationStatus};

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
        // Another node's allocation is refused by the realize itself, whatever the health here.
        let snap = self.snapshot();
        let mut warnings = match allocation.node == snap.topology.node {
            true => gpu_node::realize::check_health(&allocation, &snap.topology, force, FORCE)
                .map_err(|e| ApiError::from_error(&e))?,
            false => Vec::new(),
        };
        drop(snap);
        let me = Arc::clone(self);
        let asked = allocation.clone();
        let done = self
            .write(false, move |a| {
                (a.node().realize(&asked)).map_err(|e| ApiError::from_error(&e))
            })
            .await?;
        warnings.extend(done.warnings.iter().cloned());
        let realized = Allocation {
            status: AllocationStatus::Created,
            ..allocation
        };
        let mut value = serde_json::to_value(&done).unwrap_or_default();
        if let Some(o) = value.as_object_mut() {
            let rev = me.bus.publish(
                EventKind::MachineRealized,
                serde_json::json!({ "machine": realized.machine, "changed": done.changed }),
            );
            o.insert("revision".to_owned(), rev.into());
            o.insert(
                "allocation".to_owned(),
                serde_json::to_value(&realized).unwrap_or_default(),
            );
            if !warnings.is_empty() {
                o.insert("warnings".to_owned(), warnings.into());
            }
        }
        Ok(value)
    }
}
