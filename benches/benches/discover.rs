//! Discovery benchmarks: `cargo bench --bench discover`.
//!
//! - `discover/h200_8gpu_16vf`: an 8-GPU H200 host in NVIDIA's vendor-specific VFIO framework,
//!   16 VFs per GPU, 15 creatable types per VF (1,161 files and links discovery needs).
//! - `discover/mdev_8gpu_16vf`: the same shape in the mdev framework (A2-style types: 8 × 16 × 15
//!   type directories with `name`, `description`, `device_api`, `available_instances`, ~7,700
//!   files), the tree `mdevctl types` is compared against.
//! - `discover/a2_real`: the real A2 recording bundled in `examples/hosts/` (16 VFs, 3 mdevs).
//! - `discover/*_parallel`: the same trees read from two threads
//!   (`RealHost::with_parallel_reads(true)`, what the CLI uses), against the default's one.
//! - `discover/h200_8gpu_16vf_one_read`: as `h200_8gpu_16vf` through a host whose file read
//!   costs 3 syscalls instead of `std::fs::read`'s 5 (what that change to `RealHost` would give).
//!
//! The trees are real files in a tempdir, built before the timed sections. With
//! `GPUSLICE_BENCH_TREES=DIR` the bench writes the three trees under `DIR` and exits, so syscall
//! counts and peer tools can be measured on the same trees; with
//! `GPUSLICE_BENCH_DISCOVER_ONCE=DIR` it discovers the tree at `DIR` once and exits (run it under
//! `strace -c -f`; see `benches/RESULTS-discover.md`).

use std::hint::black_box;
use std::path::{Path, PathBuf};

use criterion::{Criterion, criterion_group, criterion_main};
use gpu_sysfs::RealHost;
use gpu_sysfs::discover::{DiscoverOptions, discover};
use gpu_sysfs::testing::{MdevTypeSpec, PciSpec, TreeBuilder};

use gpu_sysfs::testing::fixtures::{H200_BUSES as BUSES, H200_TYPES};

fn vf_address(bus: u8, n: u32) -> String {
    let i = BUSES.iter().position(|b| *b == bus).unwrap_or(0);
    gpu_sysfs::testing::fixtures::h200_vf(i, n)
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

/// `RealHost` with a read that costs three syscalls instead of five: a sysfs attribute arrives
/// whole in one `read` (at most a page), so `open`, one `read` into a page-sized buffer and
/// `close` suffice; only a full buffer reads on. Measures what that change to `RealHost::read`
/// would give.
#[derive(Debug)]
struct OneReadHost(RealHost);

impl gpu_sysfs::Host for OneReadHost {
    fn read(&self, path: &str) -> std::io::Result<Vec<u8>> {
        use std::io::Read;
        gpu_sysfs::host::check_relative(path)?;
        let root = self.0.root_dir().unwrap_or(Path::new("/"));
        let mut f = std::fs::File::open(root.join(path))?;
        let mut buf = vec![0u8; 4096];
        let mut n = f.read(&mut buf)?;
        while n == buf.len() {
            buf.resize(buf.len() * 2, 0);
            let m = f.read(&mut buf[n..])?;
            if m == 0 {
                break;
            }
            n += m;
        }
        buf.truncate(n);
        Ok(buf)
    }
    fn write(&self, path: &str, data: &[u8]) -> std::io::Result<()> {
        self.0.write(path, data)
    }
    fn list(&self, dir: &str) -> std::io::Result<Vec<String>> {
        self.0.list(dir)
    }
    fn read_link(&self, path: &str) -> std::io::Result<PathBuf> {
        self.0.read_link(path)
    }
    fn exists(&self, path: &str) -> bool {
        self.0.exists(path)
    }
    fn run(
        &self,
        program: &str,
        args: &[String],
        timeout: std::time::Duration,
    ) -> std::io::Result<gpu_sysfs::CommandOutput> {
        self.0.run(program, args, timeout)
    }
    fn root_dir(&self) -> Option<&Path> {
        self.0.root_dir()
    }
    fn parallel_reads(&self) -> bool {
        self.0.parallel_reads()
    }
}

/// User plus system CPU time of this process, in clock ticks (from `/proc/self/stat`).
fn cpu_ticks() -> u64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // Fields after the command name (which may contain spaces) start after the last ')'.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the whole line, 12 and 13 after the name.
    let get = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    get(11) + get(12)
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
    if let Some(dir) = std::env::var_os("GPUSLICE_BENCH_DISCOVER_ONCE") {
        // Discovery of an existing tree, for `strace -c` (an empty tree gives the baseline);
        // with GPUSLICE_BENCH_REPEAT=N it runs N times and prints the CPU time per run, which a
        // busy machine inflates far less than wall time.
        let real = host(Path::new(&dir));
        let one_read = OneReadHost(host(Path::new(&dir)));
        let h: &dyn gpu_sysfs::Host = if std::env::var_os("GPUSLICE_BENCH_ONE_READ").is_some() {
            &one_read
        } else {
            &real
        };
        let repeat: u32 = std::env::var("GPUSLICE_BENCH_REPEAT")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(1);
        let before = cpu_ticks();
        for _ in 0..repeat {
            match discover(h, &DiscoverOptions::new("bench")) {
                Ok(t) => {
                    black_box(t);
                }
                Err(e) => fail("discovering", e),
            }
        }
        let ticks = cpu_ticks().saturating_sub(before);
        // Linux reports CPU time in ticks of 10 ms (USER_HZ = 100).
        eprintln!(
            "{repeat} runs, {:.3} ms CPU (user+sys) per run",
            ticks as f64 * 10.0 / f64::from(repeat.max(1))
        );
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
    let parallel = host(h200.root()).with_parallel_reads(true);
    group.bench_function("h200_8gpu_16vf_parallel", |b| {
        b.iter(|| black_box(discover(&parallel, &opts)))
    });
    let fast = OneReadHost(host(h200.root()));
    group.bench_function("h200_8gpu_16vf_one_read", |b| {
        b.iter(|| black_box(discover(&fast, &opts)))
    });

    let mdev = eight_gpu_host(None, true);
    let h = host(mdev.root());
    group.bench_function("mdev_8gpu_16vf", |b| {
        b.iter(|| black_box(discover(&h, &opts)))
    });
    let parallel = host(mdev.root()).with_parallel_reads(true);
    group.bench_function("mdev_8gpu_16vf_parallel", |b| {
        b.iter(|| black_box(discover(&parallel, &opts)))
    });
    // What a uevent for one mdev costs: its GPU's 16 VF parents (types, instances, pool) read
    // again and spliced into the cached topology.
    let cached = match discover(&h, &opts) {
        Ok(t) => t,
        Err(e) => fail("discovering the mdev host", e),
    };
    let Some(first) = cached.mediated_devices.parents.first() else {
        fail("the mdev host", "has no parents")
    };
    let change = [gpu_sysfs::discover::Change::MdevParent(
        first.id.to_string(),
    )];
    if gpu_sysfs::discover::rediscover(&h, &opts, &cached, &change).as_ref() != Some(&cached) {
        fail("the narrow read", "does not give the full read's topology");
    }
    group.bench_function("mdev_8gpu_16vf_narrow_one_gpu", |b| {
        b.iter(|| black_box(gpu_sysfs::discover::rediscover(&h, &opts, &cached, &change)))
    });

    let replay = match gpu_sysfs::umockdev::materialize(&a2_recording()) {
        Ok(r) => r,
        Err(e) => fail("materializing the A2 recording", e),
    };
    let h = host(replay.root());
    group.bench_function("a2_real", |b| b.iter(|| black_box(discover(&h, &opts))));
    let parallel = host(replay.root()).with_parallel_reads(true);
    group.bench_function("a2_real_parallel", |b| {
        b.iter(|| black_box(discover(&parallel, &opts)))
    });
    group.finish();
}

criterion_group!(benches, bench_discover);
criterion_main!(benches);
