//! `gpuslice topology`: this node's (or a fleet node's) GPUs, vGPU parents, pools and instances;
//! the fleet helpers `gpu list --inventory` shares.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use std::fmt::Write as _;

use gpu_core::{Allocation, FleetNode, Gpu, NodeTopology, ParentId, PciAddress};

pub(crate) use gpu_core::text::{GPU_HEADERS, dash, gpu_row};
pub(crate) use gpu_core::usage::allocated_view;
use gpu_sysfs::actuate::{Holder, NodeHolders};

use crate::common::{Global, Output, local_topology_held, print_data, render_table};

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
    for w in t.warning_lines() {
        eprintln!("warning: {w}");
    }
}

/// The message for a `--node` not in the fleet at `path`, listing the fleet's nodes.
pub(crate) fn not_in_fleet<'a>(
    n: &str,
    path: &std::path::Path,
    known: impl Iterator<Item = &'a str>,
) -> anyhow::Error {
    anyhow::anyhow!(
        "--node {n}: not in {} (nodes: {})",
        path.display(),
        listed(known)
    )
}

/// The names given, comma-separated, or `none`.
fn listed<'a>(names: impl Iterator<Item = &'a str>) -> String {
    let names: Vec<&str> = names.collect();
    if names.is_empty() {
        "none".to_owned()
    } else {
        names.join(", ")
    }
}

/// Runs `gpuslice topology`.
pub fn topology(g: &Global, a: TopologyArgs) -> anyhow::Result<ExitCode> {
    if let Some(path) = &a.inventory {
        // Shapes stay shared: only the node shown is expanded.
        let (fleet, _) = crate::common::read_shared_fleet(path, Some("--inventory"))?;
        let names = || fleet.nodes.iter().map(FleetNode::name);
        let Some(n) = g.node.as_deref() else {
            anyhow::bail!(
                "topology --inventory needs the node to show: --node NAME (nodes: {})",
                listed(names())
            );
        };
        let shown = fleet.nodes.iter().find(|t| t.name() == n);
        let given = shown
            .ok_or_else(|| not_in_fleet(n, path, names()))?
            .to_topology();
        // Charged as placement charges: a pending vGPU's room is not free.
        let mut view = gpu_sched::node_view(&given, &fleet.allocations)
            .with_context(|| format!("--inventory {}", path.display()))?;
        for gpu in &mut view.topology.gpus {
            *gpu = allocated_view(n, &fleet.allocations, gpu).0;
        }
        match g.output {
            Output::Table => print!(
                "{}",
                render_topology(
                    &view.topology,
                    &Shown {
                        snapshot: &given,
                        allocations: &fleet.allocations,
                        allocated: &view.allocated_instances,
                        holders: &NodeHolders::default(),
                    }
                )
            ),
            other => print_data(other, &view)?,
        }
        return Ok(ExitCode::SUCCESS);
    }
    let nvml = gpu_health::NvmlSource::from_flags(a.nvml_lib, a.no_nvml);
    let (t, holders) = local_topology_held(g, parse_parents(&a.mdev_parents)?, nvml)?;
    match g.output {
        Output::Table => {
            let shown = Shown {
                snapshot: &t,
                allocations: &[],
                allocated: &[],
                holders: &holders,
            };
            print!("{}", render_topology(&t, &shown));
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

fn mib(v: u64) -> String {
    format!("{v} MiB")
}

/// What the topology is shown with: the node as discovered or given (`snapshot`: the memory
/// line counts `allocations` on it), the vGPUs allocations hold (a fleet's node) and the
/// processes holding devices open (this host).
struct Shown<'a> {
    snapshot: &'a NodeTopology,
    allocations: &'a [Allocation],
    allocated: &'a [gpu_sched::AllocatedInstance],
    holders: &'a NodeHolders,
}

/// The topology as people read it: GPUs (with HOLDER when a process holds one open), then vGPU
/// parents grouped per GPU with each profile's free count and the instances with their parents
/// and holders (the Machine whose allocation holds it, made or not yet; else the process that
/// holds it open), then the GPU memory line with the allocations counted.
fn render_topology(t: &NodeTopology, shown: &Shown<'_>) -> String {
    let allocations = shown.allocations;
    let mut out = String::new();
    let _ = writeln!(out, "Node {}", t.node);
    let _ = writeln!(out);
    let _ = writeln!(out, "GPUs");
    if t.gpus.is_empty() {
        let _ = writeln!(out, "  (none)");
    } else {
        let mut rows: Vec<Vec<String>> = t
            .gpus
            .iter()
            .map(|g| {
                let mut r = gpu_row(g);
                r.push(gpu_core::usage::memory_text(g));
                r.push(dash(g.state_reason.as_deref()));
                r
            })
            .collect();
        let mut headers = GPU_HEADERS.to_vec();
        headers.extend(["MEMORY", "WHY"]);
        add_holder_column(&mut headers, &mut rows, &t.gpus, shown.holders);
        out.push_str(&indent(&render_table(&headers, &rows)));
    }

    let _ = writeln!(out);
    let _ = writeln!(out, "vGPU parents");
    let parents = &t.mediated_devices.parents;
    if parents.is_empty() {
        let _ = writeln!(out, "  (none)");
    }
    for (key, members) in &gpu_core::pool::parents_by_pool(t) {
        let pool = t.pool(key);
        let gpu_name = key
            .pci()
            .and_then(|a: PciAddress| t.gpu_by_address(&a))
            .map(|g| g.name.clone());
        let framework = members.first().map(|p| p.framework.as_str()).unwrap_or("-");
        let free_parents = members
            .iter()
            .filter(|p| p.profiles.iter().any(|x| x.available_instances > 0))
            .count();
        let title = match &gpu_name {
            Some(n) => format!("{n} ({key})"),
            None => key.to_string(),
        };
        let mut head = format!(
            "{title}: {framework}, {} parent{}, {free_parents} with room",
            members.len(),
            if members.len() == 1 { "" } else { "s" }
        );
        if let Some(pool) = pool {
            let lower_bound = gpu_core::usage::pool_total_is_lower_bound(t, pool);
            let _ = write!(
                head,
                "; pool {} of {}{} used",
                mib(pool.used_mib),
                if lower_bound { "at least " } else { "" },
                mib(pool.total_mib)
            );
            if let Some(l) = pool.size_locked_mib.filter(|_| !pool.mixed_size) {
                let _ = write!(head, ", locked to {} vGPUs", mib(l));
            }
            if let (Some(total), Some(used)) = (pool.mig_slices_total, pool.mig_slices_used) {
                let _ = write!(head, ", MIG slices {used} of {total} used");
            }
        }
        let _ = writeln!(out, "  {head}");
        let lines = gpu_core::pool::profile_offers(members, pool);
        if !lines.is_empty() {
            let rows: Vec<Vec<String>> = lines
                .iter()
                .map(|l| {
                    vec![
                        l.name.clone(),
                        l.id.clone(),
                        l.size_mib.map_or_else(|| "-".to_owned(), mib),
                        l.free.to_string(),
                        l.parents_free.to_string(),
                    ]
                })
                .collect();
            out.push_str(&indent(&indent(&render_table(
                &["PROFILE", "ID", "SIZE", "FREE", "ON PARENTS"],
                &rows,
            ))));
        }
        let mut instances: Vec<Vec<String>> = members
            .iter()
            .flat_map(|p| {
                p.instances.iter().map(|i| {
                    vec![
                        i.uuid
                            .map(|u| u.to_string())
                            .or_else(|| i.address.map(|a| a.to_string()))
                            .unwrap_or_else(|| "-".to_owned()),
                        i.profile_name
                            .clone()
                            .unwrap_or_else(|| i.profile.to_string()),
                        i.framebuffer_mib.map_or_else(|| "-".to_owned(), mib),
                        p.id.to_string(),
                        match gpu_core::usage::allocated_instance(t, allocations, p, i) {
                            Some(a) => format!("Machine {}", a.machine),
                            None => match shown.holders.instance(i) {
                                Some(h) => h.to_string(),
                                None if i.in_use == Some(true) => "in use".to_owned(),
                                None => "-".to_owned(),
                            },
                        },
                    ]
                })
            })
            .collect();
        // Allocated vGPUs the host does not show yet, each with its Machine.
        instances.extend(
            shown
                .allocated
                .iter()
                .filter(|x| !x.made && members.iter().any(|p| p.id == x.parent))
                .map(|x| {
                    vec![
                        x.label(),
                        x.profile_name.clone(),
                        x.framebuffer_mib.map_or_else(|| "-".to_owned(), mib),
                        x.parent.to_string(),
                        format!("Machine {} ({})", x.machine, x.status.as_str()),
                    ]
                }),
        );
        if !instances.is_empty() {
            out.push_str(&indent(&indent(&render_table(
                &["INSTANCE", "PROFILE", "SIZE", "PARENT", "HOLDER"],
                &instances,
            ))));
        }
    }

    // Memory handed out: vGPU framebuffer in use, plus whole GPUs bound to vfio-pci.
    let usage = gpu_core::usage::vram_usage(shown.snapshot, allocations);
    let _ = writeln!(out);
    let _ = writeln!(out, "GPU memory: {}", usage.summary());
    out
}

/// A device's HOLDER: the process holding it open (`pid 4242 (qemu-system-x86)`), else `-`.
fn holder_text(h: Option<&Holder>) -> String {
    h.map_or_else(|| "-".to_owned(), Holder::to_string)
}

/// Adds a HOLDER column to a table of `gpus` (one row each) when a process holds one of them
/// open (a VM with it passed through); otherwise the table stays as it was.
pub(crate) fn add_holder_column(
    headers: &mut Vec<&str>,
    rows: &mut [Vec<String>],
    gpus: &[Gpu],
    holders: &NodeHolders,
) {
    if !gpus.iter().any(|g| holders.gpu(&g.address).is_some()) {
        return;
    }
    headers.push("HOLDER");
    for (r, g) in rows.iter_mut().zip(gpus) {
        r.push(holder_text(holders.gpu(&g.address)));
    }
}

fn indent(s: &str) -> String {
    s.lines().map(|l| format!("  {l}\n")).collect()
}
