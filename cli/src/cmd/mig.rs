//! `gpuslice mig list|apply|assert|clear`: MIG GPU instances through NVML, by gpu-node's MIG
//! writer ([`gpu_node::mig`]); this file parses and renders.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::{Args, Subcommand};
use gpu_core::PciAddress;
use gpu_core::mig::parted::MigPartedFile;
use gpu_node::Node;
use gpu_node::mig::text;

use crate::common::{Global, Output, print_data};

/// `gpuslice mig ...`.
#[derive(Subcommand, Debug)]
#[command(defer = true)]
pub enum MigCommand {
    /// Each MIG-capable GPU's MIG mode (enabled, disabled, pending reset), its GPU instances
    /// (profile, start, slices, made by gpuslice or other) and its profiles with the legal
    /// starts still free.
    List(ListArgs),
    /// Make the host match a config of an NVIDIA mig-parted file (read unchanged): MIG mode,
    /// then GPU instances, every GPU checked before the first write.
    Apply(FileArgs),
    /// Check that the host matches a mig-parted config (exit 1 naming what differs).
    Assert(FileArgs),
    /// Destroy the GPU instances gpuslice made (every one with --all); never one a vGPU uses.
    Clear(ClearArgs),
}

// `gpuslice mig list`.
#[derive(Args, Debug)]
pub struct ListArgs {
    /// Only this GPU.
    #[arg(long, value_name = "PCI")]
    pub gpu: Option<PciAddress>,
}

// `gpuslice mig apply|assert`.
#[derive(Args, Debug)]
pub struct FileArgs {
    /// The mig-parted config file (`version: v1`, `mig-configs`); `-` reads standard input.
    #[arg(short = 'f', long = "file", value_name = "FILE")]
    pub file: PathBuf,
    /// The config to use (a key under `mig-configs`).
    #[arg(short = 'c', long = "config", value_name = "NAME")]
    pub config: String,
}

// `gpuslice mig clear`.
#[derive(Args, Debug)]
pub struct ClearArgs {
    /// Only this GPU (default: every MIG-capable GPU).
    #[arg(long, value_name = "PCI")]
    pub gpu: Option<PciAddress>,
    /// Also GPU instances gpuslice did not make.
    #[arg(long)]
    pub all: bool,
}

/// Runs a `mig` subcommand.
pub fn run(g: &Global, c: MigCommand) -> anyhow::Result<ExitCode> {
    let req = gpu_health::NodeRequest::new(g.node_name());
    let opened = crate::common::open_node_host(g, &req)?;
    let nvml = gpu_node::mig::open::open_nvml(&opened.host, &req.nvml)?;
    let node = Node::of(&opened);
    let mig = node.mig(nvml.as_ref());
    let gpus = gpu_sysfs::discover::discover(opened.host.host(), &opened.discover)
        .context("discovering the node's GPUs")?
        .gpus;
    let capable = |only| gpu_node::front::mig_statuses(&mig, &gpus, only);
    match c {
        MigCommand::List(a) => {
            let list = capable(a.gpu)?;
            g.output.show(&list, || text::list(&list))
        }
        MigCommand::Apply(a) => {
            let changes = mig.apply(parted(&a)?.select(&a.config)?, &gpus)?;
            g.output.show(&changes, || text::applied(&changes))
        }
        MigCommand::Assert(a) => {
            let plans = mig.plan(parted(&a)?.select(&a.config)?, &gpus)?;
            g.output
                .show(&plans, || text::asserted(&plans, &a.config))?;
            let matches = plans.iter().all(gpu_node::mig::apply::GpuMigPlan::matches);
            Ok(ExitCode::from(u8::from(!matches)))
        }
        MigCommand::Clear(a) => {
            let mut out = Vec::new();
            for s in capable(a.gpu)? {
                let (change, kept) = mig.clear(&s.gpu, a.all)?;
                if g.output == Output::Table {
                    print!("{}", text::cleared(&change, &kept));
                }
                out.push(change);
            }
            if g.output != Output::Table {
                print_data(g.output, &out)?;
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// The mig-parted file `-f` names.
fn parted(a: &FileArgs) -> anyhow::Result<MigPartedFile> {
    let text = crate::common::read_input(&a.file, "mig-parted file")?;
    MigPartedFile::parse(&text).with_context(|| a.file.display().to_string())
}
