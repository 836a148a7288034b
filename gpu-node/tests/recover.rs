//! A write killed half-way leaves its intent record `started`; the next start finds it, undoes
//! what the interrupted call made where no process holds it, and never removes a device a VM
//! may hold. The kill is simulated by writing the record and leaving it.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use gpu_core::{MdevUuid, ParentId};
use gpu_node::intent::{INTENT_DIR, INTENT_FILE, Intent, IntentState, Planned};
use gpu_node::{Node, NodeError};
use gpu_sysfs::Host;
use gpu_sysfs::discover::DiscoverOptions;
use gpu_sysfs::testing::FakeKernel;

fn uuid(n: u32) -> MdevUuid {
    MdevUuid::for_machine("vm", "gpu", n)
}

fn make(node: &Node<'_>, u: MdevUuid) {
    let parent: ParentId = "0000:08:00.0".parse().unwrap();
    node.create_vgpu(
        &parent,
        "A2-4Q",
        false,
        |n| -> Result<_, NodeError> { panic!("{n}") },
        |_| Ok(Some(u)),
    )
    .unwrap();
}

fn there(k: &FakeKernel, u: MdevUuid) -> bool {
    k.exists(&format!("sys/bus/mdev/devices/{u}"))
}

/// What a process killed in the middle of its write leaves behind.
fn leave(k: &FakeKernel, intent: &Intent) {
    k.create_dir_all(INTENT_DIR).unwrap();
    k.write_atomic(INTENT_FILE, &serde_json::to_vec(intent).unwrap())
        .unwrap();
}

fn record(k: &FakeKernel) -> Intent {
    serde_json::from_slice(&k.read(INTENT_FILE).unwrap()).unwrap()
}

#[test]
fn what_an_interrupted_create_made_is_removed_and_the_record_finished() {
    let k = FakeKernel::a2_mdev_host().unwrap();
    let opts = DiscoverOptions::new("node-a");
    let node = Node::new(&k, &opts);
    make(&node, uuid(0));
    make(&node, uuid(1));
    // The process died after making uuid(1): its record names it, still `started`.
    let killed = Intent::new(
        "create-vgpu",
        "create a A2-4Q vGPU on 0000:08:00.0",
        "check",
    )
    .creating(vec![Planned::Mdev { uuid: uuid(1) }]);
    leave(&k, &killed);
    assert!(node.unfinished().unwrap().is_some());
    let r = node
        .recover()
        .unwrap()
        .expect("the interrupted write is found");
    assert_eq!(r.intent, killed);
    assert!(r.message.contains("did not finish"), "{}", r.message);
    assert_eq!(r.rolled_back, vec![format!("removed mdev {}", uuid(1))]);
    assert!(r.kept.is_empty(), "{:?}", r.kept);
    assert!(r.resolved);
    assert!(
        !there(&k, uuid(1)),
        "what the interrupted call made is gone"
    );
    assert!(there(&k, uuid(0)), "what it did not name stays");
    assert_eq!(record(&k).state, IntentState::Done);
    assert!(node.unfinished().unwrap().is_none());
    assert!(node.recover().unwrap().is_none(), "nothing left to recover");
}

#[test]
fn a_device_a_process_holds_is_never_removed_and_is_reported_kept() {
    let k = FakeKernel::a2_mdev_host().unwrap();
    let opts = DiscoverOptions::new("node-a");
    let node = Node::new(&k, &opts);
    make(&node, uuid(0));
    k.open_device(&format!("sys/bus/mdev/devices/{}", uuid(0)))
        .unwrap();
    let killed = Intent::new("realize", "realize Machine vm", "check")
        .creating(vec![Planned::Mdev { uuid: uuid(0) }]);
    leave(&k, &killed);
    let r = node.recover().unwrap().unwrap();
    assert!(r.rolled_back.is_empty());
    assert_eq!(r.kept.len(), 1, "{:?}", r.kept);
    assert!(
        r.kept[0].starts_with(&format!("mdev {}", uuid(0))),
        "{:?}",
        r.kept
    );
    assert!(!r.resolved);
    assert!(there(&k, uuid(0)), "a held device stays");
    let after = record(&k);
    assert_eq!(after.state, IntentState::Incomplete);
    assert_eq!(after.left, r.kept);
}

#[test]
fn a_record_that_names_nothing_to_undo_is_reported_and_left_as_it_was() {
    let k = FakeKernel::a2_mdev_host().unwrap();
    let opts = DiscoverOptions::new("node-a");
    let node = Node::new(&k, &opts);
    let killed = Intent::new(
        "apply-layout",
        "apply config all-4q",
        "`gpuslice vgpu assert`",
    );
    leave(&k, &killed);
    let r = node.recover().unwrap().unwrap();
    assert!(!r.resolved);
    assert!(r.rolled_back.is_empty() && r.kept.is_empty());
    assert_eq!(
        record(&k),
        killed,
        "the record is left for a person to check"
    );
}

#[test]
fn a_create_names_what_it_makes_in_its_record_before_it_makes_it() {
    let k = FakeKernel::a2_mdev_host().unwrap();
    let opts = DiscoverOptions::new("node-a");
    let node = Node::new(&k, &opts);
    make(&node, uuid(3));
    let r = record(&k);
    assert_eq!(r.op, "create-vgpu");
    assert_eq!(r.state, IntentState::Done);
    assert_eq!(r.creates, vec![Planned::Mdev { uuid: uuid(3) }]);
}
