//! Whole fake hosts: the sample mdev drivers, an A2 in the mdev framework, an L40S in the
//! vendor-specific VFIO framework, and a passthrough host.

use super::*;

impl FakeKernel {
    // ----- presets ---------------------------------------------------------------------------

    /// The kernel's sample mdev drivers as observed on Linux 6.1: `mbochs` (256 MB pool,
    /// `mbochs-small`/`-medium`/`-large` = 4/16/64 MB), `mtty` (24 ports, `mtty-1`/`mtty-2`, no
    /// `description`) and `mdpy` (4 instances, `EUSERS` when full).
    ///
    /// # Errors
    /// The I/O error of building the tree.
    pub fn sample_mdev_drivers() -> io::Result<Self> {
        let mut b = TreeBuilder::new();
        add_sample_mdev_drivers(&mut b);
        let k = FakeKernel::new(b.finish()?)?;
        Ok(k.with_sample_pools())
    }

    /// Declares the pools of the sample drivers added by [`add_sample_mdev_drivers`].
    pub fn with_sample_pools(self) -> Self {
        sample_pools().into_iter().fold(self, FakeKernel::with_pool)
    }

    /// An NVIDIA A2 (16 GB) at `0000:08:00.0` in the mdev framework: 16 VFs `0000:08:00.4` …
    /// `0000:08:02.3`, each an mdev parent of the driver's 15 types ([`A2_TYPES`]: `nvidia-742`
    /// A2-1B … `nvidia-746` A2-4Q … `nvidia-756` A2-16C).
    ///
    /// # Errors
    /// The I/O error of building the tree.
    pub fn a2_mdev_host() -> io::Result<Self> {
        let mut b = TreeBuilder::new();
        let parents = add_a2_mdev_gpu(&mut b);
        let k = FakeKernel::new(b.finish()?)?;
        Ok(k.with_pool(FakePool::NvidiaMdev {
            parents,
            per_parent: Some(1),
            types: Vec::new(),
        }))
    }

    /// An NVIDIA L40S (48 GB) at `0000:26:00.0` in the vendor-specific VFIO framework, with
    /// `numvfs` VFs enabled (0: SR-IOV still off, `sriov_totalvfs` 32).
    ///
    /// # Errors
    /// The I/O error of building the tree.
    pub fn l40s_vendor_vfio_host(numvfs: u32) -> io::Result<Self> {
        Self::l40s_vendor_vfio_host_on(numvfs, "nvidia")
    }

    /// [`FakeKernel::l40s_vendor_vfio_host`] with the PF bound to `driver` (`vfio-pci`: the card
    /// is passed through to a VM; its VFs then take no vGPU type).
    ///
    /// # Errors
    /// The I/O error of building the tree.
    pub fn l40s_vendor_vfio_host_on(numvfs: u32, driver: &str) -> io::Result<Self> {
        Self::vendor_vfio_host_with(0x26b9, driver, 48 * 1024, L40S_TYPES, numvfs)
    }

    /// An NVIDIA GPU (PCI device ID `device_id`, bound to `nvidia`) at `0000:26:00.0` in the
    /// vendor-specific VFIO framework, offering `types` (`(ID, name)`, sizes from the names) on
    /// `framebuffer_mib`, with `numvfs` VFs enabled (`sriov_totalvfs` 32). MIG-backed types take
    /// GPU-instance slots by the product's geometry where gpu-core knows it.
    ///
    /// # Errors
    /// The I/O error of building the tree.
    pub fn vendor_vfio_host(
        device_id: u16,
        framebuffer_mib: u64,
        types: &[(u32, &str)],
        numvfs: u32,
    ) -> io::Result<Self> {
        Self::vendor_vfio_host_with(device_id, "nvidia", framebuffer_mib, types, numvfs)
    }

    fn vendor_vfio_host_with(
        device_id: u16,
        driver: &str,
        framebuffer_mib: u64,
        types: &[(u32, &str)],
        numvfs: u32,
    ) -> io::Result<Self> {
        let mut b = TreeBuilder::new();
        let pf = "0000:26:00.0";
        b.pci(
            pf,
            PciSpec::new(0x10de, device_id, 0x030200)
                .driver(driver)
                .group(30)
                .numa(0),
        );
        b.attr(pf, "sriov_totalvfs", "32\n")
            .attr(pf, "sriov_numvfs", "0\n")
            .attr(pf, "sriov_offset", "4\n")
            .attr(pf, "sriov_stride", "1\n");
        let k = FakeKernel::new(b.finish()?)?;
        let pool = FakePool::VendorVfio {
            pf: pf.parse().map_err(io::Error::other)?,
            framebuffer_mib,
            types: types.iter().map(|(id, n)| (*id, (*n).to_owned())).collect(),
        };
        let k = k.with_pool(pool);
        if numvfs > 0 {
            let a: PciAddress = pf.parse().map_err(io::Error::other)?;
            k.set_numvfs(&a, numvfs)?;
        }
        Ok(k)
    }

    /// A host for whole-GPU passthrough:
    /// - `0000:01:00.0` NVIDIA GPU (`nvidia`) and `0000:01:00.1` its HD audio (`snd_hda_intel`),
    ///   IOMMU group 1 with the root port `0000:00:01.0` (`pcieport`, a bridge: tolerated);
    /// - `0000:02:00.0` NVIDIA GPU sharing IOMMU group 2 with an Intel NIC `0000:03:00.0` (`e1000e`);
    /// - `0000:04:00.0` NVIDIA GPU without an IOMMU group;
    /// - `0000:05:00.0` AMD GPU (`amdgpu`) alone in group 5, with audio `0000:05:00.1`.
    ///
    /// # Errors
    /// The I/O error of building the tree.
    pub fn passthrough_host() -> io::Result<Self> {
        let mut b = TreeBuilder::new();
        add_passthrough_devices(&mut b);
        FakeKernel::new(b.finish()?)
    }
}

/// The L40S's vendor-VFIO types as a free VF of an idle card lists them (recorded on a real
/// host by harvester/pcidevices, Apache-2.0); sizes come from the names.
pub const L40S_TYPES: &[(u32, &str)] = &[
    (1145, "NVIDIA L40S-1B"),
    (1146, "NVIDIA L40S-2B"),
    (1147, "NVIDIA L40S-1Q"),
    (1148, "NVIDIA L40S-2Q"),
    (1149, "NVIDIA L40S-3Q"),
    (1150, "NVIDIA L40S-4Q"),
    (1151, "NVIDIA L40S-6Q"),
    (1152, "NVIDIA L40S-8Q"),
    (1153, "NVIDIA L40S-12Q"),
    (1154, "NVIDIA L40S-16Q"),
    (1155, "NVIDIA L40S-24Q"),
    (1156, "NVIDIA L40S-48Q"),
    (1157, "NVIDIA L40S-1A"),
    (1158, "NVIDIA L40S-2A"),
    (1159, "NVIDIA L40S-3A"),
    (1160, "NVIDIA L40S-4A"),
    (1161, "NVIDIA L40S-6A"),
    (1162, "NVIDIA L40S-8A"),
    (1163, "NVIDIA L40S-12A"),
    (1164, "NVIDIA L40S-16A"),
    (1165, "NVIDIA L40S-24A"),
    (1166, "NVIDIA L40S-48A"),
    (2164, "NVIDIA L40S-3B"),
];

/// Adds the `mbochs`, `mtty` and `mdpy` parents with their types and initial counts.
pub fn add_sample_mdev_drivers(b: &mut TreeBuilder) {
    b.mdev_parent(
        "mbochs",
        &[
            MdevTypeSpec::new(
                "mbochs-small",
                "mbochs-small",
                64,
                Some("virtual display, 4 MB video memory"),
            ),
            MdevTypeSpec::new(
                "mbochs-medium",
                "mbochs-medium",
                16,
                Some("virtual display, 16 MB video memory"),
            ),
            MdevTypeSpec::new(
                "mbochs-large",
                "mbochs-large",
                4,
                Some("virtual display, 64 MB video memory"),
            ),
        ],
    )
    .mdev_parent(
        "mtty",
        &[
            MdevTypeSpec::new("mtty-1", "Single port serial", 24, None),
            MdevTypeSpec::new("mtty-2", "Dual port serial", 12, None),
        ],
    )
    .mdev_parent(
        "mdpy",
        &[
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
            MdevTypeSpec::new(
                "mdpy-hd",
                "mdpy-hd",
                4,
                Some("virtual display, 1920x1080 framebuffer"),
            ),
        ],
    );
}

/// The A2's mdev types as its driver lists them: `(directory, name, description)` (facts
/// recorded on a real host by harvester/pcidevices, Apache-2.0).
pub const A2_TYPES: &[(&str, &str, &str)] = &[
    (
        "nvidia-742",
        "NVIDIA A2-1B",
        "num_heads=4, frl_config=45, framebuffer=1024M, max_resolution=5120x2880, max_instance=16",
    ),
    (
        "nvidia-743",
        "NVIDIA A2-2B",
        "num_heads=4, frl_config=45, framebuffer=2048M, max_resolution=5120x2880, max_instance=8",
    ),
    (
        "nvidia-744",
        "NVIDIA A2-1Q",
        "num_heads=4, frl_config=60, framebuffer=1024M, max_resolution=5120x2880, max_instance=16",
    ),
    (
        "nvidia-745",
        "NVIDIA A2-2Q",
        "num_heads=4, frl_config=60, framebuffer=2048M, max_resolution=7680x4320, max_instance=8",
    ),
    (
        "nvidia-746",
        "NVIDIA A2-4Q",
        "num_heads=4, frl_config=60, framebuffer=4096M, max_resolution=7680x4320, max_instance=4",
    ),
    (
        "nvidia-747",
        "NVIDIA A2-8Q",
        "num_heads=4, frl_config=60, framebuffer=8192M, max_resolution=7680x4320, max_instance=2",
    ),
    (
        "nvidia-748",
        "NVIDIA A2-16Q",
        "num_heads=4, frl_config=60, framebuffer=16384M, max_resolution=7680x4320, max_instance=1",
    ),
    (
        "nvidia-749",
        "NVIDIA A2-1A",
        "num_heads=1, frl_config=60, framebuffer=1024M, max_resolution=1280x1024, max_instance=16",
    ),
    (
        "nvidia-750",
        "NVIDIA A2-2A",
        "num_heads=1, frl_config=60, framebuffer=2048M, max_resolution=1280x1024, max_instance=8",
    ),
    (
        "nvidia-751",
        "NVIDIA A2-4A",
        "num_heads=1, frl_config=60, framebuffer=4096M, max_resolution=1280x1024, max_instance=4",
    ),
    (
        "nvidia-752",
        "NVIDIA A2-8A",
        "num_heads=1, frl_config=60, framebuffer=8192M, max_resolution=1280x1024, max_instance=2",
    ),
    (
        "nvidia-753",
        "NVIDIA A2-16A",
        "num_heads=1, frl_config=60, framebuffer=16384M, max_resolution=1280x1024, max_instance=1",
    ),
    (
        "nvidia-754",
        "NVIDIA A2-4C",
        "num_heads=1, frl_config=60, framebuffer=4096M, max_resolution=4096x2400, max_instance=4",
    ),
    (
        "nvidia-755",
        "NVIDIA A2-8C",
        "num_heads=1, frl_config=60, framebuffer=8192M, max_resolution=4096x2400, max_instance=2",
    ),
    (
        "nvidia-756",
        "NVIDIA A2-16C",
        "num_heads=1, frl_config=60, framebuffer=16384M, max_resolution=4096x2400, max_instance=1",
    ),
];

/// Adds an NVIDIA A2 at `0000:08:00.0` with 16 VFs, each an mdev parent of [`A2_TYPES`];
/// returns the VF parents' names.
pub fn add_a2_mdev_gpu(b: &mut TreeBuilder) -> Vec<String> {
    let pf = "0000:08:00.0";
    let spec = PciSpec::new(0x10de, 0x25b6, 0x030200).driver("nvidia");
    b.pci(pf, spec.clone().group(20).numa(0).subsystem(0x10de, 0x157e))
        .sriov(pf, 16, 16, 4, 1, spec, Some(21));
    let types: Vec<MdevTypeSpec> = A2_TYPES
        .iter()
        .map(|(id, name, description)| MdevTypeSpec::new(id, name, 1, Some(description)))
        .collect();
    let mut parents = Vec::new();
    for i in 0..16u32 {
        let rid = (8u32 << 8) + 4 + i;
        let vf = format!("0000:08:{:02x}.{:x}", (rid >> 3) & 0x1f, rid & 7);
        b.mdev_parent(&vf, &types);
        parents.push(vf);
    }
    parents
}

/// Adds the devices of [`FakeKernel::passthrough_host`].
pub fn add_passthrough_devices(b: &mut TreeBuilder) {
    b.pci(
        "0000:00:01.0",
        PciSpec::new(0x8086, 0x1901, 0x060400)
            .driver("pcieport")
            .group(1),
    )
    .pci(
        "0000:01:00.0",
        PciSpec::new(0x10de, 0x2204, 0x030000)
            .driver("nvidia")
            .group(1)
            .subsystem(0x10de, 0x1454),
    )
    .pci(
        "0000:01:00.1",
        PciSpec::new(0x10de, 0x1aef, 0x040300)
            .driver("snd_hda_intel")
            .group(1),
    )
    .pci(
        "0000:02:00.0",
        PciSpec::new(0x10de, 0x1eb8, 0x030200)
            .driver("nvidia")
            .group(2),
    )
    .pci(
        "0000:03:00.0",
        PciSpec::new(0x8086, 0x10d3, 0x020000)
            .driver("e1000e")
            .group(2),
    )
    .pci(
        "0000:04:00.0",
        PciSpec::new(0x10de, 0x1eb8, 0x030200).driver("nvidia"),
    )
    .pci(
        "0000:05:00.0",
        PciSpec::new(0x1002, 0x73bf, 0x030000)
            .driver("amdgpu")
            .group(5),
    )
    .pci(
        "0000:05:00.1",
        PciSpec::new(0x1002, 0xab28, 0x040300)
            .driver("snd_hda_intel")
            .group(5),
    );
}

/// The pools of the kernel's sample mdev drivers as observed on Linux 6.1: `mbochs` (256 MB,
/// `mbochs-small`/`-medium`/`-large` = 4/16/64 MB), `mtty` (24 ports, `mtty-1`/`mtty-2`) and
/// `mdpy` (4 instances, `EUSERS` when full).
pub fn sample_pools() -> Vec<FakePool> {
    vec![
        FakePool::Units {
            parent: "mbochs".to_owned(),
            total: 256,
            costs: vec![
                ("mbochs-small".to_owned(), 4),
                ("mbochs-medium".to_owned(), 16),
                ("mbochs-large".to_owned(), 64),
            ],
            full_errno: errno::ENOSPC,
        },
        FakePool::Units {
            parent: "mtty".to_owned(),
            total: 24,
            costs: vec![("mtty-1".to_owned(), 1), ("mtty-2".to_owned(), 2)],
            full_errno: errno::ENOSPC,
        },
        FakePool::Units {
            parent: "mdpy".to_owned(),
            total: 4,
            costs: vec![
                ("mdpy-vga".to_owned(), 1),
                ("mdpy-xga".to_owned(), 1),
                ("mdpy-hd".to_owned(), 1),
            ],
            full_errno: errno::EUSERS,
        },
    ]
}
