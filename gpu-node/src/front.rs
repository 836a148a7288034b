//! What a front-end's options open: the node at `--root` (composed through [`crate::open`], with
//! a `--progress` line and the node name checked), the nodes of a fleet file, or this host's.
//! The CLI and the bindings parse their options into a [`Front`] and render what it opens; each
//! error names the option it came from (`--root DIR`, `--node`), as the CLI prints it.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use gpu_core::layout::LayoutFile;
use gpu_core::{Allocation, NodeTopology, ParentId, PciAddress, SharedFleet, Syntax};
use gpu_health::progress::Progress;
use gpu_sysfs::actuate::NodeHolders;
use gpu_sysfs::document::InputError;

use crate::handoff::CheckedNode;
use crate::open::{ComposedNode, NodeRequest, NvmlSource, OpenedNode};

/// The one profile per GPU a layout gives, and what could not be kept (warnings).
pub type LayoutSizes = (BTreeMap<PciAddress, String>, Vec<String>);

/// A front-end's options about the node it opens.
#[derive(Debug, Clone, Copy)]
pub struct Front<'a> {
    /// `--root`: a directory standing for `/`, a `*.umockdev` recording or `sandbox:DIR`.
    pub root: &'a Path,
    /// The node name (`--node`, else the hostname).
    pub node: &'a str,
    /// Whether a line is printed every 2 s while discovering takes long (`--progress`).
    pub progress: bool,
    /// The largest document read.
    pub limit: gpu_sysfs::DocumentLimit,
}

/// What a [`Front`] could not open, naming the option it came from.
#[derive(Debug, thiserror::Error)]
pub enum FrontError {
    /// The root did not open or compose.
    #[error("--root {}", .root.display())]
    Root {
        /// The root as given.
        root: PathBuf,
        /// Why.
        #[source]
        source: gpu_health::HealthError,
    },
    /// The node name is not a valid name.
    #[error("--node")]
    Node(#[source] gpu_core::CoreError),
    /// A document named on the command line did not read or decode.
    #[error("{0}")]
    Input(#[source] InputError),
    /// The NVML library `--nvml-lib` names did not open.
    #[error("--nvml-lib {}", .lib.display())]
    NvmlLib {
        /// The library as given.
        lib: PathBuf,
        /// The root's error.
        #[source]
        source: Box<FrontError>,
    },
    /// `--record-baseline` on a recording, which replays into a throwaway tree.
    #[error("--record-baseline needs a directory root, not a recording")]
    BaselineOnRecording,
    /// The health baseline did not read or write.
    #[error("{0}")]
    Baseline(#[source] gpu_health::HealthError),
    /// `--node` names no node of the fleet file.
    #[error("--node {node}: not in {} (nodes: {nodes})", .fleet.display())]
    NotInFleet {
        /// The name asked for.
        node: String,
        /// The fleet file.
        fleet: PathBuf,
        /// The fleet's nodes, listed.
        nodes: String,
    },
    /// The license token file did not read.
    #[error("cannot read license token {}", .path.display())]
    LicenseToken {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The guest licensing files could not be made (`named`: `license token PATH`, or
    /// `export cloud-init` without a token).
    #[error("{named}")]
    License {
        /// What the error names.
        named: String,
        /// Why.
        #[source]
        source: gpu_integrations::IntegrationError,
    },
    /// A node's name is not a valid name (a fleet's node, for `metrics`).
    #[error("node")]
    NodeName(#[source] gpu_core::CoreError),
    /// The metrics did not render.
    #[error("{0}")]
    Metrics(#[source] std::fmt::Error),
    /// The root did not open as a host.
    #[error("--root {}", .root.display())]
    Open {
        /// The root as given.
        root: PathBuf,
        /// Why.
        #[source]
        source: gpu_sysfs::SysfsError,
    },
    /// A sandbox command on a root that is no sandbox.
    #[error("--root {}: not a sandbox; this command needs --root sandbox:DIR (make one with `gpuslice sandbox init DIR`)", .root.display())]
    NotSandbox {
        /// The root as given.
        root: PathBuf,
    },
    /// A hand-off asked for without naming a device.
    #[error("name the device with --uuid, --address or --allocation")]
    NoDevice,
    /// An mdev instance asked for without a name.
    #[error("an mdev instance needs a name: pass --uuid UUID or --machine NAME")]
    NoMdevName,
    /// An option's value is not valid (`invalid --machine`).
    #[error("invalid --{flag}")]
    InvalidFlag {
        /// The option, without its dashes.
        flag: &'static str,
        /// Why.
        #[source]
        source: gpu_core::CoreError,
    },
    /// A Machine file is not a valid Machine (with the target node given, when one was).
    #[error("machine file {}", .path.display())]
    Machine {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: gpu_core::CoreError,
    },
    /// `--node` and `--target-node` name different nodes.
    #[error("--node {node:?} and --target-node {target:?} name different nodes; give one of them")]
    TwoNodes {
        /// `--node`.
        node: String,
        /// `--target-node`.
        target: String,
    },
    /// An allocation or the node to check it against is not there.
    #[error("{0}")]
    Handoff(#[source] crate::handoff::HandoffError),
    /// A layout file (or its config) is not what `vgpu apply` takes; `named` is how the error
    /// names it (`layout file PATH`, `--layout PATH`, `--layout PATH on node N`).
    #[error("{named}")]
    Layout {
        /// The file, as the error names it.
        named: String,
        /// Why.
        #[source]
        source: gpu_core::layout::LayoutError,
    },
}

impl From<InputError> for FrontError {
    fn from(e: InputError) -> Self {
        FrontError::Input(e)
    }
}

impl From<InputError> for Box<FrontError> {
    fn from(e: InputError) -> Self {
        Box::new(FrontError::Input(e))
    }
}

impl Front<'_> {
    /// The layout file at `path` (`-` reads standard input), named `flag PATH` in errors with
    /// `flag` (`--layout`), else `layout file PATH`.
    ///
    /// # Errors
    /// [`FrontError::Input`], [`FrontError::Layout`].
    pub fn read_layout(
        &self,
        path: &Path,
        flag: Option<&str>,
    ) -> Result<LayoutFile, Box<FrontError>> {
        let text = gpu_sysfs::document::read_input(path, "layout", self.limit)?;
        let shown = match flag {
            _ if path.as_os_str() == "-" && flag.is_none() => "standard input".to_owned(),
            Some(f) => format!("{f} {}", path.display()),
            None => path.display().to_string(),
        };
        let named = if flag.is_some() {
            shown
        } else {
            format!("layout file {shown}")
        };
        let parsed = LayoutFile::parse_max(&text, self.limit.bytes());
        Ok(parsed.map_err(|source| FrontError::Layout { named, source })?)
    }

    /// The one profile per GPU the config `config` (default: the file's only one) of the layout
    /// file at `path` (`--layout`) gives the GPUs of `nodes`
    /// ([`gpu_integrations::dra::layout_sizes`]), and what it could not keep.
    ///
    /// # Errors
    /// As [`Front::read_layout`]; a config the file lacks or that names what a node lacks.
    pub fn layout_sizes(
        &self,
        path: &Path,
        config: Option<&str>,
        nodes: &[NodeTopology],
    ) -> Result<LayoutSizes, Box<FrontError>> {
        let file = self.read_layout(path, Some("--layout"))?;
        let named = || format!("--layout {}", path.display());
        let layout = |named, source| FrontError::Layout { named, source };
        let config = file.select(config).map_err(|e| layout(named(), e))?;
        let (mut sizes, mut warnings) = (BTreeMap::new(), Vec::new());
        for node in nodes {
            let got = gpu_integrations::dra::layout_sizes(config, node)
                .map_err(|e| layout(format!("{} on node {}", named(), node.node), e))?;
            warnings.extend(got.warnings.into_iter().map(|w| format!("--layout: {w}")));
            sizes.extend(got.sizes);
        }
        Ok((sizes, warnings))
    }

    fn root_error(&self) -> impl FnOnce(gpu_health::HealthError) -> FrontError {
        let root = self.root.to_path_buf();
        move |source| FrontError::Root { root, source }
    }

    fn discovering(&self) -> Progress {
        let what = format!("discovering {}", self.root.display());
        Progress::start(self.progress, what)
    }

    /// The host at the root, opened: a directory, a `*.umockdev` recording or a sandbox.
    ///
    /// # Errors
    /// [`FrontError::Open`].
    pub fn open_host(&self) -> Result<gpu_sysfs::OpenedRoot, Box<FrontError>> {
        let root = self.root.to_path_buf();
        Ok(gpu_sysfs::open_root(self.root).map_err(|source| FrontError::Open { root, source })?)
    }

    /// The sandbox host at the root (`sandbox:DIR`), opened.
    ///
    /// # Errors
    /// [`FrontError::NotSandbox`], [`FrontError::Open`].
    pub fn open_sandbox(&self) -> Result<gpu_sysfs::OpenedRoot, Box<FrontError>> {
        if !gpu_sysfs::open::is_sandbox(self.root) {
            let root = self.root.to_path_buf();
            return Err(Box::new(FrontError::NotSandbox { root }));
        }
        self.open_host()
    }

    /// The root opened and composed into a node ([`crate::open_node`]).
    ///
    /// # Errors
    /// [`FrontError::Root`].
    pub fn open_node(&self, req: &NodeRequest) -> Result<ComposedNode, Box<FrontError>> {
        let _progress = self.discovering();
        Ok(crate::open_node(self.root, req).map_err(self.root_error())?)
    }

    /// The root opened for a command that changes it and discovers inside its operation
    /// ([`crate::open_node_host`]), and the warning to say first when the node's intent record
    /// holds a write an earlier command did not finish.
    ///
    /// # Errors
    /// [`FrontError::Root`].
    pub fn open_node_host(
        &self,
        req: &NodeRequest,
    ) -> Result<(OpenedNode, Option<String>), Box<FrontError>> {
        let _progress = self.discovering();
        let opened = crate::open_node_host(self.root, req).map_err(self.root_error())?;
        let warning = match crate::intent::unfinished(opened.host.host()) {
            Ok(found) => found.map(|intent| intent.describe()),
            Err(e) => Some(gpu_core::error_chain(&e)),
        };
        Ok((opened, warning))
    }

    /// This host's health graded with `req` (an NVML library given as `nvml_lib` that does not
    /// open is named by it), its baseline recorded afterwards with `record_baseline`.
    ///
    /// # Errors
    /// As [`Front::open_node`]; [`FrontError::NvmlLib`], [`FrontError::BaselineOnRecording`],
    /// [`FrontError::Baseline`].
    pub fn health(
        &self,
        req: &NodeRequest,
        nvml_lib: Option<&Path>,
        record_baseline: bool,
    ) -> Result<ComposedNode, Box<FrontError>> {
        let composed = self.open_node(req).map_err(|e| match (nvml_lib, &*e) {
            (
                Some(lib),
                FrontError::Root {
                    source: gpu_health::HealthError::NvmlLibrary { .. },
                    ..
                },
            ) => Box::new(FrontError::NvmlLib {
                lib: lib.to_path_buf(),
                source: e,
            }),
            _ => e,
        })?;
        if record_baseline {
            if self.root.is_file() {
                return Err(Box::new(FrontError::BaselineOnRecording));
            }
            let host = composed.host.host();
            let previous = gpu_health::Baseline::load(host).map_err(FrontError::Baseline)?;
            let (gpus, reports) = (&composed.topology.gpus, &composed.reports);
            let updated = gpu_health::updated_baseline(previous.as_ref(), gpus, reports);
            updated.save(host).map_err(FrontError::Baseline)?;
        }
        Ok(composed)
    }

    /// The Prometheus metrics of this host (or of the fleet file `inventory`), rendered afresh;
    /// a node name that cannot be valid is refused.
    ///
    /// # Errors
    /// As [`Front::load_nodes`]; [`FrontError::NodeName`], [`FrontError::Metrics`].
    pub fn metrics(&self, inventory: Option<&Path>) -> Result<String, Box<FrontError>> {
        let (nodes, allocations) = self.load_nodes(inventory)?;
        for n in &nodes {
            gpu_core::validate_name(&n.node).map_err(FrontError::NodeName)?;
        }
        Ok(gpu_integrations::metrics::render(&nodes, &allocations).map_err(FrontError::Metrics)?)
    }

    /// The Machine of the file at `path` (`-` reads standard input), placed on `target` (or on
    /// the front-end's `--node`, when `node_flag` is given) when one is named.
    ///
    /// # Errors
    /// [`FrontError::Input`], [`FrontError::Machine`], [`FrontError::TwoNodes`].
    pub fn read_machine(
        &self,
        path: &Path,
        target: Option<String>,
        node_flag: Option<String>,
    ) -> Result<gpu_core::Machine, Box<FrontError>> {
        let text = gpu_sysfs::document::read_input(path, "machine", self.limit)?;
        let invalid = |source| FrontError::Machine {
            path: path.to_path_buf(),
            source,
        };
        let mut machine = gpu_core::Machine::from_text(&text).map_err(invalid)?;
        // `--node` names the node for every command; for `place` it is the target node.
        let target = match (target, node_flag) {
            (Some(target), Some(node)) if target != node => {
                return Err(Box::new(FrontError::TwoNodes { node, target }));
            }
            (t, n) => t.or(n),
        };
        if let Some(node) = target {
            machine.target_node = Some(node);
            machine.validate().map_err(invalid)?;
        }
        Ok(machine)
    }

    /// The fleet file at `path` (shapes kept shared) and the nodes to show of it: `node`, or
    /// every node.
    ///
    /// # Errors
    /// As [`Front::read_shared_fleet`]; [`FrontError::NotInFleet`].
    pub fn fleet_nodes(
        &self,
        path: &Path,
        node: Option<&str>,
    ) -> Result<(SharedFleet, Vec<usize>), Box<FrontError>> {
        let (fleet, _) = self.read_shared_fleet(path, Some("--inventory"))?;
        let shown = match node {
            None => (0..fleet.nodes.len()).collect(),
            Some(n) => match fleet.nodes.iter().position(|x| x.name() == n) {
                Some(i) => vec![i],
                None => {
                    let (node, fleet, nodes) = (n.to_owned(), path.into(), fleet.names_listed());
                    return Err(Box::new(FrontError::NotInFleet { node, fleet, nodes }));
                }
            },
        };
        Ok((fleet, shown))
    }

    /// This host composed with the node name (checked first) and the request's defaults.
    ///
    /// # Errors
    /// [`FrontError::Node`], [`FrontError::Root`].
    pub fn open_named(&self) -> Result<ComposedNode, Box<FrontError>> {
        gpu_core::validate_name(self.node).map_err(FrontError::Node)?;
        self.open_node(&NodeRequest::new(self.node.to_owned()))
    }

    /// The node a hand-off is checked against: the node named `want` of the fleet file
    /// `inventory` (or its only node), else this host, discovered.
    ///
    /// # Errors
    /// As [`Front::open_named`] and [`Front::load_nodes`]; [`FrontError::Handoff`] for a node
    /// the fleet lacks.
    pub fn handoff_target(
        &self,
        inventory: Option<&Path>,
        want: Option<&str>,
    ) -> Result<CheckedNode, Box<FrontError>> {
        let Some(path) = inventory else {
            return Ok(CheckedNode::this_host(self.open_named()?));
        };
        let (nodes, _) = self.load_nodes(Some(path))?;
        Ok(CheckedNode::of_fleet(nodes, path, want).map_err(FrontError::Handoff)?)
    }

    /// The allocation of the file at `path` ([`crate::handoff::one_allocation`]): the only one,
    /// or `machine`'s.
    ///
    /// # Errors
    /// [`FrontError::Input`], [`FrontError::Handoff`].
    pub fn read_allocation(
        &self,
        path: &Path,
        machine: Option<&str>,
    ) -> Result<Allocation, Box<FrontError>> {
        let text = gpu_sysfs::document::read_input(path, "allocation", self.limit)?;
        Ok(crate::handoff::one_allocation(&text, machine, path).map_err(FrontError::Handoff)?)
    }

    /// This host composed with the node name (checked first), a parent filter and NVML.
    ///
    /// # Errors
    /// [`FrontError::Node`], [`FrontError::Root`].
    pub fn local_node(
        &self,
        mdev_parents: Option<Vec<ParentId>>,
        nvml: NvmlSource,
    ) -> Result<ComposedNode, Box<FrontError>> {
        gpu_core::validate_name(self.node).map_err(FrontError::Node)?;
        let mut req = NodeRequest::new(self.node.to_owned());
        (req.mdev_parents, req.nvml) = (mdev_parents, nvml);
        self.open_node(&req)
    }

    /// [`Front::local_node`]'s topology and the processes holding its GPUs and vGPUs open (one
    /// scan of `/proc` under the root, [`gpu_sysfs::actuate::node_holders`]).
    ///
    /// # Errors
    /// As [`Front::local_node`].
    pub fn local_topology_held(
        &self,
        mdev_parents: Option<Vec<ParentId>>,
        nvml: NvmlSource,
    ) -> Result<(NodeTopology, NodeHolders), Box<FrontError>> {
        let c = self.local_node(mdev_parents, nvml)?;
        let holders = gpu_sysfs::actuate::node_holders(c.host.host(), &c.topology);
        Ok((c.topology, holders))
    }

    /// A fleet document (`-` for standard input; errors in `FLAG PATH` with `flag`) decoded as
    /// it is read with its shapes kept shared, and the syntax it was written in.
    ///
    /// # Errors
    /// [`FrontError::Input`].
    pub fn read_shared_fleet(
        &self,
        path: &Path,
        flag: Option<&str>,
    ) -> Result<(SharedFleet, Syntax), Box<FrontError>> {
        let decode =
            |r: &mut gpu_sysfs::Document<'static>, max| SharedFleet::from_reader_max(r, max);
        Ok(gpu_sysfs::document::decode_input(
            path, "fleet", flag, self.limit, decode,
        )?)
    }

    /// The nodes and allocations to report: a fleet file's (every topology in full), or this
    /// host's (with NVML on the local `/` only).
    ///
    /// # Errors
    /// As [`Front::local_node`]; [`FrontError::Input`].
    pub fn load_nodes(
        &self,
        inventory: Option<&Path>,
    ) -> Result<(Vec<NodeTopology>, Vec<Allocation>), Box<FrontError>> {
        let Some(path) = inventory else {
            let nvml = NvmlSource::from_flags(None, false);
            return Ok((vec![self.local_node(None, nvml)?.topology], vec![]));
        };
        let decode = |r: &mut gpu_sysfs::Document<'static>, max| {
            gpu_core::Fleet::from_reader_max(r, max).map(|(f, _)| f)
        };
        let fleet = gpu_sysfs::document::decode_input(path, "fleet", None, self.limit, decode)?;
        Ok((fleet.nodes, fleet.allocations))
    }
}

/// The MIG state of the GPUs among `gpus` that are MIG-capable, or of `only` (whose refusal is
/// then returned, where the others are left out).
///
/// # Errors
/// What [`crate::mig::Mig::status`] returns for `only`, or any error but "not MIG-capable" and
/// NVML's for the others.
pub fn mig_statuses(
    mig: &crate::mig::Mig<'_, '_>,
    gpus: &[gpu_core::Gpu],
    only: Option<PciAddress>,
) -> Result<Vec<crate::mig::GpuMig>, crate::mig::MigError> {
    use crate::mig::MigError;
    let mut out = Vec::new();
    for gpu in gpus.iter().filter(|x| only.is_none_or(|a| a == x.address)) {
        match mig.status(&gpu.address) {
            Ok(s) => out.push(s),
            Err(MigError::NotMigCapable { .. } | MigError::Nvml { .. }) if only.is_none() => {}
            Err(e) => return Err(e),
        }
    }
    Ok(out)
}

/// The guest licensing files for `feature`, with the NVIDIA client configuration token read from
/// `path` when one is given ([`gpu_integrations::cloud_init::guest_files`]).
///
/// # Errors
/// [`FrontError::LicenseToken`], [`FrontError::License`].
pub fn guest_license(
    path: Option<&Path>,
    feature: gpu_integrations::cloud_init::FeatureType,
) -> Result<gpu_integrations::cloud_init::CloudConfig, Box<FrontError>> {
    let read = |p: &Path| {
        let path = p.to_path_buf();
        std::fs::read(p).map_err(|source| Box::new(FrontError::LicenseToken { path, source }))
    };
    let token = path.map(read).transpose()?;
    let name = path.and_then(|p| p.file_name()?.to_str());
    let named = path.map_or_else(
        || "export cloud-init".to_owned(),
        |p| format!("license token {}", p.display()),
    );
    let files =
        gpu_integrations::cloud_init::guest_files(token.as_deref().map(|t| (t, name)), feature);
    Ok(files.map_err(|source| FrontError::License { named, source })?)
}

/// A layout apply's report whether it succeeded or failed (`true`) after its rollback, from
/// [`crate::Node::apply_layout`]'s answer; any other error as it is.
///
/// # Errors
/// Every error but [`gpu_sysfs::apply::ApplyError::Failed`].
pub fn layout_outcome(
    result: Result<gpu_sysfs::apply::ApplyReport, crate::NodeError>,
) -> Result<(gpu_sysfs::apply::ApplyReport, bool), crate::NodeError> {
    use gpu_sysfs::apply::ApplyError;
    match result {
        Ok(report) => Ok((report, false)),
        Err(crate::NodeError::Layout(e)) => match *e {
            ApplyError::Failed { report } => Ok((*report, true)),
            other => Err(crate::NodeError::Layout(Box::new(other))),
        },
        Err(e) => Err(e),
    }
}

/// The mdev UUID `vgpu create` names a new instance with: `uuid`, else the one derived from
/// `machine`'s device `request`/`index` ([`gpu_sysfs::actuate::machine_uuid`]), stable across
/// restarts.
///
/// # Errors
/// [`FrontError::NoMdevName`] without either; [`FrontError::InvalidFlag`] for an invalid name.
pub fn mdev_uuid(
    uuid: Option<gpu_core::MdevUuid>,
    machine: Option<&str>,
    request: &str,
    index: u32,
) -> Result<gpu_core::MdevUuid, Box<FrontError>> {
    match (uuid, machine) {
        (Some(u), _) => Ok(u),
        (None, Some(m)) => Ok(gpu_sysfs::actuate::machine_uuid(m, request, index)
            .map_err(|(flag, source)| FrontError::InvalidFlag { flag, source })?),
        (None, None) => Err(Box::new(FrontError::NoMdevName)),
    }
}

/// The devices an export names by mdev `uuid` or PCI `address` (a whole GPU with its companion
/// functions, or a VF), checked against `target` ([`CheckedNode::devices`],
/// [`CheckedNode::address`]), and the check's warnings.
///
/// # Errors
/// [`FrontError::NoDevice`] without either; [`FrontError::Handoff`] for a refusal.
pub fn named_devices(
    target: &CheckedNode,
    uuid: Option<gpu_core::MdevUuid>,
    address: Option<PciAddress>,
    force: bool,
) -> Result<(Vec<gpu_integrations::handoff::VmDevice>, Vec<String>), Box<FrontError>> {
    match (uuid, address) {
        (Some(uuid), _) => {
            let devices = vec![gpu_integrations::handoff::VmDevice::Mdev { uuid }];
            let warnings = target
                .devices(&devices, force)
                .map_err(FrontError::Handoff)?;
            Ok((devices, warnings))
        }
        (None, Some(address)) => Ok(target
            .address(&address, force)
            .map_err(FrontError::Handoff)?),
        (None, None) => Err(Box::new(FrontError::NoDevice)),
    }
}
