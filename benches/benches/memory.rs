//! Memory of the solver state: `cargo bench --bench memory`.
//!
//! Prints the heap bytes a `FleetState` holds (counted by a wrapping allocator, so the figures
//! are exact and free of allocator slack) and the process's resident memory, for:
//! - one node like the bundled A2 recording (1 GPU, 16 VFs × 15 types), and each further one,
//! - one H200 node with 2 GPUs and 8 VFs,
//! - the bench's mixed fleet of 8-GPU nodes at 10,000 and 100,000 nodes.
//!
//! Single nodes are measured after `FleetState::new` consumed the fleet document, fleets are
//! built node by node with `add_node`: either way the figures are the state alone.

// A global allocator needs `unsafe impl`; it only forwards to the system allocator and counts.
#![allow(unsafe_code)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

use gpu_core::{Fleet, NodeTopology};
use gpu_sched::FleetState;
use gpuslice_benches::fleetgen::mixed_node;

struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every call forwards to `System` with the same arguments; the counter has no effect on
// the memory handed out.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size(), Ordering::Relaxed);
        // SAFETY: as the caller's contract for `GlobalAlloc::alloc`.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
        // SAFETY: `ptr` came from `alloc` above with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LIVE.fetch_add(new_size, Ordering::Relaxed);
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
        // SAFETY: as the caller's contract for `GlobalAlloc::realloc`.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
}

/// Heap bytes of the state built from the fleet `make` returns, and the state.
fn state_bytes(make: impl FnOnce() -> Fleet) -> (usize, FleetState) {
    let before = LIVE.load(Ordering::Relaxed);
    let s = match FleetState::new(make()) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("bench fleet is invalid: {e}");
            std::process::exit(1);
        }
    };
    let after = LIVE.load(Ordering::Relaxed);
    (after.saturating_sub(before), s)
}

fn one_node(topo: NodeTopology) -> Fleet {
    Fleet {
        nodes: vec![topo],
        ..Fleet::default()
    }
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let a2: NodeTopology =
        match NodeTopology::from_text(include_str!("../../gpu-sched/tests/data/a2-real-node.json"))
        {
            Ok(t) => t,
            Err(e) => {
                eprintln!("the A2 recording does not parse: {e}");
                std::process::exit(1);
            }
        };
    // Fleet data measured before it is consumed, for comparison.
    let before = LIVE.load(Ordering::Relaxed);
    let doc = one_node(a2.clone());
    let doc_bytes = LIVE.load(Ordering::Relaxed) - before;
    drop(doc);
    let (bytes, s) = state_bytes(|| one_node(a2.clone()));
    drop(s);
    // A second node like it (renamed): what each further node of the same hardware costs once
    // the shared tables hold its types, GPUs and parents.
    let (two, s) = state_bytes(|| {
        let mut b = a2.clone();
        b.node = format!("{}-b", a2.node);
        Fleet {
            nodes: vec![a2.clone(), b],
            ..Fleet::default()
        }
    });
    println!(
        "a2-recording (1 GPU, 16 VFs x 15 types): topology {doc_bytes} B, state {bytes} B, each further node {} B",
        two.saturating_sub(bytes)
    );
    drop(s);
    let (bytes, s) = state_bytes(|| one_node(gpu_sched::testing::h200_node("h200", 2, 8)));
    println!(
        "h200 (2 GPUs, 8 VFs each): state {bytes} B ({} B per GPU)",
        bytes / 2
    );
    drop(s);
    for (kind, i) in [("a2", 0usize), ("l40s", 1), ("h200", 2), ("whole h100", 3)] {
        // Two nodes of a kind: the second shows the cost once the shared tables exist.
        let (one, s1) = state_bytes(|| one_node(mixed_node(i)));
        let (two, s2) = state_bytes(|| Fleet {
            nodes: vec![mixed_node(i), mixed_node(i + 4)],
            ..Fleet::default()
        });
        println!(
            "mixed-fleet {kind} node (8 GPUs): first {one} B, each further {} B",
            two.saturating_sub(one)
        );
        drop((s1, s2));
    }
    for n in [10_000usize, 100_000] {
        // Node by node, so no fleet document inflates the resident figure.
        let rss0 = rss_kib();
        let before = LIVE.load(Ordering::Relaxed);
        let mut s = FleetState::default();
        for i in 0..n {
            if let Err(e) = s.add_node(mixed_node(i)) {
                eprintln!("bench node is invalid: {e}");
                std::process::exit(1);
            }
        }
        let bytes = LIVE.load(Ordering::Relaxed).saturating_sub(before);
        let rss1 = rss_kib();
        println!(
            "mixed fleet, {n} nodes x 8 GPUs: state {:.1} MiB heap ({} B per node, {} B per GPU); resident +{} MiB",
            bytes as f64 / (1024.0 * 1024.0),
            bytes / n,
            bytes / (n * 8),
            rss1.saturating_sub(rss0) / 1024
        );
        drop(s);
    }
}
