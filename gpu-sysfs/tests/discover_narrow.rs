//! Re-reading only what a kernel event changed: a new or removed mdev re-reads its parent's GPU
//! (the parents' types, their instances, the pool) and a rebound GPU re-reads that GPU; both
//! give exactly what a full discovery gives, with a fraction of the reads.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use gpu_core::{NodeTopology, PciAddress};
use gpu_sysfs::discover::{Change, DiscoverOptions, discover, rediscover};
use gpu_sysfs::testing::FakeKernel;
use gpu_sysfs::{CommandOutput, Host};

/// A host that records every path it is asked to read, list or follow.
#[derive(Debug)]
struct Counting<'a> {
    inner: &'a dyn Host,
    seen: Mutex<Vec<String>>,
}

impl<'a> Counting<'a> {
    fn new(inner: &'a dyn Host) -> Self {
        Counting {
            inner,
            seen: Mutex::new(Vec::new()),
        }
    }
    fn note(&self, p: &str) {
        self.seen.lock().unwrap().push(p.to_owned());
    }
    fn seen(&self) -> Vec<String> {
        self.seen.lock().unwrap().clone()
    }
}

impl Host for Counting<'_> {
    fn read(&self, path: &str) -> io::Result<Vec<u8>> {
        self.note(path);
        self.inner.read(path)
    }
    fn write(&self, path: &str, data: &[u8]) -> io::Result<()> {
        self.inner.write(path, data)
    }
    fn list(&self, dir: &str) -> io::Result<Vec<String>> {
        self.note(dir);
        self.inner.list(dir)
    }
    fn read_link(&self, path: &str) -> io::Result<PathBuf> {
        self.note(path);
        self.inner.read_link(path)
    }
    fn exists(&self, path: &str) -> bool {
        self.note(path);
        self.inner.exists(path)
    }
    fn run(&self, program: &str, args: &[String], timeout: Duration) -> io::Result<CommandOutput> {
        self.inner.run(program, args, timeout)
    }
    fn root_dir(&self) -> Option<&Path> {
        self.inner.root_dir()
    }
    fn canonicalize(&self, path: &str) -> io::Result<String> {
        self.inner.canonicalize(path)
    }
}

fn opts() -> DiscoverOptions {
    DiscoverOptions::new("node-a")
}

fn full(host: &dyn Host) -> (NodeTopology, usize) {
    let c = Counting::new(host);
    let t = discover(&c, &opts()).unwrap();
    (t, c.seen().len())
}

fn create(k: &FakeKernel, parent: &str, type_id: &str, uuid: &str) {
    k.write(
        &format!("sys/class/mdev_bus/{parent}/mdev_supported_types/{type_id}/create"),
        uuid.as_bytes(),
    )
    .unwrap();
}

const UUID: &str = "0b4d5a1e-6c2f-4f0e-9a63-3f1c2d4e5f60";

#[test]
fn a_new_mbochs_instance_re_reads_only_mbochs_and_matches_a_full_discovery() {
    let k = FakeKernel::sample_mdev_drivers().unwrap();
    let (before, _) = full(&k);
    create(&k, "mbochs", "mbochs-small", UUID);
    let (after, full_reads) = full(&k);
    assert_ne!(before, after, "the create changed the topology");

    let c = Counting::new(&k);
    let narrow = rediscover(&c, &opts(), &before, &[Change::MdevParent("mbochs".into())])
        .expect("an mbochs instance is placed on mbochs");
    assert_eq!(narrow, after);
    let seen = c.seen();
    let outside: Vec<&String> = seen
        .iter()
        .filter(|p| {
            !p.starts_with("sys/class/mdev_bus/mbochs")
                && !p.starts_with(&format!("sys/bus/mdev/devices/{UUID}"))
        })
        .collect();
    assert!(outside.is_empty(), "read outside mbochs: {outside:?}");
    assert!(
        seen.len() * 2 < full_reads,
        "{} narrow reads against {full_reads} for a full discovery",
        seen.len()
    );
}

#[test]
fn a_removed_instance_gives_its_capacity_back_as_a_full_discovery_says() {
    let k = FakeKernel::sample_mdev_drivers().unwrap();
    create(&k, "mtty", "mtty-2", UUID);
    let (before, _) = full(&k);
    k.write(&format!("sys/bus/mdev/devices/{UUID}/remove"), b"1")
        .unwrap();
    let (after, _) = full(&k);
    let narrow = rediscover(&k, &opts(), &before, &[Change::MdevParent("mtty".into())]).unwrap();
    assert_eq!(narrow, after);
}

#[test]
fn an_instance_on_one_a2_vf_re_reads_the_vfs_of_that_gpu_and_their_shared_pool() {
    let k = FakeKernel::a2_mdev_host().unwrap();
    let (before, _) = full(&k);
    create(&k, "0000:08:00.4", "nvidia-746", UUID);
    let (after, full_reads) = full(&k);
    let c = Counting::new(&k);
    let narrow = rediscover(
        &c,
        &opts(),
        &before,
        &[Change::MdevParent("0000:08:00.4".into())],
    )
    .unwrap();
    assert_eq!(narrow, after);
    // Every VF of the GPU lowered its counts: the pool is the GPU's.
    assert!(
        c.seen()
            .iter()
            .any(|p| p.starts_with("sys/class/mdev_bus/0000:08:02.3/")),
        "the last VF was not re-read"
    );
    assert!(c.seen().len() <= full_reads);
}

#[test]
fn a_gpu_bound_to_vfio_pci_by_hand_re_reads_that_gpu_and_matches_a_full_discovery() {
    let k = FakeKernel::passthrough_host().unwrap();
    let (before, full_reads) = full(&k);
    let dev = "0000:05:00.0";
    k.bind_by_hand(dev, "amdgpu", "vfio-pci").unwrap();
    let (after, _) = full(&k);
    assert_ne!(before, after);
    let c = Counting::new(&k);
    let a: PciAddress = dev.parse().unwrap();
    let narrow = rediscover(&c, &opts(), &before, &[Change::Pci(a)]).unwrap();
    assert_eq!(narrow, after);
    let gpu = narrow.gpus.iter().find(|g| g.address == a).unwrap();
    assert_eq!(gpu.driver.as_deref(), Some("vfio-pci"));
    // Other GPUs' directories are not read.
    let others: Vec<String> = c
        .seen()
        .into_iter()
        .filter(|p| {
            ["0000:01:00.0", "0000:02:00.0", "0000:04:00.0"]
                .iter()
                .any(|o| p.starts_with(&format!("sys/bus/pci/devices/{o}")))
        })
        .collect();
    assert!(others.is_empty(), "read other GPUs: {others:?}");
    assert!(c.seen().len() * 2 < full_reads);
}

#[test]
fn what_the_narrow_read_cannot_place_is_left_to_a_full_discovery() {
    let k = FakeKernel::passthrough_host().unwrap();
    let (t, _) = full(&k);
    // A device that is not a GPU of the topology, a parent that does not exist.
    let nic: PciAddress = "0000:03:00.0".parse().unwrap();
    assert_eq!(rediscover(&k, &opts(), &t, &[Change::Pci(nic)]), None);
    assert_eq!(
        rediscover(&k, &opts(), &t, &[Change::MdevParent("mbochs".into())]),
        None
    );
    // 0000:02:00.0 shares group 2 with the NIC only, no other GPU: it is placed. Under a
    // parent selection nothing is (the pools count parents the topology does not show).
    let g2: PciAddress = "0000:02:00.0".parse().unwrap();
    assert!(rediscover(&k, &opts(), &t, &[Change::Pci(g2)]).is_some());
    let selected = opts().with_mdev_parents(vec![]);
    assert_eq!(rediscover(&k, &selected, &t, &[Change::Pci(g2)]), None);
}
