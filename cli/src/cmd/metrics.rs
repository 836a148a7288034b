//! `gpuslice metrics`: Prometheus metrics of this host or a fleet, printed or served at /metrics.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context;

use crate::common::Global;

use gpu_integrations::metrics;

// Arguments of `gpuslice metrics`.
#[derive(clap::Args, Debug)]
pub struct MetricsArgs {
    /// A fleet file (JSON or YAML `Fleet`) to report instead of this host; read again on every
    /// scrape.
    #[arg(long, value_name = "FLEET")]
    pub inventory: Option<PathBuf>,
    /// Serve the metrics at http://ADDR/metrics instead of printing them (`0.0.0.0:9835`).
    #[arg(long, value_name = "ADDR")]
    pub listen: Option<String>,
    /// With --listen: exit after answering this many requests.
    #[arg(long, value_name = "N", requires = "listen")]
    pub max_requests: Option<u64>,
}

/// The metrics of this host (or of `--inventory`), rendered afresh.
fn render(g: &Global, inventory: Option<&std::path::Path>) -> anyhow::Result<String> {
    Ok(crate::common::front(g).metrics(inventory)?)
}

/// Checks what can be checked before the first render: a node name that cannot be valid is
/// refused before any output, as `topology` does.
fn check(g: &Global, a: &MetricsArgs) -> anyhow::Result<()> {
    if a.inventory.is_none() {
        gpu_core::validate_name(&g.node_name()).context("--node")?;
    }
    Ok(())
}

/// Runs `gpuslice metrics` without `--listen`: prints them once.
pub fn run(g: &Global, a: &MetricsArgs) -> anyhow::Result<ExitCode> {
    check(g, a)?;
    print!("{}", render(g, a.inventory.as_deref())?);
    Ok(ExitCode::SUCCESS)
}

/// Runs `gpuslice metrics --listen` (in the `gpuslice-agent` binary: the agent's server).
pub fn serve(g: &Global, a: MetricsArgs) -> anyhow::Result<ExitCode> {
    let Some(addr) = &a.listen else {
        return run(g, &a);
    };
    check(g, &a)?;
    let (g2, inventory) = (g.clone(), a.inventory.clone());
    // Each scrape reads afresh; a failure is the scrape's 500, with the chain as its message.
    let render = move || render(&g2, inventory.as_deref()).map_err(gpu_agent::RenderError::new);
    let content_type = metrics::CONTENT_TYPE.to_owned();
    gpu_agent::http::serve_metrics(addr, Arc::new(render), content_type, a.max_requests, |at| {
        let at = at.trim_start_matches("tcp:");
        eprintln!("gpuslice: serving metrics at http://{at}/metrics");
    })?;
    Ok(ExitCode::SUCCESS)
}
