//! Host discovery: the GPUs of a host, whether each can be handed to a VM whole, and the vGPU
//! parents, profiles, instances and pools it offers, as one [`gpu_core::NodeTopology`].
//!
//! Everything is read through a [`Host`] whose paths derive from one injected root. Every file is
//! optional: an unreadable or malformed one becomes a warning on the device it concerns and the
//! scan goes on; only a root without `sys/bus/pci/devices` is an error.
//!
//! # Reading the counts
//! A profile's `availableInstances` is what can truly still be created on that parent: the
//! driver's own count (kept in `reportedInstances`) capped by what the physical GPU's pool still
//! holds. On SR-IOV GPUs every free VF is a parent, and each may say 1 while the card holds one
//! more vGPU in total (the A2 capture: 13 free VFs each report a 4 GB vGPU, the 16 GB card holds
//! one more). The per-parent counts are therefore not additive: a consumer placing several vGPUs
//! reads `mediatedDevices.pools`, checks and charges the pool of the parent's `gpu`
//! (`Pool::check` / `Pool::charge` in gpu-core) for each vGPU, and uses the per-parent count only
//! to know that this parent can take one.
//!
//! Health is left Unknown everywhere; the health crate grades it afterwards.

pub mod fabric;
mod mig_types;
mod narrow;
mod parse;
mod pci;
mod pci_names;
mod pools;
mod prefetch;
mod read;
mod vgpu;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use gpu_core::{Gpu, GpuState, NodeTopology, ParentId, PciAddress, Vendor, VgpuFramework};

pub use narrow::{Change, rediscover};
pub use parse::{
    facts_from_type_name, parse_creatable_vgpu_types, parse_current_vgpu_type, parse_description,
    parse_link_speed, parse_link_width, parse_numa_node, parse_u32,
};

use crate::error::SysfsError;
use crate::host::Host;
use crate::resolver::TypeNameResolver;

/// What to discover and how.
#[derive(Debug, Clone)]
pub struct DiscoverOptions {
    /// The node name written into the topology.
    pub node: String,
    /// Publish only these vGPU parents (`--mdev-parents`); `None` publishes all. An entry may
    /// name a parent (`0000:08:00.4`, `mbochs`) or a physical GPU, which selects all its parents.
    /// Pools still count every instance of the GPU.
    pub mdev_parents: Option<Vec<ParentId>>,
    /// Resolves vendor-VFIO type numbers that no VF lists any more (NVML on a real host).
    pub resolver: Option<Arc<dyn TypeNameResolver>>,
}

impl DiscoverOptions {
    /// Options for node `node`: all parents, no resolver.
    pub fn new(node: impl Into<String>) -> Self {
        DiscoverOptions {
            node: node.into(),
            mdev_parents: None,
            resolver: None,
        }
    }

    /// Publishes only the given parents.
    pub fn with_mdev_parents(mut self, parents: Vec<ParentId>) -> Self {
        self.mdev_parents = Some(parents);
        self
    }

    /// Uses `resolver` for type numbers no VF lists.
    pub fn with_resolver(mut self, resolver: Arc<dyn TypeNameResolver>) -> Self {
        self.resolver = Some(resolver);
        self
    }
}

/// The IOMMU groups view.
const IOMMU_GROUPS: &str = "sys/kernel/iommu_groups";

/// Whether the host has a hardware IOMMU. Groups alone do not tell: VFIO gives every mdev an
/// emulated group named `vfio-noiommu` even on a host without an IOMMU (seen on a real 6.1 kernel
/// in the lab), so such groups are not counted. `/sys/class/iommu` lists the IOMMU units when
/// the kernel exposes them.
fn hardware_iommu_present(host: &dyn Host, warnings: &mut Vec<String>) -> bool {
    if host
        .list("sys/class/iommu")
        .is_ok_and(|units| !units.is_empty())
    {
        return true;
    }
    read::list(host, IOMMU_GROUPS, warnings).iter().any(|g| {
        host.read_string(&format!("{IOMMU_GROUPS}/{g}/name"))
            .map_or(true, |name| name != "vfio-noiommu")
    })
}

/// The one answer to "what is this vendor-VFIO type number's name": the options' resolver
/// (NVML), then the names gpuslice remembered when it listed or set them (`vgpu apply`, `vgpu
/// create`; see [`crate::remembered::RememberedNames`]). Every discovery, and so every command,
/// binding and the agent, names a type this way.
fn type_names(host: &dyn Host, opts: &DiscoverOptions) -> Option<Arc<dyn TypeNameResolver>> {
    let memory = crate::remembered::RememberedNames::read(host, opts.resolver.clone());
    if memory.is_empty() {
        opts.resolver.clone()
    } else {
        Some(Arc::new(memory))
    }
}

/// The GPUs: display and accelerator functions that are not VFs, with their companions.
fn scan_gpus(table: &mut pci::PciTable<'_>, warnings: &mut Vec<String>) -> Vec<Gpu> {
    let mut gpus: Vec<Gpu> = Vec::new();
    // In address order a PF comes before its VFs, so its virtfn links mark them and VFs cost
    // no read at all.
    for a in table.addresses() {
        if table.known_vf(&a) {
            continue;
        }
        match table.class(&a) {
            Some(c) if c.is_gpu() => {}
            Some(_) => continue,
            None => {
                // Whatever it is cannot be told: say so rather than let a GPU vanish.
                for w in table.take_warnings(&a) {
                    warnings.push(format!("{a}: not examined, its class cannot be read: {w}"));
                }
                continue;
            }
        }
        let Some((mut g, _entries)) = table.read_gpu(&a) else {
            continue;
        };
        g.functions = table.companions(&a, g.vendor_id.0);
        gpus.push(g);
    }
    gpus
}

/// Discovers the node's GPUs, vGPU parents, profiles, instances and pools.
///
/// # Errors
/// [`SysfsError::InvalidRoot`] when the root has no readable `sys/bus/pci/devices`. Every other
/// problem is a warning on the device (or node) concerned.
pub fn discover(host: &dyn Host, opts: &DiscoverOptions) -> Result<NodeTopology, SysfsError> {
    discover_with_links(host, opts).map(|(topology, _)| topology)
}

/// [`discover`], also returning the PCIe link files of every GPU as discovery read them, so
/// the health grading can judge the link without reading the files again.
///
/// # Errors
/// As [`discover`].
pub fn discover_with_links(
    host: &dyn Host,
    opts: &DiscoverOptions,
) -> Result<(NodeTopology, BTreeMap<PciAddress, crate::link::LinkFiles>), SysfsError> {
    let mut topo = NodeTopology::new(opts.node.clone());
    let prefetch = prefetch::Prefetch::new(host);
    let (resolver, mut table, mut gpus) = std::thread::scope(|s| {
        // The mdev parents' files are read on a second thread from here on, while the PCI
        // functions are listed and scanned.
        let worker = prefetch.start(s);
        let entries = host
            .list(pci::PCI_DEVICES)
            .map_err(|e| SysfsError::InvalidRoot {
                path: host
                    .root_dir()
                    .map_or_else(|| "(host)".to_owned(), |p| p.display().to_string()),
                why: format!("cannot list {}: {e}", pci::PCI_DEVICES),
            })?;
        let resolver = type_names(host, opts);
        let mut table = pci::PciTable::scan(&prefetch, &entries, &mut topo.warnings);
        let gpus = scan_gpus(&mut table, &mut topo.warnings);
        topo.fabric = fabric::discovered(fabric::nvswitches(&mut table));
        prefetch.finish(worker);
        Ok::<_, SysfsError>((resolver, table, gpus))
    })?;
    let names = gpu_core::vendor::assign_names(
        &gpus
            .iter()
            .map(|g| (g.address, g.vendor))
            .collect::<Vec<_>>(),
    );
    for (g, n) in gpus.iter_mut().zip(names) {
        g.name = n;
    }

    // vGPU parents of both frameworks.
    let mut scan = vgpu::VgpuScan::default();
    scan.mdev(&mut table);
    let vendor_vfio_gpus = scan.vendor_vfio(&mut table, &gpus, resolver.as_deref());
    topo.warnings.append(&mut scan.node_warnings);
    for g in &mut gpus {
        let other = scan.other_driver_vfs.remove(&g.address).unwrap_or_default();
        let unreadable = scan.unreadable_vfs.remove(&g.address).unwrap_or_default();
        if let Some(s) = &mut g.sriov {
            s.other_driver_vfs = other;
            s.unreadable_vfs = unreadable;
            if let Some(why) = s.other_driver_diagnosis(g.vendor_id, g.device_id) {
                g.warnings.push(why.to_string());
            }
        }
    }
    let mut parents = scan.parents;
    let built = pools::build_all(&mut parents, &gpus, resolver.as_deref());
    mig_types::fill(host, &mut gpus, &parents, resolver.as_deref());
    let (mut pools, exactness, mut mig_notes) = (built.pools, built.exact, built.notes);

    // Per-GPU framework, memory and state.
    let iommu_present = hardware_iommu_present(host, &mut topo.warnings);
    let mdev_gpus: BTreeSet<PciAddress> = parents
        .iter()
        .filter(|p| p.framework == VgpuFramework::Mdev)
        .filter_map(|p| p.gpu)
        .collect();
    let mut parent_counts: BTreeMap<PciAddress, usize> = BTreeMap::new();
    for p in &parents {
        if let Some(g) = p.gpu {
            *parent_counts.entry(g).or_default() += 1;
        }
    }
    for g in &mut gpus {
        let key = ParentId::Pci(g.address);
        if let Some(notes) = mig_notes.remove(&g.address) {
            g.warnings.extend(notes);
        }
        g.vgpu_framework = if mdev_gpus.contains(&g.address) {
            Some(VgpuFramework::Mdev)
        } else if vendor_vfio_gpus.contains(&g.address) {
            Some(VgpuFramework::VendorVfio)
        } else {
            None
        };
        if let Some(pool) = pools.iter().find(|p| p.gpu == key) {
            if g.vendor == Vendor::Nvidia && g.memory_mib.is_none() && pool.total_mib > 0 {
                g.memory_mib = Some(pool.total_mib);
                g.memory_is_lower_bound = exactness.get(&key) == Some(&false);
            }
            if exactness.get(&key) == Some(&false) && pools::is_vendor_vfio(&parents, &key) {
                g.warnings.push(
                    "vGPU pool size inferred from the types still creatable (a lower bound); \
                     a type-name resolver (NVML) gives the exact size"
                        .to_owned(),
                );
            }
        }
        settle_gpu(
            &mut table,
            g,
            parent_counts.get(&g.address).copied().unwrap_or(0),
            iommu_present,
            &mut topo.warnings,
        );
    }

    // Publish only the selected parents; pools still reflect the whole GPU.
    if let Some(sel) = &opts.mdev_parents {
        for want in sel {
            if !parents
                .iter()
                .any(|p| p.id == *want || p.pool_key() == *want)
            {
                topo.warnings.push(format!(
                    "--mdev-parents: {want} is not a vGPU parent on this host"
                ));
            }
        }
        parents.retain(|p| sel.iter().any(|w| p.id == *w || p.pool_key() == *w));
        for pool in &mut pools {
            pool.parents
                .retain(|id| parents.iter().any(|p| p.id == *id));
        }
        pools.retain(|p| !p.parents.is_empty());
    }

    topo.gpus = gpus;
    topo.mediated_devices.parents = parents;
    topo.mediated_devices.pools = pools;
    let mut links = std::mem::take(&mut table.links);
    links.retain(|a, _| topo.gpus.iter().any(|g| g.address == *a));
    Ok((topo, links))
}

/// The last facts of a GPU once its framework is known: the SR-IOV hint, whether it can go to a
/// VM whole (and why not), and the warnings read on the way.
fn settle_gpu(
    table: &mut pci::PciTable<'_>,
    g: &mut Gpu,
    vgpu_parents: usize,
    iommu_present: bool,
    node_warnings: &mut Vec<String>,
) {
    if let Some(s) = &g.sriov {
        if g.vgpu_framework.is_none()
            && s.num_vfs == 0
            && s.total_vfs > 0
            && g.vendor == Vendor::Nvidia
            && g.driver.as_deref() == Some("nvidia")
        {
            g.warnings.push(format!(
                "SR-IOV capable ({} VFs) but no VFs are enabled: vGPUs need them enabled first \
                 (sriov-manage -e)",
                s.total_vfs
            ));
        }
    }
    let (state, reason) = whole_gpu_state(table, g, vgpu_parents, iommu_present, node_warnings);
    g.state = state;
    g.state_reason = reason;
    let mut late = table.take_warnings(&g.address);
    g.warnings.append(&mut late);
}

/// Whether the GPU can go to a VM whole, and why not.
fn whole_gpu_state(
    table: &mut pci::PciTable<'_>,
    g: &Gpu,
    vgpu_parents: usize,
    iommu_present: bool,
    node_warnings: &mut Vec<String>,
) -> (GpuState, Option<String>) {
    if let Some(f) = g.vgpu_framework {
        return (
            GpuState::InUse,
            Some(format!(
                "hosts vGPUs ({}, {vgpu_parents} parent{})",
                f.as_str(),
                if vgpu_parents == 1 { "" } else { "s" }
            )),
        );
    }
    if let Some(s) = g.sriov.as_ref().filter(|s| s.num_vfs > 0) {
        return (
            GpuState::InUse,
            Some(format!("SR-IOV enabled ({} VFs)", s.num_vfs)),
        );
    }
    if g.driver.as_deref() == Some("vfio-pci") {
        return (GpuState::InUse, Some("bound to vfio-pci".to_owned()));
    }
    let Some(group) = g.iommu_group else {
        let why = if iommu_present {
            "no IOMMU group: the device is not behind an IOMMU"
        } else {
            "no IOMMU group: IOMMU disabled"
        };
        return (GpuState::Blocked, Some(why.to_owned()));
    };
    let dir = format!("{IOMMU_GROUPS}/{group}/devices");
    let members = read::list(table.host, &dir, node_warnings);
    let mut blockers = Vec::new();
    for m in members {
        let Ok(a) = m.parse::<PciAddress>() else {
            continue;
        };
        if a == g.address {
            continue;
        }
        // Functions of the same card travel with it; so do its own VFs.
        if a.same_slot(&g.address) && table.vendor(&a) == Some(g.vendor_id.0) {
            continue;
        }
        if table.physfn(&a) == Some(g.address) {
            continue;
        }
        // VFIO accepts bridges in a group whatever their driver; endpoints must all go along.
        if table.class(&a).is_some_and(|c| c.0 >> 8 == 0x0604) {
            continue;
        }
        let ids = match (table.vendor(&a), table.device(&a)) {
            (Some(v), Some(d)) => format!("{v:04x}:{d:04x}"),
            _ => "unknown device".to_owned(),
        };
        let driver = table
            .driver(&a)
            .map_or_else(|| "no driver".to_owned(), |d| format!("driver {d}"));
        blockers.push(format!("{a} ({ids}, {driver})"));
    }
    if blockers.is_empty() {
        (GpuState::Free, None)
    } else {
        (
            GpuState::Blocked,
            Some(format!(
                "IOMMU group {group} shared with {}",
                blockers.join(", ")
            )),
        )
    }
}
