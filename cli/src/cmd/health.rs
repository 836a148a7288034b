//! HealthArgs:run commands (being built).
use crate::common::Global;
use std::process::ExitCode;

/// HealthArgs.
#[derive(clap::Args, Debug)]
pub struct HealthArgs {}

/// Runs `run`.
pub fn run(_g: &Global, _a: HealthArgs) -> anyhow::Result<ExitCode> {
    anyhow::bail!("not built yet")
}
