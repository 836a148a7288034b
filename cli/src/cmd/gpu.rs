//! `gpuslice gpu list|bind|release`: the GPUs of this host or a fleet, and whole GPUs moved to
//! vfio-pci and back.
//!
//! Each command parses its identities into validated types before touching the host (nothing is
//! written for a malformed address or name), runs one operation of the node's writer
//! ([`gpu_node::Node`]) on a host opened at `--root`, and prints what was done with the QEMU and libvirt snippets.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, bail};
use clap::Args;
use gpu_core::FleetNode;
use gpu_core::PciAddress;

use super::topology::print_warnings;
use crate::common::{Global, Output, open_node_host, print_data};

// Arguments of `gpuslice gpu list`.
#[derive(clap::Args, Debug)]
pub struct GpuListArgs {
    /// List the GPUs of every node in a fleet file (JSON or YAML) instead of this host; with
    /// `--node`, only that node's.
    #[arg(long, value_name = "FLEET")]
    pub inventory: Option<PathBuf>,
    /// List this host's GPUs (the default).
    #[arg(long, conflicts_with = "inventory")]
    pub local: bool,
    /// Do not load NVML, even with `--root /`: grade health from sysfs signals only.
    #[arg(long)]
    pub no_nvml: bool,
}

/// Runs `gpuslice gpu list`.
pub fn gpu_list(g: &Global, a: GpuListArgs) -> anyhow::Result<ExitCode> {
    let Some(path) = &a.inventory else {
        let nvml = gpu_health::NvmlSource::from_flags(None, a.no_nvml);
        let (t, holders) = crate::common::front(g).local_topology_held(None, nvml)?;
        match g.output {
            Output::Table => {
                let holder = |a: &gpu_core::PciAddress| holders.gpu(a).map(ToString::to_string);
                print!("{}", gpu_core::text::gpu_table(&t.gpus, &holder));
                print_warnings(&t);
            }
            other if holders.is_empty() => print_data(other, &t.gpus)?,
            other => {
                let mut doc = serde_json::to_value(&t.gpus)?;
                holders.annotate_gpus(&mut doc);
                print_data(other, &doc)?;
            }
        }
        return Ok(ExitCode::SUCCESS);
    };
    // Shapes stay shared: a node's GPUs are read from its shape, no topology is expanded.
    let (fleet, shown) = crate::common::front(g).fleet_nodes(path, g.node.as_deref())?;
    let nodes: Vec<&FleetNode> = shown.iter().map(|&i| &fleet.nodes[i]).collect();
    // Each GPU as the fleet's allocations leave it: one an allocation holds is not free.
    let gpus = gpu_core::text::fleet_gpus(&nodes, &fleet.allocations);
    let docs = gpus.iter().map(gpu_core::text::FleetGpu::document);
    let docs = docs.collect::<Result<Vec<_>, _>>()?;
    g.output
        .show(&docs, || gpu_core::text::fleet_gpu_table(&gpus))
}

/// Opens `--root` through the one composition ([`gpu_health::open_node_host`]: the NVML
/// type-name resolver on the local `/` only); a recording is refused for commands that change
/// the host (`changes`).
pub(crate) fn open_host(g: &Global, changes: bool) -> anyhow::Result<gpu_health::OpenedNode> {
    let opened = open_node_host(g, &gpu_health::NodeRequest::new(g.node_name()))?;
    if changes && opened.host.is_recording() {
        bail!(
            "--root {} is a recording: it can be listed, not changed",
            g.root.display()
        );
    }
    Ok(opened)
}

/// The one writer of the node `--root` opened ([`gpu_node::Node`]), saying on stderr when it
/// waits for another writer's lock.
pub(crate) fn writer(opened: &gpu_health::OpenedNode) -> gpu_node::Node<'_> {
    const WAITING: gpu_node::node::LockWaiting<'static> = &crate::common::say_waiting;
    gpu_node::Node::of(opened).on_lock_wait(WAITING)
}

/// A GPU given as a PCI address or a per-node name (`nvidia0`), resolved through discovery.
pub(crate) fn resolve_gpu(
    opened: &gpu_health::OpenedNode,
    gpu: &str,
) -> anyhow::Result<PciAddress> {
    let name = match gpu_core::GpuRef::parse_one(gpu)
        .with_context(|| format!("{gpu:?} is neither a PCI address nor a GPU name"))?
    {
        gpu_core::GpuRef::Address(a) => return Ok(a),
        named => named.to_string(),
    };
    let topo = gpu_sysfs::discover::discover(opened.host.host(), &opened.discover)
        .context("cannot discover this host's GPUs to resolve the name")?;
    topo.gpu_address_by_name(&name).map_err(anyhow::Error::msg)
}

/// Each of `gpus` resolved ([`resolve_gpu`]).
pub(crate) fn resolve_gpus(
    opened: &gpu_health::OpenedNode,
    gpus: &[String],
) -> anyhow::Result<Vec<PciAddress>> {
    gpus.iter().map(|n| resolve_gpu(opened, n)).collect()
}

// `gpu bind` arguments.
#[derive(Args, Debug)]
pub struct BindArgs {
    /// The GPUs: PCI addresses (`0000:01:00.0`) or names (`nvidia0`). Their companion functions
    /// (same slot, same vendor: HD audio, USB-C) move with them. On an NVSwitch host the set
    /// must be exactly one fabric partition's members.
    #[arg(value_name = "BDF|NAME", required = true, num_args = 1..)]
    pub gpu: Vec<String>,
    /// Bind even a GPU graded Unhealthy (a VM would get a failing device).
    #[arg(long)]
    pub force: bool,
}

/// Binds a whole GPU and its companion functions to vfio-pci.
pub fn bind(g: &Global, a: BindArgs) -> anyhow::Result<ExitCode> {
    let opened = open_host(g, true)?;
    let gpus = resolve_gpus(&opened, &a.gpu)?;
    let topo = crate::common::local_topology(g, false)
        .with_context(|| format!("cannot grade the health of {} before binding it", gpus[0]))?;
    for gpu in &gpus {
        if let Some(w) = topo.check_gpu_handout(gpu, a.force, "--force")? {
            eprintln!("gpuslice: warning: {w}");
        }
    }
    let set = gpu_node::fabric::bind_set(&opened, &gpus)?;
    print_set(g, "bound", set)
}

/// Prints what a set's bind or release did: the partition first, then each GPU; a single GPU
/// without a partition prints as `gpu bind` always did.
fn print_set(
    g: &Global,
    verb: &str,
    set: gpu_node::fabric::SetBinding,
) -> anyhow::Result<ExitCode> {
    crate::common::warn(&set.warnings);
    match g.output {
        Output::Table => print!("{}", gpu_node::text::set_binding(verb, &set)),
        out if set.partition.is_none() && set.gpus.len() == 1 => print_data(out, &set.gpus[0])?,
        out => print_data(out, &set)?,
    }
    Ok(ExitCode::SUCCESS)
}

// `gpu release` arguments.
#[derive(Args, Debug)]
pub struct ReleaseArgs {
    /// The GPUs: PCI addresses or names (a fabric partition's set deactivates it afterwards).
    #[arg(value_name = "BDF|NAME", required = true, num_args = 1..)]
    pub gpu: Vec<String>,
    /// Release even when a process (a VM) holds the device open; the kernel then waits for it.
    #[arg(long)]
    pub force: bool,
}

/// Returns a GPU from vfio-pci to its host driver.
pub fn release(g: &Global, a: ReleaseArgs) -> anyhow::Result<ExitCode> {
    let opened = open_host(g, true)?;
    let gpus = resolve_gpus(&opened, &a.gpu)?;
    let set = gpu_node::fabric::release_set(&opened, &gpus, a.force)?;
    print_set(g, "released", set)
}
