//! TopologyArgs:topology commands (being built).
use crate::common::Global;
use std::process::ExitCode;

/// TopologyArgs.
#[derive(clap::Args, Debug)]
pub struct TopologyArgs {}

/// Runs `topology`.
pub fn topology(_g: &Global, _a: TopologyArgs) -> anyhow::Result<ExitCode> {
    anyhow::bail!("not built yet")
}

/// GpuListArgs.
#[derive(clap::Args, Debug)]
pub struct GpuListArgs {}

/// Runs `gpu_list`.
pub fn gpu_list(_g: &Global, _a: GpuListArgs) -> anyhow::Result<ExitCode> {
    anyhow::bail!("not built yet")
}
