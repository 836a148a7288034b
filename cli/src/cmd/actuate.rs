//! Host actuation: `gpu bind|release`, `vgpu create|remove|list`, `sriov enable`.
//!
//! Each command parses its identities into validated types before touching the host (nothing is
//! written for a malformed UUID, address or name), runs one `gpu_sysfs::actuate` operation on a
//! host opened at `--root`, and prints what was done with the QEMU and libvirt snippets.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, bail};
use clap::{Args, Subcommand};
use gpu_core::{MdevUuid, ParentId, PciAddress};
use gpu_sysfs::actuate::{self, CreateTarget, Created, GpuBinding, SriovOptions, handoff::Handoff};

use crate::common::{Global, Output, open_node_host, print_data};

/// Opens `--root` through the one composition ([`gpu_health::open_node_host`]: the NVML
/// type-name resolver on the local `/` only); a recording is refused for commands that change
/// the host (`changes`).
fn open_host(g: &Global, changes: bool) -> anyhow::Result<gpu_health::OpenedNode> {
    let opened = open_node_host(g, &gpu_health::NodeRequest::new(g.node_name()))?;
    if changes && opened.host.is_recording() {
        bail!(
            "--root {} is a recording: it can be listed, not changed",
            g.root.display()
        );
    }
    Ok(opened)
}

/// A GPU given as a PCI address or a per-node name (`nvidia0`), resolved through discovery.
fn resolve_gpu(opened: &gpu_health::OpenedNode, gpu: &str) -> anyhow::Result<PciAddress> {
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

fn print_handoff(h: &Handoff) {
    println!("  qemu:    {}", h.qemu);
    println!("  libvirt: {}", h.libvirt);
    if !h.device_nodes.is_empty() {
        println!("  devices: {}", h.device_nodes.join(" "));
    }
}

fn print_binding(verb: &str, b: &GpuBinding) {
    let groups: Vec<String> = b.iommu_groups.iter().map(u32::to_string).collect();
    println!(
        "{} {} (IOMMU group {})",
        if b.changed() { verb } else { "unchanged" },
        b.gpu,
        groups.join(", ")
    );
    for f in &b.functions {
        println!(
            "{}  {} -> {}{}",
            f.address,
            f.driver_before.as_deref().unwrap_or("none"),
            f.driver_after.as_deref().unwrap_or("none"),
            if f.changed { "" } else { " (unchanged)" }
        );
        if verb == "bound" {
            print_handoff(&f.handoff);
        }
    }
    for w in &b.warnings {
        println!("warning: {w}");
    }
}

/// `gpu bind` arguments.
#[derive(Args, Debug)]
pub struct BindArgs {
    /// The GPU: PCI address (`0000:01:00.0`) or name (`nvidia0`). Its companion functions
    /// (same slot, same vendor: HD audio, USB-C) move with it.
    #[arg(value_name = "BDF|NAME")]
    pub gpu: String,
    /// Bind even a GPU graded Unhealthy (a VM would get a failing device).
    #[arg(long)]
    pub force: bool,
}

/// Binds a whole GPU and its companion functions to vfio-pci.
///
/// # Errors
/// Invalid input, refusals (IOMMU group shared with other endpoints, no IOMMU, a VF) and
/// failed steps (after rolling back).
pub fn bind(g: &Global, a: BindArgs) -> anyhow::Result<ExitCode> {
    let opened = open_host(g, true)?;
    let host = opened.host.host();
    let gpu = resolve_gpu(&opened, &a.gpu)?;
    let topo = crate::common::local_topology(g, None, false)
        .with_context(|| format!("cannot grade the health of {gpu} before binding it"))?;
    if let Some(found) = topo.gpu_by_address(&gpu) {
        let warning = found
            .health
            .check_handout(&gpu.to_string(), a.force, "--force")?;
        if let Some(w) = warning {
            eprintln!("gpuslice: warning: {w}");
        }
    }
    let b =
        actuate::bind_gpu(host, &gpu).with_context(|| format!("cannot bind {gpu} to vfio-pci"))?;
    match g.output {
        Output::Table => print_binding("bound", &b),
        out => print_data(out, &b)?,
    }
    Ok(ExitCode::SUCCESS)
}

/// `gpu release` arguments.
#[derive(Args, Debug)]
pub struct ReleaseArgs {
    /// The GPU: PCI address or name.
    #[arg(value_name = "BDF|NAME")]
    pub gpu: String,
    /// Release even when a process (a VM) holds the device open; the kernel then waits for it.
    #[arg(long)]
    pub force: bool,
}

/// Returns a GPU from vfio-pci to its host driver.
///
/// # Errors
/// Invalid input, a device in use without `--force`, failed steps (after rolling back).
pub fn release(g: &Global, a: ReleaseArgs) -> anyhow::Result<ExitCode> {
    let opened = open_host(g, true)?;
    let host = opened.host.host();
    let gpu = resolve_gpu(&opened, &a.gpu)?;
    let b = actuate::release_gpu(host, &gpu, a.force)
        .with_context(|| format!("cannot release {gpu} to its host driver"))?;
    match g.output {
        Output::Table => print_binding("released", &b),
        out => print_data(out, &b)?,
    }
    Ok(ExitCode::SUCCESS)
}

/// `vgpu create` arguments.
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
    let host = opened.host.host();
    let parent: ParentId = a.parent.parse().context("invalid --parent")?;
    let target = actuate::create_target(host, &parent, &a.profile, |n| resolve_gpu(&opened, n))?;
    let uuid = if target.is_mdev() {
        Some(mdev_uuid(&a)?)
    } else {
        None
    };
    let what = match (&target, uuid) {
        (CreateTarget::Mdev { parent, .. }, Some(u)) => {
            format!("cannot create mdev {u} on {parent}")
        }
        (CreateTarget::MdevOnGpu { gpu, .. }, Some(u)) => {
            format!("cannot create mdev {u} on a VF of {gpu}")
        }
        (CreateTarget::VendorVfio { vf, type_num }, _) => {
            format!("cannot give VF {vf} vGPU type {type_num}")
        }
        _ => "cannot create the vGPU".to_owned(),
    };
    let created = actuate::create_vgpu(host, &target, uuid, &a.profile, a.force).context(what)?;
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

/// `vgpu remove` arguments.
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
    let host = opened.host.host();
    let (text, value) = if let Ok(u) = a.target.parse::<MdevUuid>() {
        let r = actuate::remove_mdev(host, &u, a.force)
            .with_context(|| format!("cannot remove mdev {u}"))?;
        let text = match &r.warning {
            _ if r.changed => format!("removed mdev {u}"),
            Some(w) => {
                eprintln!("warning: {w}");
                format!("mdev {u} cannot be reached (nothing removed)")
            }
            None => format!("no mdev {u} (nothing to remove)"),
        };
        (text, serde_json::to_value(&r)?)
    } else if let Ok(vf) = a.target.parse::<PciAddress>() {
        let r = actuate::clear_vf(host, &vf, a.force)
            .with_context(|| format!("cannot clear VF {vf}"))?;
        let text = match &r.previous {
            Some(p) if r.changed => format!("cleared VF {vf} (had type {p})"),
            _ => format!("VF {vf} has no vGPU type (nothing to clear)"),
        };
        (text, serde_json::to_value(&r)?)
    } else {
        bail!(
            "{:?} is neither an mdev UUID (8-4-4-4-12 hex digits) nor a PCI address",
            a.target
        );
    };
    match g.output {
        Output::Table => println!("{text}"),
        out => print_data(out, &value)?,
    }
    Ok(ExitCode::SUCCESS)
}

/// `vgpu list` arguments.
#[derive(Args, Debug)]
pub struct ListArgs {}

/// Lists the vGPU instances on this host: mdevs and vendor-VFIO VFs with a type.
///
/// # Errors
/// An unreadable host root.
pub fn list(g: &Global, _a: ListArgs) -> anyhow::Result<ExitCode> {
    let opened = open_host(g, false)?;
    let host = opened.host.host();
    let listing = actuate::list_vgpus(host)?;
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

/// `gpuslice sriov` subcommands.
#[derive(Subcommand, Debug)]
pub enum SriovCommand {
    /// Enable the VFs of an NVIDIA GPU with `sriov-manage -e <BDF>` (checked afterwards).
    Enable(SriovEnableArgs),
}

/// `sriov enable` arguments.
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

/// Runs `sriov` subcommands.
///
/// # Errors
/// Invalid input; the script timing out, failing, or exiting 0 without enabling VFs.
pub fn sriov(g: &Global, c: SriovCommand) -> anyhow::Result<ExitCode> {
    let SriovCommand::Enable(a) = c;
    if a.timeout == 0 {
        bail!("--timeout must be at least 1 second");
    }
    let opened = open_host(g, true)?;
    let host = opened.host.host();
    let pf = resolve_gpu(&opened, &a.gpu)?;
    let opts = SriovOptions {
        timeout: Duration::from_secs(a.timeout),
        chroot: a.chroot.map(|p| p.to_string_lossy().into_owned()),
        program: a.program,
    };
    let r = actuate::enable_sriov(host, &pf, &opts)
        .with_context(|| format!("cannot enable SR-IOV on {pf}"))?;
    match g.output {
        Output::Table => {
            if r.changed {
                println!("enabled {} VFs on {}", r.numvfs, r.pf);
            } else {
                println!("{} already has {} VFs", r.pf, r.numvfs);
            }
            for vf in &r.vfs {
                println!("  {vf}");
            }
        }
        out => print_data(out, &r)?,
    }
    Ok(ExitCode::SUCCESS)
}
