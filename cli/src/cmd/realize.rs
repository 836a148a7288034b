//! `gpuslice realize`: a placed Machine's devices made on this node in one call
//! ([`gpu_node::Node::realize`]), answered with the hand-off.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;
use gpu_node::{Realized, RealizedDevice};
use gpu_sysfs::actuate::Created;

use crate::cmd::handoff::read_allocation;
use crate::common::{Global, Output, print_data};

// `gpuslice realize` arguments.
#[derive(Args, Debug)]
#[command(group(clap::ArgGroup::new("from").required(true).args(["inventory", "allocation"])))]
pub struct RealizeArgs {
    /// The fleet file holding the allocation (`gpuslice place --save` records it there).
    #[arg(long, value_name = "FLEET")]
    pub inventory: Option<PathBuf>,
    /// A file holding the allocation instead (the JSON/YAML `place` prints).
    #[arg(long, value_name = "FILE", conflicts_with = "inventory")]
    pub allocation: Option<PathBuf>,
    /// The Machine whose devices to make (may be left out when the file holds one allocation).
    #[arg(long, value_name = "NAME")]
    pub machine: Option<String>,
}

/// Runs `gpuslice realize`.
pub fn run(g: &Global, a: &RealizeArgs) -> anyhow::Result<ExitCode> {
    let path = a.inventory.as_ref().or(a.allocation.as_ref());
    let Some(path) = path else {
        anyhow::bail!("name the allocation with --inventory FLEET or --allocation FILE");
    };
    let allocation = read_allocation(path, a.machine.as_deref())?;
    let opened = super::gpu::open_host(g, true)?;
    let done = super::gpu::writer(&opened).realize(&allocation)?;
    match g.output {
        Output::Table => print!("{}", table(&done)),
        out => print_data(out, &done)?,
    }
    for w in &done.warnings {
        eprintln!("gpuslice: warning: {w}");
    }
    Ok(ExitCode::SUCCESS)
}

/// What was made (or found), then the QEMU arguments (`-o json` has the libvirt XML too).
fn table(r: &Realized) -> String {
    let verb = if r.changed {
        "realized"
    } else {
        "already realized:"
    };
    let mut out = format!("{verb} Machine {} on node {}\n", r.machine, r.node);
    for d in &r.devices {
        let what = match d {
            RealizedDevice::Vgpu { created, .. } => match created {
                Created::Mdev(m) => format!("mdev {} ({} on {})", m.uuid, m.type_id, m.parent),
                Created::VendorVfio(v) => format!("VF {} (type {})", v.vf, v.type_id),
            },
            RealizedDevice::Gpu { binding, .. } => format!("GPU {} on vfio-pci", binding.gpu),
        };
        let how = if d.changed() { "made" } else { "there" };
        out.push_str(&format!("  {how:<6}{what}\n"));
    }
    out.push_str(&format!("  qemu:    {}\n", r.handoff.qemu.join(" ")));
    out
}
