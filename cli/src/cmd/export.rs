//! `gpuslice export`: hand devices to QEMU, libvirt, KubeVirt, cloud-init or Kubernetes DRA.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Subcommand};
use gpu_core::{MdevUuid, PciAddress};

use crate::cmd::handoff::{self as handoff_cmd, read_allocation};
use crate::common::{Global, Output, front};
pub(crate) use gpu_integrations::dra::parse_size_for;
use gpu_integrations::dra::{self, DraOptions, K8sVersion, model::Object};
use gpu_integrations::{cloud_init, device_nodes, handoff, kubevirt, yaml};

/// `gpuslice export` subcommands.
#[derive(Subcommand, Debug)]
#[command(defer = true)]
pub enum ExportCommand {
    /// QEMU `-device` arguments (one per line; `-o json` for an argument array).
    Qemu(HandoffArgs),
    /// A libvirt `<hostdev>` element (a `<devices>` element for several).
    Libvirt(HandoffArgs),
    /// KubeVirt `permittedHostDevices` for this host's (or a fleet's) GPUs and vGPU types.
    ///
    /// Vendor-VFIO (L4, L40S, H100, H200, B200): one `pciHostDevices` entry per vGPU type set on
    /// at least one VF (`nvidia.com/L40S-24Q`), selected by the VFs' own vendor:device ID. mdev:
    /// one `mediatedDevices` entry per offered type. Warnings (stderr, and comments in the YAML)
    /// name selectors virt-handler cannot tell apart. On nodes gpuslice manages, enable KubeVirt's
    /// `DisableMDEVConfiguration` feature gate (see docs/kubevirt.md).
    Kubevirt(KubevirtArgs),
    /// A KubeVirt VirtualMachine fragment for an allocation: `gpus`/`hostDevices` with the resource
    /// names `export kubevirt` permits, and the guest licensing files with --license-token.
    Vm(crate::cmd::export_vm::VmArgs),
    /// cloud-init `write_files` licensing an NVIDIA vGPU guest.
    CloudInit(CloudInitArgs),
    /// Kubernetes DRA ResourceSlices and DeviceClasses (YAML; `-o json` for a List).
    Dra(DraArgs),
}

// Which devices to hand off.
#[derive(Args, Debug)]
#[group(skip)]
#[command(group(clap::ArgGroup::new("what").required(true).args(["uuid", "address", "allocation"])))]
pub struct HandoffArgs {
    /// An mdev instance by UUID.
    #[arg(long, value_name = "UUID")]
    pub uuid: Option<MdevUuid>,
    /// A whole GPU (with its companion functions) or a vendor-VFIO VF, by PCI address.
    #[arg(long, value_name = "BDF")]
    pub address: Option<PciAddress>,
    /// The devices of an allocation (the JSON/YAML `place` prints, one allocation or several).
    #[arg(long, value_name = "FILE")]
    pub allocation: Option<PathBuf>,
    /// With --allocation holding several: the Machine whose devices to hand off.
    #[arg(long, value_name = "NAME", requires = "allocation")]
    pub machine: Option<String>,
    /// Check the devices against this fleet file's node (the allocation's, or --node) instead of
    /// this host.
    #[arg(long, value_name = "FLEET")]
    pub inventory: Option<PathBuf>,
    /// Hand off a device that does not exist on the node or that another VM holds open (each
    /// is then a warning on stderr instead of a refusal). A blocked GPU is always refused.
    #[arg(long)]
    pub force: bool,
    /// Print the device nodes the VM's process must be allowed to open instead (`/dev/vfio/vfio`,
    /// `/dev/vfio/<group>`, `/dev/iommu`, `/dev/vfio/devices/vfioN`), read from this host: one
    /// per line, or `-o json` per device.
    #[arg(long, conflicts_with = "inventory")]
    pub device_nodes: bool,
}

// `export kubevirt` arguments.
#[derive(Args, Debug)]
pub struct KubevirtArgs {
    /// A fleet file (JSON or YAML) instead of this host.
    #[arg(long, value_name = "FLEET")]
    pub inventory: Option<PathBuf>,
    /// Only vGPU types with at least one instance (`--configured-only=false` for every offered
    /// type). Default: on for vendor-VFIO VFs, off for mdev types.
    #[arg(long, value_name = "BOOL", num_args = 0..=1, default_missing_value = "true")]
    pub configured_only: Option<bool>,
    /// The resource-name prefix of NVIDIA devices.
    #[arg(long, value_name = "PREFIX", default_value = kubevirt::DEFAULT_PREFIX)]
    pub resource_prefix: String,
}

// `export cloud-init` arguments.
#[derive(Args, Debug)]
pub struct CloudInitArgs {
    /// The client configuration token (`.tok`) downloaded from the NVIDIA License System
    /// (needed for every --feature-type but 0).
    #[arg(long, value_name = "FILE")]
    pub license_token: Option<PathBuf>,
    /// gridd.conf's `FeatureType`: 0 unlicensed, 1 NVIDIA vGPU, 2 NVIDIA RTX Virtual
    /// Workstation, 4 NVIDIA Virtual Compute Server (NVIDIA's client licensing guide).
    #[arg(long, value_name = "N", default_value = "1")]
    pub feature_type: cloud_init::FeatureType,
}

// `export dra` arguments.
#[derive(Args, Debug)]
pub struct DraArgs {
    #[command(flatten)]
    pub claims: crate::cmd::dra::ClaimArgs,
    /// The Kubernetes release the objects are for: 1.34, 1.35, 1.36 or 1.37, or a patch release
    /// (1.36.2). A minor alone means its oldest patch. Before 1.36.2 each GPU offers one vGPU
    /// size, one device per instance; from 1.36.2 the size-lock encoding (docs/dra.md).
    #[arg(long, default_value = "1.37", value_name = "VERSION")]
    pub k8s_version: K8sVersion,
    /// Before Kubernetes 1.36.2: the vGPU profile a GPU offers while no vGPU locks its size
    /// (`0000:41:00.0=L40S-8Q`; a MIG-backed profile publishes its MIG placements instead).
    /// Repeatable.
    #[arg(long, value_name = "GPU=PROFILE", value_parser = parse_size_for)]
    pub size_for: Vec<(gpu_core::PciAddress, String)>,
    /// Before Kubernetes 1.36.2: each GPU offers the size of the vGPUs this layout file (the one
    /// `vgpu apply` applies) gives it; `--size-for` wins for the GPUs it names.
    #[arg(long, value_name = "FILE")]
    pub layout: Option<PathBuf>,
    /// With `--layout`: the config to read (default: the file's only one).
    #[arg(short = 'c', long, value_name = "NAME", requires = "layout")]
    pub config: Option<String>,
    /// A fleet file (JSON or YAML) instead of this host: slices for every node.
    #[arg(long, value_name = "FLEET")]
    pub inventory: Option<PathBuf>,
    /// `pool.generation` of the slices; raise it whenever the published content changes.
    #[arg(long, default_value_t = 1, value_name = "N")]
    pub generation: i64,
    /// Print the example ResourceClaims instead of the slices.
    #[arg(long)]
    pub examples: bool,
}

/// Runs `gpuslice export`.
pub fn run(g: &Global, c: ExportCommand) -> anyhow::Result<ExitCode> {
    match c {
        ExportCommand::Qemu(a) | ExportCommand::Libvirt(a) if a.device_nodes => {
            let devices = handoff_devices(g, &a)?;
            print_device_nodes(g, &devices)?;
        }
        ExportCommand::Qemu(a) => {
            let devices = handoff_devices(g, &a)?;
            match g.output {
                Output::Json => print!("{}", yaml::json(&handoff::qemu_args(&devices))?),
                _ => print!("{}", handoff::qemu_text(&devices)),
            }
        }
        ExportCommand::Libvirt(a) => {
            let devices = handoff_devices(g, &a)?;
            print!("{}", handoff::libvirt_xml(&devices));
        }
        ExportCommand::Kubevirt(a) => {
            let (nodes, _) = front(g).load_nodes(a.inventory.as_deref())?;
            let opts = kubevirt::KubevirtOptions {
                resource_prefix: a.resource_prefix.clone(),
                configured_only: a.configured_only,
            };
            let export = kubevirt::export(&nodes, &opts);
            crate::common::warn(&export.warnings);
            match g.output {
                Output::Json => print!("{}", yaml::json(&export.patch)?),
                _ => print!("{}", export.to_yaml()?),
            }
        }
        ExportCommand::Vm(a) => crate::cmd::export_vm::run(g, &a)?,
        ExportCommand::CloudInit(a) => {
            let config =
                gpu_node::front::guest_license(a.license_token.as_deref(), a.feature_type)?;
            // `-o json`: the same document as JSON (for an API field); otherwise the
            // `#cloud-config` YAML cloud-init reads.
            match g.output {
                Output::Json => print!("{}", yaml::json(&config)?),
                _ => print!("{}", cloud_init::to_yaml(&config)?),
            }
        }
        ExportCommand::Dra(a) => export_dra(g, &a)?,
    }
    Ok(ExitCode::SUCCESS)
}

/// The device nodes of `devices` on this host; an error naming the devices without a group.
fn print_device_nodes(g: &Global, devices: &[handoff::VmDevice]) -> anyhow::Result<()> {
    let opened = crate::common::open_host(g)?;
    let per_device = device_nodes::require_for_devices(opened.host(), devices)?;
    match g.output {
        Output::Json => print!("{}", yaml::json(&per_device)?),
        _ => device_nodes::union(&per_device)
            .iter()
            .for_each(|n| println!("{n}")),
    }
    Ok(())
}

/// The devices to hand off, checked against the node ([`crate::cmd::handoff`]): refused when
/// one does not exist or another VM has it (unless `--force`), warned about when not free.
fn handoff_devices(g: &Global, a: &HandoffArgs) -> anyhow::Result<Vec<handoff::VmDevice>> {
    if let Some(path) = &a.allocation {
        let allocation = read_allocation(g, path, a.machine.as_deref())?;
        let target = handoff_cmd::target(g, a.inventory.as_deref(), Some(&allocation.node))?;
        return handoff_cmd::checked_allocation(&target, &allocation, a.force);
    }
    let target = handoff_cmd::target(g, a.inventory.as_deref(), None)?;
    let (devices, warnings) = gpu_node::front::named_devices(&target, a.uuid, a.address, a.force)?;
    crate::common::warn(&warnings);
    Ok(devices)
}

fn export_dra(g: &Global, a: &DraArgs) -> anyhow::Result<()> {
    let objects: Vec<Object> = if a.examples {
        dra::claims::examples(&a.claims.driver)
            .into_iter()
            .map(Object::Claim)
            .collect()
    } else {
        let (nodes, _) = front(g).load_nodes(a.inventory.as_deref())?;
        let prepared = a.claims.prepared(g)?;
        let mut size_for = BTreeMap::new();
        if let Some(path) = &a.layout {
            let (sizes, warnings) = front(g).layout_sizes(path, a.config.as_deref(), &nodes)?;
            warnings.iter().for_each(|w| eprintln!("gpuslice: {w}"));
            size_for = sizes;
        }
        size_for.extend(a.size_for.iter().cloned());
        let (mixed_placements, notes) = front(g).mixed_placements(a.inventory.as_deref(), &nodes);
        notes.iter().for_each(|w| eprintln!("gpuslice: {w}"));
        let opts = DraOptions {
            driver: a.claims.driver.clone(),
            version: a.k8s_version,
            generation: a.generation,
            prepared,
            size_for,
            mixed_placements,
        };
        let export = dra::export(&nodes, &opts)?;
        eprintln!("gpuslice: {}", export.encoding.describe(a.k8s_version));
        for w in &export.warnings {
            eprintln!("gpuslice: {w}");
        }
        export.objects
    };
    print!("{}", yaml::objects(&objects, g.output == Output::Json)?);
    Ok(())
}
