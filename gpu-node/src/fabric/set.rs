//! Whole GPUs handed out and given back as one set, with the partition whose members they are:
//! one skeleton for both directions ([`bind_set`], [`release_set`]), the writes recorded in the
//! node's intent record so that a set interrupted half-way is seen and undone
//! ([`crate::recover`]).

use gpu_core::{NodeTopology, PciAddress};
use gpu_sysfs::actuate::GpuBinding;

use super::{FabricError, FabricNode, Partition, Read, SetBinding, record, relisted, set_active};
use crate::intent::{self, Intent, Planned};
use crate::{Locked, Node, NodeError};

const CHECK: &str = "`gpuslice fabric list` and `gpuslice gpu list` (a partition may be active, or GPUs on vfio-pci, that no VM owns)";

/// Which way a set goes.
#[derive(Clone, Copy)]
enum Hand {
    /// To vfio-pci, the partition activated first.
    Bind,
    /// Back to the host driver, the partition deactivated after.
    Release { force: bool },
}

impl Hand {
    fn on_node(self, node: &Node<'_>, g: &PciAddress) -> Result<GpuBinding, NodeError> {
        match self {
            Hand::Bind => node.bind_gpu(g),
            Hand::Release { force } => node.release_gpu(g, force),
        }
    }

    fn locked(self, locked: &Locked<'_, '_>, g: &PciAddress) -> Result<GpuBinding, NodeError> {
        match self {
            Hand::Bind => locked.bind_gpu(g),
            Hand::Release { force } => locked.release_gpu(g, force),
        }
    }

    /// Whether the partition changes with the set: activated with a bind when it is not yet,
    /// deactivated with a release when it is.
    fn switches(self, p: &Partition) -> bool {
        match self {
            Hand::Bind => !p.active,
            Hand::Release { .. } => p.active,
        }
    }

    /// The intent of the set's writes; a bind names what it makes (the activation, each GPU
    /// on vfio-pci), so that a bind killed half-way is undone in the reverse order.
    fn intent(
        self,
        t: &NodeTopology,
        p: &Partition,
        gpus: &[PciAddress],
        switching: bool,
    ) -> Intent {
        let names: Vec<String> = gpus.iter().map(|a| super::name_in(t, a)).collect();
        let names = names.join(", ");
        match self {
            Hand::Bind => {
                let mut creates = Vec::with_capacity(gpus.len() + 1);
                if switching {
                    creates.push(Planned::FabricPartition { id: p.id });
                }
                creates.extend(gpus.iter().map(|g| Planned::GpuBind { gpu: *g }));
                let what = format!("bind {names} to vfio-pci with partition {} activated", p.id);
                Intent::new("bind-gpu-set", what, CHECK).creating(creates)
            }
            Hand::Release { .. } => {
                let what = format!("release {names} and deactivate partition {}", p.id);
                Intent::new("release-gpu-set", what, CHECK)
            }
        }
    }
}

/// The partition a set of whole GPUs must be on this node, by the one rule
/// ([`gpu_core::Fabric::partition_for_set`]): `Ok(None)` where the node needs none (no
/// NVSwitch, bare-metal mode, or one GPU while Fabric Manager cannot be reached, with a
/// warning).
fn partition_for<'r>(
    r: &'r Read,
    gpus: &[PciAddress],
    warnings: &mut Vec<String>,
) -> Result<Option<&'r Partition>, FabricError> {
    let found = super::claim_partition(&r.topology, gpus)?;
    if found.is_none()
        && gpus.len() == 1
        && r.topology
            .fabric
            .as_ref()
            .is_some_and(|f| f.requires_partitions())
        && let Err(e) = r.fm()
    {
        warnings.push(format!("{e}; the GPU is bound alone, without NVLink peers"));
    }
    Ok(found)
}

/// Binds the whole GPUs `gpus` to vfio-pci as one set: on an NVSwitch host the set must be
/// exactly one partition's members, which is activated first; a bind that fails undoes the
/// binds before it and the activation.
///
/// # Errors
/// [`FabricError::NotAPartition`], [`FabricError::Degraded`] and [`FabricError::Unreachable`]
/// before anything is written; [`FabricError::InUse`], [`FabricError::Fm`],
/// [`FabricError::Node`].
pub fn bind_set<'h>(
    on: impl Into<FabricNode<'h>>,
    gpus: &[PciAddress],
) -> Result<SetBinding, FabricError> {
    hand_set(&on.into(), gpus, Hand::Bind)
}

/// Gives the whole GPUs `gpus` back to their host driver as one set, then deactivates the
/// partition whose members they are (when it is active).
///
/// # Errors
/// [`FabricError::NotAPartition`] before anything is written; [`FabricError::Fm`],
/// [`FabricError::Node`].
pub fn release_set<'h>(
    on: impl Into<FabricNode<'h>>,
    gpus: &[PciAddress],
    force: bool,
) -> Result<SetBinding, FabricError> {
    hand_set(&on.into(), gpus, Hand::Release { force })
}

fn hand_set(
    f: &FabricNode<'_>,
    gpus: &[PciAddress],
    hand: Hand,
) -> Result<SetBinding, FabricError> {
    let r = f.read()?;
    let mut warnings = Vec::new();
    let partition = partition_for(&r, gpus, &mut warnings)?;
    let node = f.node;
    let Some(p) = partition else {
        let done = gpus
            .iter()
            .map(|g| hand.on_node(&node, g))
            .collect::<Result<Vec<_>, _>>()?;
        return Ok(SetBinding {
            partition: None,
            gpus: done,
            warnings,
        });
    };
    let switching = hand.switches(p);
    if switching && matches!(hand, Hand::Bind) {
        r.check_members(node.host(), p, true)?;
    }
    let fm = r.fm()?;
    let host = node.host();
    let done = {
        let locked = node.lock()?;
        let intent = hand.intent(&r.topology, p, gpus, switching);
        intent::around(
            host,
            intent,
            |_| Vec::new(),
            || {
                let mut done = Vec::with_capacity(gpus.len());
                if switching && matches!(hand, Hand::Bind) {
                    set_active(fm.as_ref(), p.id, true)?;
                    record::note(host, p.id, true);
                }
                for g in gpus {
                    match hand.locked(&locked, g) {
                        Ok(b) => done.push(b),
                        Err(e) if matches!(hand, Hand::Bind) => {
                            // Undo: the GPUs bound so far, then the activation. The first failure
                            // is the answer; what the undo could not do is left for `gpu release`.
                            for b in done.iter().filter(|b: &&GpuBinding| b.changed()) {
                                let _ = locked.release_gpu(&b.gpu, false);
                            }
                            if switching && fm.deactivate(p.id).is_ok() {
                                record::note(host, p.id, false);
                            }
                            return Err(e.into());
                        }
                        Err(e) => return Err(e.into()),
                    }
                }
                if switching && matches!(hand, Hand::Release { .. }) {
                    set_active(fm.as_ref(), p.id, false)?;
                    record::note(host, p.id, false);
                }
                Ok::<_, FabricError>(done)
            },
        )?
    };
    Ok(SetBinding {
        partition: Some(relisted(f, p.id, switching)?),
        gpus: done,
        warnings,
    })
}
