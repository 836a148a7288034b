//! Counts heap allocations per placement (noise-free, unlike timings on a shared machine): builds
//! the 100,000-node HGX fleet of `place/hgx_partitions` (`FLEET=mixed`: the mixed fleet of
//! `place/scaling`), then places 10,000 Machines and reports allocations per `place` call.
//! `cargo run --release -p gpuslice-benches --example place_allocs`

// A counting global allocator forwards to `System` through its unsafe interface.
#![allow(unsafe_code)]
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicU64, Ordering};

use gpu_sched::Policy;

/// The system allocator, counting the allocations and reallocations made through it.
struct Counting;

static ALLOCS: AtomicU64 = AtomicU64::new(0);

// SAFETY: every call is forwarded unchanged to `System`; only a counter is added.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: the caller's contract is `System::alloc`'s.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the caller's contract is `System::dealloc`'s.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: the caller's contract is `System::realloc`'s.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn main() {
    let mixed = std::env::var("FLEET").is_ok_and(|f| f == "mixed");
    let (mut s, machines) = match gpuslice_benches::fabric::loop_workload(!mixed) {
        Ok(w) => w,
        Err(e) => {
            eprintln!("place_allocs: the bench fleet is invalid: {e}");
            std::process::exit(1);
        }
    };
    let mut placed = Vec::with_capacity(machines.len());
    let before = ALLOCS.load(Ordering::Relaxed);
    for m in &machines {
        placed.push(s.place(m, Policy::Binpack).map(|a| a.devices.len()));
    }
    let count = ALLOCS.load(Ordering::Relaxed) - before;
    let ok = placed.iter().filter(|p| p.is_ok()).count();
    let devices: usize = placed.iter().filter_map(|p| p.as_ref().ok()).sum();
    println!(
        "{} fleet: {} placements ({ok} placed, {devices} devices): {count} allocations, {:.2} per placement",
        if mixed { "mixed" } else { "hgx" },
        machines.len(),
        count as f64 / machines.len() as f64
    );
}
