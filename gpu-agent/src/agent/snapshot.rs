//! The host as the agent last read it, rendered at most once per revision for the read routes.
//!
//! A snapshot's documents are rendered on their first read, not when the snapshot is made: a
//! write (a vGPU made for a kubelet's claim, a layout step) pays for reading the host again,
//! not for serializing and compressing documents that no reader may ask for before the next
//! write replaces them.

use std::sync::{Arc, OnceLock};

use gpu_core::NodeTopology;
use gpu_health::GpuHealthReport;
use gpu_sysfs::Host;
use serde::Serialize;

use super::AgentConfig;
use crate::doc::Rendered;
use crate::error::ApiError;

/// The host as the agent last read it, with the revision it reflects.
#[derive(Debug)]
pub struct Snapshot {
    /// The revision of the last change this snapshot includes.
    pub revision: u64,
    /// The topology.
    pub topology: NodeTopology,
    /// Each GPU's health report.
    pub health: Vec<GpuHealthReport>,
    topology_doc: OnceLock<Rendered>,
    health_doc: OnceLock<Rendered>,
}

impl Snapshot {
    /// `GET /v1/topology`'s body (JSON, gzip and entity tag), rendered on the first call.
    pub fn topology_doc(&self) -> &Rendered {
        self.topology_doc.get_or_init(|| {
            Rendered::new(with_revision(&self.topology, self.revision), self.revision)
        })
    }

    /// `GET /v1/health`'s body, rendered on the first call.
    pub fn health_doc(&self) -> &Rendered {
        self.health_doc.get_or_init(|| {
            let body = serde_json::json!({ "node": self.topology.node, "gpus": self.health });
            Rendered::new(with_revision(&body, self.revision), self.revision)
        })
    }
}

/// A narrow re-read for [`Agent::refresh_with`](super::Agent::refresh_with): the new topology
/// and health reports composed from the cached snapshot, or `None` to read the whole host.
pub type NarrowRead<'a> =
    dyn Fn(&dyn Host, &AgentConfig, &Snapshot) -> Option<(NodeTopology, Vec<GpuHealthReport>)> + 'a;

/// The one composition of a node's topology the agent serves: discovery with every GPU's health
/// graded (the same call as `gpuslice topology`).
///
/// # Errors
/// Discovery failing (a root without `sys/bus/pci/devices`).
pub fn compose_topology(
    host: &dyn Host,
    config: &AgentConfig,
) -> Result<(NodeTopology, Vec<GpuHealthReport>), ApiError> {
    let (mut topology, mut reports) =
        gpu_health::node_topology_with_reports(host, &config.discover, &config.health)
            .map_err(|e| ApiError::from_health(&e))?;
    // An NVSwitch fabric with what Fabric Manager answers (or why it cannot), its NVLink
    // faults graded into the GPUs' health.
    gpu_health::fabric::fabric_at(&config.fabric, host, &mut topology);
    gpu_health::fabric::carry_to_reports(&topology, &mut reports);
    Ok((topology, reports))
}

fn with_revision<T: Serialize>(value: &T, revision: u64) -> String {
    let mut v = serde_json::to_value(value).unwrap_or(serde_json::Value::Null);
    if let Some(o) = v.as_object_mut() {
        o.insert("revision".to_owned(), revision.into());
    }
    v.to_string()
}

pub(crate) fn rendered(
    revision: u64,
    topology: NodeTopology,
    health: Vec<GpuHealthReport>,
) -> Arc<Snapshot> {
    Arc::new(Snapshot {
        revision,
        topology,
        health,
        topology_doc: OnceLock::new(),
        health_doc: OnceLock::new(),
    })
}
