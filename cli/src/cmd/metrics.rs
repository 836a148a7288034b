//! `gpuslice metrics`: Prometheus metrics of this host or a fleet, printed or served at /metrics.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use gpu_core::{Allocation, Fleet, NodeTopology};

use crate::common::Global;
use crate::serve;
use gpu_integrations::metrics;

/// Arguments of `gpuslice metrics`.
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

/// The nodes and allocations to report: a fleet file, or this host (discovered with health).
///
/// # Errors
/// When the fleet file cannot be read or parsed, or the host cannot be discovered.
pub fn load_nodes(
    g: &Global,
    inventory: Option<&Path>,
) -> anyhow::Result<(Vec<NodeTopology>, Vec<Allocation>)> {
    if let Some(path) = inventory {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read fleet file {}", path.display()))?;
        let fleet = Fleet::from_text(&text)
            .map_err(gpu_core::ConfigDocError)
            .with_context(|| format!("fleet file {}", path.display()))?;
        return Ok((fleet.nodes, fleet.allocations));
    }
    Ok((vec![local_topology(g)?], vec![]))
}

/// This host's topology with health graded, from `--root` (a directory or a `*.umockdev`
/// recording).
///
/// # Errors
/// When the root cannot be opened or discovered.
pub fn local_topology(g: &Global) -> anyhow::Result<NodeTopology> {
    let req = gpu_health::NodeRequest::new(g.node_name());
    Ok(crate::common::open_node(g, &req)?.topology)
}

/// Runs `gpuslice metrics`.
///
/// # Errors
/// When the inventory cannot be read or the address cannot be bound.
pub fn run(g: &Global, a: MetricsArgs) -> anyhow::Result<ExitCode> {
    let mut render = || -> Result<String, String> {
        let (nodes, allocations) =
            load_nodes(g, a.inventory.as_deref()).map_err(|e| crate::common::render_error(&e))?;
        metrics::render(&nodes, &allocations).map_err(|e| e.to_string())
    };
    let Some(addr) = &a.listen else {
        let text = render().map_err(anyhow::Error::msg)?;
        print!("{text}");
        return Ok(ExitCode::SUCCESS);
    };
    let listener = TcpListener::bind(addr).with_context(|| format!("cannot listen on {addr}"))?;
    let bound = listener.local_addr()?;
    eprintln!("gpuslice: serving metrics at http://{bound}/metrics");
    serve::serve(
        &listener,
        metrics::CONTENT_TYPE,
        &mut render,
        a.max_requests,
    )?;
    Ok(ExitCode::SUCCESS)
}
