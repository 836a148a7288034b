//! Discovery benchmarks: `cargo bench --bench discover`.
//!
//! - `discover/h200_8gpu_16vf`: an 8-GPU H200 host in NVIDIA's vendor-specific VFIO framework,
//!   16 VFs per GPU, 15 creatable types per VF (1,161 files and links discovery needs).
//! - `discover/mdev_8gpu_16vf`: the same shape in the mdev framework (A2-style types: 8 × 16 × 15
//!   type directories with `name`, `description`, `device_api`, `available_instances`, ~7,700
//!   files), the tree `mdevctl types` is compared against.
//! - `discover/a2_real`: the real A2 recording bundled in `examples/hosts/` (16 VFs, 3 mdevs).
//!
//! The trees are real files in a tempdir, built before the timed sections. With
//! `GPUSLICE_BENCH_TREES=DIR` the bench writes the three trees under `DIR` and exits, so syscall
//! counts and peer tools can be measured on the same trees (see `benches/RESULTS-discover.md`).

use std::hint::black_box;
use std::path::{Path, PathBuf};

use criterion::{Criterion, criterion_group, criterion_main};
use gpu_sysfs::RealHost;
use gpu_sysfs::discover::{DiscoverOptions, discover};
use gpu_sysfs::testing::{MdevTypeSpec, PciSpec, TreeBuilder};

/// Illustrative H200 type IDs (they change with every driver version).
const H200_TYPES: [(u32, &str); 15] = [
    (1414, "NVIDIA H200X-1-18C"),
    (1415, "NVIDIA H200X-1-18CME"),
    (1416, "NVIDIA H200X-1-35C"),
    (1417, "NVIDIA H200X-2-35C"),
    (1418, "NVIDIA H200X-3-71C"),
    (1419, "NVIDIA H200X-4-71C"),
    (1420, "NVIDIA H200X-7-141C"),
    (1421, "NVIDIA H200X-4C"),
    (1422, "NVIDIA H200X-8C"),
    (1423, "NVIDIA H200X-16C"),
    (1424, "NVIDIA H200X-18C"),
    (1425, "NVIDIA H200X-35C"),
    (1426, "NVIDIA H200X-48C"),
    (1427, "NVIDIA H200X-71C"),
    (1428, "NVIDIA H200X-141C"),
];

const BUSES: [u8; 8] = [0x18, 0x2a, 0x3a, 0x5d, 0x9a, 0xab, 0xba, 0xdb];

fn vf_address(bus: u8, n: u32) -> String {
    let rid = (u32::from(bus) << 8) + 4 + n;
    format!(
        "0000:{:02x}:{:02x}.{}",
        rid >> 8,
        (rid >> 3) & 0x1f,
        rid & 7
    )
}

fn fail(what: &str, e: impl std::fmt::Display) -> ! {
    eprintln!("discover bench: {what}: {e}");
    std::process::exit(1)
}

/// Builds the 8-GPU host under `at` (or a tempdir), in either framework.
fn eight_gpu_host(at: Option<PathBuf>, mdev: bool) -> gpu_sysfs::testing::builder::Tree {
    let mut b = match at {
        Some(p) => {
            if let Err(e) = std::fs::create_dir_all(&p) {
                fail("creating the tree", e);
            }
            TreeBuilder::at(p)
        }
        None => TreeBuilder::new(),
    };
    let a2_types: Vec<MdevTypeSpec> = (0..15u32)
        .map(|i| {
            let fb = [1024u64, 2048, 4096, 8192, 16384][(i % 5) as usize];
            let series = ["B", "Q", "A"][(i / 5) as usize];
            MdevTypeSpec::new(
                &format!("nvidia-{}", 742 + i),
                &format!("NVIDIA A2-{}{series}", fb / 1024),
                1,
                Some(&format!(
                    "num_heads=4, frl_config=60, framebuffer={fb}M, max_resolution=7680x4320, max_instance={}",
                    16384 / fb
                )),
            )
        })
        .collect();
    for (i, bus) in BUSES.iter().enumerate() {
        let pf = format!("0000:{bus:02x}:00.0");
        let device = if mdev { 0x25b6 } else { 0x2335 };
        b.pci(
            &pf,
            PciSpec::new(0x10de, device, 0x030200)
                .driver("nvidia")
                .subsystem(0x10de, 0x18be)
                .group(20 + i as u32 * 20)
                .numa(i32::from(i >= 4))
                .link(16, 16, "32.0 GT/s PCIe", "32.0 GT/s PCIe"),
        );
        b.sriov(
            &pf,
            16,
            16,
            4,
            1,
            PciSpec::new(0x10de, device, 0x030200).driver("nvidia"),
            Some(21 + i as u32 * 20),
        );
        for n in 0..16 {
            let vf = vf_address(*bus, n);
            if mdev {
                b.mdev_parent(&vf, &a2_types);
            } else {
                b.vendor_vfio_vf(&vf, &H200_TYPES, 0);
            }
        }
    }
    match b.finish() {
        Ok(t) => t,
        Err(e) => fail("building the tree", e),
    }
}

fn a2_recording() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/hosts/a2-sriov-mdev.umockdev")
}

fn host(root: &Path) -> RealHost {
    match RealHost::new(root) {
        Ok(h) => h,
        Err(e) => fail("opening the tree", e),
    }
}

fn bench_discover(c: &mut Criterion) {
    if let Some(dir) = std::env::var_os("GPUSLICE_BENCH_TREES") {
        let dir = PathBuf::from(dir);
        eight_gpu_host(Some(dir.join("h200_8gpu_16vf")), false);
        eight_gpu_host(Some(dir.join("mdev_8gpu_16vf")), true);
        match gpu_sysfs::umockdev::materialize(&a2_recording()) {
            Ok(r) => {
                let kept = r.into_tempdir().keep();
                let _ = std::fs::remove_dir_all(dir.join("a2_real"));
                if let Err(e) = std::fs::rename(&kept, dir.join("a2_real")) {
                    fail("moving the A2 tree", e);
                }
            }
            Err(e) => fail("materializing the A2 recording", e),
        }
        eprintln!("trees written under {}", dir.display());
        std::process::exit(0);
    }
    let opts = DiscoverOptions::new("bench");
    let mut group = c.benchmark_group("discover");

    let h200 = eight_gpu_host(None, false);
    let h = host(h200.root());
    match discover(&h, &opts) {
        Ok(t) => eprintln!(
            "h200_8gpu_16vf: {} GPUs, {} parents, {} profiles",
            t.gpus.len(),
            t.mediated_devices.parents.len(),
            t.mediated_devices
                .parents
                .iter()
                .map(|p| p.profiles.len())
                .sum::<usize>()
        ),
        Err(e) => fail("discovering the H200 host", e),
    }
    group.bench_function("h200_8gpu_16vf", |b| {
        b.iter(|| black_box(discover(&h, &opts)))
    });

    let mdev = eight_gpu_host(None, true);
    let h = host(mdev.root());
    group.bench_function("mdev_8gpu_16vf", |b| {
        b.iter(|| black_box(discover(&h, &opts)))
    });

    let replay = match gpu_sysfs::umockdev::materialize(&a2_recording()) {
        Ok(r) => r,
        Err(e) => fail("materializing the A2 recording", e),
    };
    let h = host(replay.root());
    group.bench_function("a2_real", |b| b.iter(|| black_box(discover(&h, &opts))));
    group.finish();
}

criterion_group!(benches, bench_discover);
criterion_main!(benches);
