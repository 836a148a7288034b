//! Promises across restarts, and one writer at a time.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use gpu_agent::state::{Device, Owner, Phase, Promise, STATE_VERSION, StateFile, StateStore};
use gpu_sysfs::Host as _;
use gpu_sysfs::testing::FakeKernel;
use support::{get, request, start};

const U1: &str = "6f1a2b3c-0000-4000-8000-000000000001";

fn kernel() -> Arc<FakeKernel> {
    Arc::new(FakeKernel::sample_mdev_drivers().unwrap())
}

fn create(socket: &std::path::Path, uuid: &str, profile: &str) -> support::Reply {
    let body = format!(r#"{{"parent":"mbochs","profile":"{profile}","uuid":"{uuid}"}}"#);
    request(socket, "POST", "/v1/vgpus", Some(&body))
}

#[test]
fn after_a_reboot_the_agent_recreates_its_instances_with_the_same_uuids() {
    let k = kernel();
    let a = start(Arc::clone(&k));
    assert_eq!(create(&a.socket, U1, "mbochs-medium").status, 201);
    a.stop();
    // The reboot: vGPUs do not survive it; the state file does.
    k.write(&format!("sys/bus/mdev/devices/{U1}/remove"), b"1")
        .unwrap();
    assert!(!k.exists(&format!("sys/bus/mdev/devices/{U1}")));
    let b = start(Arc::clone(&k));
    assert!(
        k.exists(&format!("sys/bus/mdev/devices/{U1}")),
        "re-created"
    );
    let p = get(&b.socket, "/v1/promises").json();
    assert_eq!(p["reconciled"][0]["outcome"], "recreated", "{p}");
    let l = get(&b.socket, "/v1/vgpus").json();
    assert_eq!(l["mdevs"][0]["uuid"], U1);
    assert_eq!(l["mdevs"][0]["typeId"], "mbochs-medium");
}

#[test]
fn an_instance_the_agent_did_not_create_is_left_alone() {
    let k = kernel();
    k.write(
        "sys/class/mdev_bus/mbochs/mdev_supported_types/mbochs-small/create",
        U1.as_bytes(),
    )
    .unwrap();
    let a = start(Arc::clone(&k));
    a.stop();
    let _b = start(Arc::clone(&k));
    assert!(k.exists(&format!("sys/bus/mdev/devices/{U1}")));
}

#[test]
fn a_kill_between_the_record_and_the_create_is_finished_on_the_next_start() {
    let k = kernel();
    // What the agent has on disk when killed after recording and before the kernel write.
    let store = StateStore::new(k.root().join(gpu_agent::state::DEFAULT_STATE_DIR));
    store
        .save(&StateFile {
            version: STATE_VERSION,
            promises: vec![Promise {
                device: Device::Mdev {
                    uuid: U1.parse().unwrap(),
                    parent: "mbochs".parse().unwrap(),
                    type_id: "mbochs-small".parse().unwrap(),
                },
                owner: Owner {
                    machine: Some("vm1".to_owned()),
                    request: Some("gpu".to_owned()),
                    index: Some(0),
                },
                profile: "mbochs-small".to_owned(),
                phase: Phase::Pending,
            }],
        })
        .unwrap();
    let a = start(Arc::clone(&k));
    assert!(k.exists(&format!("sys/bus/mdev/devices/{U1}")));
    let p = get(&a.socket, "/v1/promises").json();
    assert_eq!(p["promises"][0]["phase"], "created", "{p}");
}

#[test]
fn an_interrupted_create_that_cannot_be_finished_is_dropped_and_a_recorded_one_is_reported() {
    let k = kernel();
    let store = StateStore::new(k.root().join(gpu_agent::state::DEFAULT_STATE_DIR));
    let promise = |uuid: &str, parent: &str, phase| Promise {
        device: Device::Mdev {
            uuid: uuid.parse().unwrap(),
            parent: parent.parse().unwrap(),
            type_id: "mbochs-small".parse().unwrap(),
        },
        owner: Owner {
            machine: None,
            request: None,
            index: None,
        },
        profile: "mbochs-small".to_owned(),
        phase,
    };
    store
        .save(&StateFile {
            version: STATE_VERSION,
            promises: vec![
                promise(U1, "gone", Phase::Pending),
                promise(
                    "6f1a2b3c-0000-4000-8000-000000000009",
                    "gone",
                    Phase::Created,
                ),
            ],
        })
        .unwrap();
    let a = start(Arc::clone(&k));
    let p = get(&a.socket, "/v1/promises").json();
    let outcomes: Vec<&str> = p["reconciled"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["outcome"].as_str().unwrap())
        .collect();
    assert_eq!(outcomes, vec!["dropped", "failed"], "{p}");
    assert_eq!(
        p["promises"].as_array().map(Vec::len),
        Some(1),
        "the created promise is kept"
    );
}

#[test]
fn two_creates_for_the_last_free_instance_exactly_one_succeeds() {
    let a = start(kernel());
    for i in 0..3 {
        let u = format!("6f1a2b3c-0000-4000-8000-00000000010{i}");
        assert_eq!(create(&a.socket, &u, "mbochs-large").status, 201);
    }
    let s1 = a.socket.clone();
    let s2 = a.socket.clone();
    let t1 = std::thread::spawn(move || {
        create(&s1, "6f1a2b3c-0000-4000-8000-000000000201", "mbochs-large").status
    });
    let t2 = std::thread::spawn(move || {
        create(&s2, "6f1a2b3c-0000-4000-8000-000000000202", "mbochs-large").status
    });
    let mut got = vec![t1.join().unwrap(), t2.join().unwrap()];
    got.sort_unstable();
    assert_eq!(got, vec![201, 503]);
}

#[test]
fn the_agent_waits_for_a_vgpu_apply_holding_the_layout_lock_and_reads_do_not() {
    let k = kernel();
    let a = start(Arc::clone(&k));
    // What `gpuslice vgpu apply` holds while it runs.
    let lock = gpu_sysfs::apply::LayoutLock::acquire(k.root(), None, &mut |_| {}).unwrap();
    let s = a.socket.clone();
    let writer = std::thread::spawn(move || {
        let t = Instant::now();
        let r = create(&s, U1, "mbochs-small");
        (r.status, t.elapsed())
    });
    std::thread::sleep(Duration::from_millis(500));
    let t = Instant::now();
    assert_eq!(get(&a.socket, "/v1/topology").status, 200);
    assert!(
        t.elapsed() < Duration::from_millis(400),
        "a read waited for the write"
    );
    assert!(
        !k.exists(&format!("sys/bus/mdev/devices/{U1}")),
        "no write under the lock"
    );
    drop(lock);
    let (status, waited) = writer.join().unwrap();
    assert_eq!(status, 201);
    assert!(waited >= Duration::from_millis(500));
}

#[test]
fn shutdown_removes_the_socket() {
    let a = start(kernel());
    let sock = a.socket.clone();
    assert!(sock.exists());
    a.stop();
    assert!(!sock.exists());
}
