//! `gpuslice export vm`: a KubeVirt VirtualMachine fragment for an allocation.

use std::path::PathBuf;

use clap::Args;

use crate::cmd::handoff::{checked_allocation, read_allocation, target};
use crate::common::{Global, Output};
use gpu_integrations::dra::DEFAULT_DRIVER;
use gpu_integrations::{kubevirt, kubevirt_vm};

// `export vm` arguments.
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
    /// Describe the VM even when one of its devices does not exist on the node or another VM
    /// holds it open (each is then a warning on stderr instead of a refusal).
    #[arg(long)]
    pub force: bool,
    /// The resource-name prefix of NVIDIA devices (as given to `export kubevirt`).
    #[arg(long, value_name = "PREFIX", default_value = kubevirt::DEFAULT_PREFIX)]
    pub resource_prefix: String,
    /// The DRA form: a ResourceClaimTemplate for the devices (DeviceClasses `gpu` and `vgpu` of
    /// `export dra`) and a VirtualMachine naming them by `claimName` and `requestName`
    /// (KubeVirt 1.9, feature gates GPUsWithDRA and HostDevicesWithDRA).
    #[arg(long, conflicts_with = "resource_prefix")]
    pub dra: bool,
    /// With `--dra`: the DRA driver name the devices are published under.
    #[arg(long, value_name = "NAME", default_value = DEFAULT_DRIVER, requires = "dra")]
    pub driver: String,
}

/// Runs `gpuslice export vm`. Everything is read and checked (the one hand-off check every
/// export shares) before anything is printed.
pub fn run(g: &Global, a: &VmArgs) -> anyhow::Result<()> {
    let allocation = read_allocation(g, &a.allocation, a.machine.as_deref())?;
    let licensing = a
        .license_token
        .as_deref()
        .map(super::handoff::license)
        .transpose()?;
    let target = target(g, a.inventory.as_deref(), Some(&allocation.node)).map_err(|e| {
        if a.inventory.is_none() {
            return e;
        }
        let (machine, node) = (&allocation.machine, &allocation.node);
        anyhow::anyhow!(
            "the allocation of Machine {machine} is for node {node}, which the fleet file has not ({e})"
        )
    })?;
    checked_allocation(&target, &allocation, a.force)?;
    let (name, json) = (a.name.as_deref(), g.output == Output::Json);
    let text = if a.dra {
        let (vm, template) = kubevirt_vm::dra_virtual_machine(
            &allocation,
            &target.node,
            name,
            &a.driver,
            licensing.as_ref(),
        )?;
        kubevirt_vm::dra_document(&allocation, &vm, &template, json)?
    } else {
        let prefix = &a.resource_prefix;
        let vm = kubevirt_vm::virtual_machine(
            &allocation,
            &target.node,
            name,
            prefix,
            licensing.as_ref(),
        )?;
        kubevirt_vm::vm_document(&allocation, &vm, json)?
    };
    print!("{text}");
    Ok(())
}
