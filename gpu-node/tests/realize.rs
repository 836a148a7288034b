//! An allocation the scheduler placed becomes devices on the node in one call: checked before
//! the first write, made, re-read, handed off; undone on a failure; its intent recorded.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use gpu_core::{AllocatedDevice, Allocation, ClassifiedError, ErrorKind};
use gpu_node::intent::IntentState;
use gpu_node::{Node, RealizeError};
use gpu_sysfs::discover::DiscoverOptions;
use gpu_sysfs::testing::FakeKernel;

const NODE: &str = "node-a";

/// What `gpuslice place --save` records: `machine` placed by the scheduler on the node as
/// discovery reads it.
fn placed(k: &FakeKernel, machine: serde_json::Value) -> Allocation {
    let t = gpu_sysfs::discover::discover(k, &DiscoverOptions::new(NODE)).unwrap();
    gpu_sched::testing::placed_on(t, machine)
}

fn two_a2_vgpus() -> serde_json::Value {
    serde_json::json!({"name": "vm1", "devices": [
        {"name": "gpu", "profile": "A2-4Q", "count": 2}]})
}

fn mdevs(k: &FakeKernel) -> Vec<String> {
    let t = gpu_sysfs::discover::discover(k, &DiscoverOptions::new(NODE)).unwrap();
    let mut out: Vec<String> = t
        .mediated_devices
        .parents
        .iter()
        .flat_map(|p| {
            p.instances
                .iter()
                .filter_map(|i| i.uuid.map(|u| u.to_string()))
        })
        .collect();
    out.sort();
    out
}

fn uuids(a: &Allocation) -> Vec<String> {
    let mut out: Vec<String> = a
        .devices
        .iter()
        .filter_map(|d| match d {
            AllocatedDevice::Vgpu { uuid, .. } => Some(uuid.to_string()),
            AllocatedDevice::Gpu { .. } => None,
        })
        .collect();
    out.sort();
    out
}

#[test]
fn a_placed_machine_becomes_its_vgpus_with_the_handoff_and_asking_again_writes_nothing() {
    let k = FakeKernel::a2_mdev_host().unwrap();
    let opts = DiscoverOptions::new(NODE);
    let node = Node::new(&k, &opts);
    let a = placed(&k, two_a2_vgpus());
    assert!(mdevs(&k).is_empty());
    let done = node.realize(&a).unwrap();
    assert!(done.changed);
    assert_eq!(done.devices.len(), 2);
    assert_eq!(mdevs(&k), uuids(&a), "the allocation's UUIDs, on the host");
    let devices = done.handoff.qemu.iter().filter(|q| *q == "-device").count();
    assert_eq!(devices, 2, "{:?}", done.handoff.qemu);
    for u in uuids(&a) {
        assert!(done.handoff.qemu.iter().any(|q| q.contains(&u)), "{u}");
    }
    assert!(
        node.unfinished().unwrap().is_none(),
        "the intent is marked done"
    );
    let writes = k.writes().len();
    let again = node.realize(&a).unwrap();
    assert!(!again.changed);
    assert_eq!(k.writes().len(), writes, "nothing written the second time");
    assert_eq!(again.handoff, done.handoff);
}

#[test]
fn an_allocation_for_another_node_is_refused_before_anything_is_read_or_written() {
    let k = FakeKernel::a2_mdev_host().unwrap();
    let opts = DiscoverOptions::new("node-b");
    let a = placed(&k, two_a2_vgpus());
    let e = Node::new(&k, &opts).realize(&a).unwrap_err();
    assert!(matches!(e, RealizeError::OtherNode { .. }), "{e}");
    assert_eq!(e.kind(), ErrorKind::InvalidRequest);
    assert!(
        e.to_string()
            .contains("is for node node-a, but this host is node node-b"),
        "{e}"
    );
    assert!(k.writes().is_empty());
}

#[test]
fn a_parent_without_room_for_the_whole_allocation_is_refused_with_nothing_written() {
    let k = FakeKernel::a2_mdev_host().unwrap();
    let opts = DiscoverOptions::new(NODE);
    let mut a = placed(&k, two_a2_vgpus());
    // Both on one VF, which takes one A2-4Q.
    let first_parent = match &a.devices[0] {
        AllocatedDevice::Vgpu { parent, .. } => parent.clone(),
        AllocatedDevice::Gpu { .. } => panic!("a vGPU was asked"),
    };
    if let AllocatedDevice::Vgpu { parent, .. } = &mut a.devices[1] {
        *parent = first_parent;
    }
    let e = Node::new(&k, &opts).realize(&a).unwrap_err();
    assert!(matches!(e, RealizeError::NoRoom { .. }), "{e}");
    assert_eq!(e.kind(), ErrorKind::Exhausted);
    assert!(k.writes().is_empty(), "{:?}", k.writes());
    assert!(mdevs(&k).is_empty());
}

#[test]
fn a_uuid_another_vgpu_holds_is_refused_before_the_first_write() {
    let k = FakeKernel::a2_mdev_host().unwrap();
    let opts = DiscoverOptions::new(NODE);
    let node = Node::new(&k, &opts);
    let a = placed(&k, two_a2_vgpus());
    node.realize(&a).unwrap();
    // The same UUIDs asked as another Machine's, on other parents.
    let mut b = a.clone();
    b.machine = "vm2".to_owned();
    for d in &mut b.devices {
        if let AllocatedDevice::Vgpu { parent, .. } = d {
            *parent = "0000:08:01.0".parse().unwrap();
        }
    }
    let writes = k.writes().len();
    let e = node.realize(&b).unwrap_err();
    assert!(matches!(e, RealizeError::Taken { .. }), "{e}");
    assert_eq!(e.kind(), ErrorKind::InUse);
    assert_eq!(k.writes().len(), writes);
}

#[test]
fn a_failed_second_write_undoes_the_first_and_the_intent_ends_done() {
    // The first vGPU's write succeeds, the second's fails.
    let k = FakeKernel::a2_mdev_host()
        .unwrap()
        .failing_at(2, libc_enospc());
    let opts = DiscoverOptions::new(NODE);
    let a = placed(&k, two_a2_vgpus());
    let e = Node::new(&k, &opts).realize(&a).unwrap_err();
    assert!(
        matches!(e, RealizeError::Write { ref left, .. } if left.is_empty()),
        "{e}"
    );
    assert!(
        e.to_string().contains("what this call made was undone"),
        "{e}"
    );
    assert!(mdevs(&k).is_empty(), "the first vGPU was removed again");
    assert!(Node::new(&k, &opts).unfinished().unwrap().is_none());
}

#[test]
fn a_write_interrupted_after_the_first_change_leaves_an_intent_the_next_open_reports() {
    // From the second write on the device fails: the first vGPU is made, the second is not,
    // and the undo of the first fails too.
    let k = FakeKernel::a2_mdev_host()
        .unwrap()
        .failing_from(2, libc_enospc());
    let opts = DiscoverOptions::new(NODE);
    let a = placed(&k, two_a2_vgpus());
    let e = Node::new(&k, &opts).realize(&a).unwrap_err();
    let RealizeError::Write { left, .. } = &e else {
        panic!("{e}")
    };
    assert_eq!(left.len(), 1, "{left:?}");
    assert_eq!(mdevs(&k).len(), 1, "the first vGPU is still there");
    // A later open of the node finds the record and says what was being done.
    let later = DiscoverOptions::new(NODE);
    let found = Node::new(&k, &later)
        .unfinished()
        .unwrap()
        .expect("an unfinished intent");
    assert_eq!(found.op, "realize");
    assert_eq!(found.state, IntentState::Incomplete);
    let said = found.describe();
    assert!(said.contains("Machine vm1"), "{said}");
    assert!(said.contains(&mdevs(&k)[0]), "{said}");
    assert!(said.contains("check:"), "{said}");
}

#[test]
fn a_write_whose_done_record_is_lost_is_reported_as_unfinished() {
    // The intent's `started` record is written, the `done` one is not (the process stopped).
    let k = FakeKernel::a2_mdev_host()
        .unwrap()
        .failing_state_writes([2], libc_enospc());
    let opts = DiscoverOptions::new(NODE);
    let node = Node::new(&k, &opts);
    let a = placed(&k, two_a2_vgpus());
    node.realize(&a).unwrap();
    let found = node.unfinished().unwrap().expect("the record says started");
    assert_eq!(found.state, IntentState::Started);
    // The next write records its own intent and finishes it.
    node.realize(&a).unwrap();
    let writes = k.state_writes();
    let b = placed(
        &k,
        serde_json::json!({"name": "vm2", "devices": [
        {"name": "gpu", "profile": "A2-4Q"}]}),
    );
    node.realize(&b).unwrap();
    assert_eq!(k.state_writes(), writes + 2, "started, then done");
    assert!(node.unfinished().unwrap().is_none());
}

#[test]
fn an_intent_that_cannot_be_recorded_refuses_the_write_with_nothing_changed() {
    let k = FakeKernel::a2_mdev_host()
        .unwrap()
        .failing_state_writes([1], libc_enospc());
    let opts = DiscoverOptions::new(NODE);
    let a = placed(&k, two_a2_vgpus());
    let e = Node::new(&k, &opts).realize(&a).unwrap_err();
    assert!(
        matches!(e, RealizeError::Node(gpu_node::NodeError::Intent { .. })),
        "{e}"
    );
    assert_eq!(e.kind(), ErrorKind::HostError);
    assert_eq!(e.errno(), Some(libc_enospc()));
    assert!(mdevs(&k).is_empty());
}

#[test]
fn a_whole_gpu_is_bound_and_handed_off_and_a_cli_write_records_its_intent() {
    let k = FakeKernel::passthrough_host().unwrap();
    let opts = DiscoverOptions::new(NODE);
    let node = Node::new(&k, &opts);
    let a = placed(
        &k,
        serde_json::json!({"name": "pt", "devices": [
        {"name": "gpu", "class": "gpu", "vendor": "nvidia"}]}),
    );
    let gpu = match &a.devices[0] {
        AllocatedDevice::Gpu { address, .. } => *address,
        AllocatedDevice::Vgpu { .. } => panic!("a whole GPU was asked"),
    };
    let done = node.realize(&a).unwrap();
    assert!(done.changed);
    let host = format!("vfio-pci,host={gpu}");
    assert!(done.handoff.qemu.contains(&host), "{:?}", done.handoff);
    let t = gpu_sysfs::discover::discover(&k, &opts).unwrap();
    assert_eq!(
        t.gpu_by_address(&gpu).unwrap().driver.as_deref(),
        Some("vfio-pci")
    );
    // The single-step writes record theirs too: a release, then the record is done.
    node.release_gpu(&gpu, false).unwrap();
    let record = std::fs::read_to_string(k.root().join(gpu_node::intent::INTENT_FILE)).unwrap();
    assert!(record.contains("\"release-gpu\""), "{record}");
    assert!(record.contains("\"done\""), "{record}");
}

fn libc_enospc() -> i32 {
    28
}
