//! Hosts and fleets the export, metrics and DRA tests run the `gpuslice` binary against: the real
//! A2 and L40S captures (kept in `gpu-sysfs/tests/data`, see its README for their origin), fake
//! trees modelled on real hosts, and fleets built from the model.

#![allow(
    dead_code,
    unused_imports,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    missing_docs
)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use gpu_core::{
    Fleet, Gpu, GpuState, Health, HealthState, Instance, MdevUuid, NodeTopology, Parent, ParentId,
    PciAddress, Pool, Profile, VgpuFramework, VgpuTypeId,
};
use gpu_sysfs::testing::builder::Tree;
use gpu_sysfs::testing::{PciSpec, TreeBuilder};

pub fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_gpuslice"))
}

/// Runs `gpuslice` with `args`, returning its output.
pub fn run(args: &[&str]) -> Output {
    bin().args(args).output().unwrap()
}

/// Runs `gpuslice` and asserts success, returning stdout.
pub fn ok(args: &[&str]) -> String {
    let out = run(args);
    assert!(
        out.status.success(),
        "gpuslice {args:?} failed: {}\n{}",
        String::from_utf8_lossy(&out.stderr),
        String::from_utf8_lossy(&out.stdout)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// Runs `gpuslice --root sandbox:DIR --node demo ARGS`, returning its output.
pub fn on(dir: &Path, args: &[&str]) -> Output {
    let root = format!("sandbox:{}", dir.display());
    let mut all = vec!["--root", root.as_str(), "--node", "demo"];
    all.extend_from_slice(args);
    run(&all)
}

/// [`on`], asserting success, returning stdout.
pub fn ok_on(dir: &Path, args: &[&str]) -> String {
    let root = format!("sandbox:{}", dir.display());
    let mut all = vec!["--root", root.as_str(), "--node", "demo"];
    all.extend_from_slice(args);
    ok(&all)
}

/// The real captures shared with the discovery tests.
pub fn capture(rel: &str) -> PathBuf {
    gpu_sysfs::testing::fixtures::capture(rel)
}

pub fn golden_dir(area: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/golden")
        .join(area)
}

/// Compares `actual` with the golden file `area/name`; `GOLDEN_UPDATE=1` rewrites it.
pub fn golden(area: &str, name: &str, actual: &str) {
    gpu_sysfs::testing::assert_golden(&golden_dir(area).join(name), actual);
}

pub use gpu_sysfs::testing::fixtures::A2_BUSY_VFS;

/// The A2 recording with the separately captured type directories laid over every VF
/// ([`gpu_sysfs::testing::fixtures::a2_tree`]).
pub fn a2_root() -> tempfile::TempDir {
    gpu_sysfs::testing::fixtures::a2_tree().unwrap()
}

/// The captured `creatable_vgpu_types` of the L40S VF.
pub fn l40s_types() -> Vec<(u32, String)> {
    let text = std::fs::read_to_string(capture("l40s-vf-0000-26-00.4/nvidia/creatable_vgpu_types"))
        .unwrap();
    gpu_sysfs::discover::parse_creatable_vgpu_types(&text, "captured").unwrap()
}

/// An L40S (PF 0000:26:00.0, 4 VFs, NUMA node 0) in the vendor-VFIO framework. VF 26:00.4 has the
/// captured files. With `busy`, VF 26:00.5 holds an L40S-24Q (1155) made outside Kubernetes and
/// the free VFs list only what still fits (the 24 GB types).
pub fn l40s_root(busy: bool) -> Tree {
    let all = l40s_types();
    let captured =
        std::fs::read_to_string(capture("l40s-vf-0000-26-00.4/nvidia/creatable_vgpu_types"))
            .unwrap();
    let mut b = TreeBuilder::new();
    b.pci(
        "0000:26:00.0",
        PciSpec::new(0x10de, 0x26b9, 0x030200)
            .driver("nvidia")
            .group(40)
            .numa(0)
            .subsystem(0x10de, 0x1851),
    )
    .sriov(
        "0000:26:00.0",
        4,
        32,
        4,
        1,
        PciSpec::new(0x10de, 0x26b9, 0x030200).driver("nvidia"),
        Some(41),
    );
    let fitting: Vec<(u32, &str)> = all
        .iter()
        .filter(|(_, n)| n.ends_with("-24Q") || n.ends_with("-24A"))
        .map(|(i, n)| (*i, n.as_str()))
        .collect();
    let every: Vec<(u32, &str)> = all.iter().map(|(i, n)| (*i, n.as_str())).collect();
    if busy {
        b.vendor_vfio_vf("0000:26:00.4", &fitting, 0);
        b.vendor_vfio_vf("0000:26:00.5", &[], 1155);
        b.vendor_vfio_vf("0000:26:00.6", &fitting, 0);
        b.vendor_vfio_vf("0000:26:00.7", &fitting, 0);
    } else {
        b.vendor_vfio_vf("0000:26:00.4", &[], 0);
        b.attr("0000:26:00.4", "nvidia/creatable_vgpu_types", &captured);
        for vf in ["0000:26:00.5", "0000:26:00.6", "0000:26:00.7"] {
            b.vendor_vfio_vf(vf, &every, 0);
        }
    }
    b.finish().unwrap()
}

fn addr(s: &str) -> PciAddress {
    s.parse().unwrap()
}

fn profile(id: &str, name: &str, fb: u64, max: u32, mig: Option<u8>) -> Profile {
    Profile {
        id: id.parse().unwrap(),
        name: name.into(),
        framebuffer_mib: Some(fb),
        max_instances: Some(max),
        available_instances: 1,
        reported_instances: Some(1),
        device_api: "vfio-pci".into(),
        mig_slices: mig,
        mig_memory_gib: None,
        description: None,
    }
}

fn nvidia_gpu(name: &str, a: &str, device: u16, model: &str, mem: u64, numa: u32) -> Gpu {
    let mut g = Gpu::new(name, addr(a), 0x10de, device, 0x030200);
    g.model = model.into();
    g.driver = Some("nvidia".into());
    g.numa_node = Some(numa);
    g.iommu_group = Some(u32::from(addr(a).bus()));
    g.memory_mib = Some(mem);
    g.health = Health::healthy();
    g
}

/// H200 profiles: MIG-backed 1g.18gb, 2g.35gb, 3g.71gb, 7g.141gb and time-sliced 18/35/71 GB.
fn h200_profiles() -> Vec<Profile> {
    vec![
        profile("1414", "NVIDIA H200X-1-18C", 18 * 1024, 7, Some(1)),
        profile("1417", "NVIDIA H200X-2-35C", 35 * 1024, 3, Some(2)),
        profile("1418", "NVIDIA H200X-3-71C", 71 * 1024, 2, Some(3)),
        profile("1420", "NVIDIA H200X-7-141C", 141 * 1024, 1, Some(7)),
        profile("1424", "NVIDIA H200X-18C", 18 * 1024, 7, None),
        profile("1425", "NVIDIA H200X-35C", 35 * 1024, 4, None),
        profile("1427", "NVIDIA H200X-71C", 71 * 1024, 2, None),
    ]
}

/// A modelled vendor-VFIO H200 node with `gpus` GPUs, 2 VFs each (enough for the golden files),
/// MIG-capable pools of 7 slices. GPU 1 is Degraded and GPU 2 Unhealthy when they exist.
pub fn h200_node(node: &str, gpus: usize) -> NodeTopology {
    let mut t = NodeTopology::new(node);
    for i in 0..gpus {
        let pf = format!("0000:{:02x}:00.0", 0x18 + i * 0x10);
        let mut g = nvidia_gpu(
            &format!("nvidia{i}"),
            &pf,
            0x2335,
            "GH100 [H200 SXM 141GB]",
            144_384,
            u32::from(i >= 4),
        );
        g.vgpu_framework = Some(VgpuFramework::VendorVfio);
        g.state = GpuState::InUse;
        g.state_reason = Some("SR-IOV VFs enabled for vGPUs".into());
        if i == 1 {
            g.health = Health {
                state: HealthState::Degraded,
                reasons: vec!["link x8 of x16".into()],
            };
        }
        if i == 2 {
            g.health = Health {
                state: HealthState::Unhealthy,
                reasons: vec!["uncorrectable ECC errors".into()],
            };
        }
        let mut parents = vec![];
        for n in 0..2 {
            let vf = ParentId::Pci(addr(&format!("0000:{:02x}:00.{}", 0x18 + i * 0x10, 4 + n)));
            parents.push(Parent {
                id: vf,
                gpu: Some(g.address),
                framework: VgpuFramework::VendorVfio,
                health: g.health.clone(),
                profiles: h200_profiles(),
                instances: vec![],
                warnings: vec![],
            });
        }
        t.mediated_devices.pools.push(Pool {
            gpu: ParentId::Pci(g.address),
            parents: parents.iter().map(|p| p.id.clone()).collect(),
            total_mib: 144_384,
            used_mib: 0,
            size_locked_mib: None,
            mixed_size: false,
            mig_slices_total: Some(7),
            mig_slices_used: Some(0),
            mig_slots: None,
        });
        t.mediated_devices.parents.extend(parents);
        t.gpus.push(g);
    }
    t
}

/// A modelled workstation-class node: an RTX 6000 Ada in mixed-size mode (mdev on the PF), a free
/// whole AMD GPU of unknown memory, a blocked GPU, and a T4 whose PF hosts one mdev made outside
/// Kubernetes.
pub fn mixed_node(node: &str) -> NodeTopology {
    let mut t = NodeTopology::new(node);
    let mut ada = nvidia_gpu(
        "nvidia0",
        "0000:17:00.0",
        0x26b1,
        "AD102GL [RTX 6000 Ada Generation]",
        49_152,
        0,
    );
    ada.vgpu_framework = Some(VgpuFramework::Mdev);
    let ada_parent = Parent {
        id: ParentId::Pci(ada.address),
        gpu: Some(ada.address),
        framework: VgpuFramework::Mdev,
        health: ada.health.clone(),
        profiles: vec![
            profile("nvidia-1001", "NVIDIA RTX6000-Ada-4Q", 4096, 12, None),
            profile("nvidia-1002", "NVIDIA RTX6000-Ada-8Q", 8192, 6, None),
            profile("nvidia-1003", "NVIDIA RTX6000-Ada-16Q", 16384, 3, None),
        ],
        instances: vec![],
        warnings: vec![],
    };
    t.mediated_devices.pools.push(Pool {
        gpu: ParentId::Pci(ada.address),
        parents: vec![ada_parent.id.clone()],
        total_mib: 49_152,
        used_mib: 0,
        size_locked_mib: None,
        mixed_size: true,
        mig_slices_total: None,
        mig_slices_used: None,
        mig_slots: None,
    });
    t.mediated_devices.parents.push(ada_parent);

    let mut amd = Gpu::new("radeon0", addr("0000:3b:00.0"), 0x1002, 0x740f, 0x038000);
    amd.model = "Aldebaran/MI200 [Instinct MI210]".into();
    amd.numa_node = Some(0);
    amd.iommu_group = Some(59);
    amd.health = Health::unknown();

    let mut blocked = nvidia_gpu(
        "nvidia1",
        "0000:5e:00.0",
        0x1eb8,
        "TU104GL [Tesla T4]",
        15_360,
        1,
    );
    blocked.state = GpuState::Blocked;
    blocked.state_reason =
        Some("IOMMU group 94 shared with 0000:5e:00.1 (8086:1572, driver i40e)".into());

    let mut t4 = nvidia_gpu(
        "nvidia2",
        "0000:af:00.0",
        0x1eb8,
        "TU104GL [Tesla T4]",
        15_360,
        1,
    );
    t4.vgpu_framework = Some(VgpuFramework::Mdev);
    t4.state = GpuState::InUse;
    let uuid: MdevUuid = "aa0ab5f4-1b6a-4d1f-9f1e-3c2b47a0c001".parse().unwrap();
    let t4_parent = Parent {
        id: ParentId::Pci(t4.address),
        gpu: Some(t4.address),
        framework: VgpuFramework::Mdev,
        health: t4.health.clone(),
        profiles: vec![
            profile("nvidia-222", "GRID T4-1Q", 1024, 16, None),
            profile("nvidia-223", "GRID T4-2Q", 2048, 8, None),
            profile("nvidia-230", "GRID T4-2B", 2048, 8, None),
            profile("nvidia-224", "GRID T4-4Q", 4096, 4, None),
        ],
        instances: vec![Instance {
            uuid: Some(uuid),
            address: None,
            profile: VgpuTypeId::from_str_unchecked("nvidia-223"),
            profile_name: Some("GRID T4-2Q".into()),
            framebuffer_mib: Some(2048),
            in_use: Some(true),
            placement_id: None,
        }],
        warnings: vec![],
    };
    t.mediated_devices.pools.push(Pool {
        gpu: ParentId::Pci(t4.address),
        parents: vec![t4_parent.id.clone()],
        total_mib: 16_384,
        used_mib: 2048,
        size_locked_mib: Some(2048),
        mixed_size: false,
        mig_slices_total: None,
        mig_slices_used: None,
        mig_slots: None,
    });
    t.mediated_devices.parents.push(t4_parent);
    t.gpus = vec![ada, amd, blocked, t4];
    t
}

/// Writes `fleet` as JSON into `dir` and returns the path.
pub fn write_fleet(dir: &Path, name: &str, fleet: &Fleet) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, serde_json::to_string_pretty(fleet).unwrap()).unwrap();
    p
}

/// A fleet of the given nodes, no allocations.
pub fn fleet(nodes: Vec<NodeTopology>) -> Fleet {
    Fleet {
        nodes,
        allocations: vec![],
        templates: Default::default(),
    }
}
