//! `PUT /v1/layout` and the watched layout file: a layout document applied by the one writer.

use std::sync::Arc;

use gpu_node::LayoutWrite;

use super::Agent;
use super::request::no_path;
use crate::error::{ApiError, chain};
use crate::events::EventKind;

impl Agent {
    /// `PUT /v1/layout`: applies a layout document (`gpuslice vgpu apply`'s file).
    ///
    /// # Errors
    /// A malformed layout or unknown config (nothing written), a failed apply (rolled back).
    pub async fn apply_layout(
        self: &Arc<Self>,
        text: String,
        config: Option<String>,
        dry_run: bool,
        force: bool,
    ) -> Result<serde_json::Value, ApiError> {
        self.apply_layout_from(text, config, dry_run, force, None)
            .await
    }

    /// [`Agent::apply_layout`] of a document read from `source` (the watched layout file),
    /// named in the `layout-applied` event.
    ///
    /// # Errors
    /// As [`Agent::apply_layout`].
    pub async fn apply_layout_from(
        self: &Arc<Self>,
        text: String,
        config: Option<String>,
        dry_run: bool,
        force: bool,
        source: Option<String>,
    ) -> Result<serde_json::Value, ApiError> {
        if let Some(c) = &config {
            no_path("config", c)?;
        }
        // The cap every document the agent reads honours (GPUSLICE_MAX_DOCUMENT_MIB).
        let limit = gpu_sysfs::DocumentLimit::from_env().unwrap_or_default();
        let file = gpu_core::layout::LayoutFile::parse_max(&text, limit.bytes())
            .map_err(|e| ApiError::new(e.kind(), chain(&e)).with_status(400))?;
        file.select(config.as_deref())
            .map_err(|e| ApiError::new(e.kind(), chain(&e)).with_status(400))?;
        let me = Arc::clone(self);
        // The node's writer takes the host's lock itself (not for a dry run).
        let report = self
            .write(false, move |a| {
                let cfg = file
                    .select(config.as_deref())
                    .map_err(|e| ApiError::new(e.kind(), chain(&e)).with_status(400))?;
                let how = LayoutWrite {
                    dry_run,
                    force,
                    ..LayoutWrite::default()
                };
                Ok(a.node().apply_layout(cfg, &how, &mut |_| {})?)
            })
            .await?;
        let mut value = serde_json::to_value(&report).unwrap_or_default();
        if !dry_run {
            let left_alone: Vec<_> = report.plan.refused().collect();
            let rev = me.bus.publish(
                EventKind::LayoutApplied,
                serde_json::json!({
                    "status": report.status,
                    "source": source,
                    "config": report.plan.config,
                    "changes": report.changes.len(),
                    "failure": report.failure,
                    "leftAlone": left_alone,
                }),
            );
            if let Some(o) = value.as_object_mut() {
                o.insert("revision".to_owned(), rev.into());
            }
        }
        Ok(value)
    }
}
