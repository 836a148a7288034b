#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! Refusals on fleets large enough that the groups' member sets span many chunks: the grouped
//! refusal expands to what asking every node says, and a refusal kept while the fleet goes on
//! placing and releasing still says what it said.

use gpu_core::{DeviceRequest, Fleet, Machine, NodeTopology};
use gpu_sched::testing::{a2_node, h200_node, l40s_node, whole_node};
use gpu_sched::{FleetState, NodeRefusal, Policy, Refusal, RefusalGroup, SchedError};

fn node(i: usize) -> NodeTopology {
    let name = format!("node-{i:05}");
    match i % 7 {
        0 | 3 | 5 => a2_node(&name, 1, 4),
        1 | 4 => l40s_node(&name, 2, 4),
        2 => h200_node(&name, 1, 7),
        _ => whole_node(&name, 2),
    }
}

fn vgpu(name: &str, profile: &str, count: u32) -> Machine {
    Machine {
        name: name.into(),
        devices: vec![DeviceRequest {
            name: "gpu".into(),
            profile: Some(profile.into()),
            count: Some(count),
            ..DeviceRequest::default()
        }],
        ..Machine::default()
    }
}

fn whole(name: &str, count: u32) -> Machine {
    Machine {
        name: name.into(),
        devices: vec![DeviceRequest {
            name: "gpu".into(),
            count: Some(count),
            ..DeviceRequest::default()
        }],
        ..Machine::default()
    }
}

/// A small deterministic generator (the test must not depend on a seed it does not print).
struct Lcg(u64);

impl Lcg {
    fn next(&mut self, n: usize) -> usize {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        ((self.0 >> 33) as usize) % n
    }
}

type Kept = (Refusal, Vec<NodeRefusal>, Vec<RefusalGroup>);

fn refused(s: &FleetState, m: &Machine, policy: Policy) -> Refusal {
    match s.try_place(m, policy) {
        Err(SchedError::Unsatisfiable(r)) => r,
        other => panic!("expected a refusal of {}, got {other:?}", m.name),
    }
}

#[test]
fn a_refusal_on_three_thousand_nodes_is_the_full_scan_and_a_kept_one_does_not_change() {
    let mut s = FleetState::new(Fleet {
        nodes: (0..3000).map(node).collect(),
        ..Fleet::default()
    })
    .unwrap();
    let probes = [
        vgpu("too-many-a2", "NVIDIA A2-4Q", 99),
        vgpu("too-many-l40s", "L40S-8Q", 99),
        vgpu("no-such", "NVIDIA A2-4Q", 5),
        whole("too-many-whole", 9),
    ];
    let kinds = [
        |i: usize| vgpu(&format!("a2-{i}"), "NVIDIA A2-4Q", 1),
        |i: usize| vgpu(&format!("l40s-{i}"), "L40S-8Q", 1),
        |i: usize| vgpu(&format!("h200-{i}"), "H200X-1-18C", 1),
        |i: usize| whole(&format!("whole-{i}"), 1),
    ];
    let mut rng = Lcg(31);
    let mut placed: Vec<String> = Vec::new();
    let mut kept: Vec<Kept> = Vec::new();
    for round in 0..6 {
        let policy = [Policy::Binpack, Policy::Spread, Policy::FirstFit][round % 3];
        for i in 0..1500 {
            if rng.next(10) < 8 || placed.is_empty() {
                let m = kinds[rng.next(kinds.len())](round * 10_000 + i);
                if s.place(&m, policy).is_ok() {
                    placed.push(m.name);
                }
            } else {
                let k = rng.next(placed.len());
                s.release(&placed.swap_remove(k)).unwrap();
            }
        }
        if round == 3 {
            // A new snapshot of one node and a node removed are re-filed too.
            s.add_node(node(3000)).unwrap();
            s.remove_node("node-00010").unwrap();
        }
        for m in &probes {
            let r = refused(&s, m, policy);
            let full = s.refusal_by_full_scan(m, policy).unwrap();
            assert_eq!(r, full, "{}", m.name);
            assert_eq!(r.render(), full.render());
            let summary = r.summary();
            let mut expanded: Vec<String> = Vec::new();
            for (i, g) in summary.iter().enumerate() {
                let names = r.group_nodes(i);
                assert_eq!(names.len(), g.node_count);
                assert_eq!(&names[..g.first_nodes.len()], &g.first_nodes[..]);
                expanded.extend(names);
            }
            expanded.sort();
            let mut all: Vec<String> = full.nodes().into_iter().map(|n| n.node).collect();
            all.sort();
            assert_eq!(expanded, all);
            kept.push((r, full.nodes(), summary));
        }
        for (r, nodes, summary) in &kept {
            assert_eq!(&r.nodes(), nodes, "{}", r.machine);
            assert_eq!(&r.summary(), summary);
        }
    }
}
