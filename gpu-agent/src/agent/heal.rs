//! Keeping the watched layout in place: on each resync the layout last applied is planned
//! against the host again. What the host lost (a reload of the vGPU manager drops every vGPU,
//! a reboot resets every VF's type, someone cleared it by hand) is made again through the
//! node's one writer when making it removes nothing; what cannot be made again (a GPU holds
//! vGPUs the layout does not name, one of them in use, a write refused) is reported with why.

use std::sync::Arc;

use gpu_core::layout::{GpuLayoutPlan, Plan, Step};
use gpu_node::LayoutWrite;
use gpu_sysfs::apply::ApplyStatus;

use super::Agent;
use super::writes::Touched;
use crate::error::{ApiError, chain};

/// What a resync found of the watched layout.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LayoutHealth {
    /// The host holds what the layout wants; nothing was written.
    InPlace,
    /// The host had lost part of the layout and it was made again: what was missing, one line
    /// per GPU and type (`nvidia0 (0000:08:00.0): A2-4Q 0 of 4`).
    Restored {
        /// What was missing.
        missing: Vec<String>,
        /// How many changes the apply made.
        changes: usize,
    },
    /// The host does not hold the layout and the resync did not change it.
    NotInPlace {
        /// What is missing or different, one line per GPU and type.
        missing: Vec<String>,
        /// Why it was not made again.
        reason: String,
    },
}

impl Agent {
    /// Plans the layout `text` (config `config`) against the host and makes again what the
    /// host lost, as the one writer. Only a plan that creates (or enables SR-IOV) is written;
    /// one that would remove anything is reported as [`LayoutHealth::NotInPlace`].
    ///
    /// # Errors
    /// A layout that no longer parses or selects (400); the host's lock or a read failing.
    pub async fn heal_layout(
        self: &Arc<Self>,
        text: String,
        config: Option<String>,
    ) -> Result<LayoutHealth, ApiError> {
        let limit = gpu_sysfs::DocumentLimit::from_env().unwrap_or_default();
        let file = gpu_core::layout::LayoutFile::parse_max(&text, limit.bytes())
            .map_err(|e| ApiError::new(e.kind(), chain(&e)).with_status(400))?;
        self.write_touching(false, move |a| {
            let out = heal_with(a, &file, config.as_deref());
            let touched = match &out {
                Ok(LayoutHealth::InPlace | LayoutHealth::NotInPlace { .. }) | Err(_) => {
                    Touched::Nothing
                }
                Ok(LayoutHealth::Restored { .. }) => Touched::Host,
            };
            (out, touched)
        })
        .await
    }
}

fn heal_with(
    agent: &Agent,
    file: &gpu_core::layout::LayoutFile,
    config: Option<&str>,
) -> Result<LayoutHealth, ApiError> {
    let cfg = file
        .select(config)
        .map_err(|e| ApiError::new(e.kind(), chain(&e)).with_status(400))?;
    let node = agent.node();
    let look = LayoutWrite {
        dry_run: true,
        ..LayoutWrite::default()
    };
    let planned = node.apply_layout(cfg, &look, &mut |_| {})?.plan;
    let missing = missing(&planned);
    if planned.is_noop() && planned.refused().next().is_none() {
        return Ok(LayoutHealth::InPlace);
    }
    if let Some(reason) = why_not(&planned) {
        return Ok(LayoutHealth::NotInPlace { missing, reason });
    }
    let how = LayoutWrite::default();
    let report = match node.apply_layout(cfg, &how, &mut |_| {}) {
        Ok(r) => r,
        Err(e) => {
            return Ok(LayoutHealth::NotInPlace {
                missing,
                reason: chain(&e),
            });
        }
    };
    match report.status {
        ApplyStatus::Applied | ApplyStatus::Unchanged => Ok(LayoutHealth::Restored {
            missing,
            changes: report.changes.len(),
        }),
        status => Ok(LayoutHealth::NotInPlace {
            missing,
            reason: report.failure.unwrap_or_else(|| {
                format!(
                    "the apply ended {}",
                    serde_json::json!(status).as_str().unwrap_or("?")
                )
            }),
        }),
    }
}

/// What the host lacks or holds beyond the layout, per GPU and type.
fn missing(plan: &Plan) -> Vec<String> {
    let mut out = Vec::new();
    for g in plan.gpus.iter().filter(|g| !g.is_applied()) {
        if g.enable_sriov {
            out.push(format!("{}: SR-IOV off", g.label()));
        }
        for t in g.types.iter().filter(|t| t.have != t.want) {
            out.push(format!(
                "{}: {} {} of {}",
                g.label(),
                t.name,
                t.have,
                t.want
            ));
        }
    }
    out
}

/// Why a resync leaves the host as it is: a GPU left unchanged (an instance in use), or a
/// plan that removes something (a resync only makes again what was lost; removing is for an
/// edit of the layout or `vgpu apply`).
fn why_not(plan: &Plan) -> Option<String> {
    let mut reasons: Vec<String> = plan
        .refused()
        .map(|g: &GpuLayoutPlan| format!("{}: {}", g.label(), g.refused.as_deref().unwrap_or("")))
        .collect();
    for g in &plan.gpus {
        let removed: Vec<String> = plan
            .steps
            .iter()
            .filter_map(|s| match s {
                Step::Remove { gpu, instance } if *gpu == g.gpu => {
                    Some(format!("{} ({})", instance.label(), instance.type_label()))
                }
                _ => None,
            })
            .collect();
        if !removed.is_empty() {
            reasons.push(format!(
                "{} holds vGPUs the layout does not name ({}); a resync does not remove them \
                 (edit the layout or run `gpuslice vgpu apply`)",
                g.label(),
                removed.join(", ")
            ));
        }
    }
    (!reasons.is_empty()).then(|| reasons.join("; "))
}
