//! BindArgs:bind commands (being built).
use crate::common::Global;
use std::process::ExitCode;

/// BindArgs.
#[derive(clap::Args, Debug)]
pub struct BindArgs {}

/// Runs `bind`.
pub fn bind(_g: &Global, _a: BindArgs) -> anyhow::Result<ExitCode> {
    anyhow::bail!("not built yet")
}

/// ReleaseArgs.
#[derive(clap::Args, Debug)]
pub struct ReleaseArgs {}

/// Runs `release`.
pub fn release(_g: &Global, _a: ReleaseArgs) -> anyhow::Result<ExitCode> {
    anyhow::bail!("not built yet")
}

/// CreateArgs.
#[derive(clap::Args, Debug)]
pub struct CreateArgs {}

/// Runs `create`.
pub fn create(_g: &Global, _a: CreateArgs) -> anyhow::Result<ExitCode> {
    anyhow::bail!("not built yet")
}

/// RemoveArgs.
#[derive(clap::Args, Debug)]
pub struct RemoveArgs {}

/// Runs `remove`.
pub fn remove(_g: &Global, _a: RemoveArgs) -> anyhow::Result<ExitCode> {
    anyhow::bail!("not built yet")
}

/// ListArgs.
#[derive(clap::Args, Debug)]
pub struct ListArgs {}

/// Runs `list`.
pub fn list(_g: &Global, _a: ListArgs) -> anyhow::Result<ExitCode> {
    anyhow::bail!("not built yet")
}

/// SriovCommand.
#[derive(clap::Subcommand, Debug)]
pub enum SriovCommand {
    /// Not built yet.
    Todo,
}

/// Runs `sriov`.
pub fn sriov(_g: &Global, _a: SriovCommand) -> anyhow::Result<ExitCode> {
    anyhow::bail!("not built yet")
}
