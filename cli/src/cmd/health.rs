//! `gpuslice health`: every GPU's health graded from PCIe AER, link state and NVML, with reasons.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::ValueEnum;
use gpu_core::HealthState;
use gpu_health::{BaselineSource, Policy};

use crate::common::{Global, Output, front, print_data};

/// The state at which `--fail-on` makes the command exit 1.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum FailOn {
    /// Exit 1 when any GPU is Degraded or Unhealthy.
    Degraded,
    /// Exit 1 when any GPU is Unhealthy.
    Unhealthy,
}

// Arguments of `gpuslice health`.
#[derive(clap::Args, Debug)]
pub struct HealthArgs {
    /// Grading policy file (TOML, or YAML/JSON) overriding the built-in defaults.
    #[arg(long, value_name = "FILE")]
    pub policy: Option<PathBuf>,
    /// Print the effective policy (TOML for the table output) and exit.
    #[arg(long)]
    pub print_policy: bool,
    /// Load NVML from this library instead of `libnvidia-ml.so.1` on the linker's path. NVML is
    /// loaded by default only when `--root` is `/`; with another root, only from this library.
    #[arg(long, value_name = "PATH", conflicts_with = "no_nvml")]
    pub nvml_lib: Option<PathBuf>,
    /// Do not load NVML, even with `--root /`: grade from sysfs signals only.
    #[arg(long)]
    pub no_nvml: bool,
    /// Ignore the baseline file under the root.
    #[arg(long, conflicts_with = "record_baseline")]
    pub no_baseline: bool,
    /// After grading, write the baseline file under the root (widest link seen, current counters).
    #[arg(long)]
    pub record_baseline: bool,
    /// Exit 1 when any GPU is at least this bad.
    #[arg(long, value_enum, value_name = "STATE")]
    pub fail_on: Option<FailOn>,
}

fn request(g: &Global, a: &HealthArgs, policy: Policy) -> gpu_health::NodeRequest {
    let mut req = gpu_health::NodeRequest::new(g.node_name());
    req.policy = policy;
    req.nvml = gpu_health::NvmlSource::from_flags(a.nvml_lib.clone(), a.no_nvml);
    if a.no_baseline {
        req.baseline = BaselineSource::None;
    }
    req
}

/// Runs `gpuslice health`.
pub fn run(g: &Global, a: HealthArgs) -> anyhow::Result<ExitCode> {
    let policy = match &a.policy {
        Some(p) => Policy::from_file(p)?,
        None => Policy::default(),
    };
    if a.print_policy {
        let toml = policy.to_toml()?;
        return g.output.show(&policy, || toml);
    }
    let req = request(g, &a, policy);
    let composed = front(g).health(&req, a.nvml_lib.as_deref(), a.record_baseline)?;
    let (topology, reports) = (composed.topology, composed.reports);
    let doc = gpu_health::NodeHealth::new(&topology, reports);
    let worst = doc.worst();
    match g.output {
        Output::Table => {
            print!("{}", doc.table());
            // Warnings reach the table view too, not only `-o json`.
            crate::common::warn_bare(doc.warning_lines());
        }
        other => print_data(other, &doc)?,
    }
    let at = |f: FailOn| match f {
        FailOn::Degraded => HealthState::Degraded,
        FailOn::Unhealthy => HealthState::Unhealthy,
    };
    let failed = a.fail_on.is_some_and(|f| worst.rank() >= at(f).rank());
    Ok(ExitCode::from(u8::from(failed)))
}
