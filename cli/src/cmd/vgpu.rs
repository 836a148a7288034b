//! `gpuslice vgpu create|remove|list`: one vGPU instance at a time (mdev parents, VFs of an mdev
//! GPU, vendor-VFIO VFs), with the UUID given or derived from a Machine.

use std::process::ExitCode;

use anyhow::{Context, bail};
use clap::Args;
use gpu_core::{MdevUuid, ParentId};
use gpu_node::{Removed, VgpuId};
use gpu_sysfs::actuate::{self, Created};

use super::gpu::{open_host, print_handoff, resolve_gpu, writer};
use crate::common::{Global, Output, print_data};

// `vgpu create` arguments.
#[derive(Args, Debug)]
pub struct CreateArgs {
    /// The parent: an mdev parent (`0000:08:00.4`, `mbochs`), an NVIDIA vendor-VFIO VF, or the
    /// physical GPU of vendor-VFIO VFs (address or name; a free VF is picked).
    #[arg(long, value_name = "PARENT")]
    pub parent: String,
    /// The vGPU type: ID (`nvidia-746`, `1155`) or name (`A2-4Q`, `NVIDIA L40S-24Q`).
    #[arg(long, value_name = "ID|NAME")]
    pub profile: String,
    /// The mdev instance UUID.
    #[arg(long, conflicts_with = "machine", value_name = "UUID")]
    pub uuid: Option<MdevUuid>,
    /// Derive the mdev UUID from this Machine (stable across restarts).
    #[arg(long, value_name = "MACHINE")]
    pub machine: Option<String>,
    /// With --machine: the device request's name.
    #[arg(
        long,
        default_value = "gpu",
        requires = "machine",
        value_name = "REQUEST"
    )]
    pub request: String,
    /// With --machine: the device's index within the request.
    #[arg(long, default_value_t = 0, requires = "machine", value_name = "N")]
    pub index: u32,
    /// Re-type a vendor-VFIO VF even when a process holds it open.
    #[arg(long)]
    pub force: bool,
}

fn mdev_uuid(a: &CreateArgs) -> anyhow::Result<MdevUuid> {
    if let Some(u) = a.uuid {
        return Ok(u);
    }
    if let Some(m) = &a.machine {
        return actuate::machine_uuid(m, &a.request, a.index)
            .map_err(|(field, e)| anyhow::Error::new(e).context(format!("invalid --{field}")));
    }
    bail!("an mdev instance needs a name: pass --uuid UUID or --machine NAME")
}

/// Creates a vGPU: an mdev instance, or a type on a vendor-VFIO VF.
///
/// # Errors
/// Invalid input, unknown parent or profile, no capacity, a UUID taken by another type.
pub fn create(g: &Global, a: CreateArgs) -> anyhow::Result<ExitCode> {
    let opened = open_host(g, true)?;
    let parent: ParentId = a.parent.parse().context("invalid --parent")?;
    let created = writer(&opened).create_vgpu(
        &parent,
        &a.profile,
        a.force,
        |n| resolve_gpu(&opened, n),
        |t| t.is_mdev().then(|| mdev_uuid(&a)).transpose(),
    )?;
    report_created(g, &created)
}

fn report_created(g: &Global, created: &Created) -> anyhow::Result<ExitCode> {
    match g.output {
        Output::Table => {
            let (what, changed, h) = match created {
                Created::Mdev(m) => (
                    format!(
                        "mdev {} ({} on {})",
                        m.uuid,
                        m.type_name.as_deref().unwrap_or(m.type_id.as_str()),
                        m.parent
                    ),
                    m.changed,
                    &m.handoff,
                ),
                Created::VendorVfio(v) => (
                    format!(
                        "VF {} (type {}{})",
                        v.vf,
                        v.type_id,
                        v.type_name
                            .as_deref()
                            .map(|n| format!(", {n}"))
                            .unwrap_or_default()
                    ),
                    v.changed,
                    &v.handoff,
                ),
            };
            println!(
                "{} {what}",
                if changed {
                    "created"
                } else {
                    "already present:"
                }
            );
            print_handoff(h);
        }
        out => print_data(out, created)?,
    }
    Ok(ExitCode::SUCCESS)
}

// `vgpu remove` arguments.
#[derive(Args, Debug)]
pub struct RemoveArgs {
    /// An mdev UUID, or the PCI address of a vendor-VFIO VF to clear.
    #[arg(value_name = "UUID|VF")]
    pub target: String,
    /// Remove even when a process (a VM) holds the device open.
    #[arg(long)]
    pub force: bool,
}

/// Removes an mdev instance or clears a vendor-VFIO VF.
///
/// # Errors
/// Invalid input, a device in use without `--force`, refused writes.
pub fn remove(g: &Global, a: RemoveArgs) -> anyhow::Result<ExitCode> {
    let opened = open_host(g, true)?;
    let Some(id) = VgpuId::parse(&a.target) else {
        bail!(
            "{:?} is neither an mdev UUID (8-4-4-4-12 hex digits) nor a PCI address",
            a.target
        );
    };
    let removed = writer(&opened).remove_vgpu(&id, a.force)?;
    let text = match &removed {
        Removed::Mdev(r) => match &r.warning {
            _ if r.changed => format!("removed mdev {}", r.uuid),
            Some(w) => {
                eprintln!("warning: {w}");
                format!("mdev {} cannot be reached (nothing removed)", r.uuid)
            }
            None => format!("no mdev {} (nothing to remove)", r.uuid),
        },
        Removed::Vf(r) => match &r.previous {
            Some(p) if r.changed => format!("cleared VF {} (had type {p})", r.vf),
            _ => format!("VF {} has no vGPU type (nothing to clear)", r.vf),
        },
    };
    match g.output {
        Output::Table => println!("{text}"),
        out => print_data(out, &removed)?,
    }
    Ok(ExitCode::SUCCESS)
}

// `vgpu list` arguments.
#[derive(Args, Debug)]
pub struct ListArgs {}

/// Lists the vGPU instances on this host: mdevs and vendor-VFIO VFs with a type.
///
/// # Errors
/// An unreadable host root.
pub fn list(g: &Global, _a: ListArgs) -> anyhow::Result<ExitCode> {
    let opened = open_host(g, false)?;
    let listing = writer(&opened).list_vgpus()?;
    for w in &listing.warnings {
        eprintln!("warning: {w}");
    }
    match g.output {
        Output::Table => {
            println!(
                "{:<38} {:<14} {:<14} {:<24} IN USE",
                "INSTANCE", "PARENT", "TYPE", "NAME"
            );
            for m in &listing.mdevs {
                println!(
                    "{:<38} {:<14} {:<14} {:<24} {}",
                    m.uuid.to_string(),
                    m.parent.to_string(),
                    m.type_id.as_str(),
                    m.type_name.as_deref().unwrap_or("-"),
                    m.held_by.as_ref().map_or("-".to_owned(), |h| h.to_string())
                );
            }
            for v in &listing.vendor_vfio {
                println!(
                    "{:<38} {:<14} {:<14} {:<24} {}",
                    v.vf.to_string(),
                    v.pf.map_or("-".to_owned(), |p| p.to_string()),
                    v.type_id.as_str(),
                    v.type_name.as_deref().unwrap_or("-"),
                    v.held_by.as_ref().map_or("-".to_owned(), |h| h.to_string())
                );
            }
        }
        out => print_data(out, &listing)?,
    }
    Ok(ExitCode::SUCCESS)
}
