//! `GET /metrics`: gpuslice's node metrics of the served topology (`gpu_integrations::metrics`,
//! the same as `gpuslice metrics`), or an embedder's renderer, followed by the agent's own figures.

use super::Agent;
use crate::error::ApiError;

/// The content type of a renderer's text when it names none.
const TEXT_0_0_4: &str = "text/plain; version=0.0.4; charset=utf-8";

impl Agent {
    /// The metrics text and its content type; `None` when this agent serves no metrics.
    ///
    /// # Errors
    /// The renderer failing (`other`).
    pub fn metrics_text(&self) -> Option<Result<(String, String), ApiError>> {
        let snap = self.snapshot();
        let (body, content_type) = if let Some(hook) = &self.config.hooks.metrics {
            let ct = self
                .config
                .hooks
                .metrics_content_type
                .clone()
                .unwrap_or_else(|| TEXT_0_0_4.to_owned());
            (hook(&snap.topology), ct)
        } else if self.config.metrics {
            (
                gpu_integrations::metrics::render(std::slice::from_ref(&snap.topology), &[])
                    .map_err(crate::error::RenderError::new),
                gpu_integrations::metrics::CONTENT_TYPE.to_owned(),
            )
        } else {
            return None;
        };
        Some(
            body.map(|mut text| {
                text.push_str(&self.stats.render(self.bus.revision(), self.bus.sent()));
                (text, content_type)
            })
            .map_err(|e| ApiError::from_render(&e)),
        )
    }
}
