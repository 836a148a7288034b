//! DraCommand:run commands (being built).
use crate::common::Global;
use std::process::ExitCode;

/// DraCommand.
#[derive(clap::Subcommand, Debug)]
pub enum DraCommand {
    /// Not built yet.
    Todo,
}

/// Runs `run`.
pub fn run(_g: &Global, _a: DraCommand) -> anyhow::Result<ExitCode> {
    anyhow::bail!("not built yet")
}
