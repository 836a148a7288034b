//! Why a Machine could not be placed: structured per-node reasons and their rendering.
//!
//! A refusal is data first. Each node that could not take the Machine lists one [`Reason`] per
//! request that does not fit on it alone, or a single [`ReasonKind::ConflictingRequests`] when
//! each request fits alone but not all together. [`Refusal::render`] groups nodes whose reasons
//! read the same: `0/3 nodes available: 1 node(s): TopologyUnsatisfiable: needs 4 gpu profile
//! mbochs-large, 3 free; 2 node(s): ProfileNotOffered: needs 4 gpu profile mbochs-large, not
//! offered`.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::members::{Members, Names};

/// The kind of a per-node reason. JSON: the variant name (`TopologyUnsatisfiable`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum ReasonKind {
    /// No parent on the node offers the requested vGPU profile at all.
    ProfileNotOffered,
    /// The profile is offered, but fewer instances are free than needed.
    TopologyUnsatisfiable,
    /// Fewer whole GPUs pass the request's filters than needed.
    InsufficientGpus,
    /// A GPU named in the request (by name or address) is not on the node.
    GpuNotFound,
    /// Every request fits on its own, but not all of them together.
    ConflictingRequests,
    /// Enough whole GPUs may be free, but no NVSwitch partition of the wanted size has all its
    /// members free and healthy (`partitions` says which were busy, and why).
    NoFreePartition,
    /// The node's GPUs sit on an NVSwitch fabric whose Fabric Manager cannot be reached: no
    /// set of several GPUs can be promised to talk over NVLink.
    FabricUnreachable,
}

impl ReasonKind {
    /// The variant name.
    pub fn as_str(self) -> &'static str {
        match self {
            ReasonKind::ProfileNotOffered => "ProfileNotOffered",
            ReasonKind::TopologyUnsatisfiable => "TopologyUnsatisfiable",
            ReasonKind::InsufficientGpus => "InsufficientGpus",
            ReasonKind::GpuNotFound => "GpuNotFound",
            ReasonKind::ConflictingRequests => "ConflictingRequests",
            ReasonKind::NoFreePartition => "NoFreePartition",
            ReasonKind::FabricUnreachable => "FabricUnreachable",
        }
    }
}

/// A filter that took candidates away. JSON: kebab-case (`in-use`, `wrong-numa`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Filter {
    /// Not of the requested vendor.
    WrongVendor,
    /// Not of the requested class (an accelerator was asked for).
    WrongClass,
    /// The model name does not contain the requested text.
    WrongModel,
    /// Less memory (or a smaller vGPU profile) than `minMemory`.
    TooSmall,
    /// Cannot be passed through (IOMMU group shared, no IOMMU, ...).
    Blocked,
    /// Unhealthy: never handed out.
    Unhealthy,
    /// Already in use: passed through, bound to vfio-pci, hosting vGPUs, or allocated.
    InUse,
    /// Outside the NUMA node the request's devices were aligned on.
    WrongNuma,
    /// The GPU is locked to another time-sliced vGPU size (same-size rule).
    SizeLocked,
    /// The GPU holds vGPUs of the other kind (time-sliced vs MIG-backed).
    ModeConflict,
    /// The GPU's framebuffer or MIG slices are used up.
    PoolFull,
    /// Every parent (VF) offering the profile already holds an instance.
    NoFreeParent,
    /// Not of a GPU family the request lists (`gpus: [nvidia]` and the card is a `radeon`).
    OtherFamily,
}

impl Filter {
    /// Every filter, in this type's order (the order a refusal lists them in).
    pub(crate) const ALL: [Filter; 13] = [
        Filter::WrongVendor,
        Filter::WrongClass,
        Filter::WrongModel,
        Filter::TooSmall,
        Filter::Blocked,
        Filter::Unhealthy,
        Filter::InUse,
        Filter::WrongNuma,
        Filter::SizeLocked,
        Filter::ModeConflict,
        Filter::PoolFull,
        Filter::NoFreeParent,
        Filter::OtherFamily,
    ];

    /// The filter's place in [`Filter::ALL`] (a new filter fails to compile here until it is
    /// listed).
    pub(crate) fn slot(self) -> usize {
        match self {
            Filter::WrongVendor => 0,
            Filter::WrongClass => 1,
            Filter::WrongModel => 2,
            Filter::TooSmall => 3,
            Filter::Blocked => 4,
            Filter::Unhealthy => 5,
            Filter::InUse => 6,
            Filter::WrongNuma => 7,
            Filter::SizeLocked => 8,
            Filter::ModeConflict => 9,
            Filter::PoolFull => 10,
            Filter::NoFreeParent => 11,
            Filter::OtherFamily => 12,
        }
    }

    /// How the filter reads in a message.
    pub fn as_str(self) -> &'static str {
        match self {
            Filter::WrongVendor => "wrong vendor",
            Filter::WrongClass => "wrong class",
            Filter::WrongModel => "wrong model",
            Filter::TooSmall => "too small",
            Filter::Blocked => "blocked",
            Filter::Unhealthy => "unhealthy",
            Filter::InUse => "in use",
            Filter::WrongNuma => "wrong NUMA",
            Filter::SizeLocked => "size-locked",
            Filter::ModeConflict => "mode conflict",
            Filter::PoolFull => "pool full",
            Filter::NoFreeParent => "no free parent",
            Filter::OtherFamily => "other family",
        }
    }
}

/// How many candidates (GPUs) one filter excluded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Exclusion {
    /// The filter.
    pub filter: Filter,
    /// GPUs it excluded (each GPU is counted under the first filter it failed).
    pub count: u32,
}

/// Why one request (or the Machine as a whole) does not fit on one node.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Reason {
    /// What kind of misfit.
    pub kind: ReasonKind,
    /// The device request concerned (for conflicts, the first of them).
    pub request: String,
    /// The vGPU profile asked for, as written in the request.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub profile: Option<String>,
    /// The GPU named in the request that is missing ([`ReasonKind::GpuNotFound`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu: Option<String>,
    /// The GPU names and families the request lists, as written (`nvidia`, `nvidia0`), for
    /// [`ReasonKind::InsufficientGpus`].
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gpus: Vec<String>,
    /// Devices needed.
    pub needed: u32,
    /// Devices free for this request on the node (for NUMA-aligned requests: on the best NUMA
    /// node).
    pub free: u32,
    /// True when the request wants all its devices on one NUMA node.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub numa_aligned: bool,
    /// Candidates excluded, by filter.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub excluded: Vec<Exclusion>,
    /// The other requests in a conflict.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub with: Vec<String>,
    /// For [`ReasonKind::NoFreePartition`]: the partitions of the wanted size and why each
    /// could not be used (`partition 2 (nvidia0 in use)`); for
    /// [`ReasonKind::FabricUnreachable`]: why Fabric Manager could not be reached.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub partitions: Vec<String>,
    /// For a MIG-backed profile: the GPUs left out for no free GPU-instance start, each with
    /// the profile, its legal starts and the memory slots still free
    /// (`nvidia0: 4g.71gb starts at [0], slots free [4, 5, 6, 7]`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub slots: Vec<String>,
}

impl Reason {
    pub(crate) fn new(kind: ReasonKind, request: &str, needed: u32, free: u32) -> Self {
        Reason {
            kind,
            request: request.to_owned(),
            profile: None,
            gpu: None,
            gpus: vec![],
            needed,
            free,
            numa_aligned: false,
            excluded: vec![],
            with: vec![],
            partitions: vec![],
            slots: vec![],
        }
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: ", self.kind.as_str())?;
        let (n, req) = (self.needed, &self.request);
        match self.kind {
            ReasonKind::ProfileNotOffered => {
                let p = self.profile.as_deref().unwrap_or("?");
                write!(f, "needs {n} {req} profile {p}, not offered")?;
            }
            ReasonKind::TopologyUnsatisfiable => {
                let p = self.profile.as_deref().unwrap_or("?");
                let numa = if self.numa_aligned {
                    " on one NUMA node"
                } else {
                    ""
                };
                write!(f, "needs {n} {req} profile {p}{numa}, {} free", self.free)?;
            }
            ReasonKind::InsufficientGpus => {
                let numa = if self.numa_aligned {
                    " on one NUMA node"
                } else {
                    ""
                };
                let of = if self.gpus.is_empty() {
                    String::new()
                } else {
                    format!(" of {}", self.gpus.join(", "))
                };
                write!(f, "needs {n} {req} GPU(s){of}{numa}, {} free", self.free)?;
            }
            ReasonKind::GpuNotFound => {
                let g = self.gpu.as_deref().unwrap_or("?");
                write!(f, "needs {req} GPU {g}, not on node")?;
            }
            ReasonKind::ConflictingRequests => {
                let mut all = vec![req.as_str()];
                all.extend(self.with.iter().map(String::as_str));
                write!(
                    f,
                    "requests {} fit one at a time but not together",
                    all.join(", ")
                )?;
            }
            ReasonKind::NoFreePartition => {
                let why = self.partitions.join(", ");
                write!(
                    f,
                    "needs {n} {req} GPU(s) as one NVSwitch partition, none free ({why})"
                )?;
            }
            ReasonKind::FabricUnreachable => {
                let why = self.partitions.first().map_or("", String::as_str);
                write!(
                    f,
                    "needs {n} {req} GPU(s) joined by NVLink, Fabric Manager cannot be reached ({why})"
                )?;
            }
        }
        if !self.slots.is_empty() {
            write!(
                f,
                " (no free GPU-instance start: {})",
                self.slots.join("; ")
            )?;
        }
        if !self.excluded.is_empty() {
            let parts: Vec<String> = self
                .excluded
                .iter()
                .map(|e| format!("{} {}", e.count, e.filter.as_str()))
                .collect();
            write!(f, " (excluded: {})", parts.join(", "))?;
        }
        Ok(())
    }
}

/// Why one node could not take the Machine.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeRefusal {
    /// The node.
    pub node: String,
    /// One reason per request that does not fit alone, or one conflict.
    pub reasons: Vec<Reason>,
}

/// Why a Machine could not be placed anywhere: every node considered, with its reasons.
///
/// Nodes that gave the same reasons are held together (a refusal on a large fleet names
/// thousands of nodes but says a handful of different things): a group is the reasons and a
/// snapshot of the fleet's own set of nodes in that state, taken by reference count, so that a
/// refusal costs in proportion to the number of groups, not to the fleet.
/// [`Refusal::nodes`] lists them node by node. JSON: `{"machine", "nodesTotal", "nodes":
/// [{"node", "reasons"}]}`, nodes in node order.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(into = "RefusalDoc", from = "RefusalDoc")]
pub struct Refusal {
    /// The Machine.
    pub machine: String,
    /// Nodes in the fleet.
    pub nodes_total: usize,
    /// The one node the Machine was asked to go to (`targetNode`, `--target-node`, a
    /// migration's destination): the message then names it.
    pub target: Option<String>,
    /// Nodes with the same reasons, each node by its place in node order.
    groups: Vec<RefusedGroup>,
    /// The nodes' names by place, as they were when the Machine was refused.
    names: Names,
    /// A place the refusal did not consider (a migration's source), left out of every group.
    skip: Option<u32>,
}

/// Nodes (by place) that gave the same reasons.
#[derive(Debug, Clone)]
pub(crate) struct RefusedGroup {
    /// The reasons; empty when `same_as` is given.
    pub reasons: Vec<Reason>,
    /// The group (by place in the refusal's groups, an earlier one) whose reasons these nodes
    /// gave too: nodes whose answer cannot depend on their state share one list.
    pub same_as: Option<usize>,
    pub members: Members,
}

/// The document form of a [`Refusal`].
#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct RefusalDoc {
    machine: String,
    nodes_total: usize,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    target: Option<String>,
    nodes: Vec<NodeRefusal>,
}

impl From<Refusal> for RefusalDoc {
    fn from(r: Refusal) -> Self {
        RefusalDoc {
            nodes: r.nodes(),
            machine: r.machine,
            nodes_total: r.nodes_total,
            target: r.target,
        }
    }
}

impl From<RefusalDoc> for Refusal {
    fn from(d: RefusalDoc) -> Self {
        let mut r = Refusal::from_nodes(d.machine, d.nodes_total, d.nodes);
        r.target = d.target;
        r
    }
}

impl PartialEq for Refusal {
    fn eq(&self, other: &Self) -> bool {
        self.machine == other.machine
            && self.nodes_total == other.nodes_total
            && self.target == other.target
            && self.refused_count() == other.refused_count()
            && self.nodes() == other.nodes()
    }
}

impl Eq for Refusal {}

impl Refusal {
    /// A refusal from its nodes' reasons (in node order).
    pub fn from_nodes(machine: String, nodes_total: usize, nodes: Vec<NodeRefusal>) -> Self {
        let mut groups: Vec<RefusedGroup> = Vec::new();
        let mut names = Names::default();
        let mut by_reasons: HashMap<Vec<Reason>, usize> = HashMap::new();
        for (i, n) in nodes.into_iter().enumerate() {
            let at = u32::try_from(i).unwrap_or(u32::MAX);
            names.set(i, Some(Arc::from(n.node)));
            match by_reasons.get(&n.reasons) {
                Some(&g) => {
                    groups[g].members.insert(at);
                }
                None => {
                    by_reasons.insert(n.reasons.clone(), groups.len());
                    let mut members = Members::default();
                    members.insert(at);
                    groups.push(RefusedGroup {
                        reasons: n.reasons,
                        same_as: None,
                        members,
                    });
                }
            }
        }
        Refusal {
            machine,
            nodes_total,
            target: None,
            groups,
            names,
            skip: None,
        }
    }

    /// The refusal of a Machine that was asked to go to `node` only.
    pub(crate) fn targeted(mut self, node: &str) -> Self {
        self.target = Some(node.to_owned());
        self
    }

    /// A refusal from groups of the fleet's nodes: `names` gives their names, `skip` a place
    /// left out of every group.
    pub(crate) fn from_groups(
        machine: String,
        nodes_total: usize,
        groups: Vec<RefusedGroup>,
        names: Names,
        skip: Option<u32>,
    ) -> Self {
        Refusal {
            machine,
            nodes_total,
            target: None,
            groups,
            names,
            skip,
        }
    }

    /// The places of a group, in node order, without the skipped one.
    fn places<'a>(&'a self, g: &'a RefusedGroup) -> impl Iterator<Item = u32> + 'a {
        g.members.iter().filter(move |&p| Some(p) != self.skip)
    }

    /// How many nodes of a group refused.
    /// A group's reasons.
    fn reasons<'a>(&'a self, g: &'a RefusedGroup) -> &'a Vec<Reason> {
        g.same_as
            .and_then(|i| self.groups.get(i))
            .map_or(&g.reasons, |o| &o.reasons)
    }

    fn count(&self, g: &RefusedGroup) -> usize {
        let skipped = self.skip.is_some_and(|s| g.members.contains(s));
        g.members.len() - usize::from(skipped)
    }

    /// The name of the node at a place.
    fn name(&self, place: u32) -> String {
        self.names
            .get(place)
            .map_or_else(String::new, |n| n.to_string())
    }

    /// Nodes that were considered and refused, in node order, each with its reasons (built on
    /// each call: a refusal keeps nodes with the same reasons together).
    pub fn nodes(&self) -> Vec<NodeRefusal> {
        let mut all: Vec<(u32, &Vec<Reason>)> = self
            .groups
            .iter()
            .flat_map(|g| self.places(g).map(move |p| (p, self.reasons(g))))
            .collect();
        all.sort_by_key(|e| e.0);
        all.into_iter()
            .map(|(p, r)| NodeRefusal {
                node: self.name(p),
                reasons: r.clone(),
            })
            .collect()
    }

    /// How many nodes refused (those considered and not fitting).
    pub fn refused_count(&self) -> usize {
        self.groups.iter().map(|g| self.count(g)).sum()
    }

    /// The reasons one node gave, if it refused.
    pub fn reasons_of(&self, node: &str) -> Option<&[Reason]> {
        self.groups
            .iter()
            .find(|g| {
                self.places(g)
                    .any(|p| self.names.get(p).is_some_and(|n| &**n == node))
            })
            .map(|g| self.reasons(g).as_slice())
    }

    /// Groups nodes by identical reasons, most common first (ties in text order):
    /// `(count, reasons text)`.
    pub fn groups(&self) -> Vec<(usize, String)> {
        let mut by_text: BTreeMap<String, usize> = BTreeMap::new();
        for g in &self.groups {
            let count = self.count(g);
            if count == 0 {
                continue;
            }
            let text = self
                .reasons(g)
                .iter()
                .map(Reason::to_string)
                .collect::<Vec<_>>()
                .join(" and ");
            *by_text.entry(text).or_default() += count;
        }
        let mut groups: Vec<(usize, String)> = by_text.into_iter().map(|(t, c)| (c, t)).collect();
        groups.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.cmp(&b.1)));
        groups
    }

    /// The one-line message: `0/3 nodes available: 1 node(s): TopologyUnsatisfiable: needs 4 gpu
    /// profile mbochs-large, 3 free; 2 node(s): ...`.
    pub fn render(&self) -> String {
        let mut s = format!("0/{} nodes available", self.nodes_total);
        if self.nodes_total == 0 {
            s.push_str(": the fleet has no nodes");
            return s;
        }
        let groups = self.groups();
        if groups.is_empty() {
            return s;
        }
        s.push_str(": ");
        let parts: Vec<String> = groups
            .iter()
            .map(|(c, t)| match &self.target {
                // The one node asked for is named, not counted.
                Some(node) if *c == 1 => format!("node {node}: {t}"),
                _ => format!("{c} node(s): {t}"),
            })
            .collect();
        s.push_str(&parts.join("; "));
        s
    }
}

/// One set of reasons with the groups that gave it.
type Merged<'a> = (&'a Vec<Reason>, Vec<&'a RefusedGroup>);

/// How many node names a [`RefusalGroup`] lists.
pub const FIRST_NODES: usize = 5;

/// Nodes that refused for the same reasons: how many, the first few in node order, and the
/// reasons (each with its kind, what was asked, needed and free). The grouped summary costs in
/// proportion to the number of different reasons, not to the fleet.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RefusalGroup {
    /// Nodes in the group.
    pub node_count: usize,
    /// The first [`FIRST_NODES`] of them, in node order.
    pub first_nodes: Vec<String>,
    /// The reasons every node of the group gave.
    pub reasons: Vec<Reason>,
}

/// A refusal as reported: the grouped summary, and the per-node detail only when asked for.
/// JSON: `{"machine", "nodesTotal", "nodesRefused", "message", "groups": [{"nodeCount",
/// "firstNodes", "reasons"}], "nodes"?: [{"node", "reasons"}]}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RefusalReport {
    /// The Machine.
    pub machine: String,
    /// Nodes in the fleet.
    pub nodes_total: usize,
    /// The one node the Machine was asked to go to, when it was.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
    /// Nodes that were considered and refused.
    pub nodes_refused: usize,
    /// The one-line message ([`Refusal::render`]).
    pub message: String,
    /// Nodes with the same reasons, most nodes first.
    pub groups: Vec<RefusalGroup>,
    /// Every refused node with its reasons, in node order (with `detail` only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub nodes: Option<Vec<NodeRefusal>>,
}

impl Refusal {
    /// The internal groups merged by equal reasons, groups without a refused node left out.
    fn merged(&self) -> Vec<Merged<'_>> {
        let mut out: Vec<Merged<'_>> = Vec::new();
        let mut at: HashMap<&Vec<Reason>, usize> = HashMap::new();
        for g in &self.groups {
            if self.count(g) == 0 {
                continue;
            }
            let reasons = self.reasons(g);
            match at.get(reasons) {
                Some(&i) => out[i].1.push(g),
                None => {
                    at.insert(reasons, out.len());
                    out.push((reasons, vec![g]));
                }
            }
        }
        out
    }

    /// The grouped summary: one [`RefusalGroup`] per set of reasons, most nodes first (ties:
    /// the group whose first node comes first). Reads the first few places of each group: its
    /// cost does not grow with the number of nodes.
    pub fn summary(&self) -> Vec<RefusalGroup> {
        let mut groups: Vec<(u32, RefusalGroup)> = self
            .merged()
            .into_iter()
            .map(|(reasons, parts)| {
                // Each part is in node order: its first few are the candidates.
                let mut first: Vec<u32> = parts
                    .iter()
                    .flat_map(|g| self.places(g).take(FIRST_NODES))
                    .collect();
                first.sort_unstable();
                first.truncate(FIRST_NODES);
                let lead = first.first().copied().unwrap_or(u32::MAX);
                (
                    lead,
                    RefusalGroup {
                        node_count: parts.iter().map(|g| self.count(g)).sum(),
                        first_nodes: first.iter().map(|&p| self.name(p)).collect(),
                        reasons: reasons.clone(),
                    },
                )
            })
            .collect();
        groups.sort_by(|a, b| b.1.node_count.cmp(&a.1.node_count).then(a.0.cmp(&b.0)));
        groups.into_iter().map(|(_, g)| g).collect()
    }

    /// Every node of the `i`-th group of [`Refusal::summary`], in node order.
    pub fn group_nodes(&self, i: usize) -> Vec<String> {
        let summary = self.summary();
        let Some(want) = summary.get(i) else {
            return Vec::new();
        };
        let mut places: Vec<u32> = self
            .merged()
            .into_iter()
            .find(|(r, _)| **r == want.reasons)
            .map(|(_, parts)| parts.iter().flat_map(|g| self.places(g)).collect())
            .unwrap_or_default();
        places.sort_unstable();
        places.into_iter().map(|p| self.name(p)).collect()
    }

    /// The refusal as reported: the summary, and with `detail` every node's reasons.
    pub fn report(&self, detail: bool) -> RefusalReport {
        RefusalReport {
            machine: self.machine.clone(),
            nodes_total: self.nodes_total,
            target: self.target.clone(),
            nodes_refused: self.refused_count(),
            message: self.render(),
            groups: self.summary(),
            nodes: detail.then(|| self.nodes()),
        }
    }
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.render())
    }
}

#[cfg(test)]
mod tests {
    use super::Filter;

    #[test]
    fn every_filter_listed_once_in_filter_order() {
        for (i, &f) in Filter::ALL.iter().enumerate() {
            assert_eq!(f.slot(), i, "{f:?}");
        }
        assert!(Filter::ALL.windows(2).all(|w| w[0] < w[1]));
    }
}
