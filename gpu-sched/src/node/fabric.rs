//! NVSwitch partitions in placement: on a node whose GPUs sit on a fabric that activates
//! partitions (Fabric Manager in shared NVSwitch or vGPU mode), a request for N whole GPUs gets
//! the members of one N-GPU partition, all free and the partition healthy. Among those that
//! would do, the choice leaves the most larger partitions whole (a larger partition is whole
//! while every member is free): it breaks as few whole partitions as it can, the largest
//! counted first, and otherwise packs next to GPUs already taken. `first-fit` takes the lowest
//! partition ID instead (the baseline `benches/RESULTS-fabric.md` measures against).
//!
//! Nodes without a fabric, and fabrics in bare-metal mode, place exactly as before.

use std::cmp::Reverse;
use std::sync::Arc;

use gpu_core::{Fabric, Gpu};

use super::NodeState;
use crate::policy::Policy;
use crate::refusal::{Reason, ReasonKind};
use crate::resolve::Req;

/// One partition with its members as indices into the node's GPUs.
#[derive(Debug)]
pub(crate) struct PartIx {
    /// Place in [`Fabric::partitions`].
    at: usize,
    /// Members' GPU indices; `None` when a member is not among the node's GPUs (or past the
    /// 64th).
    members: Option<Box<[u16]>>,
    /// The members as a bit per GPU index.
    bits: u64,
}

/// A node's fabric and its partitions indexed by GPU, shared by the nodes of one baseboard.
#[derive(Debug)]
pub(crate) struct FabricIx {
    pub fabric: Fabric,
    /// Addresses of the GPUs the index was built over.
    addresses: Box<[gpu_core::PciAddress]>,
    parts: Box<[PartIx]>,
    /// `(size, members as a bit per GPU index)` of the healthy partitions whose members are all
    /// on the node among its first 64 GPUs: the cheap test a search runs before fitting.
    masks: Box<[(u32, u64)]>,
    /// The partition sizes, largest first.
    sizes: Box<[usize]>,
}

impl FabricIx {
    pub(crate) fn new(fabric: Fabric, gpus: &[Arc<Gpu>]) -> Self {
        let parts: Box<[PartIx]> = fabric
            .partitions
            .iter()
            .enumerate()
            .map(|(at, p)| {
                let members: Option<Box<[u16]>> = p
                    .addresses
                    .iter()
                    .map(|a| {
                        gpus.iter()
                            .position(|g| g.address == *a)
                            .and_then(|i| u16::try_from(i).ok())
                            .filter(|&i| i < 64)
                    })
                    .collect();
                let bits = members
                    .as_deref()
                    .map_or(0, |m| m.iter().fold(0u64, |acc, &g| acc | (1u64 << g)));
                PartIx { at, members, bits }
            })
            .collect();
        let masks = parts
            .iter()
            .filter(|p| fabric.partitions[p.at].is_healthy())
            .filter_map(|p| {
                let m = p.members.as_deref()?;
                Some((u32::try_from(m.len()).ok()?, p.bits))
            })
            .collect();
        let mut sizes = fabric.sizes();
        sizes.reverse();
        FabricIx {
            sizes: sizes.into_boxed_slice(),
            addresses: gpus.iter().map(|g| g.address).collect(),
            fabric,
            parts,
            masks,
        }
    }

    /// Built from an equal fabric over GPUs at the same addresses.
    pub(crate) fn same(&self, fabric: &Fabric, gpus: &[Arc<Gpu>]) -> bool {
        self.addresses.len() == gpus.len()
            && self
                .addresses
                .iter()
                .zip(gpus)
                .all(|(a, g)| *a == g.address)
            && self.fabric == *fabric
    }
}

/// Why a partition of the wanted size could not be used.
#[derive(Debug, Clone, Copy)]
enum Busy {
    Degraded,
    /// These members (a bit per GPU index) are in use or filtered out.
    Unusable(u64),
    Numa,
}

/// What the fabric says about a request for whole GPUs.
pub(super) enum PartitionFit {
    /// The fabric does not constrain it (no fabric, bare-metal mode, or one GPU without FM).
    Free,
    /// These GPUs (one partition's members).
    Chosen(Vec<usize>),
    /// No partition would do.
    Refused(Reason),
}

/// In [`NodeState::part_cost`]: no free partition of the size.
pub(crate) const NO_PARTITION: u32 = u32::MAX;

impl NodeState {
    /// The fabric index when placement must hand out partitions here: the fabric activates
    /// them, Fabric Manager is reachable and the node has at most 64 GPUs (the bit masks).
    fn partition_ix(&self) -> Option<&FabricIx> {
        let ix = self.topo.fabric.as_deref()?;
        (ix.fabric.requires_partitions()
            && ix.fabric.fabric_manager.is_reachable()
            && self.gpus.len() <= 64)
            .then_some(ix)
    }

    /// The entries of [`NodeState::part_cost`], one per partition size, not yet computed.
    pub(super) fn partition_sizes(&self) -> Box<[(u32, u32)]> {
        let Some(ix) = self.partition_ix() else {
            return Box::default();
        };
        let mut sizes: Vec<(u32, u32)> = ix
            .sizes
            .iter()
            .filter_map(|&s| Some((u32::try_from(s).ok()?, NO_PARTITION)))
            .collect();
        sizes.sort_unstable();
        sizes.dedup();
        sizes.into_boxed_slice()
    }

    /// Recomputes [`NodeState::part_cost`] from the free GPUs: per size, over the healthy free
    /// partitions of that size, the least "largest whole larger partition it would break" (0:
    /// it breaks none), or [`NO_PARTITION`] when none of that size is free.
    pub(super) fn partition_costs(&mut self) {
        if self.part_cost.is_empty() {
            return;
        }
        let Some(ix) = self.topo.fabric.as_deref() else {
            return;
        };
        let free = self
            .gpus
            .iter()
            .take(64)
            .enumerate()
            .filter(|(_, g)| g.free_whole())
            .fold(0u64, |acc, (i, _)| acc | (1u64 << i));
        for (size, cost) in self.part_cost.iter_mut() {
            *cost = NO_PARTITION;
            for &(s, bits) in ix.masks.iter() {
                if s != *size || bits & !free != 0 {
                    continue;
                }
                let broken = ix
                    .masks
                    .iter()
                    .filter(|&&(big, b)| big > s && b & bits != 0 && b & !free == 0)
                    .map(|&(big, _)| big)
                    .max()
                    .unwrap_or(0);
                *cost = (*cost).min(broken);
            }
        }
    }

    /// False when the node's fabric alone rules a whole-GPU request of the Machine out: no
    /// healthy partition of its size has every member free (a cheap necessary test, run before
    /// fitting while searching; nodes without a fabric always pass).
    pub(crate) fn fabric_may_fit(&self, m: &crate::resolve::Resolved) -> bool {
        let Some(ix) = self.topo.fabric.as_deref() else {
            return true;
        };
        let f = &ix.fabric;
        if !f.requires_partitions() || self.gpus.len() > 64 {
            return true;
        }
        let free = self
            .gpus
            .iter()
            .enumerate()
            .filter(|(_, g)| g.free_whole())
            .fold(0u64, |acc, (i, _)| acc | (1u64 << i));
        let set = self.machine_set_size(m);
        m.reqs.iter().all(|r| match &r.kind {
            crate::resolve::Kind::Whole { .. } if !f.fabric_manager.is_reachable() => r.wanted <= 1,
            crate::resolve::Kind::Whole { .. } => {
                let want = u32::try_from(set).unwrap_or(u32::MAX).max(r.wanted);
                ix.masks
                    .iter()
                    .any(|&(size, bits)| size == want && bits & !free == 0)
            }
            crate::resolve::Kind::Vgpu { .. } => true,
        })
    }

    /// On a node whose fabric activates partitions (Fabric Manager reachable), the whole GPUs
    /// of all of a Machine's whole-GPU requests when it has several: they are one set, one
    /// partition of that size. 0 otherwise (each request is its own set, or none is needed).
    pub(super) fn machine_set_size(&self, m: &crate::resolve::Resolved) -> usize {
        let Some(ix) = self.topo.fabric.as_deref() else {
            return 0;
        };
        if !ix.fabric.requires_partitions() || !ix.fabric.fabric_manager.is_reachable() {
            return 0;
        }
        let whole = m
            .reqs
            .iter()
            .filter(|r| matches!(r.kind, crate::resolve::Kind::Whole { .. }));
        if whole.clone().count() < 2 {
            return 0;
        }
        whole.map(|r| r.wanted as usize).sum()
    }

    /// The partition a request for `r.wanted` whole GPUs gets among `cands` (GPUs passing every
    /// filter and free, with whether each was named), which must hold every GPU in `named`.
    ///
    /// `size` is the partition's size: `r.wanted`, or more when the request is one of several
    /// whole-GPU requests of a Machine that share one partition; then the members beyond the
    /// `r.wanted` this request takes need only be free (the Machine's other requests take them).
    pub(super) fn fit_partition(
        &self,
        r: &Req,
        size: usize,
        cands: &[(usize, bool)],
        named: &[usize],
        taken: &[usize],
        policy: Policy,
    ) -> PartitionFit {
        let Some(ix) = self.topo.fabric.as_deref() else {
            return PartitionFit::Free;
        };
        let fabric = &ix.fabric;
        if !fabric.requires_partitions() {
            return PartitionFit::Free;
        }
        let n = size;
        let need = (r.wanted as usize).min(n);
        if !fabric.fabric_manager.is_reachable() {
            if n <= 1 {
                return PartitionFit::Free;
            }
            let mut reason = Reason::new(ReasonKind::FabricUnreachable, &r.name, r.wanted, 0);
            reason.partitions = fabric.fabric_manager.reason.iter().cloned().collect();
            return PartitionFit::Refused(reason);
        }
        let bits_of = |gs: &mut dyn Iterator<Item = usize>| {
            gs.filter(|&g| g < 64)
                .fold(0u64, |acc, g| acc | (1u64 << g))
        };
        let cand_bits = bits_of(&mut cands.iter().map(|c| c.0));
        let free_bits =
            bits_of(&mut (0..self.gpus.len().min(64)).filter(|&g| self.gpus[g].free_whole()));
        let open_bits = free_bits & !bits_of(&mut taken.iter().copied());
        let named_bits = bits_of(&mut named.iter().copied());
        let numa_of = |g: u16| self.topo.gpus[usize::from(g)].numa_node;
        // The larger sizes, largest first, are the leading entries of `ix.sizes`.
        let larger = ix.sizes.iter().take_while(|&&s| s > n).count();
        // Why each partition of the size could not be used, spelt out only on a refusal.
        let mut busy: Vec<(usize, Busy)> = Vec::new();
        let mut best: Option<(u64, Reverse<u32>, u32, &PartIx)> = None;
        for p in ix.parts.iter() {
            let part = &fabric.partitions[p.at];
            if part.size() != n || p.members.is_none() || named_bits & !p.bits != 0 {
                continue;
            }
            if !part.is_healthy() {
                busy.push((p.at, Busy::Degraded));
                continue;
            }
            let usable = if need == n {
                p.bits & !cand_bits
            } else {
                p.bits & !open_bits
            };
            if usable != 0 || ((p.bits & cand_bits).count_ones() as usize) < need {
                busy.push((p.at, Busy::Unusable(usable | (p.bits & !cand_bits))));
                continue;
            }
            let members = p.members.as_deref().unwrap_or_default();
            if r.numa && members.iter().any(|&g| numa_of(g) != numa_of(members[0])) {
                busy.push((p.at, Busy::Numa));
                continue;
            }
            let key = if policy == Policy::FirstFit {
                (0, Reverse(0), part.id, p)
            } else {
                // Whole larger partitions this one would break, per size, largest size first
                // (a byte per size, the largest in the top byte, so comparing the numbers
                // compares the counts size by size; the eight largest sizes count); then the
                // GPUs already used in the larger partitions it touches (more is better: it
                // packs next to them).
                let mut broken = 0u64;
                let mut used_near = 0u32;
                for q in ix.parts.iter() {
                    let big = &fabric.partitions[q.at];
                    if big.size() <= n || q.members.is_none() || q.bits & p.bits == 0 {
                        continue;
                    }
                    if big.is_healthy() && q.bits & !open_bits == 0 {
                        let at = ix.sizes.iter().position(|&s| s == big.size());
                        if let Some(shift) = at.filter(|&a| a < larger.min(8)).map(|a| 8 * (7 - a))
                        {
                            let byte = (broken >> shift) & 0xff;
                            if byte < 0xff {
                                broken += 1u64 << shift;
                            }
                        }
                    } else {
                        used_near += (q.bits & !free_bits).count_ones();
                    }
                }
                (broken, Reverse(used_near), part.id, p)
            };
            if best
                .as_ref()
                .is_none_or(|b| (key.0, key.1, key.2) < (b.0, b.1, b.2))
            {
                best = Some(key);
            }
        }
        match best {
            Some((_, _, _, p)) => PartitionFit::Chosen(
                p.members
                    .as_deref()
                    .unwrap_or_default()
                    .iter()
                    .map(|&g| usize::from(g))
                    .collect(),
            ),
            None => {
                let mut why: Vec<String> = busy
                    .into_iter()
                    .map(|(at, b)| self.busy_text(&fabric.partitions[at], b))
                    .collect();
                if why.is_empty() {
                    why.push(self.no_partition_of(n, named));
                }
                let mut reason = Reason::new(ReasonKind::NoFreePartition, &r.name, r.wanted, 0);
                reason.partitions = why;
                reason.gpus = named
                    .iter()
                    .map(|&g| self.topo.gpus[g].name.clone())
                    .collect();
                PartitionFit::Refused(reason)
            }
        }
    }

    /// How a refusal says why partition `p` could not be used.
    fn busy_text(&self, p: &gpu_core::Partition, why: Busy) -> String {
        match why {
            Busy::Degraded => format!(
                "{}: degraded ({})",
                p.describe(),
                p.degraded.as_deref().unwrap_or_default()
            ),
            Busy::Numa => format!("{}: spans NUMA nodes", p.describe()),
            Busy::Unusable(bits) => {
                let names: Vec<&str> = (0..self.topo.gpus.len().min(64))
                    .filter(|&g| bits & (1u64 << g) != 0)
                    .map(|g| self.topo.gpus[g].name.as_str())
                    .collect();
                format!(
                    "{}: {} in use or filtered out",
                    p.describe(),
                    names.join(", ")
                )
            }
        }
    }

    /// Why no partition of `n` GPUs was even considered: none of that size, or none holding
    /// every GPU the request names (with the ones that would do).
    fn no_partition_of(&self, n: usize, named: &[usize]) -> String {
        let Some(ix) = self.topo.fabric.as_deref() else {
            return String::new();
        };
        let f = &ix.fabric;
        if f.of_size(n).next().is_none() || named.is_empty() {
            let sizes: Vec<String> = f.sizes().iter().map(ToString::to_string).collect();
            return format!(
                "no {n}-GPU partition on the node; sizes {}",
                if sizes.is_empty() {
                    "none".to_owned()
                } else {
                    sizes.join(", ")
                }
            );
        }
        let gpus: Vec<&gpu_core::Gpu> = named.iter().map(|&g| &*self.topo.gpus[g]).collect();
        let addrs: Vec<gpu_core::PciAddress> = gpus.iter().map(|g| g.address).collect();
        let names: Vec<&str> = gpus.iter().map(|g| g.name.as_str()).collect();
        let mut would = f.would_do(&addrs);
        would.sort_by_key(|p| p.id);
        format!(
            "no {n}-GPU partition holds {}; would do: {}",
            names.join(", "),
            Fabric::describe_all(would)
        )
    }
}
