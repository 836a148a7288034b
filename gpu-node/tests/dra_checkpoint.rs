//! The DRA checkpoint on the fake kernel: a prepare killed (`kill -9`) after any write, host or
//! record, is finished by the next prepare of the claim and undone by the next unprepare, to the
//! same host state an uninterrupted call leaves; after a reboot (the boot ID changed) a recorded
//! claim's devices are made again with the same UUIDs; a device a VM holds is never taken away.
//!
//! A kill is simulated by a host that panics at its Nth write (the claim store writes through
//! it too), so nothing after that write happens, as after `kill -9`.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeMap;
use std::io;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use gpu_core::{ErrorKind, NodeTopology};
use gpu_integrations::dra::model::PrepareInput;
use gpu_integrations::dra::prepare::{ClaimPhase, PrepareAction, PreparedClaim};
use gpu_integrations::dra::{
    Claim, ClaimResult, ClaimStore, DEFAULT_STATE_DIR, DraNode, PrepareOptions, Unprepared,
};
use gpu_node::dra::{prepare_claim, unprepare_claim};
use gpu_sysfs::discover::{DiscoverOptions, discover};
use gpu_sysfs::testing::FakeKernel;
use gpu_sysfs::testing::fake_kernel::Entry;
use gpu_sysfs::{CommandOutput, Host, actuate};
use serde_json::json;

const NODE: &str = "node-a";
const DRIVER: &str = "gpu.gpuslice.dev";
const BOOT_A: &str = "3f1c2b7e-9a4d-4e8b-b1c2-5d6e7f8a9b0c";
const BOOT_B: &str = "8c0d1e2f-3a4b-4c5d-8e6f-7a8b9c0d1e2f";
const SHARE: &str = "5f0b4e3a-9c1d-4c7e-8a55-2f6d0b9e1a77";

/// A host that dies (panics, like `kill -9`: nothing after it runs) at its `kill_at`-th write,
/// counting sysfs writes and state-file writes alike.
#[derive(Debug, Clone)]
struct Dying {
    inner: Arc<FakeKernel>,
    writes: Arc<AtomicUsize>,
    kill_at: usize,
}

impl Dying {
    fn new(inner: &Arc<FakeKernel>, kill_at: usize) -> Self {
        Dying {
            inner: Arc::clone(inner),
            writes: Arc::new(AtomicUsize::new(0)),
            kill_at,
        }
    }

    fn count(&self) {
        let n = self.writes.fetch_add(1, Ordering::SeqCst) + 1;
        if n == self.kill_at {
            panic!("killed at write {n}");
        }
    }

    fn writes(&self) -> usize {
        self.writes.load(Ordering::SeqCst)
    }
}

impl Host for Dying {
    fn read(&self, path: &str) -> io::Result<Vec<u8>> {
        self.inner.read(path)
    }
    fn read_bounded(&self, path: &str, max: usize) -> io::Result<Vec<u8>> {
        self.inner.read_bounded(path, max)
    }
    fn write(&self, path: &str, data: &[u8]) -> io::Result<()> {
        self.count();
        self.inner.write(path, data)
    }
    fn write_atomic(&self, path: &str, data: &[u8]) -> io::Result<()> {
        self.count();
        self.inner.write_atomic(path, data)
    }
    fn create_dir_all(&self, path: &str) -> io::Result<()> {
        self.inner.create_dir_all(path)
    }
    fn list(&self, dir: &str) -> io::Result<Vec<String>> {
        self.inner.list(dir)
    }
    fn read_link(&self, path: &str) -> io::Result<PathBuf> {
        self.inner.read_link(path)
    }
    fn exists(&self, path: &str) -> bool {
        self.inner.exists(path)
    }
    fn run(&self, program: &str, args: &[String], timeout: Duration) -> io::Result<CommandOutput> {
        self.inner.run(program, args, timeout)
    }
    fn root_dir(&self) -> Option<&Path> {
        self.inner.root_dir()
    }
}

/// The kinds of host a claim is prepared on.
#[derive(Debug, Clone, Copy)]
enum Kind {
    /// Two vGPUs of one size on an L40S's vendor-VFIO VFs.
    L40sVfs,
    /// An mdev on an A2 VF (the share ID as its UUID).
    A2Mdev,
    /// A whole GPU with its audio function bound to vfio-pci.
    WholeGpu,
}

const KINDS: [Kind; 3] = [Kind::L40sVfs, Kind::A2Mdev, Kind::WholeGpu];

fn kernel(kind: Kind, boot: Option<&str>) -> Arc<FakeKernel> {
    let k = match kind {
        Kind::L40sVfs => FakeKernel::l40s_vendor_vfio_host(4),
        Kind::A2Mdev => FakeKernel::a2_mdev_host(),
        Kind::WholeGpu => FakeKernel::passthrough_host(),
    }
    .unwrap();
    if let Some(b) = boot {
        set_boot(&k, b);
    }
    Arc::new(k)
}

fn set_boot(k: &FakeKernel, boot: &str) {
    let f = k.root().join("proc/sys/kernel/random/boot_id");
    std::fs::create_dir_all(f.parent().unwrap()).unwrap();
    std::fs::write(f, format!("{boot}\n")).unwrap();
}

fn claim(kind: Kind, uid: &str) -> Claim {
    let (results, profile) = match kind {
        Kind::L40sVfs => (
            json!([
                {"request": "a", "driver": DRIVER, "pool": NODE, "device": "vgpu-0000-26-00-0-8192mi"},
                {"request": "b", "driver": DRIVER, "pool": NODE, "device": "vgpu-0000-26-00-0-8192mi"},
            ]),
            Some("L40S-8Q"),
        ),
        Kind::A2Mdev => (
            json!([{"request": "vgpu", "driver": DRIVER, "pool": NODE,
                    "device": "vgpu-0000-08-00-0-4096mi", "shareID": SHARE}]),
            Some("A2-4Q"),
        ),
        Kind::WholeGpu => (
            json!([{"request": "gpu", "driver": DRIVER, "pool": NODE, "device": "gpu-0000-01-00-0"}]),
            None,
        ),
    };
    let mut devices = json!({"results": results});
    if let Some(p) = profile {
        devices["config"] = json!([{"opaque": {"driver": DRIVER, "parameters": {"profile": p}}}]);
    }
    let doc = json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": "vm-gpu", "namespace": "default", "uid": uid},
        "status": {"allocation": {"devices": devices}},
    });
    let input: PrepareInput = serde_json::from_value(doc).unwrap();
    Claim::from_input(input, None).unwrap()
}

fn topology(host: &dyn Host) -> NodeTopology {
    discover(host, &DiscoverOptions::new(NODE)).unwrap()
}

fn options() -> PrepareOptions {
    PrepareOptions {
        driver: DRIVER.into(),
        dry_run: false,
    }
}

/// Prepares `claim` through `host` (its store too), with the topology as the host shows it now.
fn prepare(host: &Dying, claim: &Claim) -> gpu_integrations::Result<ClaimResult> {
    let t = topology(host);
    let node = DraNode {
        host,
        topology: &t,
        recording: false,
    };
    let store = ClaimStore::on_host(Arc::new(host.clone()));
    prepare_claim(&node, &store, claim, &options())
}

fn unprepare(host: &Dying, uid: &str, force: bool) -> gpu_integrations::Result<Unprepared> {
    let store = ClaimStore::on_host(Arc::new(host.clone()));
    unprepare_claim(host, false, &store, uid, force)
}

fn record(k: &Arc<FakeKernel>, uid: &str) -> Option<PreparedClaim> {
    ClaimStore::on_host(Arc::clone(k) as Arc<dyn Host>)
        .read(uid)
        .unwrap()
}

/// The host as a VM would find it: everything but the claim store and the boot ID.
fn host_state(k: &FakeKernel) -> BTreeMap<String, Entry> {
    let mut s = k.snapshot().unwrap();
    s.retain(|p, _| {
        !p.starts_with(DEFAULT_STATE_DIR.split('/').next().unwrap()) && !p.starts_with("proc/sys")
    });
    s
}

/// Kills a prepare of `kind` at write `n`; returns the host, left as the kill left it.
fn killed_at(kind: Kind, uid: &str, n: usize) -> Arc<FakeKernel> {
    let k = kernel(kind, Some(BOOT_A));
    let dying = Dying::new(&k, n);
    let c = claim(kind, uid);
    let out = catch_unwind(AssertUnwindSafe(|| prepare(&dying, &c)));
    assert!(
        out.is_err(),
        "{kind:?}: the prepare was not killed at write {n}"
    );
    k
}

/// An uninterrupted prepare: the host before, after, the record and the writes it took.
fn reference(
    kind: Kind,
) -> (
    BTreeMap<String, Entry>,
    BTreeMap<String, Entry>,
    PreparedClaim,
    usize,
) {
    let k = kernel(kind, Some(BOOT_A));
    let before = host_state(&k);
    let h = Dying::new(&k, usize::MAX);
    let done = prepare(&h, &claim(kind, "uid-1")).unwrap();
    assert!(!done.unchanged);
    let rec = record(&k, "uid-1").unwrap();
    assert_eq!(rec.phase, ClaimPhase::Completed);
    assert_eq!(rec.boot_id.as_deref(), Some(BOOT_A));
    (before, host_state(&k), rec, h.writes())
}

#[test]
fn a_prepare_killed_after_any_write_is_finished_by_the_next_prepare() {
    for kind in KINDS {
        let (_, after, rec, writes) = reference(kind);
        // The started record, the host writes, the completed record.
        assert!(writes >= 3, "{kind:?}: {writes} writes");
        for n in 1..=writes {
            let k = killed_at(kind, "uid-1", n);
            let again = prepare(&Dying::new(&k, usize::MAX), &claim(kind, "uid-1"))
                .unwrap_or_else(|e| panic!("{kind:?}, killed at write {n}: {e}"));
            assert_eq!(host_state(&k), after, "{kind:?}, killed at write {n}");
            let now = record(&k, "uid-1").unwrap();
            assert_eq!(now, rec, "{kind:?}, killed at write {n}");
            assert_eq!(again.devices.len(), rec.held().count());
            // And from there on a repeat answers the same with no write at all.
            let h = Dying::new(&k, 1);
            let repeat = prepare(&h, &claim(kind, "uid-1")).unwrap();
            assert!(repeat.unchanged);
            assert_eq!(repeat.devices, again.devices);
            assert_eq!(h.writes(), 0);
        }
    }
}

#[test]
fn a_prepare_killed_after_any_write_is_undone_by_the_next_unprepare() {
    for kind in KINDS {
        let (before, _, rec, writes) = reference(kind);
        for n in 1..=writes {
            let k = killed_at(kind, "uid-1", n);
            let done = unprepare(&Dying::new(&k, usize::MAX), "uid-1", false)
                .unwrap_or_else(|e| panic!("{kind:?}, killed at write {n}: {e}"));
            assert_eq!(host_state(&k), before, "{kind:?}, killed at write {n}");
            assert_eq!(record(&k, "uid-1"), None, "{kind:?}, killed at write {n}");
            // What it names as removed is what the killed call had made.
            assert!(done.removed.len() <= rec.actions.len());
            if n == writes {
                assert_eq!(done.removed.len(), rec.actions.len(), "{kind:?}");
            }
        }
    }
}

#[test]
fn after_a_reboot_the_claims_devices_are_made_again_with_the_same_uuids() {
    for kind in KINDS {
        let (_, after, rec, _) = reference(kind);
        // The same host after a reboot: the devices are gone, the record is still on disk.
        let k = kernel(kind, Some(BOOT_B));
        ClaimStore::on_host(Arc::clone(&k) as Arc<dyn Host>)
            .write(&rec)
            .unwrap();
        let done = prepare(&Dying::new(&k, usize::MAX), &claim(kind, "uid-1")).unwrap();
        assert!(!done.unchanged, "{kind:?}: answered from the stale record");
        assert_eq!(host_state(&k), after, "{kind:?}");
        let now = record(&k, "uid-1").unwrap();
        assert_eq!(now.actions, rec.actions, "{kind:?}: other UUIDs or devices");
        assert_eq!(now.boot_id.as_deref(), Some(BOOT_B));
        assert_eq!(now.phase, ClaimPhase::Completed);
    }
}

#[test]
fn a_record_of_an_earlier_boot_is_forgotten_by_unprepare_removing_nothing() {
    let (_, _, rec, _) = reference(Kind::A2Mdev);
    let k = kernel(Kind::A2Mdev, Some(BOOT_B));
    ClaimStore::on_host(Arc::clone(&k) as Arc<dyn Host>)
        .write(&rec)
        .unwrap();
    // Someone made an mdev of that UUID after the reboot: it is not the claim's to remove.
    let PrepareAction::CreateMdev {
        parent,
        type_id,
        uuid,
        ..
    } = &rec.actions[0]
    else {
        panic!("{rec:?}");
    };
    actuate::create_mdev(
        &*k,
        &actuate::MdevCreate {
            parent: parent.clone(),
            type_id: type_id.clone(),
            uuid: *uuid,
        },
    )
    .unwrap();
    let before = host_state(&k);
    let done = unprepare(&Dying::new(&k, usize::MAX), "uid-1", false).unwrap();
    assert!(done.removed.is_empty());
    assert_eq!(host_state(&k), before);
    assert_eq!(record(&k, "uid-1"), None);
}

#[test]
fn a_root_without_a_boot_id_cannot_see_reboots_and_trusts_its_records() {
    let k = kernel(Kind::A2Mdev, None);
    prepare(&Dying::new(&k, usize::MAX), &claim(Kind::A2Mdev, "uid-1")).unwrap();
    let rec = record(&k, "uid-1").unwrap();
    assert_eq!(rec.boot_id, None);
    assert!(!serde_json::to_string(&rec).unwrap().contains("bootId"));
    let h = Dying::new(&k, 1);
    assert!(
        prepare(&h, &claim(Kind::A2Mdev, "uid-1"))
            .unwrap()
            .unchanged
    );
    assert_eq!(h.writes(), 0);
    // A host whose boot ID appears later (or a record made before boot IDs were kept) is still
    // trusted: only two known, different boot IDs are a reboot.
    set_boot(&k, BOOT_A);
    assert!(
        prepare(&h, &claim(Kind::A2Mdev, "uid-1"))
            .unwrap()
            .unchanged
    );
    assert_eq!(h.writes(), 0);
}

#[test]
fn unprepare_of_a_claim_whose_device_a_vm_holds_is_refused_with_nothing_changed() {
    let k = kernel(Kind::L40sVfs, Some(BOOT_A));
    let h = Dying::new(&k, usize::MAX);
    prepare(&h, &claim(Kind::L40sVfs, "uid-1")).unwrap();
    let rec = record(&k, "uid-1").unwrap();
    let PrepareAction::SetVfType { vf, .. } = &rec.actions[1] else {
        panic!("{rec:?}");
    };
    let pid = k.open_device(&format!("sys/bus/pci/devices/{vf}")).unwrap();
    let before = host_state(&k);
    let e = unprepare(&h, "uid-1", false).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InUse, "{e}");
    assert!(e.to_string().contains("nothing was changed"), "{e}");
    // The other VF, free, was not cleared either.
    assert_eq!(host_state(&k), before);
    assert_eq!(record(&k, "uid-1"), Some(rec.clone()));
    k.close_device(pid).unwrap();
    let done = unprepare(&h, "uid-1", false).unwrap();
    assert_eq!(done.removed.len(), 2);
}

#[test]
fn an_interrupted_prepare_whose_device_a_vm_took_is_not_undone_from_under_it() {
    // Killed after the started record and the first VF's type: then a VM opened that VF.
    let k = killed_at(Kind::L40sVfs, "uid-1", 3);
    let rec = record(&k, "uid-1").unwrap();
    assert_eq!(rec.phase, ClaimPhase::Started);
    let PrepareAction::SetVfType { vf, .. } = &rec.actions[0] else {
        panic!("{rec:?}");
    };
    k.open_device(&format!("sys/bus/pci/devices/{vf}")).unwrap();
    let before = host_state(&k);
    let e = unprepare(&Dying::new(&k, usize::MAX), "uid-1", false).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InUse, "{e}");
    assert_eq!(host_state(&k), before);
    assert_eq!(record(&k, "uid-1"), Some(rec));
}

#[test]
fn a_whole_gpu_a_vm_holds_is_refused_and_nothing_is_recorded() {
    let k = kernel(Kind::WholeGpu, Some(BOOT_A));
    k.bind_by_hand("0000:01:00.0", "nvidia", "vfio-pci")
        .unwrap();
    k.open_device("sys/bus/pci/devices/0000:01:00.0").unwrap();
    let before = host_state(&k);
    let h = Dying::new(&k, usize::MAX);
    let e = prepare(&h, &claim(Kind::WholeGpu, "uid-1")).unwrap_err();
    assert!(e.to_string().contains("nothing was changed"), "{e}");
    assert_eq!(h.writes(), 0);
    assert_eq!(host_state(&k), before);
    assert_eq!(record(&k, "uid-1"), None);
}

#[test]
fn a_device_an_interrupted_prepare_planned_is_not_given_to_another_claim() {
    // Killed after the started record: the VFs it planned still look free on the host.
    let k = killed_at(Kind::L40sVfs, "uid-1", 2);
    let planned = record(&k, "uid-1").unwrap();
    let h = Dying::new(&k, usize::MAX);
    let e = prepare(&h, &claim(Kind::L40sVfs, "uid-2")).unwrap_err();
    assert!(e.to_string().contains("is held by claim uid-1"), "{e}");
    assert_eq!(record(&k, "uid-2"), None);
    // The first claim finishes; the second, planned again on the host as it is now, gets
    // other VFs.
    prepare(&h, &claim(Kind::L40sVfs, "uid-1")).unwrap();
    assert_eq!(record(&k, "uid-1").unwrap().actions, planned.actions);
    prepare(&h, &claim(Kind::L40sVfs, "uid-2")).unwrap();
    let second = record(&k, "uid-2").unwrap();
    let vfs = |c: &PreparedClaim| -> Vec<String> {
        c.actions
            .iter()
            .filter_map(|a| match a {
                PrepareAction::SetVfType { vf, .. } => Some(vf.to_string()),
                _ => None,
            })
            .collect()
    };
    assert!(vfs(&second).iter().all(|v| !vfs(&planned).contains(v)));
}
