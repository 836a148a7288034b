//! Discovery against real host captures (see tests/data/README.md for their origin).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

mod discover_support;

use std::sync::Arc;

use discover_support::*;
use gpu_core::{GpuState, HealthState, ParentId, PciAddress, VgpuFramework};
use gpu_sysfs::discover::{DiscoverOptions, discover};
use gpu_sysfs::resolver::InMemoryResolver;
use gpu_sysfs::testing::{PciSpec, TreeBuilder};
use gpu_sysfs::{RealHost, umockdev};

fn addr(s: &str) -> PciAddress {
    s.parse().unwrap()
}

#[test]
fn a2_capture_holds_one_more_4gb_vgpu_for_the_whole_card_although_13_vfs_report_one() {
    let h = a2_host();
    let t = discover_on(&h.host());
    let pool = t.pool(&ParentId::Pci(addr("0000:08:00.0"))).unwrap();
    assert_eq!(
        (pool.total_mib, pool.used_mib, pool.size_locked_mib),
        (16384, 12288, Some(4096))
    );
    assert_eq!(pool.parents.len(), 16);

    let free_vfs: Vec<_> = t
        .mediated_devices
        .parents
        .iter()
        .filter(|p| p.instances.is_empty())
        .collect();
    assert_eq!(free_vfs.len(), 13);
    for p in &free_vfs {
        for prof in &p.profiles {
            let four_gb = prof.framebuffer_mib == Some(4096);
            assert_eq!(
                prof.reported_instances,
                Some(u32::from(four_gb)),
                "{} on {}",
                prof.name,
                p.id
            );
            assert_eq!(prof.available_instances, u32::from(four_gb));
            // The pool, not the sum over VFs, says how many more fit: one.
            if four_gb {
                assert_eq!(pool.creatable(prof), 1);
            }
        }
    }
    let a2_4q = &free_vfs[0]
        .profiles
        .iter()
        .find(|p| p.name == "NVIDIA A2-4Q")
        .unwrap();
    assert_eq!(a2_4q.id.as_str(), "nvidia-746");
    assert_eq!(a2_4q.max_instances, Some(4));
    assert_eq!(a2_4q.device_api, "vfio-pci");
}

#[test]
fn a2_capture_shows_the_three_live_mdevs_on_their_vfs() {
    let h = a2_host();
    let t = discover_on(&h.host());
    for (vf, ty) in A2_BUSY_VFS {
        let p = t.parent(&ParentId::Pci(addr(vf))).unwrap();
        assert_eq!(p.framework, VgpuFramework::Mdev);
        assert_eq!(p.gpu, Some(addr("0000:08:00.0")));
        assert_eq!(p.instances.len(), 1, "{vf}");
        assert_eq!(p.instances[0].profile.as_str(), ty);
        assert_eq!(p.instances[0].framebuffer_mib, Some(4096));
        assert!(p.profiles.iter().all(|x| x.available_instances == 0));
        assert_eq!(p.health.state, HealthState::Unknown);
    }
    let names: Vec<_> = A2_BUSY_VFS
        .iter()
        .map(|(vf, _)| {
            t.parent(&ParentId::Pci(addr(vf))).unwrap().instances[0]
                .profile_name
                .clone()
                .unwrap()
        })
        .collect();
    assert_eq!(names, ["NVIDIA A2-4C", "NVIDIA A2-4A", "NVIDIA A2-4Q"]);
}

#[test]
fn a2_gpu_is_named_in_use_and_lists_its_vfs_in_virtfn_order() {
    let h = a2_host();
    let t = discover_on(&h.host());
    let g = t.gpu_by_name("nvidia0").unwrap();
    assert_eq!(g.address, addr("0000:08:00.0"));
    assert_eq!(g.state, GpuState::InUse);
    assert_eq!(
        g.state_reason.as_deref(),
        Some("hosts vGPUs (mdev, 16 parents)")
    );
    assert_eq!(g.vgpu_framework, Some(VgpuFramework::Mdev));
    assert_eq!(g.memory_mib, Some(16384));
    assert!(g.model.contains("A2"), "{}", g.model);
    assert_eq!((g.numa_node, g.iommu_group), (Some(0), Some(38)));
    let link = g.link.as_ref().unwrap();
    assert_eq!((link.current_width, link.max_width), (Some(8), Some(16)));
    assert_eq!(
        (link.current_speed_gts, link.max_speed_gts),
        (Some(2.5), Some(16.0))
    );
    let s = g.sriov.as_ref().unwrap();
    assert_eq!((s.total_vfs, s.num_vfs, s.vfs.len()), (16, 16, 16));
    assert_eq!(s.vfs[0], addr("0000:08:00.4"));
    assert_eq!(s.vfs[9], addr("0000:08:01.5"));
    assert_eq!(
        s.vfs[10],
        addr("0000:08:01.6"),
        "virtfn10 comes after virtfn9"
    );
    assert_eq!(s.vfs[15], addr("0000:08:02.3"));
    assert_eq!(g.health.state, HealthState::Unknown);
    assert!(g.warnings.is_empty(), "{:?}", g.warnings);
    // VFs carry a display class too, but are parents, never GPUs.
    assert_eq!(t.gpus.len(), 2);
}

#[test]
fn a2_host_bmc_vga_is_blocked_by_the_ilo_functions_of_its_slot() {
    let h = a2_host();
    let t = discover_on(&h.host());
    let m = t.gpu_by_name("matrox0").unwrap();
    assert_eq!(m.address, addr("0000:01:00.1"));
    assert!(m.boot_vga);
    assert_eq!(m.state, GpuState::Blocked);
    let why = m.state_reason.as_deref().unwrap();
    assert!(
        why.starts_with("IOMMU group 33 shared with 0000:01:00.0 (103c:3306, driver hpwdt)"),
        "{why}"
    );
    assert!(
        m.functions.is_empty(),
        "functions of another vendor are not the card's"
    );
    assert_eq!(m.model, "MGA G200EH (iLO4)");
}

#[test]
fn raw_a2_recording_without_type_directories_still_reports_instances_with_warnings() {
    let replay = umockdev::materialize(&data("a2-sriov-mdev-host.umockdev")).unwrap();
    let t = discover_on(&RealHost::new(replay.root()).unwrap());
    assert_eq!(t.mediated_devices.parents.len(), 3);
    for p in &t.mediated_devices.parents {
        assert_eq!(p.instances.len(), 1);
        assert!(
            p.warnings
                .iter()
                .any(|w| w.contains("mdev_supported_types")),
            "{:?}",
            p.warnings
        );
    }
    let g = t.gpu_by_name("nvidia0").unwrap();
    assert_eq!(g.state, GpuState::InUse);
}

#[test]
fn matrox_bmc_host_without_iommu_blocks_its_only_display() {
    let replay = umockdev::materialize(&data("matrox-bmc-host.umockdev")).unwrap();
    let t = discover_on(&RealHost::new(replay.root()).unwrap());
    assert_eq!(t.gpus.len(), 1);
    let m = &t.gpus[0];
    assert_eq!(
        (m.name.as_str(), m.vendor_id.0, m.device_id.0),
        ("matrox0", 0x102b, 0x0533)
    );
    assert_eq!(m.state, GpuState::Blocked);
    assert_eq!(
        m.state_reason.as_deref(),
        Some("no IOMMU group: IOMMU disabled")
    );
    assert!(t.mediated_devices.parents.is_empty());
}

#[test]
fn t4_snapshot_finds_the_t4_and_the_bmc_vga_from_sparse_attributes() {
    let t = topology_of(&data("t4-host"));
    let names: Vec<_> = t
        .gpus
        .iter()
        .map(|g| (g.name.as_str(), g.address.to_string()))
        .collect();
    assert_eq!(
        names,
        [
            ("matrox0", "0000:01:00.1".to_owned()),
            ("nvidia0", "0000:08:00.0".to_owned())
        ]
    );
    let g = t.gpu_by_name("nvidia0").unwrap();
    assert_eq!((g.vendor_id.0, g.device_id.0), (0x10de, 0x1eb8));
    assert_eq!(g.driver.as_deref(), Some("nvidia"));
    assert!(g.model.contains("T4"), "{}", g.model);
    assert_eq!(g.link, None, "the snapshot has no link attributes");
    assert_eq!(g.state, GpuState::Blocked);
    assert!(g.warnings.is_empty(), "{:?}", g.warnings);
}

/// An L40S (PF 0000:26:00.0, 4 VFs) whose VF 26:00.4 has the captured `nvidia/` files; the
/// other VFs list `creatable` and hold `current`.
/// A VF address, the types it lists, and the type it holds (0 = none).
type VfSpec<'a> = (&'a str, &'a [(u32, &'a str)], u32);

fn l40s_host(vfs: &[VfSpec<'_>]) -> gpu_sysfs::testing::builder::Tree {
    let captured =
        std::fs::read_to_string(data("l40s-vf-0000-26-00.4/nvidia/creatable_vgpu_types")).unwrap();
    let mut b = TreeBuilder::new();
    b.pci(
        "0000:26:00.0",
        PciSpec::new(0x10de, 0x26b9, 0x030200)
            .driver("nvidia")
            .group(40)
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
    b.vendor_vfio_vf("0000:26:00.4", &[], 0);
    b.attr("0000:26:00.4", "nvidia/creatable_vgpu_types", &captured);
    for (vf, list, cur) in vfs {
        b.vendor_vfio_vf(vf, list, *cur);
    }
    b.finish().unwrap()
}

fn captured_l40s_types() -> Vec<(u32, String)> {
    let text =
        std::fs::read_to_string(data("l40s-vf-0000-26-00.4/nvidia/creatable_vgpu_types")).unwrap();
    gpu_sysfs::discover::parse_creatable_vgpu_types(&text, "captured").unwrap()
}

#[test]
fn l40s_vf_capture_is_read_as_vendor_vfio_with_23_creatable_types() {
    let all = captured_l40s_types();
    let list: Vec<(u32, &str)> = all.iter().map(|(i, n)| (*i, n.as_str())).collect();
    let tree = l40s_host(&[
        ("0000:26:00.5", &list, 0),
        ("0000:26:00.6", &list, 0),
        ("0000:26:00.7", &list, 0),
    ]);
    let t = topology_of(tree.root());
    let g = t.gpu_by_name("nvidia0").unwrap();
    assert_eq!(g.vgpu_framework, Some(VgpuFramework::VendorVfio));
    assert_eq!(g.state, GpuState::InUse);
    assert_eq!(g.memory_mib, Some(48 * 1024));
    let p = t.parent(&ParentId::Pci(addr("0000:26:00.4"))).unwrap();
    assert_eq!(p.framework, VgpuFramework::VendorVfio);
    assert_eq!(p.profiles.len(), 23);
    let q24 = p.profiles.iter().find(|x| x.id.as_str() == "1155").unwrap();
    assert_eq!(q24.name, "NVIDIA L40S-24Q");
    assert_eq!(q24.framebuffer_mib, Some(24 * 1024));
    assert_eq!(
        (q24.available_instances, q24.reported_instances),
        (1, Some(1))
    );
    let pool = t.pool(&ParentId::Pci(g.address)).unwrap();
    assert_eq!((pool.total_mib, pool.used_mib), (49152, 0));
    assert_eq!(pool.creatable(q24), 2);
    assert!(g.warnings.is_empty(), "{:?}", g.warnings);
}

#[test]
fn l40s_instance_takes_its_name_from_another_vfs_list_and_caps_the_rest() {
    let left: [(u32, &str); 2] = [(1155, "NVIDIA L40S-24Q"), (1165, "NVIDIA L40S-24A")];
    let tree = l40s_host(&[
        ("0000:26:00.4", &left, 0),
        ("0000:26:00.5", &[], 1155),
        ("0000:26:00.6", &left, 0),
        ("0000:26:00.7", &left, 0),
    ]);
    let t = topology_of(tree.root());
    let busy = t.parent(&ParentId::Pci(addr("0000:26:00.5"))).unwrap();
    assert_eq!(busy.instances.len(), 1);
    let i = &busy.instances[0];
    assert_eq!(i.address, Some(addr("0000:26:00.5")));
    assert_eq!(i.profile_name.as_deref(), Some("NVIDIA L40S-24Q"));
    assert_eq!(i.framebuffer_mib, Some(24576));
    let pool = t.pool(&ParentId::Pci(addr("0000:26:00.0"))).unwrap();
    assert_eq!(
        (pool.total_mib, pool.used_mib, pool.size_locked_mib),
        (49152, 24576, Some(24576))
    );
    let free = t.parent(&ParentId::Pci(addr("0000:26:00.6"))).unwrap();
    let q24 = free
        .profiles
        .iter()
        .find(|x| x.id.as_str() == "1155")
        .unwrap();
    assert_eq!(
        (q24.reported_instances, q24.available_instances),
        (Some(1), 1)
    );
    assert_eq!(
        pool.creatable(q24),
        1,
        "one more 24 GB vGPU for the whole card"
    );
}

#[test]
fn used_up_l40s_names_its_instances_through_the_resolver_only() {
    let tree = l40s_host(&[
        ("0000:26:00.5", &[], 1155),
        ("0000:26:00.6", &[], 1155),
        ("0000:26:00.7", &[], 0),
    ]);
    // 26:00.4 keeps the capture's full list: drop it so nothing names 1155.
    std::fs::write(
        tree.root()
            .join("sys/devices/pci0000:00/0000:26:00.4/nvidia/creatable_vgpu_types"),
        "ID    : vGPU Name\n",
    )
    .unwrap();
    let host = RealHost::new(tree.root()).unwrap();
    let t = discover(&host, &DiscoverOptions::new("n")).unwrap();
    let p = t.parent(&ParentId::Pci(addr("0000:26:00.5"))).unwrap();
    assert_eq!(p.instances[0].profile_name, None);
    assert!(
        p.warnings.iter().any(|w| w.contains("vGPU type 1155")),
        "{:?}",
        p.warnings
    );

    let opts = DiscoverOptions::new("n").with_resolver(Arc::new(
        InMemoryResolver::new().with(1155, "NVIDIA L40S-24Q"),
    ));
    let t = discover(&host, &opts).unwrap();
    let p = t.parent(&ParentId::Pci(addr("0000:26:00.5"))).unwrap();
    assert_eq!(
        p.instances[0].profile_name.as_deref(),
        Some("NVIDIA L40S-24Q")
    );
    assert_eq!(p.instances[0].framebuffer_mib, Some(24576));
    assert!(p.warnings.is_empty(), "{:?}", p.warnings);
    let pool = t.pool(&ParentId::Pci(addr("0000:26:00.0"))).unwrap();
    assert_eq!(pool.used_mib, 49152);
}

#[test]
fn the_bundled_example_host_discovers_exactly_like_the_test_data() {
    let example = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../examples/hosts/a2-sriov-mdev.umockdev");
    let replay = umockdev::materialize(&example).unwrap();
    let from_example = discover_on(&RealHost::new(replay.root()).unwrap());
    let from_data = discover_on(&a2_host().host());
    assert_eq!(from_example, from_data);
}

/// A real tree that counts each read and listing (and which thread made it), reading side by
/// side or not as told.
#[derive(Debug)]
struct Counted {
    inner: RealHost,
    parallel: bool,
    reads: std::sync::Mutex<std::collections::BTreeMap<String, usize>>,
    by_prefetch: std::sync::atomic::AtomicUsize,
}

impl Counted {
    fn new(root: &std::path::Path, parallel: bool) -> Self {
        Counted {
            inner: RealHost::new(root).unwrap(),
            parallel,
            reads: std::sync::Mutex::default(),
            by_prefetch: std::sync::atomic::AtomicUsize::new(0),
        }
    }

    fn note(&self, what: String) {
        if std::thread::current().name() == Some("gpuslice-prefetch") {
            self.by_prefetch
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        *self.reads.lock().unwrap().entry(what).or_default() += 1;
    }
}

impl gpu_sysfs::Host for Counted {
    fn read(&self, path: &str) -> std::io::Result<Vec<u8>> {
        self.note(format!("read {path}"));
        self.inner.read(path)
    }
    fn write(&self, _: &str, _: &[u8]) -> std::io::Result<()> {
        panic!("discovery writes nothing")
    }
    fn list(&self, dir: &str) -> std::io::Result<Vec<String>> {
        self.note(format!("list {dir}"));
        self.inner.list(dir)
    }
    fn read_link(&self, path: &str) -> std::io::Result<std::path::PathBuf> {
        self.note(format!("readlink {path}"));
        self.inner.read_link(path)
    }
    fn exists(&self, path: &str) -> bool {
        self.inner.exists(path)
    }
    fn run(
        &self,
        _: &str,
        _: &[String],
        _: std::time::Duration,
    ) -> std::io::Result<gpu_sysfs::CommandOutput> {
        panic!("discovery runs nothing")
    }
    fn root_dir(&self) -> Option<&std::path::Path> {
        self.inner.root_dir()
    }
    fn parallel_reads(&self) -> bool {
        self.parallel
    }
}

#[test]
fn reading_the_mdev_parents_beside_the_pci_scan_gives_the_same_topology_from_the_same_reads() {
    let example = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../examples/hosts/a2-sriov-mdev.umockdev");
    let replay = umockdev::materialize(&example).unwrap();
    let serial = Counted::new(replay.root(), false);
    let side_by_side = Counted::new(replay.root(), true);
    let one = discover_on(&serial);
    let two = discover_on(&side_by_side);
    assert_eq!(one, two);
    assert_eq!(serial.by_prefetch.into_inner(), 0);
    // The second thread read its share (at least the parents' listing; how many parents each
    // thread takes depends on how fast the scan goes)...
    let prefetched = side_by_side.by_prefetch.into_inner();
    assert!(prefetched > 0, "{prefetched} reads on the prefetch thread");
    // ...and each file exactly as often as a serial scan reads it: nothing twice. The only
    // reads a serial scan does not make are the `class` of a VF the second thread reached
    // before the scan knew it for one (it meets the scan there and stops).
    let serial = serial.reads.into_inner().unwrap();
    let mut side_by_side = side_by_side.reads.into_inner().unwrap();
    for (what, n) in &serial {
        assert_eq!(side_by_side.remove(what), Some(*n), "{what}");
    }
    let vfs: Vec<String> = one
        .gpus
        .iter()
        .filter_map(|g| g.sriov.as_ref())
        .flat_map(|s| &s.vfs)
        .map(|a| format!("read sys/bus/pci/devices/{a}/class"))
        .collect();
    for (what, n) in side_by_side {
        assert!(vfs.contains(&what) && n == 1, "{what} read {n} times");
    }
}

#[test]
fn a_vf_its_gpu_named_is_never_read_again_and_no_file_is_read_twice() {
    // Looking for NVSwitches (whose class says so) reads no VF's class: a function a GPU's
    // `virtfnN` link named is that GPU's VF. Each file is read at most once in all.
    let example = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../examples/hosts/a2-sriov-mdev.umockdev");
    let replay = umockdev::materialize(&example).unwrap();
    let serial = Counted::new(replay.root(), false);
    let topology = discover_on(&serial);
    let reads = serial.reads.into_inner().unwrap();
    let vfs: Vec<String> = topology
        .gpus
        .iter()
        .filter_map(|g| g.sriov.as_ref())
        .flat_map(|s| &s.vfs)
        .map(|a| format!("read sys/bus/pci/devices/{a}/class"))
        .collect();
    assert!(!vfs.is_empty(), "the A2 host has VFs");
    for vf in &vfs {
        assert!(!reads.contains_key(vf), "{vf}");
    }
    for (what, n) in &reads {
        assert_eq!(*n, 1, "{what} read {n} times");
    }
}
