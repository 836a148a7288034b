//! `gpuslice place` and `gpuslice plan`: put a Machine on a fleet, plan moves, drains and
//! evacuations. The scheduling is all in `gpu-sched`; this module reads files and prints.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, bail};
use clap::{Args, Subcommand};
use gpu_core::Fleet;
use gpu_sched::text::{self, PlacedDocument, Recorded, RefusalDocument, UnplacedDocument};
use gpu_sched::{FleetState, Policy, Refusal, SchedError};

use crate::common::{Global, Output};

/// Exit status when the fleet cannot hold what was asked (the refusal is on stderr).
const EXIT_REFUSED: u8 = 3;

// `gpuslice place` arguments.
#[derive(Args, Debug)]
pub struct PlaceArgs {
    /// The fleet file: `{nodes: [...], allocations: [...], templates: {...}}`, JSON or YAML.
    #[arg(long, value_name = "FLEET")]
    pub inventory: PathBuf,
    /// The Machine to place: a JSON or YAML file (`-` reads standard input).
    #[arg(long, value_name = "SPEC")]
    pub machine: PathBuf,
    /// How to choose among nodes and GPUs that fit: binpack (fill used nodes and GPUs first),
    /// spread (the opposite), or firstfit (the first node in node order that fits, as the
    /// Kubernetes DRA allocator does).
    #[arg(long, default_value = "binpack", value_parser = parse_policy, value_name = "POLICY")]
    pub policy: Policy,
    /// Write the fleet back to FLEET with the new allocation recorded as pending.
    #[arg(long, conflicts_with = "dry_run")]
    pub save: bool,
    /// Say where the Machine would go and record nothing (a what-if; the fleet is unchanged).
    #[arg(long)]
    pub dry_run: bool,
    /// Place on this node only, or refuse with its reasons (overrides the Machine's `targetNode`).
    /// The global `--node NODE` means the same for `place`; naming two different nodes is refused.
    #[arg(long, value_name = "NODE")]
    pub target_node: Option<String>,
    /// With `-o json`/`-o yaml`, a refusal lists every refused node with its reasons under
    /// `refusal.nodes` (by default only the grouped summary, `refusal.groups`).
    #[arg(long)]
    pub detail: bool,
}

fn parse_policy(s: &str) -> Result<Policy, SchedError> {
    s.parse()
}

/// `gpuslice plan` subcommands. Each prints a plan and changes nothing; each exits 3 when part
/// of the plan cannot be made (a Machine that cannot move).
#[derive(Subcommand, Debug)]
#[command(defer = true)]
pub enum PlanCommand {
    /// Where a Machine would go on another node: same GPU family (or --gpu), same vGPU profile.
    Migrate(MigrateArgs),
    /// Where every Machine on a node (given with the global --node) would go, and which must stay.
    Drain(FleetArgs),
    /// Machines on Unhealthy GPUs, each with a destination.
    Evacuate(FleetArgs),
}

// `gpuslice plan migrate` arguments.
#[derive(Args, Debug)]
pub struct MigrateArgs {
    /// The fleet file.
    #[arg(long, value_name = "FLEET")]
    pub inventory: PathBuf,
    /// The Machine to move.
    #[arg(long, value_name = "NAME")]
    pub machine: String,
    /// The destination node.
    #[arg(long, value_name = "NODE")]
    pub to: String,
    /// A destination GPU for each whole GPU the Machine holds, in the order it holds them.
    #[arg(long = "gpu", value_name = "NAME")]
    pub gpus: Vec<String>,
    /// With `-o json`/`-o yaml`, a refusal lists every refused node with its reasons.
    #[arg(long)]
    pub detail: bool,
}

// `gpuslice plan drain|evacuate` arguments (drain's node comes from the global `--node`).
#[derive(Args, Debug)]
pub struct FleetArgs {
    /// The fleet file.
    #[arg(long, value_name = "FLEET")]
    pub inventory: PathBuf,
}

/// Reads a fleet file with its shapes kept shared (each shape indexed once, its nodes copies of
/// that index: no topology is expanded per node), and says whether it was JSON.
fn load_fleet(g: &Global, path: &Path) -> anyhow::Result<(FleetState, bool)> {
    let (fleet, syntax) = crate::common::front(g).read_shared_fleet(path, None)?;
    let json = syntax == gpu_core::Syntax::Json;
    let state =
        FleetState::from_shared(fleet).with_context(|| format!("fleet file {}", path.display()))?;
    Ok((state, json))
}

fn save_fleet(path: &Path, fleet: &Fleet, json: bool) -> anyhow::Result<()> {
    gpu_sysfs::atomic::write_file_atomic(path, fleet.to_text(json)?.as_bytes())
        .with_context(|| format!("cannot replace {}", path.display()))
}

/// Prints a refusal on stderr (text, or JSON/YAML with `-o`) and returns exit status 3.
fn refused(out: Output, refusal: &Refusal, detail: bool) -> anyhow::Result<ExitCode> {
    let doc = || RefusalDocument::of(refusal, detail);
    match out {
        Output::Table => eprintln!(
            "gpuslice: cannot place Machine {:?}: {}",
            refusal.machine,
            refusal.render()
        ),
        Output::Json => eprintln!("{}", serde_json::to_string_pretty(&doc())?),
        Output::Yaml => eprint!("{}", serde_yaml_ng::to_string(&doc())?),
    }
    Ok(ExitCode::from(EXIT_REFUSED))
}

/// Runs `place`.
pub fn place(g: &Global, a: PlaceArgs) -> anyhow::Result<ExitCode> {
    let (mut state, json) = load_fleet(g, &a.inventory)?;
    let (target, node) = (a.target_node, g.node.clone());
    let machine = crate::common::front(g).read_machine(&a.machine, target, node)?;
    let result = if a.dry_run {
        state.try_place_detailed(&machine, a.policy)
    } else {
        state.place_detailed(&machine, a.policy)
    };
    let placed = match result {
        Ok(p) => p,
        Err(SchedError::Unsatisfiable(r)) => return refused(g.output, &r, a.detail),
        Err(e) => return Err(e.into()),
    };
    if a.save && !placed.already_placed {
        save_fleet(&a.inventory, &state.to_fleet(), json)?;
    }
    let recorded = Recorded::of(a.dry_run, a.save);
    let (placement, dry_run, saved) = (&placed, a.dry_run, a.save);
    let doc = PlacedDocument {
        placement,
        dry_run,
        saved,
    };
    g.output.show(&doc, || {
        text::placement(&state, &placed, a.policy, recorded)
    })
}

// `gpuslice unplace` arguments.
#[derive(Args, Debug)]
pub struct UnplaceArgs {
    /// The fleet file `place --save` recorded the Machine in.
    #[arg(long, value_name = "FLEET")]
    pub inventory: PathBuf,
    /// The Machine whose allocation to release, by name.
    #[arg(long, value_name = "NAME")]
    pub machine: String,
    /// Write the fleet back to FLEET without the allocation (without it: say what would be
    /// released, and change nothing).
    #[arg(long)]
    pub save: bool,
}

/// Runs `unplace`: the inverse of `place --save`.
pub fn unplace(g: &Global, a: UnplaceArgs) -> anyhow::Result<ExitCode> {
    let (mut state, json) = load_fleet(g, &a.inventory)?;
    let unplaced = state
        .unplace(&a.machine)
        .with_context(|| format!("fleet file {}", a.inventory.display()))?;
    if a.save {
        save_fleet(&a.inventory, &state.to_fleet(), json)?;
    }
    let doc = UnplacedDocument {
        unplaced: &unplaced,
        saved: a.save,
    };
    g.output
        .show(&doc, || text::unplaced(&state, &unplaced, a.save))
}

/// Runs `plan`.
pub fn plan(g: &Global, c: PlanCommand) -> anyhow::Result<ExitCode> {
    match c {
        PlanCommand::Migrate(a) => {
            let (state, _) = load_fleet(g, &a.inventory)?;
            match state.plan_migration(&a.machine, &a.to, &a.gpus) {
                Ok(plan) => g.output.show(&plan, || text::migration(&plan)),
                Err(SchedError::Unsatisfiable(r)) => refused(g.output, &r, a.detail),
                Err(e) => Err(e.into()),
            }
        }
        PlanCommand::Drain(a) => {
            let Some(node) = g.node.as_deref() else {
                bail!("`plan drain` needs the node to drain: --node NODE");
            };
            let (state, _) = load_fleet(g, &a.inventory)?;
            let plan = state.plan_drain(node)?;
            g.output.show(&plan, || text::drain(&plan))?;
            Ok(complete(plan.is_complete()))
        }
        PlanCommand::Evacuate(a) => {
            let (state, _) = load_fleet(g, &a.inventory)?;
            let plan = state.plan_evacuation();
            g.output.show(&plan, || text::evacuation(&plan))?;
            Ok(complete(plan.machines.iter().all(|m| m.plan.is_some())))
        }
    }
}

/// Exit 0 for a plan made whole, 3 for one that leaves a Machine where it is.
fn complete(whole: bool) -> ExitCode {
    ExitCode::from(if whole { 0 } else { EXIT_REFUSED })
}
