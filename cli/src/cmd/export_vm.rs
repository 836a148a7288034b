//! `gpuslice export vm`: a KubeVirt VirtualMachine fragment for an allocation.

use anyhow::{Context, bail};

use crate::cmd::export::{VmArgs, read_allocation};
use crate::common::load_nodes;
use crate::common::{Global, Output};
use gpu_integrations::{cloud_init, kubevirt_vm, yaml};

/// Runs `gpuslice export vm`. Everything is read and checked before anything is printed.
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
    let (nodes, _) = load_nodes(g, a.inventory.as_deref())?;
    let node = if a.inventory.is_some() {
        let Some(n) = nodes.iter().find(|n| n.node == allocation.node) else {
            bail!(
                "the allocation of Machine {} is for node {}, which the fleet file has not",
                allocation.machine,
                allocation.node
            );
        };
        n
    } else {
        let Some(n) = nodes.first() else {
            bail!("discovery returned no node");
        };
        if n.node != allocation.node {
            bail!(
                "the allocation of Machine {} is for node {}, but this host is node {} (pass \
                 --node {} if that is this host's name, or --inventory FLEET)",
                allocation.machine,
                allocation.node,
                n.node,
                allocation.node
            );
        }
        n
    };
    let vm = kubevirt_vm::virtual_machine(
        &allocation,
        node,
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
