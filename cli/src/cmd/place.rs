//! PlaceArgs:place commands (being built).
use crate::common::Global;
use std::process::ExitCode;

/// PlaceArgs.
#[derive(clap::Args, Debug)]
pub struct PlaceArgs {}

/// Runs `place`.
pub fn place(_g: &Global, _a: PlaceArgs) -> anyhow::Result<ExitCode> {
    anyhow::bail!("not built yet")
}

/// PlanCommand.
#[derive(clap::Subcommand, Debug)]
pub enum PlanCommand {
    /// Not built yet.
    Todo,
}

/// Runs `plan`.
pub fn plan(_g: &Global, _a: PlanCommand) -> anyhow::Result<ExitCode> {
    anyhow::bail!("not built yet")
}
