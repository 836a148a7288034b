//! `gpuslice export vm`: a KubeVirt VirtualMachine fragment for an allocation.

use std::path::PathBuf;

use anyhow::Context;
use clap::Args;

use crate::cmd::handoff::{checked_allocation, read_allocation, target};
use crate::common::{Global, Output};
use gpu_integrations::{cloud_init, kubevirt, kubevirt_vm, yaml};

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
    /// Describe the VM even when one of its devices does not exist on the node or another VM
    /// holds it open (each is then a warning on stderr instead of a refusal).
    #[arg(long)]
    pub force: bool,
    /// The resource-name prefix of NVIDIA devices (as given to `export kubevirt`).
    #[arg(long, value_name = "PREFIX", default_value = kubevirt::DEFAULT_PREFIX)]
    pub resource_prefix: String,
}

/// Runs `gpuslice export vm`. Everything is read and checked (the one hand-off check every
/// export shares) before anything is printed.
///
/// # Errors
/// When the allocation or token cannot be read, or the allocation does not fit the node.
pub fn run(g: &Global, a: &VmArgs) -> anyhow::Result<()> {
    let allocation = read_allocation(&a.allocation, a.machine.as_deref())?;
    let licensing = match &a.license_token {
        Some(path) => {
            let token = std::fs::read(path)
                .with_context(|| format!("cannot read license token {}", path.display()))?;
            let name = path.file_name().and_then(|n| n.to_str());
            Some(
                cloud_init::license_files(&token, name)
                    .with_context(|| format!("license token {}", path.display()))?,
            )
        }
        None => None,
    };
    let target = target(g, a.inventory.as_deref(), Some(&allocation.node)).map_err(|e| {
        if a.inventory.is_some() {
            anyhow::anyhow!(
                "the allocation of Machine {} is for node {}, which the fleet file has not ({e})",
                allocation.machine,
                allocation.node
            )
        } else {
            e
        }
    })?;
    checked_allocation(&target, &allocation, a.force)?;
    let vm = kubevirt_vm::virtual_machine(
        &allocation,
        &target.node,
        a.name.as_deref(),
        &a.resource_prefix,
        licensing.as_ref(),
    )?;
    if g.output == Output::Json {
        println!("{}", serde_json::to_string_pretty(&vm)?);
    } else {
        print!(
            "# KubeVirt VirtualMachine fragment for Machine {} on node {} (gpuslice export vm):\n\
             # merge it into your VirtualMachine; the resource names are those `gpuslice export\n\
             # kubevirt` permits.\n{}",
            allocation.machine,
            allocation.node,
            yaml::to_string(&vm)?
        );
    }
    Ok(())
}
