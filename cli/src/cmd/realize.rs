//! `gpuslice realize`: a placed Machine's devices made on this node in one call, as the agent's
//! `POST /v1/realize` makes them ([`gpu_node::Node::realize_graded`]), answered with the
//! hand-off and the allocation as realized.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;

use crate::cmd::handoff::read_allocation;
use crate::common::Global;

// `gpuslice realize` arguments.
#[derive(Args, Debug)]
#[command(group(clap::ArgGroup::new("from").required(true).args(["inventory", "allocation"])))]
pub struct RealizeArgs {
    /// The fleet file holding the allocation (`gpuslice place --save` records it there).
    #[arg(long, value_name = "FLEET")]
    pub inventory: Option<PathBuf>,
    /// A file holding the allocation instead (the JSON/YAML `place` prints).
    #[arg(long, value_name = "FILE", conflicts_with = "inventory")]
    pub allocation: Option<PathBuf>,
    /// The Machine whose devices to make (may be left out when the file holds one allocation).
    #[arg(long, value_name = "NAME")]
    pub machine: Option<String>,
    /// Use a GPU graded Unhealthy (a VM would get a failing device), with a warning.
    #[arg(long)]
    pub force: bool,
}

/// Runs `gpuslice realize`.
pub fn run(g: &Global, a: &RealizeArgs) -> anyhow::Result<ExitCode> {
    let path = a.inventory.as_ref().or(a.allocation.as_ref());
    let Some(path) = path else {
        anyhow::bail!("name the allocation with --inventory FLEET or --allocation FILE");
    };
    let allocation = read_allocation(g, path, a.machine.as_deref())?;
    let opened = super::gpu::open_host(g, true)?;
    let graded = crate::common::local_topology(g, false)?;
    let nvml = gpu_node::mig::open::open_nvml(&opened.host, &gpu_health::NvmlSource::LocalOnly);
    let writer = super::gpu::writer(&opened).with_nvml(nvml.as_deref().ok());
    let done = writer.realize_graded(&allocation, &graded, a.force, "--force")?;
    let shown = g
        .output
        .show(&done, || gpu_node::text::realized(&done.done));
    crate::common::warn(&done.done.warnings);
    shown
}
