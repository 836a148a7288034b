//! `gpuslice vgpu create|remove|list`: one vGPU instance at a time (mdev parents, VFs of an mdev
//! GPU, vendor-VFIO VFs), with the UUID given or derived from a Machine.

use std::process::ExitCode;

use anyhow::{Context, bail};
use clap::Args;
use gpu_core::{MdevUuid, ParentId};
use gpu_node::VgpuId;

use super::gpu::{open_host, resolve_gpu, writer};
use crate::common::Global;

// `vgpu create` arguments.
#[derive(Args, Debug)]
pub struct CreateArgs {
    /// The parent: an mdev parent (`0000:08:00.4`, `mbochs`), an NVIDIA vendor-VFIO VF, or the
    /// physical GPU of vendor-VFIO VFs (address or name; a free VF is picked).
    #[arg(long, value_name = "PARENT")]
    pub parent: String,
    /// The vGPU type: ID (`nvidia-746`, `1155`) or name (`A2-4Q`, `NVIDIA L40S-24Q`).
    /// `--type` (mdevctl's name) is the same option.
    #[arg(long, visible_alias = "type", value_name = "ID|NAME")]
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
    /// Turn the GPU to mixed-size vGPU mode first where it is idle and NVML says it allows it
    /// (a GPU already in that mode mixes sizes without it).
    #[arg(long)]
    pub mixed_sizes: bool,
}

fn mdev_uuid(a: &CreateArgs) -> anyhow::Result<MdevUuid> {
    let machine = a.machine.as_deref();
    Ok(gpu_node::front::mdev_uuid(
        a.uuid, machine, &a.request, a.index,
    )?)
}

/// Creates a vGPU: an mdev instance, or a type on a vendor-VFIO VF.
pub fn create(g: &Global, a: CreateArgs) -> anyhow::Result<ExitCode> {
    let opened = open_host(g, true)?;
    let parent: ParentId = a.parent.parse().context("invalid --parent")?;
    // Where NVML answers, a MIG-backed type gets its GPU instance made on request, and sizes
    // mix on a GPU in (or, with --mixed-sizes, turned to) mixed-size mode.
    let (created, made) = gpu_node::mixed_door::create_on_request(
        &writer(&opened),
        &opened.host,
        &parent,
        &a.profile,
        a.force,
        a.mixed_sizes,
        |n| resolve_gpu(&opened, n),
        |t| t.is_mdev().then(|| mdev_uuid(&a)).transpose(),
    )?;
    if let Some(gi) = made {
        eprintln!(
            "gpuslice: made GPU instance {} ({} at memory slice {}) for it",
            gi.id, gi.profile, gi.start
        );
    }
    g.output
        .show(&created, || gpu_node::text::created(&created))
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
pub fn remove(g: &Global, a: RemoveArgs) -> anyhow::Result<ExitCode> {
    let opened = open_host(g, true)?;
    let Some(id) = VgpuId::parse(&a.target) else {
        bail!(
            "{:?} is neither an mdev UUID (8-4-4-4-12 hex digits) nor a PCI address",
            a.target
        );
    };
    let (removed, destroyed) =
        gpu_node::mig::vgpu::remove_on_request(&writer(&opened), &opened.host, &id, a.force)?;
    if let Some(gi) = destroyed {
        eprintln!("gpuslice: destroyed GPU instance {gi}, which gpuslice made for it");
    }
    let (text, warning) = gpu_node::text::removed(&removed);
    if let Some(w) = warning {
        eprintln!("warning: {w}");
    }
    g.output.show(&removed, || format!("{text}\n"))
}

// `vgpu list` arguments.
#[derive(Args, Debug)]
pub struct ListArgs {}

/// Lists the vGPU instances on this host: mdevs and vendor-VFIO VFs with a type.
pub fn list(g: &Global, _a: ListArgs) -> anyhow::Result<ExitCode> {
    let opened = open_host(g, false)?;
    let listing = writer(&opened).list_vgpus()?;
    crate::common::warn_bare(&listing.warnings);
    g.output
        .show(&listing, || gpu_node::text::vgpu_list(&listing))
}

// `vgpu clear` arguments: what to clear, by GPU, the whole host or a layout file's selection.
#[derive(Args, Debug)]
pub struct ClearArgs {
    /// Clear the vGPUs of this GPU (address or name, `nvidia0`): mdev instances on it or its
    /// VFs, and its vendor-VFIO VFs' types. Repeat for several GPUs.
    #[arg(long = "gpu", value_name = "GPU", conflicts_with_all = ["all", "file"])]
    pub gpus: Vec<String>,
    /// Clear every vGPU on the host.
    #[arg(long, conflicts_with = "file")]
    pub all: bool,
    /// Layout file: clear the GPUs one of its configs selects (see `vgpu apply`); `-` reads
    /// standard input. Without -f, --gpu and --all: $VGPU_DM_CONFIG_FILE, as `vgpu apply`.
    #[arg(short = 'f', long = "file", value_name = "FILE")]
    pub file: Option<std::path::PathBuf>,
    /// With a layout file: the config to use (may be left out when the file has only one);
    /// default $VGPU_DM_SELECTED_CONFIG, as `vgpu apply`.
    #[arg(short = 'c', long = "config", value_name = "NAME")]
    pub config: Option<String>,
    #[command(flatten)]
    pub write: super::layout::WriteOptions,
}

/// Runs `vgpu clear`: the vGPUs of `--gpu` GPUs, of the host (`--all`), or of a layout's GPUs.
pub fn clear(g: &Global, a: ClearArgs) -> anyhow::Result<ExitCode> {
    // NVIDIA's variables, read where `vgpu apply` reads them; --gpu and --all win over them.
    let env = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty());
    let file = a.file.or_else(|| {
        (a.gpus.is_empty() && !a.all)
            .then(|| env("VGPU_DM_CONFIG_FILE").map(Into::into))
            .flatten()
    });
    if a.config.is_some() && file.is_none() {
        bail!(
            "-c/--config names a config of a layout file: give -f FILE (or $VGPU_DM_CONFIG_FILE)"
        );
    }
    if let Some(file) = file {
        let config = a
            .config
            .or_else(|| env("VGPU_DM_SELECTED_CONFIG").map(|v| v.to_string_lossy().into_owned()));
        let source = super::layout::LayoutSource { file, config };
        return super::layout::run(g, &source, &a.write, gpu_core::layout::Mode::Clear);
    }
    if a.gpus.is_empty() && !a.all {
        bail!(
            "say what to clear: --gpu GPU (repeatable), --all, or -f LAYOUT [-c CONFIG] (or $VGPU_DM_CONFIG_FILE)"
        );
    }
    let opened = open_host(g, !a.write.dry_run)?;
    let scope = if a.all {
        gpu_node::ClearScope::All
    } else {
        gpu_node::ClearScope::Gpus(super::gpu::resolve_gpus(&opened, &a.gpus)?)
    };
    let cleared = writer(&opened).clear_vgpus(&scope, a.write.force, a.write.dry_run)?;
    g.output
        .show(&cleared, || gpu_node::text::cleared(&cleared, &scope))
}

// `vgpu types` arguments.
#[derive(Args, Debug)]
pub struct TypesArgs {
    /// Only this parent (an mdev parent or a vendor-VFIO VF), as `mdevctl types --parent`.
    #[arg(long, value_name = "PARENT")]
    pub parent: Option<ParentId>,
}

/// Lists each parent's or VF's vGPU types with their free instances: `mdevctl types`'s text,
/// or the list with `-o json|yaml`.
pub fn types(g: &Global, a: TypesArgs) -> anyhow::Result<ExitCode> {
    let topo = crate::common::local_topology(g, false)?;
    let listing = gpu_core::vgpu_types::vgpu_types(&topo, a.parent.as_ref());
    g.output
        .show(&listing, || gpu_core::text::vgpu_types(&listing))
}
