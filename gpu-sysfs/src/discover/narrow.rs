//! Re-reading only what changed: one mdev parent's GPU (its parents' types, their instances and
//! the GPU's pool) or one PCI GPU, spliced into a topology read before. What the narrow read
//! cannot place (a device that is not in the topology, a change that moves parents, VFs or
//! pools) gives `None`, and the caller reads the whole host again with [`super::discover`].
//!
//! The result equals what a full discovery of the host would give, except for the health of
//! the changed devices, which is carried over from `cached` (the health crate grades afterwards).

use std::collections::BTreeSet;

use gpu_core::{MdevUuid, NodeTopology, ParentId, PciAddress, VgpuFramework};

use super::pci::{self, PciTable};
use super::vgpu::{self, FactsCache, MDEV_BUS, MDEV_DEVICES};
use super::{DiscoverOptions, hardware_iommu_present, pools, read, settle_gpu};
use crate::host::Host;

/// What a kernel event changed, as far as discovery is concerned.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum Change {
    /// An mdev instance of this parent (its `mdev_bus` entry: `mbochs`, `0000:08:00.4`) or one of
    /// its type directories appeared, went or changed.
    MdevParent(String),
    /// A PCI function was bound to or unbound from a driver, or changed.
    Pci(PciAddress),
}

/// `cached` with the devices `changes` name read again, or `None` when a change cannot be
/// placed in it (then read the whole host).
pub fn rediscover(
    host: &dyn Host,
    opts: &DiscoverOptions,
    cached: &NodeTopology,
    changes: &[Change],
) -> Option<NodeTopology> {
    // A parent selection hides parents the pools still count: only the full read knows them.
    if opts.mdev_parents.is_some() {
        return None;
    }
    let mut topo = cached.clone();
    let mut done_pools: BTreeSet<ParentId> = BTreeSet::new();
    let changes: BTreeSet<&Change> = changes.iter().collect();
    for c in changes {
        match c {
            Change::MdevParent(entry) => {
                mdev_parent(host, opts, &mut topo, entry, &mut done_pools)?;
            }
            Change::Pci(a) => pci_gpu(host, &mut topo, a)?,
        }
    }
    Some(topo)
}

/// Reads again every mdev parent of the GPU (or virtual parent) that `entry` belongs to: the
/// types, the instances and the pool they share.
fn mdev_parent(
    host: &dyn Host,
    opts: &DiscoverOptions,
    topo: &mut NodeTopology,
    entry: &str,
    done: &mut BTreeSet<ParentId>,
) -> Option<()> {
    let parents = &topo.mediated_devices.parents;
    let target = parents
        .iter()
        .find(|p| p.framework == VgpuFramework::Mdev && p.id.to_string() == entry)?;
    let key = target.pool_key();
    if !done.insert(key.clone()) {
        return Some(());
    }
    if parents
        .iter()
        .any(|p| p.pool_key() == key && p.framework != VgpuFramework::Mdev)
    {
        return None;
    }
    let members: Vec<usize> = (0..parents.len())
        .filter(|i| parents[*i].pool_key() == key)
        .collect();
    let mut node_warnings = Vec::new();
    let mut table = PciTable::scan(host, &[], &mut node_warnings);
    let mut facts = FactsCache::new();
    let mut fresh = Vec::new();
    for i in &members {
        let old = &parents[*i];
        let (gpu, driver_key) = vgpu::parent_identity(&mut table, &old.id);
        if gpu != old.gpu {
            return None;
        }
        let entry = old.id.to_string();
        let mut p =
            vgpu::read_mdev_parent(host, &entry, old.id.clone(), gpu, &driver_key, &mut facts);
        p.health = old.health.clone();
        fresh.push((p, driver_key));
    }
    // Instances after every parent's types, as the full read does: a type may be listed by a
    // sibling only.
    for (p, driver_key) in &mut fresh {
        let dir = format!("{MDEV_BUS}/{}", p.id);
        for u in read::list(host, &dir, &mut node_warnings) {
            let Ok(uuid) = u.parse::<MdevUuid>() else {
                continue;
            };
            let path = format!("{MDEV_DEVICES}/{u}");
            let inst = vgpu::read_instance(host, p, uuid, &path, driver_key, &facts)?;
            // Sized from another GPU's parent in a full read: leave it to the full read.
            inst.profile_name.as_ref()?;
            p.instances.push(inst);
        }
    }
    if !node_warnings.is_empty() {
        return None;
    }
    let mut fresh: Vec<gpu_core::Parent> = fresh.into_iter().map(|(p, _)| p).collect();
    let built = pools::build_all(&mut fresh, &topo.gpus, opts.resolver.as_deref());
    // Notes on MIG slots are the GPU's warnings, which only the full read writes again.
    let noted = |a: &PciAddress| {
        topo.gpus
            .iter()
            .any(|g| g.address == *a && g.warnings.iter().any(|w| w.starts_with("MIG slots:")))
    };
    if !built.notes.is_empty() || matches!(&key, ParentId::Pci(a) if noted(a)) {
        return None;
    }
    let mut built = built.pools;
    let pools = &mut topo.mediated_devices.pools;
    let old_pool = pools.iter().position(|p| p.gpu == key);
    match (old_pool, built.pop()) {
        (None, None) => {}
        // The pool's size feeds the GPU's memory: a changed size is for the full read.
        (Some(i), Some(b)) if b.total_mib == pools[i].total_mib && built.is_empty() => {
            pools[i] = b;
        }
        _ => return None,
    }
    for (i, p) in members.into_iter().zip(fresh) {
        topo.mediated_devices.parents[i] = p;
    }
    Some(())
}

/// Reads again one GPU that hosts no vGPUs and has no VFs: its files, companions and whether it
/// can go to a VM whole.
fn pci_gpu(host: &dyn Host, topo: &mut NodeTopology, a: &PciAddress) -> Option<()> {
    let i = topo.gpus.iter().position(|g| g.address == *a)?;
    let old = &topo.gpus[i];
    if old.vgpu_framework.is_some()
        || old
            .sriov
            .as_ref()
            .is_some_and(|s| s.num_vfs > 0 || !s.vfs.is_empty())
    {
        return None;
    }
    // Another GPU in the same group names this one's driver in its state.
    if old.iommu_group.is_some()
        && topo
            .gpus
            .iter()
            .any(|g| g.address != *a && g.iommu_group == old.iommu_group)
    {
        return None;
    }
    let mut node_warnings = Vec::new();
    // A driver bound or unbound may have registered or dropped mdev parents.
    let now: BTreeSet<String> = read::list(host, MDEV_BUS, &mut node_warnings)
        .into_iter()
        .collect();
    let known: BTreeSet<String> = topo
        .mediated_devices
        .parents
        .iter()
        .filter(|p| p.framework == VgpuFramework::Mdev)
        .map(|p| p.id.to_string())
        .collect();
    if now != known {
        return None;
    }
    let entries = host.list(pci::PCI_DEVICES).ok()?;
    let mut table = PciTable::scan(host, &entries, &mut node_warnings);
    let (mut g, _) = table.read_gpu(a)?;
    if g.vendor != old.vendor
        || g.sriov
            .as_ref()
            .is_some_and(|s| s.num_vfs > 0 || !s.vfs.is_empty())
        || !table.class(a).is_some_and(|c| c.is_gpu())
    {
        return None;
    }
    g.functions = table.companions(a, g.vendor_id.0);
    g.name = old.name.clone();
    g.health = old.health.clone();
    let iommu_present = hardware_iommu_present(host, &mut node_warnings);
    settle_gpu(&mut table, &mut g, 0, iommu_present, &mut node_warnings);
    if !node_warnings.is_empty() {
        return None;
    }
    topo.gpus[i] = g;
    Some(())
}
