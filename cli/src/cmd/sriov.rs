//! `gpuslice sriov enable|disable`: the VFs of an NVIDIA GPU, made through `sriov-manage` (with a
//! timeout, checked afterwards) and taken away again once none holds a vGPU.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::bail;
use clap::{Args, Subcommand};
use gpu_sysfs::actuate::{self, SriovOptions};

use super::gpu::{open_host, resolve_gpu, writer};
use crate::common::Global;

/// `gpuslice sriov` subcommands.
#[derive(Subcommand, Debug)]
#[command(defer = true)]
pub enum SriovCommand {
    /// Enable the VFs of an NVIDIA GPU with `sriov-manage -e <BDF>` (checked afterwards).
    Enable(SriovEnableArgs),
    /// Disable the VFs of a GPU (`sriov_numvfs` set to 0); refused while a VF holds a vGPU or a
    /// process holds one open.
    Disable(SriovDisableArgs),
}

// `sriov enable` arguments.
#[derive(Args, Debug)]
pub struct SriovEnableArgs {
    /// The physical GPU: PCI address or name.
    #[arg(value_name = "BDF|NAME")]
    pub gpu: String,
    /// Kill `sriov-manage` after this many seconds.
    #[arg(long, default_value_t = 60, value_name = "SECS")]
    pub timeout: u64,
    /// Run it as `chroot DIR sriov-manage ...` (the host's root, from a container).
    #[arg(long, value_name = "DIR")]
    pub chroot: Option<PathBuf>,
    /// The script to run.
    #[arg(long, default_value = actuate::SRIOV_MANAGE, value_name = "PATH")]
    pub program: String,
}

// `sriov disable` arguments.
#[derive(Args, Debug)]
pub struct SriovDisableArgs {
    /// The physical GPU: PCI address or name.
    #[arg(value_name = "BDF|NAME")]
    pub gpu: String,
}

/// Runs `sriov` subcommands.
pub fn sriov(g: &Global, c: SriovCommand) -> anyhow::Result<ExitCode> {
    let a = match c {
        SriovCommand::Enable(a) => a,
        SriovCommand::Disable(a) => return disable(g, &a),
    };
    if a.timeout == 0 {
        bail!("--timeout must be at least 1 second");
    }
    let opened = open_host(g, true)?;
    let pf = resolve_gpu(&opened, &a.gpu)?;
    let opts = SriovOptions {
        timeout: Duration::from_secs(a.timeout),
        chroot: a.chroot.map(|p| p.to_string_lossy().into_owned()),
        program: a.program,
    };
    let r = writer(&opened).enable_sriov(&pf, &opts)?;
    g.output.show(&r, || gpu_node::text::sriov_enabled(&r))
}

fn disable(g: &Global, a: &SriovDisableArgs) -> anyhow::Result<ExitCode> {
    let opened = open_host(g, true)?;
    let pf = resolve_gpu(&opened, &a.gpu)?;
    let r = writer(&opened).disable_sriov(&pf)?;
    g.output.show(&r, || gpu_node::text::sriov_disabled(&r))
}
