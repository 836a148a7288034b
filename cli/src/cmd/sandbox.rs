//! `gpuslice sandbox`: make a sandbox host to try every command on (`--root sandbox:DIR`), and
//! stand in for a VM holding one of its devices open.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::{Args, Subcommand};

use crate::common::{Global, Output, print_data};

/// The bundled recording a sandbox is made from by default: a real host with one NVIDIA A2 in
/// 16 SR-IOV virtual functions carrying three live vGPUs.
const DEFAULT_RECORDING: &[u8] = include_bytes!("../../../examples/hosts/a2-sriov-mdev.umockdev");
const DEFAULT_LABEL: &str = "examples/hosts/a2-sriov-mdev.umockdev (bundled)";

/// `gpuslice sandbox ...`.
#[derive(Subcommand, Debug)]
#[command(defer = true)]
pub enum SandboxCommand {
    /// Make a sandbox host in DIR: a writable copy of a host where a fake kernel reacts to every
    /// write as Linux and NVIDIA's drivers do. Use it with `--root sandbox:DIR` (or
    /// GPUSLICE_ROOT=sandbox:DIR); its state stays in DIR between commands.
    Init(InitArgs),
    /// Stand in for a VM holding a sandbox device open (a process with its VFIO node open):
    /// prints the process ID. Needs `--root sandbox:DIR`.
    Hold(HoldArgs),
    /// End a holder made by `sandbox hold`. Needs `--root sandbox:DIR`.
    Unhold(UnholdArgs),
    /// Simulate a reload of NVIDIA's vGPU manager (a driver DaemonSet restart, a reboot):
    /// every vGPU is dropped (mdevs removed, every VF's `current_vgpu_type` back to 0);
    /// refused while a holder has one open. Needs `--root sandbox:DIR`.
    ReloadDriver,
    /// Reset a sandbox GPU as `nvidia-smi -r` would: a MIG mode pending a reset comes into
    /// force (refused while a vGPU or process uses the GPU). Needs `--root sandbox:DIR`.
    Reset(ResetArgs),
}

// `gpuslice sandbox reset`.
#[derive(Args, Debug)]
pub struct ResetArgs {
    /// The GPU's PCI address.
    #[arg(value_name = "GPU")]
    pub gpu: gpu_core::PciAddress,
}

// `gpuslice sandbox init`.
#[derive(Args, Debug)]
pub struct InitArgs {
    /// The directory to make (new or empty).
    #[arg(value_name = "DIR")]
    pub dir: PathBuf,
    /// What to copy: a `*.umockdev` recording or a directory tree standing for `/` (default:
    /// the bundled A2 recording, examples/hosts/a2-sriov-mdev.umockdev). Never this machine's `/`.
    #[arg(long, value_name = "RECORDING|TREE")]
    pub from: Option<PathBuf>,
}

// `gpuslice sandbox hold`.
#[derive(Args, Debug)]
pub struct HoldArgs {
    /// A vGPU's UUID, a PCI address, or a VFIO node (`/dev/vfio/7`).
    #[arg(value_name = "DEVICE")]
    pub device: String,
}

// `gpuslice sandbox unhold`.
#[derive(Args, Debug)]
pub struct UnholdArgs {
    /// The process ID `sandbox hold` printed.
    #[arg(value_name = "PID")]
    pub pid: u32,
}

/// Runs a `sandbox` subcommand.
pub fn run(g: &Global, c: SandboxCommand) -> anyhow::Result<ExitCode> {
    match c {
        SandboxCommand::Init(a) => init(g, a),
        SandboxCommand::Hold(a) => hold(g, a),
        SandboxCommand::Unhold(a) => unhold(g, a),
        SandboxCommand::ReloadDriver => reload_driver(g),
        SandboxCommand::Reset(a) => reset(g, &a),
    }
}

fn init(g: &Global, a: InitArgs) -> anyhow::Result<ExitCode> {
    // Copying a host tree takes a few seconds (the bundled A2 is ~10,000 files).
    let started = std::time::Instant::now();
    eprintln!(
        "gpuslice: making a sandbox host in {} from {} (usually a few seconds) ...",
        a.dir.display(),
        a.from
            .as_ref()
            .map_or_else(|| DEFAULT_LABEL.to_owned(), |f| f.display().to_string())
    );
    let report = match &a.from {
        Some(from) => gpu_sysfs::sandbox::init(&a.dir, from),
        None => {
            gpu_sysfs::sandbox::init_from_recording_text(&a.dir, DEFAULT_RECORDING, DEFAULT_LABEL)
        }
    }
    .with_context(|| format!("sandbox init {}", a.dir.display()))?;
    eprintln!(
        "gpuslice: sandbox host made in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    g.output.show(&report.document(), || report.summary())
}

/// `--root`, which must be a sandbox, opened.
fn opened_sandbox(g: &Global) -> anyhow::Result<gpu_sysfs::OpenedRoot> {
    Ok(crate::common::front(g).open_sandbox()?)
}

fn hold(g: &Global, a: HoldArgs) -> anyhow::Result<ExitCode> {
    let d = a.device.trim();
    let pid = opened_sandbox(g)?.hold(d)?;
    if g.output == Output::Table {
        println!("{pid}");
        eprintln!("gpuslice: process {pid} now holds {d} open, as a VM would");
    } else {
        print_data(g.output, &serde_json::json!({ "pid": pid, "device": d }))?;
    }
    Ok(ExitCode::SUCCESS)
}

fn unhold(g: &Global, a: UnholdArgs) -> anyhow::Result<ExitCode> {
    opened_sandbox(g)?.unhold(a.pid)?;
    Ok(ExitCode::SUCCESS)
}

fn reload_driver(g: &Global) -> anyhow::Result<ExitCode> {
    let opened = opened_sandbox(g)?;
    let dropped = opened
        .sandbox()
        .context("not a sandbox")?
        .reload_vgpu_manager()
        .context("reloading the sandbox's vGPU manager")?;
    let (mdevs, vfs) = (dropped.mdevs.len(), dropped.vfs.len());
    g.output.show(&dropped, || {
        format!("vGPU manager reloaded: {mdevs} mdev(s) removed, {vfs} VF type(s) cleared\n")
    })
}

fn reset(g: &Global, a: &ResetArgs) -> anyhow::Result<ExitCode> {
    let opened = opened_sandbox(g)?;
    gpu_node::mig::sandbox::reset(&opened, &a.gpu).with_context(|| format!("GPU {}", a.gpu))?;
    println!("{} reset", a.gpu);
    Ok(ExitCode::SUCCESS)
}
