//! What a node hands to a VM, checked: the allocation a document holds, the node it is checked
//! against (this host, or a fleet file's node), and the one hand-off check
//! ([`gpu_integrations::handoff::allocation_handoff`] / [`gpu_integrations::handoff::check_devices`])
//! that `export qemu|libvirt`, `export vm` and [`crate::Node::realize`] share.

use std::path::{Path, PathBuf};

use gpu_core::{Allocation, ClassifiedError, ErrorKind, NodeTopology, PciAddress};
use gpu_integrations::IntegrationError;
use gpu_integrations::handoff::{self, VmDevice};

/// Why a hand-off was refused before or at its check.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum HandoffError {
    /// The fleet file has no node of that name.
    #[error("node {name} is not in the fleet file {}", .fleet.display())]
    NotInFleet {
        /// The node asked for.
        name: String,
        /// The fleet file.
        fleet: PathBuf,
    },
    /// The fleet has several nodes (or none) and none was named.
    #[error("the fleet has {nodes} nodes; name one with --node")]
    NodeNotNamed {
        /// How many nodes the fleet has.
        nodes: usize,
    },
    /// The allocation is for another node than this host.
    #[error(
        "the allocation of Machine {machine} is for node {node}, but this host is node {this} \
         (pass --node {node} if that is this host's name, or --inventory FLEET)"
    )]
    OtherNode {
        /// The Machine.
        machine: String,
        /// The allocation's node.
        node: String,
        /// This host's node name.
        this: String,
    },
    /// The allocation document does not decode.
    #[error("allocation file {}", .path.display())]
    Decode {
        /// The document.
        path: PathBuf,
        /// Why it does not decode.
        #[source]
        source: gpu_core::CoreError,
    },
    /// The document holds no allocation (for the Machine named).
    #[error("allocation file {} holds no allocation{}", .path.display(), for_machine(.machine))]
    NoAllocation {
        /// The document.
        path: PathBuf,
        /// The Machine asked for.
        machine: Option<String>,
    },
    /// The document holds several allocations and no Machine was named.
    #[error("allocation file {} holds {count} allocations; pick one with --machine", .path.display())]
    SeveralAllocations {
        /// The document.
        path: PathBuf,
        /// How many it holds.
        count: usize,
    },
    /// The hand-off check refused a device.
    #[error(transparent)]
    Check(#[from] IntegrationError),
}

fn for_machine(machine: &Option<String>) -> String {
    machine
        .as_ref()
        .map(|m| format!(" for machine {m}"))
        .unwrap_or_default()
}

impl ClassifiedError for HandoffError {
    fn kind(&self) -> ErrorKind {
        // The command line's own refusals (as before they were typed) are of no library kind.
        self.inner().map_or(ErrorKind::Other, |e| e.kind())
    }

    fn errno(&self) -> Option<i32> {
        self.inner().and_then(|e| e.errno())
    }

    fn detail(&self) -> gpu_core::ErrorDetail {
        self.inner()
            .map_or(gpu_core::ErrorDetail::None, |e| e.detail())
    }
}

impl HandoffError {
    /// The library error inside, whose kind, errno and detail this one gives.
    fn inner(&self) -> Option<&dyn ClassifiedError> {
        match self {
            HandoffError::Decode { source, .. } => Some(source),
            HandoffError::Check(source) => Some(source),
            _ => None,
        }
    }
}

/// The allocation of a document's text (see [`handoff::allocations_in`]): the only one, or
/// `machine`'s. `path` names the document in messages.
///
/// # Errors
/// [`HandoffError::Decode`], [`HandoffError::NoAllocation`], [`HandoffError::SeveralAllocations`].
pub fn one_allocation(
    text: &str,
    machine: Option<&str>,
    path: &Path,
) -> Result<Allocation, HandoffError> {
    let mut allocations =
        handoff::allocations_in(text, machine).map_err(|source| HandoffError::Decode {
            path: path.to_owned(),
            source,
        })?;
    match allocations.len() {
        1 => Ok(allocations.remove(0)),
        0 => Err(HandoffError::NoAllocation {
            path: path.to_owned(),
            machine: machine.map(str::to_owned),
        }),
        count => Err(HandoffError::SeveralAllocations {
            path: path.to_owned(),
            count,
        }),
    }
}

/// The node a hand-off is checked against, and this host when it is this host (for the
/// processes holding devices open).
pub struct CheckedNode {
    /// The node's topology.
    pub node: NodeTopology,
    /// This host, when the node is this host.
    pub host: Option<gpu_sysfs::OpenedRoot>,
}

impl CheckedNode {
    /// This host, composed.
    pub fn this_host(composed: crate::ComposedNode) -> Self {
        CheckedNode {
            node: composed.topology,
            host: Some(composed.host),
        }
    }

    /// The node of a fleet (read from `fleet`) named `want`, or its only node.
    ///
    /// # Errors
    /// [`HandoffError::NotInFleet`], [`HandoffError::NodeNotNamed`].
    pub fn of_fleet(
        nodes: Vec<NodeTopology>,
        fleet: &Path,
        want: Option<&str>,
    ) -> Result<Self, HandoffError> {
        let node = match (want, nodes.len()) {
            (Some(name), _) => nodes.into_iter().find(|n| n.node == name).ok_or_else(|| {
                HandoffError::NotInFleet {
                    name: name.to_owned(),
                    fleet: fleet.to_owned(),
                }
            })?,
            (None, 1) => nodes
                .into_iter()
                .next()
                .ok_or(HandoffError::NodeNotNamed { nodes: 0 })?,
            (None, n) => return Err(HandoffError::NodeNotNamed { nodes: n }),
        };
        Ok(CheckedNode { node, host: None })
    }

    /// The host to look for holders on.
    pub fn host(&self) -> Option<&dyn gpu_sysfs::Host> {
        self.host.as_ref().map(|h| h.host())
    }

    /// The one check of `allocation` for a hand-off now: the allocation is for this node, fits
    /// it, and each device exists and is not another owner's (`force`: warned only). Returns the
    /// devices and the warnings.
    ///
    /// # Errors
    /// [`HandoffError::OtherNode`] where the node is this host under another name; the check's
    /// refusal.
    pub fn allocation(
        &self,
        allocation: &Allocation,
        force: bool,
    ) -> Result<(Vec<VmDevice>, Vec<String>), HandoffError> {
        if self.host.is_some() && allocation.node != self.node.node {
            return Err(HandoffError::OtherNode {
                machine: allocation.machine.clone(),
                node: allocation.node.clone(),
                this: self.node.node.clone(),
            });
        }
        Ok(handoff::allocation_handoff(
            allocation,
            &self.node,
            self.host(),
            force,
        )?)
    }

    /// The devices at `address` (a whole GPU with its companion functions, or a VF), checked as
    /// [`CheckedNode::devices`]; with `force` an address that is neither is handed off as it is
    /// (the check then says what it is not, and still refuses a blocked GPU). Returns the
    /// devices and the warnings.
    ///
    /// # Errors
    /// What the address is not (without `force`); the check's refusal.
    pub fn address(
        &self,
        address: &PciAddress,
        force: bool,
    ) -> Result<(Vec<VmDevice>, Vec<String>), HandoffError> {
        let devices = match handoff::address_devices(&self.node, address) {
            Ok(d) => d,
            Err(_) if force => vec![VmDevice::Pci { address: *address }],
            Err(e) => return Err(e.into()),
        };
        let warnings = self.devices(&devices, force)?;
        Ok((devices, warnings))
    }

    /// [`handoff::check_devices`] on `devices`: the warnings.
    ///
    /// # Errors
    /// The check's refusal.
    pub fn devices(&self, devices: &[VmDevice], force: bool) -> Result<Vec<String>, HandoffError> {
        Ok(handoff::check_devices(
            &self.node,
            devices,
            self.host(),
            force,
        )?)
    }
}
