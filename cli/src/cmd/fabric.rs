//! `gpuslice fabric list|activate|deactivate`: the NVSwitch fabric partitions Fabric Manager
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
