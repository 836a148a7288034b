//! Hosts the discovery tests run against: real captures from `tests/data` and fake trees modelled
//! on real hosts, built with the public tree builder.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::{Path, PathBuf};

use gpu_sysfs::discover::{DiscoverOptions, discover};
use gpu_sysfs::testing::builder::Tree;
use gpu_sysfs::testing::{MdevTypeSpec, PciSpec, TreeBuilder};
use gpu_sysfs::umockdev::{self, Recording};
use gpu_sysfs::{Host, RealHost};

pub fn data(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(rel)
}

pub fn topology_of(root: &Path) -> gpu_core::NodeTopology {
    let host = RealHost::new(root).unwrap();
    discover(&host, &DiscoverOptions::new("test-node")).unwrap()
}

/// The three VFs of the A2 capture that hold an mdev, with the type each holds.
pub const A2_BUSY_VFS: [(&str, &str); 3] = [
    ("0000:08:00.4", "nvidia-754"),
    ("0000:08:00.6", "nvidia-751"),
    ("0000:08:02.0", "nvidia-746"),
];

/// The A2 recording with the type directories of the separately captured free VF laid over every
/// VF: free VFs get the captured files as they are, the VFs holding an mdev report 0 for every
/// type (each A2 VF holds at most one vGPU). The recorder did not descend into these
/// directories; every other file is as recorded.
pub fn a2_recording_with_types() -> Recording {
    let text = std::fs::read_to_string(data("a2-sriov-mdev-host.umockdev")).unwrap();
    let mut rec = umockdev::parse(&text, "a2").unwrap();
    let types_dir = data("a2-vf-0000-08-01.7/mdev_supported_types");
    let mut types: Vec<String> = std::fs::read_dir(&types_dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
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
                let mut v = std::fs::read(types_dir.join(t).join(f)).unwrap();
                if busy && f == "available_instances" {
                    v = b"0\n".to_vec();
                }
                dev.attributes
                    .push((format!("mdev_supported_types/{t}/{f}"), v));
            }
        }
    }
    rec
}

/// A materialized recording kept alive with its directory.
pub struct Materialized {
    pub dir: tempfile::TempDir,
}

impl Materialized {
    pub fn root(&self) -> &Path {
        self.dir.path()
    }
    pub fn host(&self) -> RealHost {
        RealHost::new(self.root()).unwrap()
    }
}

pub fn materialize(rec: &Recording) -> Materialized {
    let dir = tempfile::tempdir().unwrap();
    rec.write_tree(dir.path(), "recording").unwrap();
    Materialized { dir }
}

pub fn a2_host() -> Materialized {
    materialize(&a2_recording_with_types())
}

/// A host shaped like the lab reference (QEMU, Linux 6.1): five bochs displays, one IOMMU group
/// shared by two of them and an e1000 NIC behind a driverless pci-bridge, the sample mdev drivers
/// mbochs, mdpy and mtty as virtual parents.
pub fn lab_host() -> Tree {
    let mut b = TreeBuilder::new();
    let bochs = |class| PciSpec::new(0x1234, 0x1111, class).subsystem(0x1af4, 0x1100);
    b.pci(
        "0000:00:00.0",
        PciSpec::new(0x8086, 0x29c0, 0x060000).group(0),
    );
    let mut vga = bochs(0x030000).driver("bochs-drm").group(1);
    vga.boot_vga = Some(true);
    b.pci("0000:00:02.0", vga);
    b.pci("0000:00:03.0", bochs(0x038000).driver("bochs-drm").group(2));
    b.pci(
        "0000:00:04.0",
        PciSpec::new(0x1b36, 0x0001, 0x060400).group(3),
    );
    b.pci(
        "0000:00:05.0",
        PciSpec::new(0x1b36, 0x000c, 0x060400)
            .driver("pcieport")
            .group(4),
    );
    b.pci(
        "0000:00:1f.0",
        PciSpec::new(0x8086, 0x2918, 0x060100).group(5),
    );
    b.pci(
        "0000:00:1f.2",
        PciSpec::new(0x8086, 0x2922, 0x010601).group(5),
    );
    b.pci(
        "0000:00:1f.3",
        PciSpec::new(0x8086, 0x2930, 0x0c0500).group(5),
    );
    b.pci("0000:01:01.0", bochs(0x038000).driver("bochs-drm").group(3));
    b.pci(
        "0000:01:02.0",
        PciSpec::new(0x8086, 0x100e, 0x020000)
            .driver("e1000")
            .group(3),
    );
    b.pci("0000:01:03.0", bochs(0x038000).driver("bochs-drm").group(3));
    b.pci("0000:02:00.0", bochs(0x038000).driver("bochs-drm").group(6));
    b.mdev_parent(
        "mbochs",
        &[
            MdevTypeSpec::new(
                "mbochs-large",
                "mbochs-large",
                4,
                Some("virtual display, 64 MB video memory"),
            ),
            MdevTypeSpec::new(
                "mbochs-medium",
                "mbochs-medium",
                15,
                Some("virtual display, 16 MB video memory"),
            ),
            MdevTypeSpec::new(
                "mbochs-small",
                "mbochs-small",
                63,
                Some("virtual display, 4 MB video memory"),
            ),
        ],
    );
    b.mdev_instance(
        "de306c9f-a714-4373-a290-dc15d4e49b71",
        "mbochs",
        "mbochs-small",
    );
    b.mdev_parent(
        "mdpy",
        &[
            MdevTypeSpec::new(
                "mdpy-hd",
                "mdpy-hd",
                4,
                Some("virtual display, 1920x1080 framebuffer"),
            ),
            MdevTypeSpec::new(
                "mdpy-vga",
                "mdpy-vga",
                4,
                Some("virtual display, 640x480 framebuffer"),
            ),
            MdevTypeSpec::new(
                "mdpy-xga",
                "mdpy-xga",
                4,
                Some("virtual display, 1024x768 framebuffer"),
            ),
        ],
    );
    b.mdev_parent(
        "mtty",
        &[
            MdevTypeSpec::new("mtty-1", "Single port serial", 24, None),
            MdevTypeSpec::new("mtty-2", "Dual port serial", 12, None),
        ],
    );
    b.finish().unwrap()
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

/// The PF address of H200 number `i` (0..8) on the modelled host.
pub fn h200_pf(i: usize) -> String {
    const BUSES: [u8; 8] = [0x18, 0x2a, 0x3a, 0x5d, 0x9a, 0xab, 0xba, 0xdb];
    format!("0000:{:02x}:00.0", BUSES[i])
}

/// The VF `n` (0..16) of H200 `i`: offset 4, stride 1, as the builder lays them out.
pub fn h200_vf(i: usize, n: u32) -> String {
    let pf: gpu_core::PciAddress = h200_pf(i).parse().unwrap();
    let rid = (u32::from(pf.bus()) << 8) + 4 + n;
    format!(
        "0000:{:02x}:{:02x}.{}",
        rid >> 8,
        (rid >> 3) & 0x1f,
        rid & 7
    )
}

/// An 8-GPU H200 SXM host in NVIDIA's vendor-specific VFIO framework, 16 VFs per GPU.
/// `state` says per GPU which VFs hold which type; every VF of a GPU lists what is still
/// creatable GPU-wide per `creatable` (called with the GPU index and the types in use).
pub fn h200_host(busy: &[(usize, u32, u32)]) -> Tree {
    let mut b = TreeBuilder::new();
    for i in 0..8 {
        let pf = h200_pf(i);
        b.pci(
            &pf,
            PciSpec::new(0x10de, 0x2335, 0x030200)
                .driver("nvidia")
                .subsystem(0x10de, 0x18be)
                .group(20 + i as u32 * 20)
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
            Some(21 + i as u32 * 20),
        );
        let used: Vec<u32> = busy
            .iter()
            .filter(|(g, _, _)| *g == i)
            .map(|(_, _, t)| *t)
            .collect();
        let creatable = h200_creatable(&used);
        for n in 0..16 {
            let vf = h200_vf(i, n);
            let current = busy
                .iter()
                .find(|(g, v, _)| *g == i && *v == n)
                .map_or(0, |(_, _, t)| *t);
            let list: Vec<(u32, &str)> = if current == 0 {
                creatable.clone()
            } else {
                vec![]
            };
            b.vendor_vfio_vf(&vf, &list, current);
        }
    }
    b.finish().unwrap()
}

/// What an H200 lists as creatable with the given types in use (MIG slices and time-sliced
/// framebuffer shared per GPU, the same-size rule, no mixing of the two kinds).
pub fn h200_creatable(used: &[u32]) -> Vec<(u32, &'static str)> {
    let facts = |id: u32| {
        let name = H200_TYPES.iter().find(|(i, _)| *i == id).unwrap().1;
        gpu_sysfs::discover::facts_from_type_name(name).unwrap()
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

/// A workstation: an Intel iGPU sharing its IOMMU group with the USB controller, two Radeons
/// (each with its HD audio), one NVIDIA card with HD audio, USB-C and UCSI functions.
pub fn workstation_host() -> Tree {
    let mut b = TreeBuilder::new();
    let mut igpu = PciSpec::new(0x8086, 0x4680, 0x030000)
        .driver("i915")
        .group(0);
    igpu.boot_vga = Some(true);
    b.pci("0000:00:02.0", igpu);
    b.pci(
        "0000:00:14.0",
        PciSpec::new(0x8086, 0x7ae0, 0x0c0330)
            .driver("xhci_hcd")
            .group(0),
    );
    b.pci(
        "0000:00:01.0",
        PciSpec::new(0x8086, 0x460d, 0x060400)
            .driver("pcieport")
            .group(1),
    );
    b.pci(
        "0000:03:00.0",
        PciSpec::new(0x1002, 0x73bf, 0x030000)
            .driver("amdgpu")
            .group(12)
            .numa(-1)
            .link(8, 16, "8.0 GT/s PCIe", "16.0 GT/s PCIe"),
    );
    b.pci(
        "0000:03:00.1",
        PciSpec::new(0x1002, 0xab28, 0x040300)
            .driver("snd_hda_intel")
            .group(12),
    );
    b.pci(
        "0000:0a:00.0",
        PciSpec::new(0x10de, 0x2684, 0x030000)
            .driver("nvidia")
            .group(15)
            .subsystem(0x10de, 0x16f3),
    );
    b.pci(
        "0000:0a:00.1",
        PciSpec::new(0x10de, 0x22ba, 0x040300)
            .driver("snd_hda_intel")
            .group(15),
    );
    b.pci(
        "0000:0a:00.2",
        PciSpec::new(0x10de, 0x1ada, 0x0c0330)
            .driver("xhci_hcd")
            .group(15),
    );
    b.pci(
        "0000:0a:00.3",
        PciSpec::new(0x10de, 0x1adb, 0x0c8000)
            .driver("nvidia-gpu")
            .group(15),
    );
    b.pci(
        "0000:0c:00.0",
        PciSpec::new(0x1002, 0x744c, 0x030000)
            .driver("vfio-pci")
            .group(16),
    );
    b.pci(
        "0000:0c:00.1",
        PciSpec::new(0x1002, 0xab30, 0x040300)
            .driver("vfio-pci")
            .group(16),
    );
    b.finish().unwrap()
}

/// Discovery through any host.
pub fn discover_on(host: &dyn Host) -> gpu_core::NodeTopology {
    discover(host, &DiscoverOptions::new("test-node")).unwrap()
}
