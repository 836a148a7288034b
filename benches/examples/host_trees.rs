//! Writes the bench hosts' trees (an L40S with 16 vendor-VFIO VFs, an A2 with 16 mdev VFs, an
//! 8-GPU H200 in MIG mode, a whole-GPU passthrough host; see `benches/support/hosts.rs`) under a
//! directory, for the Python and Node benches to discover through their bindings:
//!
//! ```console
//! $ cargo run --release -p gpuslice-benches --example host_trees -- /tmp/gpuslice-hosts
//! $ python bindings/python/bench/bench_refusal.py /tmp/gpuslice-hosts 10000 10000
//! ```
//!
//! Each copy is discovered again and must give the same topology as the tree it was copied from.

#[path = "../benches/support/hosts.rs"]
mod hosts;

use std::path::PathBuf;

fn main() {
    let dir = PathBuf::from(
        std::env::args()
            .nth(1)
            .unwrap_or_else(|| "/tmp/gpuslice-hosts".into()),
    );
    if let Err(e) = run(&dir) {
        eprintln!("host_trees: {e}");
        std::process::exit(1);
    }
}

fn run(dir: &std::path::Path) -> Result<(), String> {
    let written = hosts::write_host_trees(dir)?;
    let originals = hosts::discovered_hosts()?;
    for ((name, path), (_, want)) in written.iter().zip(&originals) {
        let got = hosts::discover(path, "proto")?;
        if &got != want {
            return Err(format!(
                "{name}: the copy at {} discovers differently",
                path.display()
            ));
        }
        println!(
            "{name}: {} ({} GPUs, {} vGPU parents)",
            path.display(),
            got.gpus.len(),
            got.mediated_devices.parents.len()
        );
    }
    Ok(())
}
