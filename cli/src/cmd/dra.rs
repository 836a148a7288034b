//! `gpuslice dra prepare|unprepare`: the node side of Kubernetes DRA.
//!
//! A kubelet plugin wrapper forwards the claim it is asked to prepare (as JSON) and gets back the
//! devices to hand to the VM. What was created is recorded under the state directory, one file per
//! claim, so that `unprepare` removes exactly that, a repeated `prepare` answers the same, and
//! `gpuslice export dra` does not subtract the scheduler's own vGPUs from what it publishes.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::{Args, Subcommand};

use crate::common::{Global, open_node, read_input};
use gpu_integrations::dra::model::PrepareInput;
use gpu_integrations::dra::{self, ClaimStore, DEFAULT_DRIVER, model, rules};

/// `gpuslice dra` subcommands.
#[derive(Subcommand, Debug)]
pub enum DraCommand {
    /// Create what an allocated ResourceClaim names on this node.
    Prepare(PrepareArgs),
    /// Remove what `prepare` created for a claim.
    Unprepare(UnprepareArgs),
    /// Check ResourceSlices (a YAML stream or a JSON List, any driver's) against the API's limits
    /// and the exclusivity of whole GPUs and vGPUs; exit 1 listing every violation.
    Check(CheckArgs),
}

/// `dra check` arguments.
#[derive(Args, Debug)]
pub struct CheckArgs {
    /// The file with the slices (`-` for standard input).
    #[arg(value_name = "FILE")]
    pub file: PathBuf,
    /// The Kubernetes release whose rules apply (1.34 ... 1.37, or a patch release: 1.36.2).
    #[arg(long, default_value = "1.37", value_name = "VERSION")]
    pub k8s_version: gpu_integrations::dra::K8sVersion,
}

/// `dra prepare` arguments.
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

/// `dra unprepare` arguments.
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

/// Runs `gpuslice dra`.
///
/// # Errors
/// When the claim cannot be read or mapped, or the host refuses a change (already-made changes
/// of the same call are undone).
pub fn run(g: &Global, c: DraCommand) -> anyhow::Result<ExitCode> {
    match c {
        DraCommand::Prepare(a) => prepare(g, &a),
        DraCommand::Unprepare(a) => unprepare(g, &a),
        DraCommand::Check(a) => check(&a),
    }
}

fn check(a: &CheckArgs) -> anyhow::Result<ExitCode> {
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

fn prepare(g: &Global, a: &PrepareArgs) -> anyhow::Result<ExitCode> {
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

fn unprepare(g: &Global, a: &UnprepareArgs) -> anyhow::Result<ExitCode> {
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
