//! The one call that composes discovery and health into a node's topology, shared by the CLI
//! and the bindings.

use std::sync::Arc;

use gpu_core::{Health, HealthState, NodeTopology, ParentId, PciAddress};
use gpu_nvml::{NvmlDevices, NvmlLibrary};
use gpu_sysfs::Host;
use gpu_sysfs::discover::{DiscoverOptions, discover_with_links};
use serde::Serialize;

use crate::assess::{GpuHealthReport, HealthOptions, grade_topology_with_links};
use crate::error::HealthError;

/// Discovers the node (GPUs, vGPU parents, profiles, instances, pools), grades every GPU's
/// health, copies it to the vGPU parents of that GPU, and fills `memoryMiB` from telemetry when
/// it was read.
///
/// # Errors
/// [`HealthError::Discovery`] when discovery fails (a root without `sys/bus/pci/devices`);
/// health itself never fails, it grades what it cannot read as Unknown.
pub fn node_topology(
    host: &dyn Host,
    opts: &DiscoverOptions,
    health: &HealthOptions,
) -> Result<NodeTopology, HealthError> {
    node_topology_with_reports(host, opts, health).map(|(topology, _)| topology)
}

/// [`node_topology`], also returning each GPU's full health report (the signals read, the
/// expected link width and the warnings), in the topology's GPU order. Each PCIe link file is
/// read once, by discovery, and handed to the grading.
///
/// # Errors
/// [`HealthError::Discovery`] when discovery fails.
pub fn node_topology_with_reports(
    host: &dyn Host,
    opts: &DiscoverOptions,
    health: &HealthOptions,
) -> Result<(NodeTopology, Vec<GpuHealthReport>), HealthError> {
    // Discovery reads the PCIe link files once; health judges the link from what it read.
    let (mut topology, links) = discover_with_links(host, opts)?;
    let reports = grade_topology_with_links(host, &mut topology, health, &links);
    Ok((topology, reports))
}

/// Where a composed node's NVML comes from.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum NvmlSource {
    /// The driver's NVML, only when the root is this machine's `/` (the local NVML describes
    /// this machine's GPUs, not those of another tree or a recording); then also the vGPU
    /// type-name resolver.
    #[default]
    LocalOnly,
    /// No NVML at all.
    Off,
    /// This NVML library, whatever the root (for tests and unusual installs), for telemetry,
    /// vGPU type names and GPU-instance placements; a library that does not open is an error.
    Library(std::path::PathBuf),
}

impl NvmlSource {
    /// The source the CLI flags name: `--nvml-lib PATH` wins, then `--no-nvml`, else the local
    /// `/` only.
    pub fn from_flags(library: Option<std::path::PathBuf>, off: bool) -> Self {
        match (library, off) {
            (Some(lib), _) => NvmlSource::Library(lib),
            (None, true) => NvmlSource::Off,
            (None, false) => NvmlSource::LocalOnly,
        }
    }
}

/// What [`open_node`] composes: the node's name and the health options besides NVML.
#[derive(Debug, Clone)]
pub struct NodeRequest {
    /// The node name written into the topology.
    pub node: String,
    /// Only these vGPU parents (all when `None`).
    pub mdev_parents: Option<Vec<gpu_core::ParentId>>,
    /// The grading policy.
    pub policy: crate::Policy,
    /// Where NVML comes from.
    pub nvml: NvmlSource,
    /// Where the health baseline comes from.
    pub baseline: crate::assess::BaselineSource,
}

impl NodeRequest {
    /// A request for node `node` with the default policy, NVML on the local `/` only, and the
    /// baseline read from the root.
    pub fn new(node: impl Into<String>) -> Self {
        NodeRequest {
            node: node.into(),
            mdev_parents: None,
            policy: crate::Policy::default(),
            nvml: NvmlSource::LocalOnly,
            baseline: crate::assess::BaselineSource::FromHost,
        }
    }
}

/// A root opened and composed into a node: the opened host (kept for commands that go on to
/// change it), the topology and each GPU's health report.
#[derive(Debug)]
pub struct ComposedNode {
    /// The host the root names.
    pub host: gpu_sysfs::OpenedRoot,
    /// The node's topology, health graded.
    pub topology: NodeTopology,
    /// Each GPU's full health report, in the topology's GPU order.
    pub reports: Vec<GpuHealthReport>,
}

/// A root opened with the options the composition decided for it, before anything is
/// discovered: for commands that change the host and discover inside their own operation (the
/// layout and actuation commands, the node agent).
#[derive(Debug)]
pub struct OpenedNode {
    /// The host the root names.
    pub host: gpu_sysfs::OpenedRoot,
    /// Discovery options: the node name, the parent filter and, on the local `/`, the NVML vGPU
    /// type-name resolver.
    pub discover: DiscoverOptions,
    /// Health options: the policy, the baseline and the NVML telemetry the root allows.
    pub health: HealthOptions,
}

/// Opens `root` and decides its options the one way every front-end shares: only the local `/`
/// uses the driver's NVML (telemetry and the vGPU type-name resolver) unless a library is named;
/// a recording never does.
///
/// # Errors
/// [`HealthError::Root`] for a root that cannot be opened, [`HealthError::NvmlLibrary`] for a
/// named NVML library that does not open.
pub fn open_node_host(
    root: &std::path::Path,
    req: &NodeRequest,
) -> Result<OpenedNode, HealthError> {
    let (mut opened, nvml) = open_node_parts(root, req, false)?;
    opened.health = health_options(req, nvml.as_ref());
    Ok(opened)
}

/// [`open_node_host`] with the health options left to [`health_options`]: the NVML the root
/// allows, if any, opened once for the resolver and the telemetry; with `background`, the
/// local NVML opens on its own thread while the caller discovers (a named library is opened
/// first, so that one which does not open is an error before anything is read).
fn open_node_parts(
    root: &std::path::Path,
    req: &NodeRequest,
    background: bool,
) -> Result<(OpenedNode, Option<Arc<NvmlLibrary>>), HealthError> {
    let host = gpu_sysfs::open_root(root).map_err(|e| HealthError::Root(Box::new(e)))?;
    let mut discover = DiscoverOptions::new(req.node.clone());
    discover.mdev_parents = req.mdev_parents.clone();
    let local = host.is_local_host();
    let nvml = match &req.nvml {
        NvmlSource::Off => None,
        NvmlSource::LocalOnly if !local => None,
        NvmlSource::LocalOnly if background => Some(Arc::new(NvmlLibrary::start(None))),
        NvmlSource::LocalOnly => Some(Arc::new(NvmlLibrary::open_now(None))),
        NvmlSource::Library(lib) => {
            let once = NvmlLibrary::open_now(Some(lib));
            if let Err(e) = once.wait() {
                return Err(HealthError::NvmlLibrary {
                    path: lib.clone(),
                    message: e.to_string(),
                });
            }
            Some(Arc::new(once))
        }
    };
    if let Some(once) = &nvml {
        // Names vendor-VFIO types no VF lists any more and places GPU instances; an NVML that
        // does not open answers as no resolver would.
        let devices: Arc<dyn NvmlDevices> = Arc::clone(once) as Arc<dyn NvmlDevices>;
        discover.resolver = Some(Arc::new(crate::NvmlResolver::over(devices)));
    }
    let health = HealthOptions::without_telemetry(req.policy.clone());
    Ok((
        OpenedNode {
            host,
            discover,
            health,
        },
        nvml,
    ))
}

/// The health options of `req` with the node's NVML (waiting for it if it is still opening):
/// its telemetry, or the reason it has none; no NVML, no telemetry.
fn health_options(req: &NodeRequest, nvml: Option<&Arc<NvmlLibrary>>) -> HealthOptions {
    let policy = req.policy.clone();
    let telemetry = |n: &Arc<NvmlLibrary>| {
        n.wait().map(|()| {
            let devices: Arc<dyn NvmlDevices> = Arc::clone(n) as Arc<dyn NvmlDevices>;
            crate::NvmlTelemetry::over(devices)
        })
    };
    let mut health = match nvml.map(telemetry) {
        None => HealthOptions::without_telemetry(policy),
        Some(Ok(t)) => HealthOptions::with_telemetry(policy, Arc::new(t)),
        Some(Err(e)) => HealthOptions::unavailable(policy, &e),
    };
    health.baseline = req.baseline.clone();
    health
}

/// The one composition from a root to a node, used by every CLI command and both bindings:
/// opens `root` and decides its options as [`open_node_host`] does, discovers the node and
/// grades its health. The local NVML opens while sysfs is read.
///
/// # Errors
/// As [`open_node_host`], plus [`HealthError::Discovery`] when discovery fails.
pub fn open_node(root: &std::path::Path, req: &NodeRequest) -> Result<ComposedNode, HealthError> {
    let (opened, nvml) = open_node_parts(root, req, true)?;
    let (mut topology, links) = discover_with_links(&opened.host, &opened.discover)?;
    let health = health_options(req, nvml.as_ref());
    let reports = grade_topology_with_links(&opened.host, &mut topology, &health, &links);
    // An NVSwitch fabric is completed with what Fabric Manager answers (or why it cannot).
    // Its members' module IDs are mapped to PCI addresses through NVML where it answers.
    let devices = nvml.as_ref().filter(|n| n.wait().is_ok());
    let devices = devices.map(|n| n.as_ref() as &dyn NvmlDevices);
    crate::fabric::fabric_of_with_nvml(&opened.host, &mut topology, devices);
    let mut reports = reports;
    crate::fabric::carry_to_reports(&topology, &mut reports);
    Ok(ComposedNode {
        host: opened.host,
        topology,
        reports,
    })
}

/// A vGPU parent and the health it inherits from its GPU.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ParentHealth {
    /// The parent.
    pub id: ParentId,
    /// Its physical GPU, when it has one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gpu: Option<PciAddress>,
    /// The GPU's health.
    pub health: Health,
}

/// The health of a node (`gpuslice health -o json`): each GPU's report and each vGPU parent's
/// inherited health.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeHealth {
    /// The node.
    pub node: String,
    /// Each GPU's report, in the topology's GPU order.
    pub gpus: Vec<GpuHealthReport>,
    /// Each vGPU parent with its GPU's health.
    pub parents: Vec<ParentHealth>,
}

impl NodeHealth {
    /// The health of `topology` with its GPUs' `reports`.
    pub fn new(topology: &NodeTopology, reports: Vec<GpuHealthReport>) -> Self {
        let parents = topology
            .mediated_devices
            .parents
            .iter()
            .map(|p| ParentHealth {
                id: p.id.clone(),
                gpu: p.gpu,
                health: p.health.clone(),
            })
            .collect();
        NodeHealth {
            node: topology.node.clone(),
            gpus: reports,
            parents,
        }
    }

    /// The worst state of any GPU (Healthy for a node without GPUs).
    pub fn worst(&self) -> HealthState {
        self.gpus
            .iter()
            .map(|r| r.health.state)
            .fold(HealthState::Healthy, HealthState::worst)
    }

    /// The table people read: each GPU's name, address, state and reasons (`(no GPUs)` under
    /// the header when there are none). The warnings are apart ([`NodeHealth::warning_lines`]).
    pub fn table(&self) -> String {
        let rows: Vec<Vec<String>> = self
            .gpus
            .iter()
            .map(|r| {
                let reasons = match r.health.reasons.is_empty() {
                    true => "-".to_owned(),
                    false => r.health.reasons.join("; "),
                };
                let (name, address) = (r.name.clone(), r.address.to_string());
                vec![name, address, r.health.state.to_string(), reasons]
            })
            .collect();
        let mut out = gpu_core::text::render_table(&["NAME", "ADDRESS", "STATE", "REASONS"], &rows);
        if rows.is_empty() {
            out.push_str("(no GPUs)\n");
        }
        out
    }

    /// Each GPU's warnings, as `NAME: WARNING`.
    pub fn warning_lines(&self) -> Vec<String> {
        let each = self
            .gpus
            .iter()
            .flat_map(|r| r.warnings.iter().map(move |w| format!("{}: {w}", r.name)));
        each.collect()
    }
}
