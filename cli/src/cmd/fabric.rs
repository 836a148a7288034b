//! `gpuslice fabric list|activate|deactivate`: the NVSwitch fabric partitions Fabric Manager
//! offers, activated and deactivated through the node's writer ([`gpu_node::fabric`]).

use std::process::ExitCode;

use clap::{Args, Subcommand};
use gpu_core::fabric::Fabric;

use super::gpu::open_host;
use crate::common::{Global, Output, print_data, render_table};

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
///
/// # Errors
/// An invalid `--root`, a node without NVSwitches, Fabric Manager unreachable or refusing, a
/// member GPU in use.
pub fn run(g: &Global, c: FabricCommand) -> anyhow::Result<ExitCode> {
    let opened = open_host(g, !matches!(c, FabricCommand::List))?;
    match c {
        FabricCommand::List => {
            let f = gpu_node::fabric::list(&opened)?;
            match g.output {
                Output::Table => print!("{}", table(&f)),
                out => print_data(out, &f)?,
            }
        }
        FabricCommand::Activate(a) => {
            let p = gpu_node::fabric::activate(&opened, a.id)?;
            change(g, "activated", &p)?;
        }
        FabricCommand::Deactivate(a) => {
            let p = gpu_node::fabric::deactivate(&opened, a.id)?;
            change(g, "deactivated", &p)?;
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn change(g: &Global, verb: &str, p: &gpu_node::fabric::PartitionChange) -> anyhow::Result<()> {
    match g.output {
        Output::Table => println!(
            "{} {}",
            if p.changed { verb } else { "unchanged" },
            p.partition.describe()
        ),
        out => print_data(out, p)?,
    }
    Ok(())
}

/// The fabric as text: Fabric Manager's state, then one row per partition.
pub(crate) fn table(f: &Fabric) -> String {
    let fm = &f.fabric_manager;
    let mut out = match (fm.is_reachable(), fm.mode) {
        (true, Some(mode)) => format!(
            "Fabric Manager: reachable, {mode} mode; {} NVSwitches\n",
            f.nvswitches.len()
        ),
        _ => format!(
            "Fabric Manager: cannot be reached ({}); {} NVSwitches: no multi-GPU set is handed out\n",
            fm.reason.as_deref().unwrap_or("no reason given"),
            f.nvswitches.len()
        ),
    };
    if f.partitions.is_empty() {
        return out;
    }
    let rows: Vec<Vec<String>> = f
        .partitions
        .iter()
        .map(|p| {
            vec![
                p.id.to_string(),
                p.size().to_string(),
                p.gpus.join(","),
                if p.active { "yes" } else { "no" }.to_owned(),
                p.degraded.clone().unwrap_or_else(|| "-".to_owned()),
            ]
        })
        .collect();
    out.push_str(&render_table(
        &["ID", "SIZE", "GPUS", "ACTIVE", "DEGRADED"],
        &rows,
    ));
    out
}
