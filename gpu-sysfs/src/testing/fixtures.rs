//! The hosts tests, benches and the bindings' tests share: the real A2 capture (kept in
//! `gpu-sysfs/tests/data`, see its README for its origin) with its separately captured VF type
//! directories laid over it, and the modelled 8-GPU H200 host in NVIDIA's vendor-specific VFIO
//! framework.

use std::io;
use std::path::{Path, PathBuf};

use gpu_core::PciAddress;

use super::builder::PciSpec;
use super::builder::{Tree, TreeBuilder};
use crate::umockdev::{self, Recording};

/// The directory of the real captures (`gpu-sysfs/tests/data`).
pub fn capture_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data")
}

/// The capture file or directory `rel` under [`capture_dir`].
pub fn capture(rel: &str) -> PathBuf {
    capture_dir().join(rel)
}

/// The three VFs of the A2 capture that hold an mdev, with the type each holds.
pub const A2_BUSY_VFS: [(&str, &str); 3] = [
    ("0000:08:00.4", "nvidia-754"),
    ("0000:08:00.6", "nvidia-751"),
    ("0000:08:02.0", "nvidia-746"),
];

fn other(e: impl std::fmt::Display) -> io::Error {
    io::Error::other(e.to_string())
}

/// The A2 recording with the type directories of the separately captured free VF laid over every
/// A2 VF (the recorder did not descend into them): free VFs get the captured files as they are,
/// the VFs holding an mdev ([`A2_BUSY_VFS`]) report 0 for every type, as an A2 VF holds at most
/// one vGPU. Every other file is as recorded.
///
/// # Errors
/// A capture file that cannot be read or parsed.
pub fn a2_recording_with_types() -> io::Result<Recording> {
    let text = std::fs::read_to_string(capture("a2-sriov-mdev-host.umockdev"))?;
    let mut rec = umockdev::parse(&text, "a2").map_err(other)?;
    let types_dir = capture("a2-vf-0000-08-01.7/mdev_supported_types");
    let mut types: Vec<String> = std::fs::read_dir(&types_dir)?
        .map(|e| e.map(|e| e.file_name().to_string_lossy().into_owned()))
        .collect::<io::Result<_>>()?;
    types.sort();
    for dev in &mut rec.devices {
        let is_a2_vf = dev.property("PCI_ID") == Some("10DE:25B6")
            && dev.links.iter().any(|(n, _)| n == "physfn");
        if !is_a2_vf {
            continue;
        }
        let busy = A2_BUSY_VFS.iter().any(|(vf, _)| *vf == dev.name());
        for t in &types {
            for f in ["name", "description", "device_api", "available_instances"] {
                let mut v = std::fs::read(types_dir.join(t).join(f))?;
                if busy && f == "available_instances" {
                    v = b"0\n".to_vec();
                }
                dev.attributes
                    .push((format!("mdev_supported_types/{t}/{f}"), v));
            }
        }
    }
    Ok(rec)
}

/// [`a2_recording_with_types`] written out as a tree in a new temporary directory.
///
/// # Errors
/// As [`a2_recording_with_types`], and the tree that cannot be written.
pub fn a2_tree() -> io::Result<tempfile::TempDir> {
    let rec = a2_recording_with_types()?;
    let dir = tempfile::tempdir()?;
    rec.write_tree(dir.path(), "recording").map_err(other)?;
    Ok(dir)
}

/// The 15 types each H200 VF of the modelled vendor-VFIO host lists when the GPU is empty
/// (IDs illustrative: they change with every driver version).
pub const H200_TYPES: [(u32, &str); 15] = [
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

/// A resolver naming every H200 type as NVML would (a VF holding a type lists none), for
/// discovery in tests of the H200 fixtures.
pub fn h200_names() -> crate::resolver::InMemoryResolver {
    H200_TYPES
        .iter()
        .fold(crate::resolver::InMemoryResolver::new(), |r, (id, name)| {
            r.with(*id, name)
        })
}

/// The buses of the eight H200s of the modelled host.
pub const H200_BUSES: [u8; 8] = [0x18, 0x2a, 0x3a, 0x5d, 0x9a, 0xab, 0xba, 0xdb];

fn h200_bus(i: usize) -> u8 {
    H200_BUSES.get(i).copied().unwrap_or(0)
}

/// The PF address of H200 number `i` (0..8) on the modelled host.
pub fn h200_pf(i: usize) -> String {
    format!("0000:{:02x}:00.0", h200_bus(i))
}

/// The VF `n` (0..16) of H200 `i`: offset 4, stride 1, as the builder lays them out.
pub fn h200_vf(i: usize, n: u32) -> String {
    let rid = (u32::from(h200_bus(i)) << 8) + 4 + n;
    format!(
        "0000:{:02x}:{:02x}.{}",
        rid >> 8,
        (rid >> 3) & 0x1f,
        rid & 7
    )
}

/// What an H200 lists as creatable with the given types in use (MIG slices and time-sliced
/// framebuffer shared per GPU, the same-size rule, no mixing of the two kinds).
pub fn h200_creatable(used: &[u32]) -> Vec<(u32, &'static str)> {
    let facts = |id: u32| {
        H200_TYPES
            .iter()
            .find(|(i, _)| *i == id)
            .and_then(|(_, name)| crate::discover::facts_from_type_name(name))
            .unwrap_or((0, None, None))
    };
    let mig_used: u8 = used.iter().filter_map(|t| facts(*t).1).sum();
    let ts: Vec<u64> = used
        .iter()
        .filter(|t| facts(**t).1.is_none())
        .map(|t| facts(*t).0)
        .collect();
    let ts_used: u64 = ts.iter().sum();
    H200_TYPES
        .iter()
        .filter(|(id, _)| {
            let (fb, slices, _) = facts(*id);
            match slices {
                Some(s) => ts.is_empty() && mig_used + s <= 7,
                None => {
                    mig_used == 0
                        && ts.first().is_none_or(|l| *l == fb)
                        && ts_used + fb <= 141 * 1024
                }
            }
        })
        .copied()
        .collect()
}

/// The PF of H200 number `i` with its 16 VFs enabled (no vGPU files yet).
fn h200_pf_into(b: &mut TreeBuilder, i: usize) {
    let pf = h200_pf(i);
    let group = 20 + u32::try_from(i).unwrap_or(0) * 20;
    b.pci(
        &pf,
        PciSpec::new(0x10de, 0x2335, 0x030200)
            .driver("nvidia")
            .subsystem(0x10de, 0x18be)
            .group(group)
            .numa(if i < 4 { 0 } else { 1 })
            .link(16, 16, "32.0 GT/s PCIe", "32.0 GT/s PCIe"),
    );
    b.sriov(
        &pf,
        16,
        16,
        4,
        1,
        PciSpec::new(0x10de, 0x2335, 0x030200)
            .driver("nvidia")
            .subsystem(0x10de, 0x0000),
        Some(group + 1),
    );
}

/// One H200 SXM of the modelled host (at [`h200_pf`]`(0)`, 16 VFs) with exactly what the
/// driver lists: the VFs in `busy` hold a type (`(vf index, type id)`), and every free VF lists
/// the types `listed` (IDs of [`H200_TYPES`]). For tests of MIG slots, where what the driver
/// lists beside existing MIG-backed vGPUs depends on where their GPU instances sit.
///
/// # Errors
/// The tree that cannot be written.
pub fn h200_mig_host(busy: &[(u32, u32)], listed: &[u32]) -> io::Result<Tree> {
    let mut b = TreeBuilder::new();
    h200_pf_into(&mut b, 0);
    let list: Vec<(u32, &str)> = H200_TYPES
        .iter()
        .filter(|(id, _)| listed.contains(id))
        .copied()
        .collect();
    for n in 0..16 {
        match busy.iter().find(|(v, _)| *v == n) {
            Some((_, t)) => b.vendor_vfio_vf(&h200_vf(0, n), &[], *t),
            None => b.vendor_vfio_vf(&h200_vf(0, n), &list, 0),
        };
    }
    b.finish()
}

/// The fake kernel of one H200 of [`h200_mig_host`] (every free VF listing what fits) whose
/// driver's MIG state is what `nvml` answers, asked each time a list is read or a type set: for
/// tests of MIG on request through the fake NVML and the fake kernel together.
///
/// # Errors
/// The tree that cannot be written.
pub fn h200_mig_kernel(
    busy: &[(u32, u32)],
    nvml: std::sync::Arc<gpu_nvml::fake::FakeNvml>,
) -> io::Result<super::FakeKernel> {
    let all: Vec<u32> = H200_TYPES.iter().map(|(id, _)| *id).collect();
    let pf: PciAddress = h200_pf(0)
        .parse()
        .map_err(|_| io::Error::other("H200 address"))?;
    Ok(super::FakeKernel::new(h200_mig_host(busy, &all)?)?
        .with_pool(super::FakePool::VendorVfio {
            pf,
            framebuffer_mib: 141 * 1024,
            types: H200_TYPES
                .iter()
                .map(|(i, s)| (*i, (*s).to_owned()))
                .collect(),
        })
        .with_mig_source(move |gpu| super::FakeMig::of(nvml.as_ref(), gpu)))
}

/// Lays the 8-GPU H200 SXM host (vendor-specific VFIO, 16 VFs per GPU) into `b`. `busy` says
/// which VFs hold which type, as `(gpu index, vf index, type id)`; every free VF of a GPU lists
/// what is still creatable GPU-wide ([`h200_creatable`]).
pub fn h200_host_into(b: &mut TreeBuilder, busy: &[(usize, u32, u32)]) {
    for i in 0..H200_BUSES.len() {
        h200_pf_into(b, i);
        let used: Vec<u32> = busy
            .iter()
            .filter(|(g, _, _)| *g == i)
            .map(|(_, _, t)| *t)
            .collect();
        let creatable = h200_creatable(&used);
        for n in 0..16 {
            let current = busy
                .iter()
                .find(|(g, v, _)| *g == i && *v == n)
                .map_or(0, |(_, _, t)| *t);
            let list: Vec<(u32, &str)> = if current == 0 {
                creatable.clone()
            } else {
                vec![]
            };
            b.vendor_vfio_vf(&h200_vf(i, n), &list, current);
        }
    }
}

/// The 8-GPU H200 host of [`h200_host_into`] in a new temporary tree.
///
/// # Errors
/// The tree that cannot be written.
pub fn h200_host(busy: &[(usize, u32, u32)]) -> io::Result<Tree> {
    let mut b = TreeBuilder::new();
    h200_host_into(&mut b, busy);
    b.finish()
}
