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

use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, bail};
use clap::Args;
use gpu_core::layout::{Assertion, LayoutFile, Mode, Plan, Step};
use gpu_core::nvidia::strip_prefix;
use gpu_node::{LayoutWrite, NodeError};
use gpu_sysfs::actuate::SriovOptions;
use gpu_sysfs::apply::{ApplyError, ApplyEvent, ApplyReport, ApplyStatus, describe};

use crate::common::{Global, Output, open_node_host, print_data, read_input};

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

// `gpuslice vgpu clear`.
#[derive(Args, Debug)]
pub struct ClearArgs {
    #[command(flatten)]
    pub source: LayoutSource,
    #[command(flatten)]
    pub write: WriteOptions,
}

/// Runs `vgpu apply`: makes the selected GPUs hold what the config says.
///
/// # Errors
/// Unreadable or invalid files, unknown configs, a host that cannot be opened.
pub fn apply(g: &Global, a: ApplyArgs) -> anyhow::Result<ExitCode> {
    run(g, &a.source, &a.write, Mode::Apply)
}

/// Runs `vgpu clear`: removes the vGPUs of the GPUs the config selects.
///
/// # Errors
/// As [`apply`].
pub fn clear(g: &Global, a: ClearArgs) -> anyhow::Result<ExitCode> {
    run(g, &a.source, &a.write, Mode::Clear)
}

/// Runs `vgpu assert`: exit 0 when the selected GPUs hold what the config says, 1 with a diff.
///
/// # Errors
/// As [`apply`], and configs that cannot be resolved on this host.
pub fn assert(g: &Global, a: AssertArgs) -> anyhow::Result<ExitCode> {
    let file = read_layout(&a.source.file)?;
    let config = file.select(a.source.config.as_deref())?;
    let opened = open_node_host(g, &gpu_health::NodeRequest::new(g.node_name()))?;
    let result = gpu_node::Node::of(&opened).assert_layout(config)?;
    match g.output {
        Output::Table => print_assertion(&result),
        out => print_data(out, &result)?,
    }
    Ok(ExitCode::from(if result.applied { 0 } else { 1 }))
}

fn run(g: &Global, src: &LayoutSource, w: &WriteOptions, mode: Mode) -> anyhow::Result<ExitCode> {
    let file = read_layout(&src.file)?;
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
    let node = gpu_node::Node::of(&opened).lock_timeout(lock_timeout);
    let mut progress = Progress::new(g.output == Output::Table);
    let result = node.apply_layout(config, &how, &mut |e| progress.event(&e));
    progress.finish();
    match result {
        Ok(report) => {
            match g.output {
                Output::Table => print_report(&report),
                out => print_data(out, &report)?,
            }
            Ok(ExitCode::from(match report.status {
                ApplyStatus::Incomplete => 1,
                _ => 0,
            }))
        }
        Err(NodeError::Layout(e)) => match *e {
            ApplyError::Failed { report } => {
                match g.output {
                    Output::Table => print_report(&report),
                    out => print_data(out, &report)?,
                }
                let code = if report.status == ApplyStatus::RollbackIncomplete {
                    4
                } else {
                    3
                };
                eprintln!("gpuslice: {}", ApplyError::Failed { report });
                Ok(ExitCode::from(code))
            }
            other => Err(NodeError::Layout(Box::new(other)).into()),
        },
        Err(e) => Err(e.into()),
    }
}

fn seconds(s: f64) -> anyhow::Result<Duration> {
    Duration::try_from_secs_f64(s)
        .map_err(|_| anyhow::anyhow!("{s} is not a number of seconds (0 or more)"))
}

fn read_layout(path: &Path) -> anyhow::Result<LayoutFile> {
    let text = read_input(path, "layout")?;
    let shown = if path.as_os_str() == "-" {
        "standard input".to_owned()
    } else {
        path.display().to_string()
    };
    LayoutFile::parse_max(&text, crate::common::document_limit().bytes())
        .with_context(|| format!("layout file {shown}"))
}

/// Progress on standard error: a bar redrawn in place on a terminal, plain lines otherwise
/// (journald, CI logs). Machine-readable output (`-o json`) keeps standard output clean either way.
struct Progress {
    tty: bool,
    verbose: bool,
    drawn: bool,
}

impl Progress {
    fn new(verbose: bool) -> Self {
        Progress {
            tty: std::io::stderr().is_terminal(),
            verbose,
            drawn: false,
        }
    }

    fn event(&mut self, e: &ApplyEvent<'_>) {
        let mut err = std::io::stderr().lock();
        match e {
            ApplyEvent::WaitingForLock { path } => {
                let _ = writeln!(
                    err,
                    "waiting for another gpuslice apply to finish (lock {})",
                    path.display()
                );
            }
            ApplyEvent::Planned { .. } => {}
            ApplyEvent::Step { index, total, step } => {
                let what = describe(step);
                if self.tty {
                    const WIDTH: usize = 24;
                    let filled = (index + 1) * WIDTH / (*total).max(1);
                    let bar: String = "#".repeat(filled) + &"-".repeat(WIDTH - filled);
                    let mut line = format!("[{bar}] {}/{total} {what}", index + 1);
                    line.truncate(120);
                    let _ = write!(err, "\r\x1b[2K{line}");
                    self.drawn = true;
                } else if self.verbose {
                    let _ = writeln!(err, "[{}/{total}] {what}", index + 1);
                }
            }
            ApplyEvent::RollingBack { changes } => {
                if self.drawn {
                    let _ = writeln!(err);
                    self.drawn = false;
                }
                let _ = writeln!(err, "a step failed; undoing {changes} changes");
            }
        }
        let _ = err.flush();
    }

    fn finish(&mut self) {
        if self.drawn {
            eprintln!();
            self.drawn = false;
        }
    }
}

fn print_plan(plan: &Plan) {
    for gp in &plan.gpus {
        let index = gp.index.map(|i| format!(" index {i}")).unwrap_or_default();
        println!("{}{index} [{}]", gp.label(), gp.entry);
        if gp.enable_sriov {
            println!("  SR-IOV is off: enable it, then plan the types");
        }
        for t in &gp.types {
            let mark = if t.have == t.want { "=" } else { "~" };
            println!(
                "  {mark} {:<16} have {:>2}  want {:>2}",
                strip_prefix(&t.name),
                t.have,
                t.want
            );
        }
        if let Some(why) = &gp.refused {
            println!("  left unchanged: {why}");
        }
    }
    if plan.steps.is_empty() {
        return;
    }
    println!("steps:");
    for (i, s) in plan.steps.iter().enumerate() {
        let marker = match s {
            Step::Remove { .. } => "-",
            Step::Create { .. } => "+",
            Step::EnableSriov { .. } => "*",
        };
        println!("  {:>3}. {marker} {}", i + 1, describe(s));
    }
}

fn print_report(r: &ApplyReport) {
    let verb = match r.plan.mode {
        Mode::Apply => "apply",
        Mode::Clear => "clear",
    };
    match r.status {
        ApplyStatus::DryRun => {
            print_plan(&r.plan);
            println!(
                "dry run: {} steps to {verb} config {:?} on node {}; nothing written",
                r.plan.steps.len(),
                r.plan.config,
                r.plan.node
            );
        }
        ApplyStatus::Unchanged => println!(
            "config {:?} is already in place on {} GPU(s); nothing written",
            r.plan.config,
            r.plan.gpus.len()
        ),
        ApplyStatus::Applied | ApplyStatus::Incomplete => {
            for c in &r.changes {
                let t = c
                    .type_id
                    .as_ref()
                    .map(|t| format!(" {t}"))
                    .unwrap_or_default();
                println!("{:<12} {}{t} ({})", c.op, c.device, c.gpu);
            }
            let removed = r.changes.iter().filter(|c| c.op == "remove").count();
            let created = r.changes.iter().filter(|c| c.op == "create").count();
            println!(
                "{verb} config {:?}: {removed} removed, {created} created",
                r.plan.config
            );
            for gp in r.plan.refused() {
                if let Some(why) = &gp.refused {
                    println!("{} left unchanged: {why}", gp.label());
                }
            }
        }
        ApplyStatus::RolledBack | ApplyStatus::RollbackIncomplete => {
            if let Some(f) = &r.failure {
                println!("failed: {f}");
            }
            if let Some(rb) = &r.rollback {
                for u in &rb.undone {
                    println!("  undone: {u}");
                }
                for l in &rb.leftover {
                    println!("  NOT UNDONE: {l}");
                }
            }
        }
    }
    for w in &r.plan.warnings {
        eprintln!("warning: {w}");
    }
}

fn print_assertion(a: &Assertion) {
    if a.applied {
        println!(
            "config {:?} is applied on {} GPU(s) of node {}",
            a.config,
            a.gpus.len(),
            a.node
        );
    } else {
        println!("config {:?} is not applied on node {}:", a.config, a.node);
        for d in &a.diff {
            println!("  {d}");
        }
    }
}
