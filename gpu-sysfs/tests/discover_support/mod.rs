//! Hosts the discovery tests run against: real captures from `tests/data` and fake trees modelled
//! on real hosts, built with the public tree builder.

#![allow(
    dead_code,
    unused_imports,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic
)]

use std::path::{Path, PathBuf};

use gpu_sysfs::discover::{DiscoverOptions, discover};
use gpu_sysfs::testing::builder::Tree;
use gpu_sysfs::testing::{MdevTypeSpec, PciSpec, TreeBuilder};
use gpu_sysfs::umockdev::Recording;
use gpu_sysfs::{Host, RealHost};

pub fn data(rel: &str) -> PathBuf {
    gpu_sysfs::testing::fixtures::capture(rel)
}

pub fn topology_of(root: &Path) -> gpu_core::NodeTopology {
    let host = RealHost::new(root).unwrap();
    discover(&host, &DiscoverOptions::new("test-node")).unwrap()
}

pub use gpu_sysfs::testing::fixtures::{A2_BUSY_VFS, H200_TYPES, h200_creatable, h200_pf, h200_vf};

/// The A2 recording with its VF type directories laid over it
/// ([`gpu_sysfs::testing::fixtures::a2_recording_with_types`]).
pub fn a2_recording_with_types() -> Recording {
    gpu_sysfs::testing::fixtures::a2_recording_with_types().unwrap()
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

/// The 8-GPU H200 host ([`gpu_sysfs::testing::fixtures::h200_host`]) with `busy` VFs holding
/// types.
pub fn h200_host(busy: &[(usize, u32, u32)]) -> Tree {
    gpu_sysfs::testing::fixtures::h200_host(busy).unwrap()
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
