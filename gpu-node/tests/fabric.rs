//! NVSwitch partitions on the bundled HGX H100 host's sandbox (the fake Fabric Manager kept
//! between processes): a partition's GPUs bound as one set with the partition activated, a set
//! that is no partition refused before any write, holders named, and release deactivating.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::{Path, PathBuf};

use gpu_core::fabric::FabricManagerState;
use gpu_core::{ClassifiedError, ErrorKind, PciAddress};
use gpu_health::{NodeRequest, OpenedNode, open_node_host};
use gpu_node::fabric::{self, FabricError};

const GPU0: &str = "0000:18:00.0";
const GPU1: &str = "0000:2a:00.0";
const GPU2: &str = "0000:3a:00.0";

fn addr(s: &str) -> PciAddress {
    s.parse().unwrap()
}

/// A fresh sandbox of the bundled HGX host: the directory and its root.
fn hgx_sandbox() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let sandbox = dir.path().join("sb");
    let host =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/hosts/hgx-h100-nvswitch.umockdev");
    gpu_sysfs::sandbox::init(&sandbox, &host).unwrap();
    let root = PathBuf::from(format!("sandbox:{}", sandbox.display()));
    (dir, root)
}

fn open(root: &Path) -> OpenedNode {
    open_node_host(root, &NodeRequest::new("hgx")).unwrap()
}

fn active(root: &Path) -> Vec<u32> {
    fabric::list(&open(root))
        .unwrap()
        .partitions
        .iter()
        .filter(|p| p.active)
        .map(|p| p.id)
        .collect()
}

fn driver(root: &Path, gpu: &str) -> Option<String> {
    let t = gpu_health::open_node(root, &NodeRequest::new("hgx"))
        .unwrap()
        .topology;
    t.gpu_by_address(&addr(gpu)).unwrap().driver.clone()
}

#[test]
fn the_sandbox_starts_with_fifteen_partitions_none_active() {
    let (_dir, root) = hgx_sandbox();
    let f = fabric::list(&open(&root)).unwrap();
    assert_eq!(f.fabric_manager.state, FabricManagerState::Reachable);
    assert_eq!(f.nvswitches.len(), 4);
    assert_eq!(f.partitions.len(), 15);
    assert!(f.partitions.iter().all(|p| !p.active));
    let p4 = f.partition(4).unwrap();
    assert_eq!(p4.gpus, ["nvidia0", "nvidia2"]);
    assert_eq!(p4.addresses, [addr(GPU0), addr(GPU2)]);
    // The composed topology carries the same fabric.
    let t = gpu_health::open_node(&root, &NodeRequest::new("hgx"))
        .unwrap()
        .topology;
    assert_eq!(t.fabric.unwrap().partitions.len(), 15);
}

#[test]
fn a_partitions_gpus_are_bound_with_it_activated_and_released_with_it_deactivated() {
    let (_dir, root) = hgx_sandbox();
    let set = [addr(GPU0), addr(GPU2)];
    let b = fabric::bind_set(&open(&root), &set).unwrap();
    let p = b.partition.unwrap();
    assert_eq!(
        (p.partition.id, p.partition.active, p.changed),
        (4, true, true)
    );
    assert_eq!(b.gpus.len(), 2);
    // Kept between processes: a fresh opening sees it active and the GPUs on vfio-pci.
    assert_eq!(active(&root), [4]);
    assert_eq!(driver(&root, GPU0).as_deref(), Some("vfio-pci"));
    assert_eq!(driver(&root, GPU2).as_deref(), Some("vfio-pci"));

    // Partition 2 (modules 1, 2, 5, 6) shares nvidia0 with the active partition 4.
    let e = fabric::activate(&open(&root), 2).unwrap_err();
    assert!(matches!(e, FabricError::InUse { .. }), "{e}");
    assert!(
        e.to_string()
            .contains("in use by active partition 4 (nvidia0, nvidia2)"),
        "{e}"
    );

    let r = fabric::release_set(&open(&root), &set, false).unwrap();
    assert!(!r.partition.unwrap().partition.active);
    assert!(active(&root).is_empty());
    assert_ne!(driver(&root, GPU0).as_deref(), Some("vfio-pci"));
}

#[test]
fn a_set_that_is_no_partition_is_refused_before_any_bind_naming_those_that_would_do() {
    let (_dir, root) = hgx_sandbox();
    let before = driver(&root, GPU0);
    let e = fabric::bind_set(&open(&root), &[addr(GPU0), addr(GPU1)]).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidRequest);
    let msg = e.to_string();
    assert!(
        msg.starts_with("nvidia0, nvidia1 are not the members of one fabric partition"),
        "{msg}"
    );
    assert!(msg.contains("partition 4 (nvidia0, nvidia2)"), "{msg}");
    assert!(msg.contains("partition 5 (nvidia1, nvidia3)"), "{msg}");
    assert_eq!(driver(&root, GPU0), before);
    assert!(active(&root).is_empty());
}

#[test]
fn a_partition_whose_gpu_a_vm_holds_is_not_deactivated_and_the_holder_is_named() {
    let (_dir, root) = hgx_sandbox();
    let set = [addr(GPU0), addr(GPU2)];
    fabric::bind_set(&open(&root), &set).unwrap();
    let opened = open(&root);
    let pid = opened
        .host
        .sandbox()
        .unwrap()
        .open_device(&format!("sys/bus/pci/devices/{GPU2}"))
        .unwrap();
    let e = fabric::deactivate(&opened, 4).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InUse);
    assert!(
        e.to_string()
            .contains(&format!("nvidia2 is in use by pid {pid}")),
        "{e}"
    );
    assert_eq!(active(&root), [4]);
    opened.host.sandbox().unwrap().close_device(pid).unwrap();
    let d = fabric::deactivate(&open(&root), 4).unwrap();
    assert!(d.changed && !d.partition.active);
    assert!(!fabric::deactivate(&open(&root), 4).unwrap().changed);
}

#[test]
fn activate_and_deactivate_answer_for_unknown_ids_and_hosts_without_a_fabric() {
    let (_dir, root) = hgx_sandbox();
    let e = fabric::activate(&open(&root), 99).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NotFound);
    assert!(
        e.to_string()
            .contains("offers no partition 99 (it offers 1, 2, 3"),
        "{e}"
    );
    let a = fabric::activate(&open(&root), 12).unwrap();
    assert!(a.changed && a.partition.active);
    assert!(!fabric::activate(&open(&root), 12).unwrap().changed);

    let dir = tempfile::tempdir().unwrap();
    let sb = dir.path().join("sb");
    let a2 = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../examples/hosts/workstation-passthrough.umockdev");
    gpu_sysfs::sandbox::init(&sb, &a2).unwrap();
    let other = PathBuf::from(format!("sandbox:{}", sb.display()));
    assert!(matches!(
        fabric::list(&open(&other)),
        Err(FabricError::NoFabric)
    ));
}

#[test]
fn with_fabric_manager_unreachable_the_fabric_is_listed_and_no_multi_gpu_set_is_bound() {
    // A directory tree (not this machine, not a sandbox) has no Fabric Manager to ask.
    let replay = gpu_sysfs::umockdev::materialize(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/hosts/hgx-h100-nvswitch.umockdev"),
    )
    .unwrap();
    let root = replay.root().to_path_buf();
    let f = fabric::list(&open(&root)).unwrap();
    assert_eq!(f.fabric_manager.state, FabricManagerState::Unreachable);
    assert!(f.partitions.is_empty());
    let e = fabric::bind_set(&open(&root), &[addr(GPU0), addr(GPU2)]).unwrap_err();
    assert!(matches!(e, FabricError::Unreachable { .. }), "{e}");
    assert!(
        e.to_string()
            .contains("NVSwitch fabric but Fabric Manager cannot be reached"),
        "{e}"
    );
}

/// An allocated claim of the whole GPUs `gpus` on node `hgx`.
fn gpu_claim(uid: &str, gpus: &[&str]) -> serde_json::Value {
    let results: Vec<serde_json::Value> = gpus
        .iter()
        .map(|g| {
            serde_json::json!({
                "request": "gpus",
                "driver": gpu_integrations::dra::DEFAULT_DRIVER,
                "pool": "hgx",
                "device": gpu_integrations::dra::device_name::gpu_device_name(&addr(g)),
            })
        })
        .collect();
    serde_json::json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "vm", "namespace": "default", "uid": uid},
        "spec": {"devices": {"requests": [{"name": "gpus"}]}},
        "status": {"allocation": {"devices": {"results": results}}}
    })
}

fn once() -> gpu_node::dra::once::Once<'static> {
    gpu_node::dra::once::Once {
        driver: gpu_integrations::dra::DEFAULT_DRIVER,
        state_dir: None,
        cdi: None,
        lock_timeout: None,
        waiting: &|_| {},
    }
}

#[test]
fn a_dra_prepare_activates_the_claims_partition_and_unprepare_deactivates_it() {
    let (_dir, root) = hgx_sandbox();
    let node = gpu_health::open_node(&root, &NodeRequest::new("hgx")).unwrap();
    let uid = "6f1c2d3e-0000-4000-8000-00000000f004";
    let doc = gpu_claim(uid, &[GPU2, GPU0]);
    let id = gpu_node::dra::ClaimId::of_document(&doc, None).unwrap();
    once().prepare(&node, &doc, &id, false).unwrap();
    assert_eq!(active(&root), [4]);
    assert_eq!(driver(&root, GPU0).as_deref(), Some("vfio-pci"));

    let node = gpu_health::open_node(&root, &NodeRequest::new("hgx")).unwrap();
    once().unprepare(&node, uid, false).unwrap();
    assert!(active(&root).is_empty());
    assert_ne!(driver(&root, GPU0).as_deref(), Some("vfio-pci"));
}

#[test]
fn a_dra_claim_whose_gpus_are_no_partition_is_refused_before_any_write() {
    let (_dir, root) = hgx_sandbox();
    let node = gpu_health::open_node(&root, &NodeRequest::new("hgx")).unwrap();
    let doc = gpu_claim("6f1c2d3e-0000-4000-8000-00000000f005", &[GPU0, GPU1]);
    let id = gpu_node::dra::ClaimId::of_document(&doc, None).unwrap();
    let e = once().prepare(&node, &doc, &id, false).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidRequest);
    assert!(
        e.to_string()
            .contains("would do: partition 4 (nvidia0, nvidia2)"),
        "{e}"
    );
    assert!(active(&root).is_empty());
    assert_ne!(driver(&root, GPU0).as_deref(), Some("vfio-pci"));
}

/// A fresh sandbox of the bundled vGPU-mode HGX host (SR-IOV VFs on every GPU), its Fabric
/// Manager in the mode `fabric_mode` (`FABRIC_MODE` of its configuration file).
fn hgx_vgpu_sandbox(fabric_mode: u32) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let sandbox = dir.path().join("sb");
    let host =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/hosts/hgx-h100-vgpu.umockdev");
    gpu_sysfs::sandbox::init(&sandbox, &host).unwrap();
    let cfg = sandbox.join("host").join(gpu_fabric::CONFIG_FILE);
    std::fs::create_dir_all(cfg.parent().unwrap()).unwrap();
    std::fs::write(&cfg, format!("FABRIC_MODE={fabric_mode}\n")).unwrap();
    let root = PathBuf::from(format!("sandbox:{}", sandbox.display()));
    (dir, root)
}

fn fake_state(root: &Path) -> gpu_fabric::fake::FakeState {
    let dir = gpu_sysfs::sandbox::sandbox_dir(root).unwrap();
    serde_json::from_slice(&std::fs::read(dir.join("fabric.json")).unwrap()).unwrap()
}

fn vf_type(root: &Path, vf: &str) -> String {
    let dir = gpu_sysfs::sandbox::sandbox_dir(root).unwrap();
    std::fs::read_to_string(dir.join(format!(
        "host/sys/bus/pci/devices/{vf}/nvidia/current_vgpu_type"
    )))
    .unwrap()
    .trim()
    .to_owned()
}

fn names(n: &[&str]) -> Vec<String> {
    n.iter().map(|s| (*s).to_owned()).collect()
}

#[test]
fn in_vgpu_mode_whole_framebuffer_vgpus_are_made_with_the_partition_activated_for_their_vfs() {
    let (_dir, root) = hgx_vgpu_sandbox(2);
    let f = fabric::list(&open(&root)).unwrap();
    assert_eq!(f.fabric_manager.mode, Some(gpu_core::FabricMode::Vgpu));
    let set = fabric::create_vgpu_set(&open(&root), &names(&["nvidia2", "nvidia0"]), "H100XM-80C")
        .unwrap();
    assert_eq!(
        (set.partition.partition.id, set.partition.partition.active),
        (4, true)
    );
    // One VF of each GPU, in the partition's order (module 1, then module 3).
    let vfs: Vec<String> = set.vfs.iter().map(ToString::to_string).collect();
    assert_eq!(vfs, ["0000:18:00.4", "0000:3a:00.4"]);
    assert_eq!(fake_state(&root).vfs[&4], set.vfs);
    assert_eq!(vf_type(&root, "0000:18:00.4"), "1100");
    assert_eq!(active(&root), [4]);

    let gone =
        fabric::remove_vgpu_set(&open(&root), &names(&["nvidia0", "nvidia2"]), false).unwrap();
    assert!(!gone.partition.partition.active);
    assert!(active(&root).is_empty());
    assert_eq!(vf_type(&root, "0000:18:00.4"), "0");
    assert!(fake_state(&root).vfs.is_empty());
}

#[test]
fn a_partial_or_mig_backed_vgpu_asked_to_use_nvlink_is_refused_with_nvidias_rule_before_any_write()
{
    let (_dir, root) = hgx_vgpu_sandbox(2);
    let set = names(&["nvidia0", "nvidia2"]);
    let e = fabric::create_vgpu_set(&open(&root), &set, "H100XM-40C").unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidRequest);
    let msg = e.to_string();
    assert!(
        msg.contains("H100XM-40C on nvidia0 cannot use NVLink"),
        "{msg}"
    );
    assert!(msg.contains("use all of its GPU's framebuffer"), "{msg}");
    let e = fabric::create_vgpu_set(&open(&root), &set, "H100XM-1-10C").unwrap_err();
    assert!(
        e.to_string()
            .contains("MIG-backed, and on NVSwitch systems only time-sliced"),
        "{e}"
    );
    // A set that is no partition: refused too, naming those that would do.
    let e = fabric::create_vgpu_set(&open(&root), &names(&["nvidia0", "nvidia1"]), "H100XM-80C")
        .unwrap_err();
    assert!(
        e.to_string().contains("partition 4 (nvidia0, nvidia2)"),
        "{e}"
    );
    assert_eq!(vf_type(&root, "0000:18:00.4"), "0");
    assert!(active(&root).is_empty());
}

#[test]
fn vgpus_with_nvlink_need_fabric_manager_in_vgpu_mode() {
    let (_dir, root) = hgx_vgpu_sandbox(1);
    let e = fabric::create_vgpu_set(&open(&root), &names(&["nvidia0", "nvidia2"]), "H100XM-80C")
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unsupported);
    assert!(
        e.to_string()
            .contains("needs Fabric Manager in vGPU mode; it runs in shared NVSwitch mode"),
        "{e}"
    );
    assert_eq!(vf_type(&root, "0000:18:00.4"), "0");
}

#[test]
fn a_set_bind_records_its_intent_and_one_killed_half_way_is_reported_and_undone() {
    let (_dir, root) = hgx_sandbox();
    fabric::bind_set(&open(&root), &[addr(GPU0), addr(GPU2)]).unwrap();
    let host = open(&root);
    let record: gpu_node::intent::Intent = serde_json::from_slice(
        &host
            .host
            .host()
            .read(gpu_node::intent::INTENT_FILE)
            .unwrap(),
    )
    .unwrap();
    assert_eq!(record.op, "bind-gpu-set");
    assert!(!record.unfinished());
    assert_eq!(
        record.creates,
        [
            gpu_node::intent::Planned::FabricPartition { id: 4 },
            gpu_node::intent::Planned::GpuBind { gpu: addr(GPU0) },
            gpu_node::intent::Planned::GpuBind { gpu: addr(GPU2) },
        ]
    );
    fabric::release_set(&open(&root), &[addr(GPU0), addr(GPU2)], false).unwrap();

    // The process killed after the activation and the first bind: the record stays `started`.
    fabric::activate(&open(&root), 4).unwrap();
    let opened = open(&root);
    gpu_node::Node::of(&opened).bind_gpu(&addr(GPU0)).unwrap();
    let mut killed = record.clone();
    killed.state = gpu_node::intent::IntentState::Started;
    let json = serde_json::to_vec(&killed).unwrap();
    opened
        .host
        .host()
        .write_atomic(gpu_node::intent::INTENT_FILE, &json)
        .unwrap();
    let found = gpu_node::intent::unfinished(opened.host.host())
        .unwrap()
        .unwrap();
    assert!(
        found.describe().contains("bind-gpu-set"),
        "{}",
        found.describe()
    );
    let d = gpu_node::recover::diagnose(
        opened.host.host(),
        "hgx",
        &gpu_integrations::doctor::GuestOptions::default(),
    )
    .unwrap();
    assert!(d.checks.iter().any(|c| c.check == "interrupted-write"));

    let r = fabric::recover(&open(&root)).unwrap().unwrap();
    assert!(r.resolved, "{r:?}");
    assert_eq!(
        r.rolled_back,
        [
            format!("released {GPU0} from vfio-pci"),
            "deactivated partition 4".to_owned()
        ]
    );
    assert!(active(&root).is_empty());
    assert_ne!(driver(&root, GPU0).as_deref(), Some("vfio-pci"));
    assert!(
        gpu_node::intent::unfinished(open(&root).host.host())
            .unwrap()
            .is_none()
    );
}

#[test]
fn after_a_fabric_manager_restart_the_partitions_gpuslice_activated_are_given_back() {
    let (_dir, root) = hgx_sandbox();
    fabric::bind_set(&open(&root), &[addr(GPU0), addr(GPU2)]).unwrap();
    fabric::activate(&open(&root), 7).unwrap();
    assert!(fabric::restore_activated(&open(&root)).unwrap().is_none());
    // FM restarted: it lists every partition inactive until told.
    let mut s = fake_state(&root);
    for p in &mut s.partitions {
        p.active = false;
    }
    let dir = gpu_sysfs::sandbox::sandbox_dir(&root).unwrap();
    std::fs::write(dir.join("fabric.json"), serde_json::to_vec(&s).unwrap()).unwrap();
    assert!(active(&root).is_empty());
    assert_eq!(
        fabric::restore_activated(&open(&root)).unwrap(),
        Some(vec![4, 7])
    );
    assert_eq!(active(&root), [4, 7]);
    // Deactivating forgets it.
    fabric::deactivate(&open(&root), 7).unwrap();
    assert_eq!(
        gpu_node::fabric::recorded(open(&root).host.host()).unwrap(),
        [4].into_iter().collect()
    );
}

#[test]
fn the_kubevirt_metadata_of_a_prepared_partition_says_what_the_guest_needs() {
    let (dir, root) = hgx_sandbox();
    // The fake Fabric Manager reports its version (its state made by a first change).
    change_fm(&root, |s| s.version = Some("550.90.07".to_owned()));
    let node = gpu_health::open_node(&root, &NodeRequest::new("hgx")).unwrap();
    let uid = "6f1c2d3e-0000-4000-8000-00000000f006";
    let doc = gpu_claim(uid, &[GPU0, GPU2]);
    let id = gpu_node::dra::ClaimId::of_document(&doc, None).unwrap();
    let cdi = gpu_integrations::dra::cdi::CdiLayout::new(
        dir.path().join("cdi"),
        dir.path().join("metadata"),
        gpu_integrations::dra::DEFAULT_DRIVER,
    )
    .unwrap();
    let mut o = once();
    o.cdi = Some(&cdi);
    o.prepare(&node, &doc, &id, false).unwrap();
    let file = dir
        .path()
        .join("metadata")
        .join(uid)
        .join("gpus")
        .join(format!(
            "{}-metadata.json",
            gpu_integrations::dra::DEFAULT_DRIVER
        ));
    let m: serde_json::Value = serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
    let a = &m["requests"][0]["devices"][0]["attributes"];
    assert_eq!(a["nvswitchPartition"]["int"], 4);
    let driver = a["guestDriver"]["string"].as_str().unwrap();
    assert!(
        driver.starts_with("NVIDIA driver 550.90.07, the version of the host's Fabric Manager"),
        "{driver}"
    );
    assert!(driver.contains("cuInit error 802"), "{driver}");
}

/// The sandbox's Fabric Manager reports NVLink ports 3 and 7 of nvidia2 (module 3) failed.
fn fail_nvidia2_links(root: &Path) {
    change_fm(root, |s| {
        let f = gpu_fabric::fake::FakeFabric::new(s.clone());
        f.fail_nvlinks(addr(GPU2), false, &[3, 7]);
        *s = f.state();
    });
}

/// Changes the sandbox's Fabric Manager state (made by a first change when there is none).
fn change_fm(root: &Path, change: impl FnOnce(&mut gpu_fabric::fake::FakeState)) {
    fabric::activate(&open(root), 12).unwrap();
    fabric::deactivate(&open(root), 12).unwrap();
    let mut s = fake_state(root);
    change(&mut s);
    let sb = gpu_sysfs::sandbox::sandbox_dir(root).unwrap();
    std::fs::write(sb.join("fabric.json"), serde_json::to_vec(&s).unwrap()).unwrap();
}

#[test]
fn nvlink_faults_fabric_manager_reports_taint_the_gpus_dra_device_and_refuse_its_partition() {
    let (_dir, root) = hgx_sandbox();
    fail_nvidia2_links(&root);

    let node = gpu_health::open_node(&root, &NodeRequest::new("hgx")).unwrap();
    let health: Vec<_> = node.reports.iter().map(|r| r.health.state).collect();
    assert_eq!(health[2], gpu_core::HealthState::Degraded, "{health:?}");
    let slices = gpu_integrations::dra::build::node_slices(
        &node.topology,
        &gpu_integrations::dra::DraOptions::default(),
    )
    .unwrap();
    let device = |gpu: &str| {
        let name = gpu_integrations::dra::device_name::gpu_device_name(&addr(gpu));
        slices
            .slices
            .iter()
            .flat_map(|s| s.spec.devices.iter())
            .find(|d| d.name == name)
            .unwrap()
            .clone()
    };
    assert!(!device(GPU2).taints.is_empty(), "{:?}", device(GPU2));
    assert!(device(GPU0).taints.is_empty(), "{:?}", device(GPU0));
    // The partition holding it is degraded: a set bind of it is refused before any write.
    let e = fabric::bind_set(&open(&root), &[addr(GPU0), addr(GPU2)]).unwrap_err();
    assert!(matches!(e, FabricError::Degraded { .. }), "{e}");
    assert!(
        e.to_string().contains("nvidia2: 2 of 18 NVLinks down"),
        "{e}"
    );
    assert_ne!(driver(&root, GPU0).as_deref(), Some("vfio-pci"));
}

#[test]
fn placement_avoids_a_partition_fabric_manager_reports_degraded() {
    let (_dir, root) = hgx_sandbox();
    fail_nvidia2_links(&root);
    let node = gpu_health::open_node(&root, &NodeRequest::new("hgx")).unwrap();
    let fleet = gpu_sched::FleetState::new(gpu_core::Fleet {
        nodes: vec![node.topology],
        ..gpu_core::Fleet::default()
    })
    .unwrap();
    let two =
        gpu_core::Machine::from_text("name: m\ndevices: [{name: gpu, count: 2, gpus: [nvidia]}]")
            .unwrap();
    let a = fleet.try_place(&two, gpu_sched::Policy::Binpack).unwrap();
    let got: Vec<String> = a
        .devices
        .iter()
        .map(|d| match d {
            gpu_core::AllocatedDevice::Gpu { name, .. } => name.clone(),
            other => panic!("{other:?}"),
        })
        .collect();
    // Partition 4 (nvidia0, nvidia2) is degraded: another pair is chosen.
    assert!(!got.contains(&"nvidia2".to_owned()), "{got:?}");
    let both =
        gpu_core::Machine::from_text("name: n\ndevices: [{name: gpu, gpus: [nvidia0, nvidia2]}]")
            .unwrap();
    let e = fleet
        .try_place(&both, gpu_sched::Policy::Binpack)
        .unwrap_err();
    assert!(e.to_string().contains("degraded"), "{e}");
}

/// An allocated claim of one `profile` vGPU on each GPU of `gpus` (each `size_mib`).
fn vgpu_claim(uid: &str, gpus: &[&str], size_mib: u64, profile: &str) -> serde_json::Value {
    let results: Vec<serde_json::Value> = gpus
        .iter()
        .enumerate()
        .map(|(i, g)| {
            serde_json::json!({
                "request": format!("v{i}"),
                "driver": gpu_integrations::dra::DEFAULT_DRIVER,
                "pool": "hgx",
                "device": gpu_integrations::dra::device_name::vgpu_device_name(&addr(g), size_mib),
            })
        })
        .collect();
    serde_json::json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "vm", "namespace": "default", "uid": uid},
        "status": {"allocation": {"devices": {
            "results": results,
            "config": [{"opaque": {"driver": gpu_integrations::dra::DEFAULT_DRIVER,
                                   "parameters": {"profile": profile}}}],
        }}}
    })
}

#[test]
fn a_dra_prepare_in_vgpu_mode_activates_the_partition_with_the_claims_vfs() {
    let (_dir, root) = hgx_vgpu_sandbox(2);
    let node = gpu_health::open_node(&root, &NodeRequest::new("hgx")).unwrap();
    let uid = "6f1c2d3e-0000-4000-8000-00000000f007";
    let doc = vgpu_claim(uid, &[GPU0, GPU2], 81920, "H100XM-80C");
    let id = gpu_node::dra::ClaimId::of_document(&doc, None).unwrap();
    once().prepare(&node, &doc, &id, false).unwrap();
    assert_eq!(active(&root), [4]);
    let vfs: Vec<String> = fake_state(&root).vfs[&4]
        .iter()
        .map(ToString::to_string)
        .collect();
    assert_eq!(vfs, ["0000:18:00.4", "0000:3a:00.4"]);

    let node = gpu_health::open_node(&root, &NodeRequest::new("hgx")).unwrap();
    once().unprepare(&node, uid, false).unwrap();
    assert!(active(&root).is_empty());
    assert_eq!(vf_type(&root, "0000:18:00.4"), "0");
}

#[test]
fn a_dra_claim_of_partial_vgpus_on_several_gpus_in_vgpu_mode_is_refused_before_any_write() {
    let (_dir, root) = hgx_vgpu_sandbox(2);
    let node = gpu_health::open_node(&root, &NodeRequest::new("hgx")).unwrap();
    let doc = vgpu_claim(
        "6f1c2d3e-0000-4000-8000-00000000f008",
        &[GPU0, GPU2],
        40960,
        "H100XM-40C",
    );
    let id = gpu_node::dra::ClaimId::of_document(&doc, None).unwrap();
    let e = once().prepare(&node, &doc, &id, false).unwrap_err();
    assert!(
        gpu_core::error_chain(&e).contains("cannot use NVLink"),
        "{}",
        gpu_core::error_chain(&e)
    );
    assert!(active(&root).is_empty());
    assert_eq!(vf_type(&root, "0000:18:00.4"), "0");
}
