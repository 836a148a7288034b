//! `gpuslice fabric list|activate|deactivate|vgpus`: the NVSwitch fabric partitions Fabric Manager
//! offers, activated and deactivated through the node's writer ([`gpu_node::fabric`]).

use std::process::ExitCode;

use clap::{Args, Subcommand};

use super::gpu::open_host;
use crate::common::Global;

/// `gpuslice fabric` subcommands.
#[derive(Subcommand, Debug)]
pub enum FabricCommand {
    /// List the NVSwitches, Fabric Manager's state and its partitions.
    List,
    /// Activate a partition (refused while a member GPU is in use by something else).
    Activate(PartitionArgs),
    /// Deactivate a partition (refused while a member GPU is in use by something else).
    Deactivate(PartitionArgs),
    /// Fabric Manager in vGPU mode: a whole-framebuffer vGPU on a VF of each of a partition's
    /// GPUs, the partition activated with those VFs (`--remove`: the reverse).
    Vgpus(VgpusArgs),
}

/// A partition's GPUs and the vGPU type their VFs take.
#[derive(Args, Debug)]
pub struct VgpusArgs {
    /// The GPUs (names or PCI addresses): exactly one partition's members.
    #[arg(value_name = "BDF|NAME", required = true, num_args = 1..)]
    pub gpu: Vec<String>,
    /// The vGPU type (time-sliced, taking the whole framebuffer: `H100XM-80C`).
    #[arg(long, required_unless_present = "remove")]
    pub profile: Option<String>,
    /// Deactivate the partition and clear the VFs' types instead.
    #[arg(long, conflicts_with = "profile")]
    pub remove: bool,
    /// With `--remove`: clear a VF a process (a VM) holds.
    #[arg(long, requires = "remove")]
    pub force: bool,
}

/// A partition by Fabric Manager's ID.
#[derive(Args, Debug)]
pub struct PartitionArgs {
    /// The partition ID, as `fabric list` shows it.
    #[arg(value_name = "ID")]
    pub id: u32,
}

/// Runs `gpuslice fabric ...`.
pub fn run(g: &Global, c: FabricCommand) -> anyhow::Result<ExitCode> {
    let opened = open_host(g, !matches!(c, FabricCommand::List))?;
    match c {
        FabricCommand::List => {
            let f = gpu_node::fabric::list(&opened)?;
            g.output.show(&f, || gpu_node::text::fabric(&f))
        }
        FabricCommand::Activate(a) => {
            change(g, "activated", &gpu_node::fabric::activate(&opened, a.id)?)
        }
        FabricCommand::Deactivate(a) => change(
            g,
            "deactivated",
            &gpu_node::fabric::deactivate(&opened, a.id)?,
        ),
        FabricCommand::Vgpus(a) => {
            let (set, verb) = match &a.profile {
                Some(p) => (
                    gpu_node::fabric::create_vgpu_set(&opened, &a.gpu, p)?,
                    "activated",
                ),
                None => (
                    gpu_node::fabric::remove_vgpu_set(&opened, &a.gpu, a.force)?,
                    "deactivated",
                ),
            };
            g.output.show(&set, || set.describe(verb))
        }
    }
}

fn change(
    g: &Global,
    verb: &str,
    p: &gpu_node::fabric::PartitionChange,
) -> anyhow::Result<ExitCode> {
    let verb = if p.changed { verb } else { "unchanged" };
    g.output
        .show(p, || format!("{verb} {}\n", p.partition.describe()))
}
