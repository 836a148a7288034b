//! Plans and placements as people read them (what `gpuslice place|unplace|plan` prints), and the
//! documents `-o json|yaml` prints for them: every front-end shows one rendering.

use gpu_core::text::{PendingRow, Shown, render_table};
use gpu_core::{AllocatedDevice, Allocation, NodeTopology, PciAddress};

use crate::{
    DrainPlan, EvacuationPlan, FleetState, MigrationPlan, NodeView, Placement, Policy, Refusal,
    RefusalReport, SchedError, Unplaced,
};

/// What became of a placement: only a save records it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Recorded {
    /// A what-if: nothing recorded.
    DryRun,
    /// Placed in memory, not written back.
    NotSaved,
    /// Written to the fleet file.
    Saved,
}

impl Recorded {
    /// What became of a placement asked as a what-if (`dry_run`) or to be saved (`save`).
    #[must_use]
    pub fn of(dry_run: bool, save: bool) -> Self {
        match (dry_run, save) {
            (true, _) => Recorded::DryRun,
            (false, true) => Recorded::Saved,
            (false, false) => Recorded::NotSaved,
        }
    }
}

/// What `place` prints with `-o json|yaml`: the placement's keys, plus whether it was recorded.
#[derive(serde::Serialize, Debug)]
#[serde(rename_all = "camelCase")]
pub struct PlacedDocument<'a> {
    /// The placement, its keys at the top level.
    #[serde(flatten)]
    pub placement: &'a Placement,
    /// True for a what-if: nothing recorded.
    pub dry_run: bool,
    /// True when the fleet file was written; false means nothing was recorded.
    pub saved: bool,
}

/// What `unplace` prints with `-o json|yaml`: the allocation released, and whether it was.
#[derive(serde::Serialize, Debug)]
#[serde(rename_all = "camelCase")]
pub struct UnplacedDocument<'a> {
    /// The release, its keys at the top level.
    #[serde(flatten)]
    pub unplaced: &'a Unplaced,
    /// True when the fleet file was written.
    pub saved: bool,
}

/// A refusal as a document: `{"error": {"kind": "unsatisfiable", "message", "refusal"}}`, the
/// shape of every other error.
#[derive(serde::Serialize, Debug)]
pub struct RefusalDocument {
    error: RefusalError,
}

#[derive(serde::Serialize, Debug)]
struct RefusalError {
    /// The kind, from the one vocabulary (`unsatisfiable`).
    kind: &'static str,
    message: String,
    /// The grouped summary; every node's reasons too with `detail`.
    refusal: RefusalReport,
}

impl RefusalDocument {
    /// The document of `refusal`; every refused node's reasons too with `detail`.
    #[must_use]
    pub fn of(refusal: &Refusal, detail: bool) -> Self {
        Self {
            error: RefusalError {
                kind: gpu_core::ErrorKind::Unsatisfiable.as_str(),
                message: refusal.render(),
                refusal: refusal.report(detail),
            },
        }
    }
}

/// A device in a few words: `nvidia0 (0000:41:00.0)`, `L40S-8Q on 0000:41:00.4`.
#[must_use]
pub fn device_short(d: &AllocatedDevice) -> String {
    match d {
        AllocatedDevice::Gpu { name, address, .. } => format!("{name} ({address})"),
        AllocatedDevice::Vgpu {
            parent,
            profile_name,
            ..
        } => format!("{profile_name} on {parent}"),
    }
}

/// The columns of [`device_rows`].
pub const DEVICE_HEADER: [&str; 7] = [
    "REQUEST",
    "KIND",
    "GPU",
    "DEVICE",
    "PROFILE",
    "MEMORY_MIB",
    "UUID",
];

/// Rows of an allocation; vGPUs show their GPU by per-node name when the fleet knows it.
#[must_use]
pub fn device_rows(state: &FleetState, a: &Allocation) -> Vec<Vec<String>> {
    let node = state.node(&a.node);
    let gpu_name = |addr: &PciAddress| {
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

/// A placement: what became of it, its devices, and a warning per Degraded device it uses.
#[must_use]
pub fn placement(state: &FleetState, p: &Placement, policy: Policy, rec: Recorded) -> String {
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

/// A released allocation (`saved`: recorded in the fleet file), its devices, and a note when
/// they were made on the host.
#[must_use]
pub fn unplaced(state: &FleetState, u: &Unplaced, saved: bool) -> String {
    let al = &u.allocation;
    let (machine, node, was) = (&al.machine, &al.node, al.status.as_str());
    let mut s = if saved {
        format!(
            "Machine {machine} released from node {node} (was {was}; recorded in the fleet file)\n"
        )
    } else {
        format!(
            "Machine {machine} would be released from node {node} (was {was}; not recorded: pass --save to record it)\n"
        )
    };
    s.push_str(&render_table(&DEVICE_HEADER, &device_rows(state, al)));
    if u.on_host {
        s.push_str(&format!(
            "note: its devices were created on node {node}; remove them there (`gpuslice vgpu remove`, `gpuslice gpu release`)\n"
        ));
    }
    s
}

/// A migration plan: the move, then each request's device before and after.
#[must_use]
pub fn migration(p: &MigrationPlan) -> String {
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

/// A drain plan: the Machines that can move with their moves, then those that must stay.
#[must_use]
pub fn drain(p: &DrainPlan) -> String {
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

/// An evacuation plan: each Machine on an Unhealthy GPU, what is affected, and where it goes.
#[must_use]
pub fn evacuation(p: &EvacuationPlan) -> String {
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

/// A fleet node's view ([`crate::node_view`], each GPU as the allocations leave it: one an
/// allocation holds is not free), what `gpuslice topology --inventory` shows.
///
/// # Errors
/// As [`crate::node_view`].
pub fn fleet_node_view(
    given: &NodeTopology,
    allocations: &[Allocation],
) -> Result<NodeView, SchedError> {
    let mut view = crate::node_view(given, allocations)?;
    for gpu in &mut view.topology.gpus {
        *gpu = gpu_core::usage::allocated_view(&given.node, allocations, gpu).0;
    }
    Ok(view)
}

/// The topology page of a fleet node's view ([`fleet_node_view`] of `given`): HOLDER names the
/// Machine, and the allocated vGPUs the host does not show yet are listed under their parent.
#[must_use]
pub fn fleet_node(view: &NodeView, given: &NodeTopology, allocations: &[Allocation]) -> String {
    let pending: Vec<PendingRow> = view
        .allocated_instances
        .iter()
        .filter(|x| !x.made)
        .map(|x| {
            let size = x
                .framebuffer_mib
                .map_or_else(|| "-".to_owned(), |v| format!("{v} MiB"));
            let holder = format!("Machine {} ({})", x.machine, x.status.as_str());
            let row = [
                x.label(),
                x.profile_name.clone(),
                size,
                x.parent.to_string(),
                holder,
            ];
            (x.parent.clone(), row)
        })
        .collect();
    let shown = Shown {
        snapshot: Some(given),
        allocations,
        pending: &pending,
        ..Shown::default()
    };
    gpu_core::text::topology(&view.topology, &shown)
}
