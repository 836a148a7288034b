//! `gpuslice dra prepare|unprepare|check|publish`: the node side of Kubernetes DRA.
//!
//! `prepare` and `unprepare` are the kubelet plugin's own calls ([`gpu_node::dra::prepare`] /
//! [`gpu_node::dra::unprepare`]): the same checks of the claim, the same plan, record and undo,
//! under the same host lock, and with `--cdi-dir` the same CDI spec and KubeVirt metadata. A
//! wrapper forwards the claim it is asked to prepare (as JSON or YAML) and gets back the devices
//! to hand to the VM. What was created is recorded under the state directory, one file per
//! claim, so that `unprepare` removes exactly that, a repeated `prepare` answers the same, and
//! `gpuslice export dra` does not subtract the scheduler's own vGPUs from what it publishes.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::{Args, Subcommand};

use crate::common::{Global, Output, open_node, print_data, read_input};
use gpu_integrations::dra::cdi::CdiLayout;
use gpu_integrations::dra::{ClaimStore, DEFAULT_DRIVER, model, rules};
use gpu_node::dra::ClaimId;
use gpu_node::dra::once::Once;

/// The kubelet's default directory (the plugin's `--kubelet-dir`).
const DEFAULT_KUBELET_DIR: &str = "/var/lib/kubelet";
/// How long a prepare or unprepare waits for the host lock another writer holds.
const LOCK_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60);

/// `gpuslice dra` subcommands.
#[derive(Subcommand, Debug)]
#[command(defer = true)]
pub enum DraCommand {
    /// Create what an allocated ResourceClaim names on this node.
    Prepare(PrepareArgs),
    /// Remove what `prepare` created for a claim.
    Unprepare(UnprepareArgs),
    /// Check ResourceSlices (a YAML stream or a JSON List, any driver's) against the API's limits
    /// and the exclusivity of whole GPUs and vGPUs; exit 1 listing every violation.
    Check(CheckArgs),
    /// Make the API server hold exactly this node's ResourceSlices (or every node's of a fleet
    /// file), as `gpuslice export dra` computes them for the server's version: create, update,
    /// delete, a new pool generation whenever the content changes; exit 1 when a node failed.
    Publish(PublishArgs),
}

// `dra publish` arguments.
#[derive(Args, Debug)]
pub struct PublishArgs {
    /// The kubeconfig file (its current context); without it, the in-cluster service account.
    #[arg(long, value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,
    /// A fleet file (JSON or YAML) instead of this host: every node's pool.
    #[arg(long, value_name = "FLEET")]
    pub inventory: Option<PathBuf>,
    /// Print the create/update/delete plan per node without writing.
    #[arg(long)]
    pub dry_run: bool,
    #[command(flatten)]
    pub claims: ClaimArgs,
    /// Before Kubernetes 1.36.2: the vGPU profile a GPU offers while no vGPU locks its size
    /// (as `export dra --size-for`). Repeatable.
    #[arg(long, value_name = "GPU=PROFILE", value_parser = gpu_integrations::dra::parse_size_for)]
    pub size_for: Vec<(gpu_core::PciAddress, String)>,
    /// The longest one request to the API server may take, in seconds.
    #[arg(long, default_value_t = 15, value_name = "SECONDS", value_parser = clap::value_parser!(u64).range(1..=600))]
    pub timeout: u64,
    /// How many nodes are published at a time, and the most requests on the wire to the API
    /// server.
    #[arg(long, default_value_t = 16, value_name = "N", value_parser = clap::value_parser!(u64).range(1..=256))]
    pub parallel: u64,
}

// `dra check` arguments.
#[derive(Args, Debug)]
pub struct CheckArgs {
    /// The file with the slices (`-` for standard input).
    #[arg(value_name = "FILE")]
    pub file: PathBuf,
    /// The Kubernetes release whose rules apply (1.34 ... 1.37, or a patch release: 1.36.2).
    #[arg(long, default_value = "1.37", value_name = "VERSION")]
    pub k8s_version: gpu_integrations::dra::K8sVersion,
}

// `dra prepare` arguments.
#[derive(Args, Debug)]
pub struct PrepareArgs {
    /// The ResourceClaim with `status.allocation` (or a bare AllocationResult), JSON or YAML;
    /// `-` reads standard input.
    #[arg(long, value_name = "FILE")]
    pub claim: PathBuf,
    /// The claim's UID, when the input has no `metadata.uid`.
    #[arg(long, value_name = "UID")]
    pub claim_uid: Option<String>,
    #[command(flatten)]
    pub claims: ClaimArgs,
    /// Print the plan without changing the host.
    #[arg(long)]
    pub dry_run: bool,
    #[command(flatten)]
    pub cdi: CdiArgs,
}

// The driver the devices are published under and where prepared claims are recorded.
#[derive(Args, Debug)]
pub struct ClaimArgs {
    /// The DRA driver name the devices are published under (it names the CDI spec
    /// `--cdi-dir` writes).
    #[arg(long, default_value = DEFAULT_DRIVER, value_name = "NAME")]
    pub driver: String,
    /// Where `gpuslice dra prepare` records the claims it prepared, so that none is undone or
    /// subtracted twice (default: var/lib/gpuslice/dra inside --root; for `--root sandbox:DIR`,
    /// inside the sandbox's host tree).
    #[arg(long, value_name = "DIR")]
    pub state_dir: Option<PathBuf>,
}

impl ClaimArgs {
    /// The claims `dra prepare` recorded on `--root`'s node.
    pub fn prepared(
        &self,
        g: &Global,
    ) -> anyhow::Result<std::collections::BTreeMap<String, gpu_integrations::dra::Prepared>> {
        Ok(ClaimStore::open(&g.root, self.state_dir.as_deref())?.read_prepared()?)
    }

    /// How `prepare` and `unprepare` run: on `--root`'s node, waiting for the host lock up to a
    /// minute and saying so on stderr.
    fn once<'a>(&'a self, cdi: Option<&'a CdiLayout>) -> Once<'a> {
        let (driver, state_dir) = (&self.driver, self.state_dir.as_deref());
        let (lock_timeout, waiting) = (Some(LOCK_TIMEOUT), &crate::common::say_waiting);
        Once {
            driver,
            state_dir,
            cdi,
            lock_timeout,
            waiting,
        }
    }
}

// Where the CDI spec and KubeVirt's metadata go (`--cdi-dir`), as the kubelet plugin writes them.
#[derive(Args, Debug)]
pub struct CdiArgs {
    /// Also write the claim's CDI spec (`<driver>-<uid>.json`) in DIR and its KubeVirt device
    /// metadata, as the kubelet plugin does (a host path, taken as given, not under --root);
    /// `unprepare` removes them.
    #[arg(long, value_name = "DIR")]
    pub cdi_dir: Option<PathBuf>,
    /// The kubelet's directory (taken as given): the metadata files go in
    /// `<DIR>/plugins/<driver>/metadata`, where the plugin puts them.
    #[arg(long, default_value = DEFAULT_KUBELET_DIR, value_name = "DIR", requires = "cdi_dir")]
    pub kubelet_dir: PathBuf,
}

impl CdiArgs {
    /// The CDI layout of `driver`, when `--cdi-dir` was given.
    fn layout(&self, driver: &str) -> anyhow::Result<Option<CdiLayout>> {
        let Some(cdi_dir) = &self.cdi_dir else {
            return Ok(None);
        };
        let layout = CdiLayout::under_kubelet(cdi_dir.clone(), &self.kubelet_dir, driver);
        Ok(Some(layout.context("--driver")?))
    }
}

// `dra unprepare` arguments.
#[derive(Args, Debug)]
pub struct UnprepareArgs {
    /// The claim's UID.
    #[arg(long, value_name = "UID")]
    pub claim_uid: String,
    /// Remove instances even while a VM holds them open.
    #[arg(long)]
    pub force: bool,
    #[command(flatten)]
    pub claims: ClaimArgs,
    #[command(flatten)]
    pub cdi: CdiArgs,
}

/// Runs `gpuslice dra publish` (in the `gpuslice-agent` binary: it talks to the API server).
pub fn publish(g: &Global, a: &PublishArgs) -> anyhow::Result<ExitCode> {
    use gpu_agent::kube::{self, ClientOptions, KubeClient, SliceOptions};
    let (nodes, _) = crate::common::front(g).load_nodes(a.inventory.as_deref())?;
    let prepared = a.claims.prepared(g)?;
    let (mixed_placements, notes) =
        crate::common::front(g).mixed_placements(a.inventory.as_deref(), &nodes);
    notes.iter().for_each(|w| eprintln!("gpuslice: {w}"));
    let opts = SliceOptions {
        driver: a.claims.driver.clone(),
        size_for: a.size_for.iter().cloned().collect(),
        mixed_placements,
    };
    let parallel = usize::try_from(a.parallel).unwrap_or(1);
    let client_opts = ClientOptions {
        kubeconfig: a.kubeconfig.clone(),
        timeout: std::time::Duration::from_secs(a.timeout),
        max_in_flight: parallel,
        ..ClientOptions::default()
    };
    let rt = gpu_agent::runtime().context("cannot start the runtime")?;
    let (server, reports) = rt.block_on(async {
        let client = KubeClient::connect(&client_opts).await?;
        kube::publish_nodes(&client, &nodes, &opts, &prepared, a.dry_run, parallel).await
    })?;
    let summary = kube::PublishSummary {
        server: &server,
        reports: &reports,
        dry_run: a.dry_run,
    };
    summary
        .notes()
        .iter()
        .for_each(|n| eprintln!("gpuslice: {n}"));
    match g.output {
        Output::Table => print!("{}", summary.table()),
        other => print_data(other, &summary.document())?,
    }
    let failed = summary.failed();
    if failed > 0 {
        eprintln!(
            "gpuslice: {failed} of {} nodes not published",
            reports.len()
        );
        return Ok(ExitCode::from(1));
    }
    Ok(ExitCode::SUCCESS)
}

/// Runs `gpuslice dra check` (exit 1 when a slice breaks a rule of the version).
pub fn check(a: &CheckArgs) -> anyhow::Result<ExitCode> {
    let slices = model::parse_slices(&read_input(&a.file, "slices")?)?;
    let violations = rules::check(&slices, a.k8s_version);
    violations.iter().for_each(|v| println!("{v}"));
    if !violations.is_empty() {
        return Ok(ExitCode::from(1));
    }
    let (n, version) = (slices.len(), a.k8s_version);
    eprintln!("gpuslice: {n} slices hold the Kubernetes {version} rules");
    Ok(ExitCode::SUCCESS)
}

/// The CDI layout of `--cdi-dir`, then the node (in this order: a bad `--driver` is refused
/// before the host is read).
fn cdi_and_node(
    g: &Global,
    cdi: &CdiArgs,
    driver: &str,
) -> anyhow::Result<(Option<CdiLayout>, gpu_node::ComposedNode)> {
    let cdi = cdi.layout(driver)?;
    gpu_core::validate_name(&g.node_name()).context("--node")?;
    Ok((
        cdi,
        open_node(g, &gpu_health::NodeRequest::new(g.node_name()))?,
    ))
}

/// Runs `gpuslice dra prepare`: the kubelet plugin's call, on `--root`.
pub fn prepare(g: &Global, a: &PrepareArgs) -> anyhow::Result<ExitCode> {
    let text = read_input(&a.claim, "claim")?;
    let doc: serde_json::Value = gpu_core::decode_text("ResourceClaim", &text)?;
    let id = ClaimId::of_document(&doc, a.claim_uid.as_deref())?;
    let (cdi, node) = cdi_and_node(g, &a.cdi, &a.claims.driver)?;
    let done = a
        .claims
        .once(cdi.as_ref())
        .prepare(&node, &doc, &id, a.dry_run)?;
    println!("{}", serde_json::to_string_pretty(&done.document()?)?);
    Ok(ExitCode::SUCCESS)
}

/// Runs `gpuslice dra unprepare`: the kubelet plugin's call, on `--root`.
pub fn unprepare(g: &Global, a: &UnprepareArgs) -> anyhow::Result<ExitCode> {
    // The root is opened as prepare opens it, so a root that is no host is refused alike
    // (not answered "nothing to undo").
    let (cdi, node) = cdi_and_node(g, &a.cdi, &a.claims.driver)?;
    let done = a
        .claims
        .once(cdi.as_ref())
        .unprepare(&node, &a.claim_uid, a.force)?;
    println!("{}", serde_json::to_string(&done)?);
    Ok(ExitCode::SUCCESS)
}
