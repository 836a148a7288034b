//! `gpuslice realize`: a placed Machine's devices made on this node in one call
//! ([`gpu_node::Node::realize`]), answered with the hand-off.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;

use crate::cmd::handoff::read_allocation;
use crate::common::{Global, Output, print_data};

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
}

/// Runs `gpuslice realize`.
pub fn run(g: &Global, a: &RealizeArgs) -> anyhow::Result<ExitCode> {
    let path = a.inventory.as_ref().or(a.allocation.as_ref());
    let Some(path) = path else {
        anyhow::bail!("name the allocation with --inventory FLEET or --allocation FILE");
    };
    let allocation = read_allocation(path, a.machine.as_deref())?;
    let opened = super::gpu::open_host(g, true)?;
    let done = super::gpu::writer(&opened).realize(&allocation)?;
    match g.output {
        Output::Table => print!("{}", gpu_node::text::realized(&done)),
        out => print_data(out, &done)?,
    }
    for w in &done.warnings {
        eprintln!("gpuslice: warning: {w}");
    }
    Ok(ExitCode::SUCCESS)
}
