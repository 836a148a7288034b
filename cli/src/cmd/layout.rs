//! Declarative vGPU layouts: `vgpu apply|assert|clear -f FILE [-c NAME]`.
//!
//! The file is NVIDIA's vgpu-device-manager format (read unchanged) or gpuslice's per-device
//! forms; `docs/layouts.md` describes both. Planning is `gpu_core::layout`, execution (lock,
//! SR-IOV, writes, rollback) is the node's writer (`gpu_node::Node::apply_layout`); this module
//! reads arguments and prints.
//!
//! Exit status: 0 applied (or already applied); 1 not applied (`assert`) or GPUs left unchanged
//! because a VM uses their vGPUs; 2 nothing was changed because of an error (bad file, unknown
//! config or type, layout does not fit, lock timeout); 3 a write failed and every change was
//! rolled back; 4 a write failed and the rollback was incomplete.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::bail;
use clap::Args;
use gpu_core::layout::Mode;
use gpu_node::LayoutWrite;
use gpu_sysfs::actuate::SriovOptions;
use gpu_sysfs::apply::{ApplyError, text};

use crate::common::{Global, Output, open_node_host};

// Where the layout comes from.
#[derive(Args, Debug, Clone)]
pub struct LayoutSource {
    /// Layout file (NVIDIA vgpu-device-manager format or gpuslice's per-device forms); `-` reads
    /// standard input.
    #[arg(
        short = 'f',
        long = "file",
        value_name = "FILE",
        env = "VGPU_DM_CONFIG_FILE"
    )]
    pub file: PathBuf,
    /// The config to use (may be left out when the file has only one).
    #[arg(
        short = 'c',
        long = "config",
        value_name = "NAME",
        env = "VGPU_DM_SELECTED_CONFIG"
    )]
    pub config: Option<String>,
}

// Options of the commands that write.
#[derive(Args, Debug, Clone)]
pub struct WriteOptions {
    /// Print the plan and write nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Also remove vGPUs that a VM has open (the VM loses its device).
    #[arg(long)]
    pub force: bool,
    /// Give up after waiting this many seconds for another apply (default: wait).
    #[arg(long, value_name = "SECS")]
    pub lock_timeout: Option<f64>,
    /// Kill `sriov-manage` after this many seconds.
    #[arg(long, value_name = "SECS", default_value_t = 60.0)]
    pub sriov_timeout: f64,
    /// Run `sriov-manage` as `chroot DIR ...` (the host's root seen from a container).
    #[arg(long, value_name = "DIR")]
    pub sriov_chroot: Option<String>,
}

// `gpuslice vgpu apply`.
#[derive(Args, Debug)]
pub struct ApplyArgs {
    #[command(flatten)]
    source: LayoutSource,
    #[command(flatten)]
    write: WriteOptions,
}

// `gpuslice vgpu assert`.
#[derive(Args, Debug)]
pub struct AssertArgs {
    #[command(flatten)]
    source: LayoutSource,
}

/// Runs `vgpu apply`: makes the selected GPUs hold what the config says.
pub fn apply(g: &Global, a: ApplyArgs) -> anyhow::Result<ExitCode> {
    run(g, &a.source, &a.write, Mode::Apply)
}

/// Runs `vgpu assert`: exit 0 when the selected GPUs hold what the config says, 1 with a diff.
pub fn assert(g: &Global, a: AssertArgs) -> anyhow::Result<ExitCode> {
    let file = crate::common::front(g).read_layout(&a.source.file, None)?;
    let config = file.select(a.source.config.as_deref())?;
    let opened = open_node_host(g, &gpu_health::NodeRequest::new(g.node_name()))?;
    let result = gpu_node::Node::of(&opened).assert_layout(config)?;
    g.output.show(&result, || text::assertion(&result))?;
    Ok(ExitCode::from(u8::from(!result.applied)))
}

/// Runs `vgpu apply` or, with `-f`, `vgpu clear`: the GPUs the config selects made to hold
/// what it says, or cleared.
pub(crate) fn run(
    g: &Global,
    src: &LayoutSource,
    w: &WriteOptions,
    mode: Mode,
) -> anyhow::Result<ExitCode> {
    let file = crate::common::front(g).read_layout(&src.file, None)?;
    let config = file.select(src.config.as_deref())?;
    let opened = open_node_host(g, &gpu_health::NodeRequest::new(g.node_name()))?;
    if opened.host.is_recording() && !w.dry_run {
        bail!(
            "--root {} is a recording: it can be planned against (--dry-run) or asserted, not changed",
            g.root.display()
        );
    }
    let lock_timeout = w.lock_timeout.map(seconds).transpose()?;
    let how = LayoutWrite {
        mode,
        force: w.force,
        dry_run: w.dry_run,
        sriov: SriovOptions {
            timeout: seconds(w.sriov_timeout)?,
            chroot: w.sriov_chroot.clone(),
            ..SriovOptions::default()
        },
    };
    let nvml = gpu_node::mig::open::open_nvml(&opened.host, &gpu_health::NvmlSource::LocalOnly);
    let node = gpu_node::Node::of(&opened)
        .lock_timeout(lock_timeout)
        .with_nvml(nvml.as_deref().ok());
    let verbose = g.output == Output::Table;
    let mut progress = text::Progress::new(std::io::stderr().is_terminal(), verbose);
    let result = node.apply_layout(config, &how, &mut |e| {
        progress.event(&e, &mut std::io::stderr().lock());
    });
    progress.finish(&mut std::io::stderr());
    let (report, failed) = gpu_node::front::layout_outcome(result)?;
    g.output.show(&report, || text::report(&report))?;
    if g.output == Output::Table {
        // The plan's warnings on stderr, after the report.
        crate::common::warn_bare(&report.plan.warnings);
    }
    if !failed {
        return Ok(ExitCode::from(report.status.exit_status()));
    }
    // A failed apply is never 0 or 1, whatever its report says.
    let code = report.status.exit_status().max(3);
    let report = Box::new(report);
    eprintln!("gpuslice: {}", ApplyError::Failed { report });
    Ok(ExitCode::from(code))
}

fn seconds(s: f64) -> anyhow::Result<Duration> {
    Duration::try_from_secs_f64(s)
        .map_err(|_| anyhow::anyhow!("{s} is not a number of seconds (0 or more)"))
}
