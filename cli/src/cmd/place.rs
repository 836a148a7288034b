//! `gpuslice place` and `gpuslice plan`: put a Machine on a fleet, plan moves, drains and
//! evacuations. The scheduling is all in `gpu-sched`; this module reads files and prints.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, bail};
use clap::{Args, Subcommand};
use gpu_core::{AllocatedDevice, Allocation, Fleet, Machine};
use gpu_sched::{
    DrainPlan, EvacuationPlan, FleetState, MigrationPlan, Placement, Policy, Refusal, SchedError,
};

use crate::common::{Global, Output, print_data, read_input, render_table};

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

/// What `place` prints with `-o json|yaml`: the placement's keys, plus whether it was recorded.
#[derive(serde::Serialize)]
#[serde(rename_all = "camelCase")]
struct PlacedOut<'a> {
    #[serde(flatten)]
    placement: &'a Placement,
    /// True with `--dry-run`: a what-if, nothing recorded.
    dry_run: bool,
    /// True when the fleet file was written (`--save`); false means nothing was recorded.
    saved: bool,
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
    Drain(DrainArgs),
    /// Machines on Unhealthy GPUs, each with a destination.
    Evacuate(EvacuateArgs),
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

// `gpuslice plan drain` arguments (the node comes from the global `--node`).
#[derive(Args, Debug)]
pub struct DrainArgs {
    /// The fleet file.
    #[arg(long, value_name = "FLEET")]
    pub inventory: PathBuf,
}

// `gpuslice plan evacuate` arguments.
#[derive(Args, Debug)]
pub struct EvacuateArgs {
    /// The fleet file.
    #[arg(long, value_name = "FLEET")]
    pub inventory: PathBuf,
}

/// Reads a fleet file with its shapes kept shared (each shape indexed once, its nodes copies of
/// that index: no topology is expanded per node), and says whether it was JSON.
fn load_fleet(path: &Path) -> anyhow::Result<(FleetState, bool)> {
    let (fleet, syntax) = crate::common::read_shared_fleet(path, None)?;
    let json = syntax == gpu_core::Syntax::Json;
    let state =
        FleetState::from_shared(fleet).with_context(|| format!("fleet file {}", path.display()))?;
    Ok((state, json))
}

fn save_fleet(path: &Path, fleet: &Fleet, json: bool) -> anyhow::Result<()> {
    gpu_sysfs::atomic::write_file_atomic(path, fleet.to_text(json)?.as_bytes())
        .with_context(|| format!("cannot replace {}", path.display()))
}

/// A refusal as printed with `-o json` / `-o yaml`: `{"error": {"kind": "unsatisfiable",
/// "message", "refusal"}}`, the shape of every other error.
#[derive(serde::Serialize)]
struct RefusalOut {
    error: RefusalError,
}

#[derive(serde::Serialize)]
struct RefusalError {
    /// The kind, from the one vocabulary (`unsatisfiable`).
    kind: &'static str,
    message: String,
    /// The grouped summary; every node's reasons too with `--detail`.
    refusal: gpu_sched::RefusalReport,
}

/// Prints a refusal on stderr (text, or JSON/YAML with `-o`) and returns exit status 3.
fn refused(out: Output, refusal: &Refusal, detail: bool) -> anyhow::Result<ExitCode> {
    match out {
        Output::Table => eprintln!(
            "gpuslice: cannot place Machine {:?}: {}",
            refusal.machine,
            refusal.render()
        ),
        Output::Json => eprintln!(
            "{}",
            serde_json::to_string_pretty(&out_of(refusal, detail))?
        ),
        Output::Yaml => eprint!("{}", serde_yaml_ng::to_string(&out_of(refusal, detail))?),
    }
    Ok(ExitCode::from(EXIT_REFUSED))
}

fn out_of(refusal: &Refusal, detail: bool) -> RefusalOut {
    RefusalOut {
        error: RefusalError {
            kind: gpu_core::ErrorKind::Unsatisfiable.as_str(),
            message: refusal.render(),
            refusal: refusal.report(detail),
        },
    }
}

/// Runs `place`.
///
/// # Errors
/// Unreadable or invalid files and invalid Machines (exit 2); a refusal is exit 3, not an error.
pub fn place(g: &Global, a: PlaceArgs) -> anyhow::Result<ExitCode> {
    let (mut state, json) = load_fleet(&a.inventory)?;
    let text = read_input(&a.machine, "machine")?;
    let mut machine = Machine::from_text(&text)
        .with_context(|| format!("machine file {}", a.machine.display()))?;
    // `--node` names the node for every command; for `place` it is the target node.
    let target = match (a.target_node, g.node.clone()) {
        (Some(t), Some(n)) if t != n => {
            bail!("--node {n:?} and --target-node {t:?} name different nodes; give one of them")
        }
        (t, n) => t.or(n),
    };
    if let Some(node) = target {
        machine.target_node = Some(node);
        machine
            .validate()
            .with_context(|| format!("machine file {}", a.machine.display()))?;
    }
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
    let recorded = if a.dry_run {
        Recorded::DryRun
    } else if a.save {
        Recorded::Saved
    } else {
        Recorded::NotSaved
    };
    match g.output {
        Output::Table => print!("{}", placement_table(&state, &placed, a.policy, recorded)),
        out => print_data(
            out,
            &PlacedOut {
                placement: &placed,
                dry_run: a.dry_run,
                saved: a.save,
            },
        )?,
    }
    Ok(ExitCode::SUCCESS)
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

/// What `unplace` prints with `-o json|yaml`: the allocation released, and whether it was.
#[derive(serde::Serialize)]
#[serde(rename_all = "camelCase")]
struct UnplacedOut<'a> {
    #[serde(flatten)]
    unplaced: &'a gpu_sched::Unplaced,
    /// True when the fleet file was written (`--save`).
    saved: bool,
}

/// Runs `unplace`: the inverse of `place --save`.
///
/// # Errors
/// Unreadable or invalid files, a Machine that is not placed (exit 2).
pub fn unplace(g: &Global, a: UnplaceArgs) -> anyhow::Result<ExitCode> {
    let (mut state, json) = load_fleet(&a.inventory)?;
    let unplaced = state
        .unplace(&a.machine)
        .with_context(|| format!("fleet file {}", a.inventory.display()))?;
    if a.save {
        save_fleet(&a.inventory, &state.to_fleet(), json)?;
    }
    match g.output {
        Output::Table => {
            let al = &unplaced.allocation;
            let head = if a.save {
                format!(
                    "Machine {} released from node {} (was {}; recorded in the fleet file)\n",
                    al.machine,
                    al.node,
                    al.status.as_str()
                )
            } else {
                format!(
                    "Machine {} would be released from node {} (was {}; not recorded: pass --save to record it)\n",
                    al.machine,
                    al.node,
                    al.status.as_str()
                )
            };
            print!(
                "{head}{}",
                render_table(&DEVICE_HEADER, &device_rows(&state, al))
            );
            if unplaced.on_host {
                println!(
                    "note: its devices were created on node {}; remove them there (`gpuslice vgpu remove`, `gpuslice gpu release`)",
                    al.node
                );
            }
        }
        out => print_data(
            out,
            &UnplacedOut {
                unplaced: &unplaced,
                saved: a.save,
            },
        )?,
    }
    Ok(ExitCode::SUCCESS)
}

/// Runs `plan`.
///
/// # Errors
/// Unreadable or invalid files, unknown Machines or nodes (exit 2).
pub fn plan(g: &Global, c: PlanCommand) -> anyhow::Result<ExitCode> {
    match c {
        PlanCommand::Migrate(a) => {
            let (state, _) = load_fleet(&a.inventory)?;
            let plan = match state.plan_migration(&a.machine, &a.to, &a.gpus) {
                Ok(p) => p,
                Err(SchedError::Unsatisfiable(r)) => return refused(g.output, &r, a.detail),
                Err(e) => return Err(e.into()),
            };
            match g.output {
                Output::Table => print!("{}", migration_table(&plan)),
                out => print_data(out, &plan)?,
            }
            Ok(ExitCode::SUCCESS)
        }
        PlanCommand::Drain(a) => {
            let Some(node) = g.node.as_deref() else {
                bail!("`plan drain` needs the node to drain: --node NODE");
            };
            let (state, _) = load_fleet(&a.inventory)?;
            let plan = state.plan_drain(node)?;
            match g.output {
                Output::Table => print!("{}", drain_table(&plan)),
                out => print_data(out, &plan)?,
            }
            Ok(if plan.is_complete() {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(EXIT_REFUSED)
            })
        }
        PlanCommand::Evacuate(a) => {
            let (state, _) = load_fleet(&a.inventory)?;
            let plan = state.plan_evacuation();
            match g.output {
                Output::Table => print!("{}", evacuation_table(&plan)),
                out => print_data(out, &plan)?,
            }
            Ok(if plan.machines.iter().all(|m| m.plan.is_some()) {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(EXIT_REFUSED)
            })
        }
    }
}

// ---------------------------------------------------------------------- tables

fn device_short(d: &AllocatedDevice) -> String {
    match d {
        AllocatedDevice::Gpu { name, address, .. } => format!("{name} ({address})"),
        AllocatedDevice::Vgpu {
            parent,
            profile_name,
            ..
        } => format!("{profile_name} on {parent}"),
    }
}

/// Rows of an allocation; vGPUs show their GPU by per-node name when the fleet knows it.
fn device_rows(state: &FleetState, a: &Allocation) -> Vec<Vec<String>> {
    let node = state.node(&a.node);
    let gpu_name = |addr: &gpu_core::PciAddress| {
        node.as_ref()
            .and_then(|n| n.gpu_by_address(addr))
            .map_or_else(|| addr.to_string(), |g| g.name.clone())
    };
    a.devices
        .iter()
        .map(|d| match d {
            AllocatedDevice::Gpu {
                request,
                name,
                address,
                functions,
                memory_mib,
            } => {
                let mut addr = address.to_string();
                for f in functions {
                    addr.push_str(&format!(",{f}"));
                }
                vec![
                    request.clone(),
                    "gpu".into(),
                    name.clone(),
                    addr,
                    "-".into(),
                    memory_mib.map_or("-".into(), |m| m.to_string()),
                    "-".into(),
                ]
            }
            AllocatedDevice::Vgpu {
                request,
                index,
                parent,
                gpu,
                profile,
                profile_name,
                framebuffer_mib,
                uuid,
                ..
            } => vec![
                request.clone(),
                format!("vgpu #{index}"),
                gpu.as_ref().map_or("-".into(), gpu_name),
                parent.to_string(),
                format!("{profile_name} ({profile})"),
                framebuffer_mib.map_or("-".into(), |m| m.to_string()),
                uuid.to_string(),
            ],
        })
        .collect()
}

const DEVICE_HEADER: [&str; 7] = [
    "REQUEST",
    "KIND",
    "GPU",
    "DEVICE",
    "PROFILE",
    "MEMORY_MIB",
    "UUID",
];

/// What became of a placement: only `--save` records it.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Recorded {
    DryRun,
    NotSaved,
    Saved,
}

fn placement_table(state: &FleetState, p: &Placement, policy: Policy, rec: Recorded) -> String {
    let a = &p.allocation;
    let mut s = match (p.already_placed, rec) {
        (true, _) => format!(
            "Machine {} is already placed on node {} ({}, unchanged; nothing new recorded)\n",
            a.machine,
            a.node,
            a.status.as_str()
        ),
        (false, Recorded::DryRun) => format!(
            "Machine {} would be placed on node {} (dry run, nothing recorded, {policy})\n",
            a.machine, a.node
        ),
        (false, Recorded::NotSaved) => format!(
            "Machine {} would be placed on node {} (not recorded: pass --save to record it, {policy})\n",
            a.machine, a.node
        ),
        (false, Recorded::Saved) => format!(
            "Machine {} placed on node {} ({}, recorded in the fleet file, {policy})\n",
            a.machine,
            a.node,
            a.status.as_str()
        ),
    };
    s.push_str(&render_table(&DEVICE_HEADER, &device_rows(state, a)));
    for d in &p.degraded {
        s.push_str(&format!(
            "warning: request {} uses Degraded {}: {}\n",
            d.request,
            d.device,
            if d.reasons.is_empty() {
                "no reason given".to_owned()
            } else {
                d.reasons.join(", ")
            }
        ));
    }
    s
}

fn migration_table(p: &MigrationPlan) -> String {
    let mut s = format!("Machine {}: node {} -> node {}\n", p.machine, p.from, p.to);
    let rows: Vec<Vec<String>> = p
        .moves
        .iter()
        .map(|m| {
            vec![
                m.request.clone(),
                device_short(&m.from),
                device_short(&m.to),
            ]
        })
        .collect();
    s.push_str(&render_table(&["REQUEST", "FROM", "TO"], &rows));
    s
}

fn drain_table(p: &DrainPlan) -> String {
    let mut s = format!(
        "Drain node {}: {} Machine(s) can move, {} must stay\n",
        p.node,
        p.moves.len(),
        p.stay.len()
    );
    if !p.moves.is_empty() {
        let rows: Vec<Vec<String>> = p
            .moves
            .iter()
            .map(|m| {
                vec![
                    m.machine.clone(),
                    m.to.clone(),
                    m.moves
                        .iter()
                        .map(|d| format!("{} -> {}", device_short(&d.from), device_short(&d.to)))
                        .collect::<Vec<_>>()
                        .join("; "),
                ]
            })
            .collect();
        s.push_str(&render_table(&["MACHINE", "TO", "DEVICES"], &rows));
    }
    for st in &p.stay {
        s.push_str(&format!("stays: {}: {}\n", st.machine, st.reason));
    }
    s
}

fn evacuation_table(p: &EvacuationPlan) -> String {
    if p.machines.is_empty() {
        return "No Machine is on an Unhealthy GPU.\n".to_owned();
    }
    let rows: Vec<Vec<String>> = p
        .machines
        .iter()
        .map(|e| {
            let affected = e
                .affected
                .iter()
                .map(|a| {
                    if a.reasons.is_empty() {
                        format!("{} ({})", a.device, a.health)
                    } else {
                        format!("{} ({}: {})", a.device, a.health, a.reasons.join(", "))
                    }
                })
                .collect::<Vec<_>>()
                .join("; ");
            let to = match (&e.plan, &e.refusal) {
                (Some(plan), _) => format!(
                    "{}: {}",
                    plan.to,
                    plan.allocation
                        .devices
                        .iter()
                        .map(device_short)
                        .collect::<Vec<_>>()
                        .join("; ")
                ),
                (None, Some(r)) => format!("nowhere: {}", r.render()),
                (None, None) => "nowhere".to_owned(),
            };
            vec![e.machine.clone(), e.node.clone(), affected, to]
        })
        .collect();
    render_table(&["MACHINE", "NODE", "AFFECTED", "DESTINATION"], &rows)
}
