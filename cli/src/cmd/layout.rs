//! ApplyArgs:apply commands (being built).
use crate::common::Global;
use std::process::ExitCode;

/// ApplyArgs.
#[derive(clap::Args, Debug)]
pub struct ApplyArgs {}

/// Runs `apply`.
pub fn apply(_g: &Global, _a: ApplyArgs) -> anyhow::Result<ExitCode> {
    anyhow::bail!("not built yet")
}

/// AssertArgs.
#[derive(clap::Args, Debug)]
pub struct AssertArgs {}

/// Runs `assert`.
pub fn assert(_g: &Global, _a: AssertArgs) -> anyhow::Result<ExitCode> {
    anyhow::bail!("not built yet")
}

/// ClearArgs.
#[derive(clap::Args, Debug)]
pub struct ClearArgs {}

/// Runs `clear`.
pub fn clear(_g: &Global, _a: ClearArgs) -> anyhow::Result<ExitCode> {
    anyhow::bail!("not built yet")
}
