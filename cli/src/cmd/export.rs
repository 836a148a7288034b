//! ExportCommand:run commands (being built).
use std::process::ExitCode;
use crate::common::Global;

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
