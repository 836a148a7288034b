//! ExportCommand:run commands (being built).
use crate::common::Global;
use std::process::ExitCode;

/// ExportCommand.
#[derive(clap::Subcommand, Debug)]
pub enum ExportCommand {
    /// Not built yet.
    Todo,
}

/// Runs `run`.
pub fn run(_g: &Global, _a: ExportCommand) -> anyhow::Result<ExitCode> {
    anyhow::bail!("not built yet")
}
