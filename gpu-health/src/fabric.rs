//! A node's NVSwitch fabric as Fabric Manager sees it: which FM a root is answered by, its
//! partitions named with the node's GPU names, and the NVLink faults it reports graded.
//!
//! Discovery finds the NVSwitches (`gpu_sysfs::discover::fabric`); this module asks Fabric
//! Manager the rest:
//!
//! - on this machine's own `/`, NVIDIA's `libnvfm` ([`gpu_fabric::FmLibrary`]) at the address
//!   the environment names (`GPUSLICE_FM_ADDRESS`, default `127.0.0.1`), in the mode FM's
//!   configuration file sets (`FABRIC_MODE`);
//! - in a sandbox, the fake Fabric Manager ([`gpu_fabric::fake::FakeFabric`]) whose state is
//!   kept in the sandbox's `fabric.json` (made on the first change; until then every
//!   partition of the HGX 8-GPU set is inactive);
//! - on any other root (a tree, a recording) no FM answers.
//!
//! Where FM cannot be reached the fabric still exists: its `fabricManager` is `unreachable`
//! with the reason, it lists no partition, and every multi-GPU hand-out is refused
//! ([`gpu_core::Fabric::requires_partitions`]).
//!
//! Faults FM reports are graded here, once: a partition with a member whose NVLinks are fewer
//! than its maximum, a member FM lists among the devices with failed NVLinks, or any NVSwitch
//! with failed NVLinks, is `degraded` with the reason (placement and claims skip it); the
//! member GPU itself is graded Degraded with the same reason, so the DRA slices taint it and
//! the health stream reports it.

use std::collections::BTreeMap;
use std::sync::Arc;

use gpu_nvml::NvmlDevices;

use gpu_core::fabric::{FabricManager as FmState, FabricMode, Partition};
use gpu_core::{HealthState, NodeTopology, PciAddress, Vendor};
use gpu_fabric::fake::{FakeFabric, FakeState};
use gpu_fabric::{FabricManager, FmConfig, FmError, FmErrorKind, FmLibrary, NvlinkFailures};
use gpu_sysfs::OpenedRoot;

/// The fake Fabric Manager's state, in a sandbox's directory.
pub const SANDBOX_STATE: &str = "fabric.json";
/// The most a sandbox's `fabric.json` may hold.
const STATE_MAX: usize = 1 << 20;

fn unavailable(why: impl Into<String>) -> FmError {
    FmError::new("open", FmErrorKind::Unavailable(why.into()))
}

/// Where a node's Fabric Manager answers, decided once from the root it was opened at (kept by
/// a long-running caller, the agent, that holds only the host).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum FabricSource {
    /// No Fabric Manager answers (a tree, a recording).
    #[default]
    None,
    /// This machine's Fabric Manager, through `libnvfm`.
    Local,
    /// The fake Fabric Manager of the sandbox in this directory.
    Sandbox(std::path::PathBuf),
}

impl FabricSource {
    /// The source for `root`.
    pub fn of(root: &OpenedRoot) -> Self {
        match root.sandbox_dir() {
            Some(dir) => FabricSource::Sandbox(dir.to_path_buf()),
            None if root.is_local_host() => FabricSource::Local,
            None => FabricSource::None,
        }
    }
}

/// The Fabric Manager that answers for `root`, whose discovered topology is `topology`.
///
/// # Errors
/// As [`open_fabric_at`].
pub fn open_fabric(
    root: &OpenedRoot,
    topology: &NodeTopology,
) -> Result<Arc<dyn FabricManager>, FmError> {
    open_fabric_at(&FabricSource::of(root), root.host(), topology)
}

/// The Fabric Manager `source` names for `host`, whose discovered topology is `topology`.
///
/// # Errors
/// An [`FmError`] saying why none answers: no NVSwitch, a root that is not this machine or a
/// sandbox, a library or service that cannot be reached, a sandbox state that cannot be read.
pub fn open_fabric_at(
    source: &FabricSource,
    host: &dyn gpu_sysfs::host::Host,
    topology: &NodeTopology,
) -> Result<Arc<dyn FabricManager>, FmError> {
    if topology.fabric.is_none() {
        return Err(unavailable("this node has no NVSwitch"));
    }
    match source {
        FabricSource::Sandbox(dir) => {
            // The sandbox's FM runs in the mode its host's configuration sets, as on a machine;
            // without one, in shared NVSwitch mode.
            let mode = match host.read(gpu_fabric::CONFIG_FILE) {
                Ok(_) => config_mode(host)?,
                Err(_) => FabricMode::SharedNvswitch,
            };
            open_sandbox(dir, topology, mode).map(|f| Arc::new(f) as Arc<dyn FabricManager>)
        }
        FabricSource::Local => {
            let fm = FmLibrary::open(&FmConfig::from_env(config_mode(host)?))?;
            Ok(Arc::new(fm))
        }
        FabricSource::None => Err(unavailable(
            "Fabric Manager answers for this machine or a sandbox only, not for a directory tree or a recording",
        )),
    }
}

/// FM's mode from its configuration file (`FABRIC_MODE`).
fn config_mode(host: &dyn gpu_sysfs::host::Host) -> Result<FabricMode, FmError> {
    match host.read(gpu_fabric::CONFIG_FILE) {
        Ok(text) => gpu_fabric::mode_from_config(&String::from_utf8_lossy(&text))
            .map_err(|e| unavailable(format!("/{}: {e}", gpu_fabric::CONFIG_FILE))),
        Err(e) => Err(unavailable(format!(
            "/{} cannot be read: {e}",
            gpu_fabric::CONFIG_FILE
        ))),
    }
}

/// The sandbox's fake Fabric Manager: its kept state, or the HGX 8-GPU set over the node's
/// NVIDIA GPUs (module IDs in address order), in `mode`, none active.
fn open_sandbox(
    dir: &std::path::Path,
    topology: &NodeTopology,
    mode: FabricMode,
) -> Result<FakeFabric, FmError> {
    let at = |e: std::io::Error| unavailable(format!("{}: {e}", dir.join(SANDBOX_STATE).display()));
    let d = gpu_sysfs::atomic::Dir::open(dir).map_err(at)?;
    let state = match d.read(SANDBOX_STATE, STATE_MAX).map_err(at)? {
        Some(bytes) => serde_json::from_slice::<FakeState>(&bytes)
            .map_err(|e| unavailable(format!("{}: {e}", dir.join(SANDBOX_STATE).display())))?,
        None => {
            let gpus: Vec<PciAddress> = topology
                .gpus
                .iter()
                .filter(|g| g.vendor == Vendor::Nvidia)
                .map(|g| g.address)
                .collect();
            FakeState::hgx8(&gpus, mode).map_err(|_| {
                unavailable(format!(
                    "the sandbox's Fabric Manager models an HGX 8-GPU baseboard; this host has {} NVIDIA GPUs",
                    gpus.len()
                ))
            })?
        }
    };
    let dir = dir.to_path_buf();
    let store = move |s: &FakeState| -> Result<(), String> {
        let text = serde_json::to_vec_pretty(s).map_err(|e| e.to_string())?;
        gpu_sysfs::atomic::Dir::open(&dir)
            .and_then(|d| d.write(SANDBOX_STATE, &text))
            .map_err(|e| e.to_string())
    };
    Ok(FakeFabric::with_store(state, Box::new(store)))
}

/// Why FM cannot be reached, as the fabric says it: the message alone where FM was never
/// called, the call and FM's answer otherwise.
fn reason(e: &FmError) -> String {
    match &e.kind {
        FmErrorKind::Unavailable(why) => why.clone(),
        _ => e.to_string(),
    }
}

/// Fills `topology`'s fabric (when it has one) with what `fm` answers: FM's state and mode,
/// its partitions with the node's GPU names, and the faults graded. An unreachable FM leaves
/// the fabric with its reason and no partition.
pub fn compose_fabric(topology: &mut NodeTopology, fm: &Result<Arc<dyn FabricManager>, FmError>) {
    compose_fabric_with(topology, fm, None);
}

/// Each NVIDIA GPU's module ID as NVML reads it (`nvmlDeviceGetModuleId`), by module ID; GPUs
/// NVML does not answer for are left out.
fn module_ids(topology: &NodeTopology, nvml: &dyn NvmlDevices) -> BTreeMap<u32, PciAddress> {
    topology
        .gpus
        .iter()
        .filter(|g| g.vendor == Vendor::Nvidia)
        .filter_map(|g| nvml.module_id(&g.address).ok().map(|m| (m, g.address)))
        .collect()
}

/// A member's PCI address: FM's, NVML's for its module ID, both when they agree; `Err` with the
/// disagreement when they do not (never guessed), `Ok(None)` when neither says.
fn member_address(
    g: &gpu_fabric::FmGpu,
    modules: &BTreeMap<u32, PciAddress>,
) -> Result<Option<PciAddress>, String> {
    match (g.pci_bus_id, modules.get(&g.physical_id)) {
        (Some(fm), Some(nvml)) if fm != *nvml => Err(format!(
            "Fabric Manager and NVML disagree on module {}: {fm} to Fabric Manager, {nvml} to NVML",
            g.physical_id
        )),
        (Some(a), _) => Ok(Some(a)),
        (None, nvml) => Ok(nvml.copied()),
    }
}

/// [`compose_fabric`], with each member's module ID mapped to its PCI address through `nvml`
/// (where given): a member FM names by module ID only gets NVML's address, and a member whose
/// two addresses differ makes the whole fabric unusable (Fabric Manager reads as unreachable,
/// with the disagreement as the reason) rather than guessed.
pub fn compose_fabric_with(
    topology: &mut NodeTopology,
    fm: &Result<Arc<dyn FabricManager>, FmError>,
    nvml: Option<&dyn NvmlDevices>,
) {
    let modules = nvml.map(|n| module_ids(topology, n)).unwrap_or_default();
    let Some(fabric) = topology.fabric.as_mut() else {
        return;
    };
    let fm = match fm {
        Ok(fm) => fm,
        Err(e) => {
            fabric.fabric_manager = FmState::unreachable(reason(e));
            fabric.partitions.clear();
            return;
        }
    };
    let mode = fm.mode();
    let listed = if mode == FabricMode::BareMetal {
        Ok(vec![])
    } else {
        fm.partitions()
    };
    let listed = match listed {
        Ok(l) => l,
        Err(e) => {
            fabric.fabric_manager = FmState::unreachable(e.to_string());
            fabric.partitions.clear();
            return;
        }
    };
    let failures = fm.nvlink_failed_devices().unwrap_or_default();
    let mut state = FmState::reachable(mode);
    state.version = fm.version();
    fabric.fabric_manager = state;
    let names: Vec<(PciAddress, String)> = topology
        .gpus
        .iter()
        .map(|g| (g.address, g.name.clone()))
        .collect();
    let name = |a: &PciAddress| {
        names
            .iter()
            .find(|(x, _)| x == a)
            .map(|(_, n)| n.clone())
            .unwrap_or_default()
    };
    let mut partitions = Vec::with_capacity(listed.len());
    for p in &listed {
        let addresses = match p
            .gpus
            .iter()
            .map(|g| member_address(g, &modules))
            .collect::<Result<Vec<Option<PciAddress>>, String>>()
        {
            Ok(a) => a,
            Err(why) => {
                fabric.fabric_manager = FmState::unreachable(why);
                fabric.partitions.clear();
                return;
            }
        };
        // A member neither FM nor NVML gives an address for cannot be named: the partition is
        // left out.
        let Some(addresses) = addresses.into_iter().collect::<Option<Vec<PciAddress>>>() else {
            continue;
        };
        let mut faults = Vec::new();
        for (g, a) in p.gpus.iter().zip(&addresses) {
            let who = name(a);
            if g.is_degraded() {
                faults.push(format!(
                    "{who}: {} of {} NVLinks down",
                    g.max_nvlinks - g.nvlinks,
                    g.max_nvlinks
                ));
            } else if let Some(f) = failures.gpus.iter().find(|f| f.pci_bus_id == Some(*a)) {
                faults.push(format!("{who}: NVLink ports {:?} failed", f.ports));
            }
        }
        faults.extend(switch_faults(&failures));
        partitions.push(Partition {
            id: p.id,
            gpus: addresses.iter().map(&name).collect(),
            module_ids: p.gpus.iter().map(|g| g.physical_id).collect(),
            nvlinks: p.gpus.iter().map(|g| g.nvlinks).min(),
            active: p.active,
            degraded: (!faults.is_empty()).then(|| faults.join("; ")),
            addresses,
        });
    }
    fabric.partitions = partitions;
    grade_members(topology, &failures, &listed);
}

fn switch_faults(failures: &NvlinkFailures) -> Vec<String> {
    failures
        .switches
        .iter()
        .map(|s| {
            let at = s
                .pci_bus_id
                .map_or_else(|| "an NVSwitch".to_owned(), |a| format!("NVSwitch {a}"));
            format!("{at}: NVLink ports {:?} failed", s.ports)
        })
        .collect()
}

/// Grades each GPU with failed NVLinks Degraded (it still works alone; its NVLink peers do
/// not), with the reason FM gave.
fn grade_members(
    topology: &mut NodeTopology,
    failures: &NvlinkFailures,
    listed: &[gpu_fabric::FmPartition],
) {
    for g in &mut topology.gpus {
        let down = listed
            .iter()
            .flat_map(|p| &p.gpus)
            .find(|m| m.pci_bus_id == Some(g.address) && m.is_degraded())
            .map(|m| {
                format!(
                    "{} of {} NVLinks down",
                    m.max_nvlinks - m.nvlinks,
                    m.max_nvlinks
                )
            });
        let failed = failures
            .gpus
            .iter()
            .find(|f| f.pci_bus_id == Some(g.address))
            .map(|f| format!("NVLink ports {:?} failed (Fabric Manager)", f.ports));
        for reason in down.into_iter().chain(failed) {
            g.health.state = g.health.state.worst(HealthState::Degraded);
            if !g.health.reasons.contains(&reason) {
                g.health.reasons.push(reason);
            }
        }
    }
}

/// The fabric of `topology` with FM asked: [`open_fabric`] then [`compose_fabric`]; the FM
/// (when one answers) for the caller that goes on to change partitions.
pub fn fabric_of(
    root: &OpenedRoot,
    topology: &mut NodeTopology,
) -> Option<Result<Arc<dyn FabricManager>, FmError>> {
    fabric_at(&FabricSource::of(root), root.host(), topology)
}

/// [`fabric_of`] with the members' module IDs mapped through `nvml` ([`compose_fabric_with`]).
pub fn fabric_of_with_nvml(
    root: &OpenedRoot,
    topology: &mut NodeTopology,
    nvml: Option<&dyn NvmlDevices>,
) -> Option<Result<Arc<dyn FabricManager>, FmError>> {
    topology.fabric.as_ref()?;
    let fm = open_fabric_at(&FabricSource::of(root), root.host(), topology);
    compose_fabric_with(topology, &fm, nvml);
    Some(fm)
}

/// [`fabric_of`] for a caller holding the host and the source.
pub fn fabric_at(
    source: &FabricSource,
    host: &dyn gpu_sysfs::host::Host,
    topology: &mut NodeTopology,
) -> Option<Result<Arc<dyn FabricManager>, FmError>> {
    topology.fabric.as_ref()?;
    let fm = open_fabric_at(source, host, topology);
    compose_fabric(topology, &fm);
    Some(fm)
}

/// Carries the grades the fabric gave its GPUs ([`compose_fabric`]) into health `reports` made
/// before it was composed, so that `health` and `GET /v1/health` say what the topology says.
pub fn carry_to_reports(topology: &NodeTopology, reports: &mut [crate::GpuHealthReport]) {
    if topology.fabric.is_none() {
        return;
    }
    for r in reports {
        if let Some(g) = topology.gpu_by_address(&r.address) {
            r.health.clone_from(&g.health);
        }
    }
}
