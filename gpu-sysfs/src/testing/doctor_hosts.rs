//! Modelled hosts for `doctor`: one ready node, and nodes that earn each warning and failure.
//! Shared by the library's and the CLI's tests.

use std::io;

use super::builder::Tree;
use super::{PciSpec, TreeBuilder};

/// L40S `creatable_vgpu_types` lines for the 24 GB types (IDs as NVIDIA's driver lists them).
const L40S_24: [(u32, &str); 2] = [(1155, "NVIDIA L40S-24Q"), (1165, "NVIDIA L40S-24A")];
/// H200 SXM MIG-backed types.
const H200_MIG: [(u32, &str); 2] = [(1414, "NVIDIA H200X-1-18C"), (1417, "NVIDIA H200X-2-35C")];

/// Writes the files of a systemd host running `processes` (pid, comm), with the vGPU manager's
/// units installed.
fn systemd(b: &mut TreeBuilder, processes: &[(u32, &str)]) {
    b.mkdir("run/systemd/system");
    for unit in ["nvidia-vgpu-mgr", "nvidia-vgpud"] {
        b.file(
            &format!("usr/lib/systemd/system/{unit}.service"),
            &format!("[Service]\nExecStart=/usr/bin/{unit}\n"),
        );
    }
    for (pid, comm) in processes {
        b.file(&format!("proc/{pid}/comm"), &format!("{comm}\n"));
        b.file(
            &format!("proc/{pid}/cmdline"),
            &format!("/usr/bin/{comm}\0"),
        );
    }
}

/// A ready node: IOMMU on in passthrough mode, vfio-pci and the vGPU manager loaded and running,
/// `sriov-manage` installed, an L40S (VFs on, one typed) and an H200 in MIG mode (VFs on).
///
/// # Errors
/// An I/O error building the tree.
pub fn ready() -> io::Result<Tree> {
    let mut b = TreeBuilder::new();
    b.file(
        "proc/cmdline",
        "BOOT_IMAGE=/vmlinuz-6.8.0 root=/dev/sda1 ro intel_iommu=on iommu=pt\n",
    )
    .file(
        "proc/modules",
        "nvidia_vgpu_vfio 86016 0 - Live 0x0000000000000000\n\
         vfio_pci 16384 0 - Live 0x0000000000000000\n\
         nvidia 56811520 10 nvidia_vgpu_vfio, Live 0x0000000000000000 (POE)\n",
    )
    .mkdir("sys/class/iommu/dmar0")
    .mkdir("sys/bus/pci/drivers/vfio-pci")
    .file("usr/lib/nvidia/sriov-manage", "#!/bin/sh\n");
    systemd(&mut b, &[(812, "nvidia-vgpud"), (813, "nvidia-vgpu-mgr")]);
    b.pci(
        "0000:26:00.0",
        PciSpec::new(0x10de, 0x26b9, 0x030200)
            .driver("nvidia")
            .group(40)
            .subsystem(0x10de, 0x1851),
    )
    .sriov(
        "0000:26:00.0",
        2,
        32,
        4,
        1,
        PciSpec::new(0x10de, 0x26b9, 0x030200).driver("nvidia"),
        Some(41),
    )
    .vendor_vfio_vf("0000:26:00.4", &[], 1155)
    .vendor_vfio_vf("0000:26:00.5", &L40S_24, 0);
    b.pci(
        "0000:18:00.0",
        PciSpec::new(0x10de, 0x2335, 0x030200)
            .driver("nvidia")
            .group(50),
    )
    .sriov(
        "0000:18:00.0",
        2,
        16,
        4,
        1,
        PciSpec::new(0x10de, 0x2335, 0x030200).driver("nvidia"),
        Some(51),
    )
    .vendor_vfio_vf("0000:18:00.4", &H200_MIG, 0)
    .vendor_vfio_vf("0000:18:00.5", &H200_MIG, 0);
    for g in [40, 41, 42, 50, 51, 52] {
        b.file(&format!("sys/kernel/iommu_groups/{g}/type"), "identity\n");
    }
    b.finish()
}

/// A node that fails: the IOMMU turned off on the command line (VFIO in no-IOMMU mode), no
/// vfio-pci anywhere, an L40S with SR-IOV off and no `sriov-manage`, `nvidia-vgpu-mgr` installed
/// but not running, and KubeVirt's virt-handler running.
///
/// # Errors
/// An I/O error building the tree.
pub fn broken() -> io::Result<Tree> {
    let mut b = TreeBuilder::new();
    b.file(
        "proc/cmdline",
        "BOOT_IMAGE=/vmlinuz-6.1.0 root=/dev/vda1 intel_iommu=off vfio.enable_unsafe_noiommu_mode=1\n",
    )
    .file(
        "proc/modules",
        "nvidia 56811520 0 - Live 0x0000000000000000 (POE)\n",
    )
    .file("proc/sys/kernel/osrelease", "6.1.0-28-amd64\n")
    .mkdir("lib/modules/6.1.0-28-amd64/kernel/drivers/gpu");
    systemd(&mut b, &[(4242, "virt-handler")]);
    b.pci(
        "0000:26:00.0",
        PciSpec::new(0x10de, 0x26b9, 0x030200)
            .driver("nvidia")
            .subsystem(0x10de, 0x1851),
    );
    b.file("sys/bus/pci/devices/0000:26:00.0/sriov_totalvfs", "32\n")
        .file("sys/bus/pci/devices/0000:26:00.0/sriov_numvfs", "0\n");
    without_vfio_pci(b.finish()?)
}

/// The builder registers vfio-pci as a loaded kernel would; a kernel without it has no directory.
fn without_vfio_pci(tree: Tree) -> io::Result<Tree> {
    std::fs::remove_dir_all(tree.root().join("sys/bus/pci/drivers/vfio-pci"))?;
    Ok(tree)
}

/// A node that works with warnings and per-GPU failures: IOMMU on in translated mode, vfio-pci
/// installed but not loaded, an H200 whose VFs list no type though it holds none (after a live
/// MIG change), a T4 sharing its IOMMU group with a NIC, and a BMC VGA sharing the BMC's group.
///
/// # Errors
/// An I/O error building the tree.
pub fn degraded() -> io::Result<Tree> {
    let mut b = TreeBuilder::new();
    b.file(
        "proc/cmdline",
        "BOOT_IMAGE=/vmlinuz-6.1.0 root=/dev/vda1 amd_iommu=on\n",
    )
    .file(
        "proc/modules",
        "nvidia_vgpu_vfio 86016 0 - Live 0x0000000000000000\n\
         nvidia 56811520 0 - Live 0x0000000000000000 (POE)\n",
    )
    .file("proc/sys/kernel/osrelease", "6.1.0-28-amd64\n")
    .file(
        "lib/modules/6.1.0-28-amd64/kernel/drivers/vfio/pci/vfio-pci.ko.xz",
        "",
    )
    .mkdir("sys/class/iommu/ivhd0")
    .file("usr/lib/nvidia/sriov-manage", "#!/bin/sh\n");
    b.pci(
        "0000:18:00.0",
        PciSpec::new(0x10de, 0x2335, 0x030200)
            .driver("nvidia")
            .group(50),
    )
    .sriov(
        "0000:18:00.0",
        2,
        16,
        4,
        1,
        PciSpec::new(0x10de, 0x2335, 0x030200).driver("nvidia"),
        Some(51),
    )
    .vendor_vfio_vf("0000:18:00.4", &[], 0)
    .vendor_vfio_vf("0000:18:00.5", &[], 0);
    b.pci(
        "0000:5e:00.0",
        PciSpec::new(0x10de, 0x1eb8, 0x030200)
            .driver("nvidia")
            .group(94),
    )
    .pci(
        "0000:5e:00.1",
        PciSpec::new(0x8086, 0x1572, 0x020000)
            .driver("i40e")
            .group(94),
    )
    .pci(
        "0000:01:00.1",
        PciSpec::new(0x102b, 0x0533, 0x030000)
            .driver("mgag200")
            .group(33),
    )
    .pci(
        "0000:01:00.2",
        PciSpec::new(0x103c, 0x3307, 0x088000)
            .driver("hpilo")
            .group(33),
    );
    for g in [33, 50, 51, 52, 94] {
        b.file(&format!("sys/kernel/iommu_groups/{g}/type"), "DMA-FQ\n");
    }
    without_vfio_pci(b.finish()?)
}

/// A node whose L40S VFs vfio-pci took (`vfio-pci.ids=10de:26b9` on the kernel command line:
/// the VFs share the PF's device ID), beside a second L40S whose VF `0000:27:00.5` answers
/// its `nvidia/current_vgpu_type` with an error.
///
/// # Errors
/// An I/O error building the tree.
pub fn vfs_elsewhere() -> io::Result<Tree> {
    let mut b = TreeBuilder::new();
    b.file(
        "proc/cmdline",
        "BOOT_IMAGE=/vmlinuz-6.8.0 root=/dev/sda1 ro intel_iommu=on iommu=pt vfio-pci.ids=10de:26b9\n",
    )
    .mkdir("sys/class/iommu/dmar0")
    .mkdir("sys/bus/pci/drivers/vfio-pci")
    .file("usr/lib/nvidia/sriov-manage", "#!/bin/sh\n");
    b.pci(
        "0000:26:00.0",
        PciSpec::new(0x10de, 0x26b9, 0x030200)
            .driver("nvidia")
            .group(40),
    )
    .sriov(
        "0000:26:00.0",
        3,
        32,
        4,
        1,
        PciSpec::new(0x10de, 0x26b9, 0x030200).driver("vfio-pci"),
        Some(41),
    );
    b.pci(
        "0000:27:00.0",
        PciSpec::new(0x10de, 0x26b9, 0x030200)
            .driver("nvidia")
            .group(60),
    )
    .sriov(
        "0000:27:00.0",
        2,
        32,
        4,
        1,
        PciSpec::new(0x10de, 0x26b9, 0x030200).driver("nvidia"),
        Some(61),
    )
    .vendor_vfio_vf("0000:27:00.4", &L40S_24, 0)
    // A directory where the attribute should be: reading it fails (EISDIR), as a VF whose
    // state the driver cannot give answers with an error.
    .mkdir("sys/devices/pci0000:00/0000:27:00.5/nvidia/current_vgpu_type");
    b.finish()
}
