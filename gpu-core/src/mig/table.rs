//! The MIG geometry table: each known product's GPU-instance profiles, their memory slices and
//! allowed start slots, keyed by PCI device ID and vGPU board name.

use super::{MigGeometry, MigProfile};

const fn p(
    name: &'static str,
    compute_slices: u8,
    memory_slices: u8,
    memory_gb: u32,
    starts: &'static [u8],
) -> MigProfile {
    MigProfile {
        name,
        compute_slices,
        memory_slices,
        memory_gb,
        starts,
    }
}

const S1: &[u8] = &[0, 1, 2, 3, 4, 5, 6];
const S1X2: &[u8] = &[0, 2, 4, 6];
const S2: &[u8] = &[0, 2, 4];
const S3: &[u8] = &[0, 4];
const S0: &[u8] = &[0];

/// The seven-slice products (eight memory slices): 1g at 0–6, 1g with two memory slices at
/// 0/2/4/6, 2g at 0/2/4, 3g at 0/4, 4g and 7g at 0. `names` are NVIDIA's profile names in
/// that order, `gb` their memory.
const fn seven(names: [&'static str; 6], gb: [u32; 6]) -> [MigProfile; 6] {
    [
        p(names[0], 1, 1, gb[0], S1),
        p(names[1], 1, 2, gb[1], S1X2),
        p(names[2], 2, 2, gb[2], S2),
        p(names[3], 3, 4, gb[3], S3),
        p(names[4], 4, 4, gb[4], S0),
        p(names[5], 7, 8, gb[5], S0),
    ]
}

// Profile names and memory: NVIDIA's MIG user guide, "Supported MIG Profiles" (A30 24 GB,
// A100 40/80 GB, H100, H200, H20, B200 180 GB). The `+me` variants hold the same slots as their
// base profile and are not listed separately.
const A100_40: [MigProfile; 6] = seven(
    [
        "1g.5gb", "1g.10gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb",
    ],
    [5, 10, 10, 20, 20, 40],
);
const A100_80: [MigProfile; 6] = seven(
    [
        "1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb",
    ],
    [10, 20, 20, 40, 40, 80],
);
const H100_64: [MigProfile; 6] = seven(
    [
        "1g.8gb", "1g.16gb", "2g.16gb", "3g.32gb", "4g.32gb", "7g.64gb",
    ],
    [8, 16, 16, 32, 32, 64],
);
const H100_94: [MigProfile; 6] = seven(
    [
        "1g.12gb", "1g.24gb", "2g.24gb", "3g.47gb", "4g.47gb", "7g.94gb",
    ],
    [12, 24, 24, 47, 47, 94],
);
const H200_141: [MigProfile; 6] = seven(
    [
        "1g.18gb", "1g.35gb", "2g.35gb", "3g.71gb", "4g.71gb", "7g.141gb",
    ],
    [18, 35, 35, 71, 71, 141],
);
const H20_96: [MigProfile; 6] = seven(
    [
        "1g.12gb", "1g.24gb", "2g.24gb", "3g.48gb", "4g.48gb", "7g.96gb",
    ],
    [12, 24, 24, 48, 48, 96],
);
const B200_180: [MigProfile; 6] = seven(
    [
        "1g.23gb", "1g.45gb", "2g.45gb", "3g.90gb", "4g.90gb", "7g.180gb",
    ],
    [23, 45, 45, 90, 90, 180],
);
const A30_24: [MigProfile; 3] = [
    p("1g.6gb", 1, 1, 6, &[0, 1, 2, 3]),
    p("2g.12gb", 2, 2, 12, &[0, 2]),
    p("4g.24gb", 4, 4, 24, S0),
];

const fn g7(
    product: &'static str,
    vgpu_board: &'static str,
    device_ids: &'static [u16],
    profiles: &'static [MigProfile],
) -> MigGeometry {
    MigGeometry {
        product,
        vgpu_board,
        device_ids,
        compute_slices: 7,
        memory_slices: 8,
        profiles,
    }
}

/// The products whose MIG geometry is known, one per vGPU board.
///
/// Boards (the part of a MIG-backed vGPU type name before the slice count, `H200X` in
/// `H200X-3-71C`) and the profile each type maps to: NVIDIA's vGPU for Compute type tables
/// ("Ampere Architecture vGPU Types", "Hopper Architecture vGPU Types" in the NVIDIA AI
/// Enterprise documentation). PCI device IDs are listed only where one is established (0x20b0
/// is the A100 HGX 40GB, whose driver table names `GRID A100X-1-5C`); a product without one is
/// found by its board name. B200's board name could not be established from public sources:
/// NVIDIA's "Blackwell Architecture vGPU Types" page lists the HGX B200, but the copies read for
/// gpuslice show only its RTX PRO rows, whose types carry the shared board `DC` (`DC-1-16C`) rather
/// than a product name. `B200` is therefore an assumption, and a B200 is matched only by a type
/// name with that board (no PCI device ID is on record for it); one whose types name another
/// board gets no MIG slots, and its MIG-backed types are then checked by slice counts only.
pub const GEOMETRIES: &[MigGeometry] = &[
    g7("A100 PCIe 40GB", "A100", &[0x20f1], &A100_40),
    g7("A100 HGX 40GB", "A100X", &[0x20b0], &A100_40),
    g7("A100 PCIe 80GB", "A100D", &[0x20b5], &A100_80),
    g7("A100 HGX 80GB", "A100DX", &[0x20b2], &A100_80),
    MigGeometry {
        product: "A30 24GB",
        vgpu_board: "A30",
        device_ids: &[0x20b7],
        compute_slices: 4,
        memory_slices: 4,
        profiles: &A30_24,
    },
    g7("H100 PCIe 80GB", "H100", &[], &A100_80),
    g7("H100 SXM5 80GB", "H100XM", &[0x2330], &A100_80),
    g7("H100 SXM5 64GB", "H100XS", &[], &H100_64),
    g7("H100 NVL 94GB", "H100L", &[], &H100_94),
    g7("H100 SXM5 94GB", "H100XL", &[], &H100_94),
    g7("H800 PCIe 80GB", "H800", &[], &A100_80),
    g7("H800 SXM5 80GB", "H800XM", &[], &A100_80),
    g7("H800 NVL 94GB", "H800L", &[], &H100_94),
    g7("H200 SXM5 141GB", "H200X", &[0x2335], &H200_141),
    g7("H200 NVL 141GB", "H200", &[], &H200_141),
    g7("H20 SXM5 96GB", "H20", &[], &H20_96),
    g7("H20 SXM5 141GB", "H20X", &[], &H200_141),
    g7("B200 180GB", "B200", &[], &B200_180),
];
