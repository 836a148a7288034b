//! MetricsArgs:run commands (being built).
use crate::common::Global;
use std::process::ExitCode;

/// MetricsArgs.
#[derive(clap::Args, Debug)]
pub struct MetricsArgs {}

/// Runs `run`.
pub fn run(_g: &Global, _a: MetricsArgs) -> anyhow::Result<ExitCode> {
    anyhow::bail!("not built yet")
}
