//! `gpuslice dra prepare|unprepare|check|publish`: the node side of Kubernetes DRA.
//!
//! A kubelet plugin wrapper forwards the claim it is asked to prepare (as JSON) and gets back the
//! devices to hand to the VM. What was created is recorded under the state directory, one file per
//! claim, so that `unprepare` removes exactly that, a repeated `prepare` answers the same, and
//! `gpuslice export dra` does not subtract the scheduler's own vGPUs from what it publishes.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::{Args, Subcommand};

use crate::common::{Global, Output, load_nodes, open_node, read_input, render_table};
use gpu_integrations::dra::model::PrepareInput;
use gpu_integrations::dra::{self, ClaimStore, DEFAULT_DRIVER, model, rules};

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
    /// The DRA driver name.
    #[arg(long, default_value = DEFAULT_DRIVER, value_name = "NAME")]
    pub driver: String,
    /// Before Kubernetes 1.36.2: the vGPU profile a GPU offers while no vGPU locks its size
    /// (as `export dra --size-for`). Repeatable.
    #[arg(long, value_name = "GPU=PROFILE", value_parser = crate::cmd::export::parse_size_for)]
    pub size_for: Vec<(gpu_core::PciAddress, String)>,
    /// Where `gpuslice dra prepare` records what it created (so it is not subtracted twice).
    #[arg(long, value_name = "DIR")]
    pub state_dir: Option<PathBuf>,
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
    /// The DRA driver name the devices were published under.
    #[arg(long, default_value = DEFAULT_DRIVER, value_name = "NAME")]
    pub driver: String,
    /// Where prepared claims are recorded (default: var/lib/gpuslice/dra inside --root).
    #[arg(long, value_name = "DIR")]
    pub state_dir: Option<PathBuf>,
    /// Print the plan without changing the host.
    #[arg(long)]
    pub dry_run: bool,
}

// `dra unprepare` arguments.
#[derive(Args, Debug)]
pub struct UnprepareArgs {
    /// The claim's UID.
    #[arg(long, value_name = "UID")]
    pub claim_uid: String,
    /// Where prepared claims are recorded (default: var/lib/gpuslice/dra inside --root).
    #[arg(long, value_name = "DIR")]
    pub state_dir: Option<PathBuf>,
    /// Remove instances even while a VM holds them open.
    #[arg(long)]
    pub force: bool,
}

/// Runs `gpuslice dra publish` (in the `gpuslice-agent` binary: it talks to the API server).
///
/// # Errors
/// When the API server cannot be reached or refuses the slices.
pub fn publish(g: &Global, a: &PublishArgs) -> anyhow::Result<ExitCode> {
    use gpu_agent::kube::{self, ClientOptions, KubeClient, SliceOptions};
    let (nodes, _) = load_nodes(g, a.inventory.as_deref())?;
    let prepared = ClaimStore::open(&g.root, a.state_dir.as_deref())?.read_prepared()?;
    let opts = SliceOptions {
        driver: a.driver.clone(),
        size_for: a.size_for.iter().cloned().collect(),
    };
    let parallel = usize::try_from(a.parallel).unwrap_or(1);
    let client_opts = ClientOptions {
        kubeconfig: a.kubeconfig.clone(),
        timeout: std::time::Duration::from_secs(a.timeout),
        max_in_flight: parallel,
    };
    let rt = gpu_agent::runtime().context("cannot start the runtime")?;
    let (server, reports) = rt.block_on(async {
        let client = KubeClient::connect(&client_opts).await?;
        kube::publish_nodes(&client, &nodes, &opts, &prepared, a.dry_run, parallel).await
    })?;
    eprintln!(
        "gpuslice: API server {}; {}",
        server.git_version,
        server.encoding().describe(server.version)
    );
    let mut failed = 0;
    let mut rows = Vec::new();
    let mut docs = Vec::new();
    for r in &reports {
        for w in &r.warnings {
            eprintln!("gpuslice: {}: {w}", r.node);
        }
        match &r.result {
            Ok((generation, steps)) => {
                let plan = if steps.is_empty() {
                    "unchanged".to_owned()
                } else {
                    steps
                        .iter()
                        .map(ToString::to_string)
                        .collect::<Vec<_>>()
                        .join(", ")
                };
                rows.push(vec![r.node.clone(), generation.to_string(), plan]);
                docs.push(serde_json::json!({
                    "node": r.node,
                    "generation": generation,
                    "steps": steps.iter().map(|s| {
                        let (op, name) = match s {
                            kube::PlanStep::Create { name } => ("create", name),
                            kube::PlanStep::Update { name, .. } => ("update", name),
                            kube::PlanStep::Delete { name } => ("delete", name),
                        };
                        serde_json::json!({"op": op, "name": name})
                    }).collect::<Vec<_>>(),
                }));
            }
            Err(e) => {
                failed += 1;
                rows.push(vec![r.node.clone(), "-".to_owned(), format!("failed: {e}")]);
                docs.push(serde_json::json!({"node": r.node, "error": e.to_string()}));
            }
        }
    }
    let doc = serde_json::json!({
        "server": server.git_version,
        "encoding": server.encoding().as_str(),
        "dryRun": a.dry_run,
        "nodes": docs,
    });
    match g.output {
        Output::Table => {
            let head = if a.dry_run { "PLAN" } else { "WRITTEN" };
            print!("{}", render_table(&["NODE", "GENERATION", head], &rows));
        }
        Output::Json => println!("{}", serde_json::to_string_pretty(&doc)?),
        Output::Yaml => print!("{}", serde_yaml_ng::to_string(&doc)?),
    }
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
///
/// # Errors
/// When the slices cannot be read or decoded.
pub fn check(a: &CheckArgs) -> anyhow::Result<ExitCode> {
    let slices = model::parse_slices(&read_input(&a.file, "slices")?)?;
    let violations = rules::check(&slices, a.k8s_version);
    for v in &violations {
        println!("{v}");
    }
    if violations.is_empty() {
        eprintln!(
            "gpuslice: {} slices hold the Kubernetes {} rules",
            slices.len(),
            a.k8s_version
        );
        Ok(ExitCode::SUCCESS)
    } else {
        Ok(ExitCode::from(1))
    }
}

/// Runs `gpuslice dra prepare`.
///
/// # Errors
/// When the claim cannot be read or mapped, or the host refuses a change (already-made
/// changes of the same call are undone).
pub fn prepare(g: &Global, a: &PrepareArgs) -> anyhow::Result<ExitCode> {
    let text = read_input(&a.claim, "claim")?;
    let input: PrepareInput = gpu_core::decode_text("ResourceClaim", &text)?;
    let claim = dra::Claim::from_input(input, a.claim_uid.clone())?;
    let store = ClaimStore::open(&g.root, a.state_dir.as_deref())?;
    gpu_core::validate_name(&g.node_name()).context("--node")?;
    let opened = open_node(g, &gpu_health::NodeRequest::new(g.node_name()))?;
    let node = dra::DraNode {
        host: &opened.host,
        topology: &opened.topology,
        recording: opened.host.is_recording(),
    };
    let opts = dra::PrepareOptions {
        driver: a.driver.clone(),
        dry_run: a.dry_run,
    };
    let result = dra::prepare_claim(&node, &store, &claim, &opts)?;
    println!("{}", serde_json::to_string_pretty(&result.answer)?);
    Ok(ExitCode::SUCCESS)
}

/// Runs `gpuslice dra unprepare`.
///
/// # Errors
/// When the recorded claim cannot be read or the host refuses a removal.
pub fn unprepare(g: &Global, a: &UnprepareArgs) -> anyhow::Result<ExitCode> {
    let store = ClaimStore::open(&g.root, a.state_dir.as_deref())?;
    gpu_core::validate_name(&g.node_name()).context("--node")?;
    // The root is opened as prepare opens it, so a root that is no host is refused alike
    // (not answered "nothing to undo").
    let opened = open_node(g, &gpu_health::NodeRequest::new(g.node_name()))?;
    let done = dra::unprepare_claim(
        &opened.host,
        opened.host.is_recording(),
        &store,
        &a.claim_uid,
        a.force,
    )?;
    println!("{}", serde_json::to_string(&done)?);
    Ok(ExitCode::SUCCESS)
}
