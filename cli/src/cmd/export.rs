//! `gpuslice export`: hand devices to QEMU, libvirt, KubeVirt, cloud-init or Kubernetes DRA.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, bail};
use clap::{Args, Subcommand};
use gpu_core::{Allocation, MdevUuid, NodeTopology, PciAddress};

use crate::common::{Global, Output, load_nodes};
use gpu_integrations::dra::{self, DraOptions, K8sVersion, model::Object};
use gpu_integrations::{cloud_init, device_nodes, handoff, kubevirt, yaml};

/// `gpuslice export` subcommands.
#[derive(Subcommand, Debug)]
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
    Vm(VmArgs),
    /// cloud-init `write_files` licensing an NVIDIA vGPU guest.
    CloudInit(CloudInitArgs),
    /// Kubernetes DRA ResourceSlices and DeviceClasses (YAML; `-o json` for a List).
    Dra(DraArgs),
}

/// Which devices to hand off.
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
    /// With --address: look the address up in this fleet file (node from --node) instead of
    /// this host.
    #[arg(long, value_name = "FLEET", requires = "address")]
    pub inventory: Option<PathBuf>,
    /// Print the device nodes the VM's process must be allowed to open instead (`/dev/vfio/vfio`,
    /// `/dev/vfio/<group>`, `/dev/iommu`, `/dev/vfio/devices/vfioN`), read from this host: one
    /// per line, or `-o json` per device.
    #[arg(long, conflicts_with = "inventory")]
    pub device_nodes: bool,
}

/// `export kubevirt` arguments.
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

/// `export vm` arguments.
#[derive(Args, Debug)]
pub struct VmArgs {
    /// The allocation (the JSON/YAML `place` prints, one allocation or several).
    #[arg(long, value_name = "FILE")]
    pub allocation: PathBuf,
    /// With an allocation file holding several: the Machine to describe.
    #[arg(long, value_name = "NAME")]
    pub machine: Option<String>,
    /// The VirtualMachine's name (default: the Machine's).
    #[arg(long, value_name = "NAME")]
    pub name: Option<String>,
    /// Add the guest licensing files (cloud-init) for this NVIDIA client configuration token.
    #[arg(long, value_name = "FILE")]
    pub license_token: Option<PathBuf>,
    /// Look the allocation's node up in this fleet file instead of this host.
    #[arg(long, value_name = "FLEET")]
    pub inventory: Option<PathBuf>,
    /// The resource-name prefix of NVIDIA devices (as given to `export kubevirt`).
    #[arg(long, value_name = "PREFIX", default_value = kubevirt::DEFAULT_PREFIX)]
    pub resource_prefix: String,
}

/// `export cloud-init` arguments.
#[derive(Args, Debug)]
pub struct CloudInitArgs {
    /// The client configuration token (`.tok`) downloaded from the NVIDIA License System.
    #[arg(long, value_name = "FILE")]
    pub license_token: PathBuf,
}

/// `export dra` arguments.
#[derive(Args, Debug)]
pub struct DraArgs {
    /// The DRA driver name.
    #[arg(long, default_value = dra::DEFAULT_DRIVER, value_name = "NAME")]
    pub driver: String,
    /// The Kubernetes version the objects are for: 1.34, 1.35, 1.36 or 1.37.
    #[arg(long, default_value = "1.37", value_name = "VERSION")]
    pub k8s_version: K8sVersion,
    /// A fleet file (JSON or YAML) instead of this host: slices for every node.
    #[arg(long, value_name = "FLEET")]
    pub inventory: Option<PathBuf>,
    /// `pool.generation` of the slices; raise it whenever the published content changes.
    #[arg(long, default_value_t = 1, value_name = "N")]
    pub generation: i64,
    /// Where `gpuslice dra prepare` records what it created (so it is not subtracted twice).
    #[arg(long, value_name = "DIR")]
    pub state_dir: Option<PathBuf>,
    /// Print the example ResourceClaims instead of the slices.
    #[arg(long)]
    pub examples: bool,
}

/// Runs `gpuslice export`.
///
/// # Errors
/// When inputs cannot be read or do not name existing devices.
pub fn run(g: &Global, c: ExportCommand) -> anyhow::Result<ExitCode> {
    match c {
        ExportCommand::Qemu(a) | ExportCommand::Libvirt(a) if a.device_nodes => {
            let devices = handoff_devices(g, &a)?;
            print_device_nodes(g, &devices)?;
        }
        ExportCommand::Qemu(a) => {
            let devices = handoff_devices(g, &a)?;
            if g.output == Output::Json {
                println!(
                    "{}",
                    serde_json::to_string_pretty(&handoff::qemu_args(&devices))?
                );
            } else {
                print!("{}", handoff::qemu_text(&devices));
            }
        }
        ExportCommand::Libvirt(a) => {
            let devices = handoff_devices(g, &a)?;
            print!("{}", handoff::libvirt_xml(&devices));
        }
        ExportCommand::Kubevirt(a) => {
            let (nodes, _) = load_nodes(g, a.inventory.as_deref())?;
            let opts = kubevirt::KubevirtOptions {
                resource_prefix: a.resource_prefix.clone(),
                configured_only: a.configured_only,
            };
            let export = kubevirt::export(&nodes, &opts);
            for w in &export.warnings {
                eprintln!("gpuslice: warning: {w}");
            }
            if g.output == Output::Json {
                println!("{}", serde_json::to_string_pretty(&export.patch)?);
            } else {
                print!("{}", export.to_yaml()?);
            }
        }
        ExportCommand::Vm(a) => crate::cmd::export_vm::run(g, &a)?,
        ExportCommand::CloudInit(a) => {
            let token = std::fs::read(&a.license_token).with_context(|| {
                format!("cannot read license token {}", a.license_token.display())
            })?;
            let name = a.license_token.file_name().and_then(|n| n.to_str());
            let config = cloud_init::license_files(&token, name)
                .with_context(|| format!("license token {}", a.license_token.display()))?;
            // `-o json`: the same document as JSON (for an API field); otherwise the
            // `#cloud-config` YAML cloud-init reads.
            if g.output == Output::Json {
                println!("{}", serde_json::to_string_pretty(&config)?);
            } else {
                print!("{}", cloud_init::to_yaml(&config)?);
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
    if g.output == Output::Json {
        println!("{}", serde_json::to_string_pretty(&per_device)?);
    } else {
        for n in device_nodes::union(&per_device) {
            println!("{n}");
        }
    }
    Ok(())
}

fn handoff_devices(g: &Global, a: &HandoffArgs) -> anyhow::Result<Vec<handoff::VmDevice>> {
    if let Some(uuid) = a.uuid {
        return Ok(vec![handoff::VmDevice::Mdev { uuid }]);
    }
    if let Some(path) = &a.allocation {
        let allocation = read_allocation(path, a.machine.as_deref())?;
        return Ok(handoff::allocation_devices(&allocation));
    }
    let Some(address) = a.address else {
        bail!("name the device with --uuid, --address or --allocation");
    };
    let node = pick_node(g, a.inventory.as_deref())?;
    Ok(handoff::address_devices(&node, &address)?)
}

/// The node to look an address up in: this host, or the `--node` of a fleet file.
fn pick_node(g: &Global, inventory: Option<&Path>) -> anyhow::Result<NodeTopology> {
    // This host is one node, named as `--node` says: the match finds it either way.
    let (nodes, _) = load_nodes(g, inventory)?;
    match (&g.node, nodes.len()) {
        (Some(name), _) => nodes
            .into_iter()
            .find(|n| &n.node == name)
            .with_context(|| format!("node {name} is not in the fleet")),
        (None, 1) => nodes.into_iter().next().context("empty fleet"),
        (None, n) => bail!("the fleet has {n} nodes; name one with --node"),
    }
}

/// Reads the allocation of a file (see [`handoff::allocations_in`]): the only one, or
/// `machine`'s.
pub(crate) fn read_allocation(path: &Path, machine: Option<&str>) -> anyhow::Result<Allocation> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read allocation file {}", path.display()))?;
    let mut allocations = handoff::allocations_in(&text, machine)
        .with_context(|| format!("allocation file {}", path.display()))?;
    match allocations.len() {
        1 => Ok(allocations.remove(0)),
        0 => bail!(
            "allocation file {} holds no allocation{}",
            path.display(),
            machine
                .map(|m| format!(" for machine {m}"))
                .unwrap_or_default()
        ),
        n => bail!(
            "allocation file {} holds {n} allocations; pick one with --machine",
            path.display()
        ),
    }
}

fn export_dra(g: &Global, a: &DraArgs) -> anyhow::Result<()> {
    let objects: Vec<Object> = if a.examples {
        dra::claims::examples(&a.driver)
            .into_iter()
            .map(Object::Claim)
            .collect()
    } else {
        let (nodes, _) = load_nodes(g, a.inventory.as_deref())?;
        let prepared = dra::ClaimStore::open(&g.root, a.state_dir.as_deref())?.read_prepared()?;
        let opts = DraOptions {
            driver: a.driver.clone(),
            version: a.k8s_version,
            generation: a.generation,
            prepared,
        };
        let export = dra::export(&nodes, &opts)?;
        for w in &export.warnings {
            eprintln!("gpuslice: {w}");
        }
        export.objects
    };
    print_objects(g.output, &objects)
}

/// Prints Kubernetes objects as a YAML stream (`---` between documents) or a JSON `List`.
///
/// # Errors
/// A serialization error.
pub fn print_objects(out: Output, objects: &[Object]) -> anyhow::Result<()> {
    if out == Output::Json {
        let mut list = BTreeMap::new();
        list.insert("apiVersion", serde_json::json!("v1"));
        list.insert("kind", serde_json::json!("List"));
        list.insert("items", serde_json::to_value(objects)?);
        println!("{}", serde_json::to_string_pretty(&list)?);
    } else {
        for o in objects {
            print!("---\n{}", yaml::to_string(o)?);
        }
    }
    Ok(())
}
