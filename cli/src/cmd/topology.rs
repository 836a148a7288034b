//! `gpuslice topology`: this node's (or a fleet node's) GPUs, vGPU parents, pools and instances;
//! the fleet helpers `gpu list --inventory` shares.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;

use gpu_core::text::Shown;
use gpu_core::{NodeTopology, ParentId};

use crate::common::{Global, Output, front, print_data};

// Arguments of `gpuslice topology`.
#[derive(clap::Args, Debug)]
pub struct TopologyArgs {
    /// Publish only these vGPU parents (comma-separated parent IDs such as `0000:08:00.4` or
    /// `mbochs`; a GPU's address selects all its parents), keeping the others for other uses.
    #[arg(long, value_delimiter = ',', value_name = "LIST")]
    pub mdev_parents: Option<Vec<String>>,
    /// Do not load NVML, even with `--root /`: grade health from sysfs signals only.
    #[arg(long)]
    pub no_nvml: bool,
    /// Load NVML from this library, whatever `--root` is (health telemetry, vGPU type names and
    /// the placements of existing MIG GPU instances).
    #[arg(long, value_name = "PATH", conflicts_with = "no_nvml")]
    pub nvml_lib: Option<PathBuf>,
    /// Show a node of a fleet file (JSON or YAML, with `--node NAME`) instead of this host: its
    /// topology with the fleet's allocations counted (HOLDER names the Machine).
    #[arg(long, value_name = "FLEET", conflicts_with_all = ["no_nvml", "nvml_lib", "mdev_parents"])]
    pub inventory: Option<PathBuf>,
}

fn parse_parents(list: &Option<Vec<String>>) -> anyhow::Result<Option<Vec<ParentId>>> {
    let Some(list) = list else { return Ok(None) };
    let given = list.iter().filter(|s| !s.trim().is_empty());
    let parsed = given.map(|s| s.parse::<ParentId>().context("--mdev-parents"));
    parsed.collect::<anyhow::Result<Vec<_>>>().map(Some)
}

pub(crate) fn print_warnings(t: &NodeTopology) {
    crate::common::warn_bare(t.warning_lines());
}

/// Runs `gpuslice topology`.
pub fn topology(g: &Global, a: TopologyArgs) -> anyhow::Result<ExitCode> {
    if let Some(path) = &a.inventory {
        let Some(n) = g.node.as_deref() else {
            let (fleet, _) = front(g).fleet_nodes(path, None)?;
            let nodes = fleet.names_listed();
            anyhow::bail!(
                "topology --inventory needs the node to show: --node NAME (nodes: {nodes})"
            );
        };
        // Shapes stay shared: only the node shown is expanded.
        let (fleet, shown) = front(g).fleet_nodes(path, Some(n))?;
        let shown = &fleet.nodes[shown[0]];
        let given = shown.to_topology();
        // Charged as placement charges: a pending vGPU's room is not free.
        let view = gpu_sched::text::fleet_node_view(&given, &fleet.allocations)
            .with_context(|| format!("--inventory {}", path.display()))?;
        match g.output {
            Output::Table => print!(
                "{}",
                gpu_sched::text::fleet_node(&view, &given, &fleet.allocations)
            ),
            other => print_data(other, &view)?,
        }
        return Ok(ExitCode::SUCCESS);
    }
    let nvml = gpu_health::NvmlSource::from_flags(a.nvml_lib, a.no_nvml);
    let (t, holders) = front(g).local_topology_held(parse_parents(&a.mdev_parents)?, nvml)?;
    match g.output {
        Output::Table => {
            let gpu = |a: &gpu_core::PciAddress| holders.gpu(a).map(ToString::to_string);
            let instance = |i: &gpu_core::Instance| holders.instance(i).map(ToString::to_string);
            let shown = Shown {
                gpu_holder: Some(&gpu),
                instance_holder: Some(&instance),
                ..Shown::default()
            };
            print!("{}", gpu_core::text::topology(&t, &shown));
            if let Some(f) = &t.fabric {
                print!("\nNVSwitch fabric: {}", gpu_node::text::fabric(f));
            }
            print_warnings(&t);
        }
        // Held devices get a `holder` key; otherwise the document prints as it always did.
        other if holders.is_empty() => print_data(other, &t)?,
        other => {
            let mut doc = serde_json::to_value(&t)?;
            holders.annotate_topology(&mut doc);
            print_data(other, &doc)?;
        }
    }
    // The process ends next: the system takes the topology's memory back at once, faster than
    // freeing its thousands of strings one by one.
    std::mem::forget(t);
    Ok(ExitCode::SUCCESS)
}
