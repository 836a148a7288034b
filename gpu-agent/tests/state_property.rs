//! A property of the agent's records: whatever creates and deletes are asked for, with the state
//! store failing at random points (a full disk, a read-only one), after the next start the host
//! and the promises agree, every answer that said "done" holds, and no deleted instance comes back.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use gpu_agent::{Agent, AgentConfig, CreateRequest};
use gpu_sysfs::testing::FakeKernel;
use proptest::prelude::*;

const UUIDS: [&str; 3] = [
    "6f1a2b3c-0000-4000-8000-000000000001",
    "6f1a2b3c-0000-4000-8000-000000000002",
    "6f1a2b3c-0000-4000-8000-000000000003",
];
const ENOSPC: i32 = 28;
const EROFS: i32 = 30;

/// One request, and which of the (at most two) state writes it makes fail.
#[derive(Debug, Clone)]
struct Op {
    create: bool,
    uuid: usize,
    /// Bit 0: the first state write of the request fails; bit 1: the second.
    faults: u8,
    full_disk: bool,
}

fn op() -> impl Strategy<Value = Op> {
    (any::<bool>(), 0..UUIDS.len(), 0u8..4, any::<bool>()).prop_map(
        |(create, uuid, faults, full_disk)| Op {
            create,
            uuid,
            faults,
            full_disk,
        },
    )
}

fn open(k: &Arc<FakeKernel>) -> Arc<Agent> {
    let mut config = AgentConfig::new("node-a");
    config.lock_timeout = std::time::Duration::from_secs(20);
    Agent::open(Arc::clone(k) as Arc<dyn gpu_sysfs::Host>, config).unwrap()
}

fn on_host(k: &FakeKernel) -> BTreeSet<String> {
    gpu_sysfs::actuate::list_instances(k)
        .unwrap()
        .into_iter()
        .map(|i| i.uuid.to_string())
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn after_a_restart_host_and_promises_agree_and_no_deleted_instance_comes_back(
        ops in prop::collection::vec(op(), 1..10)
    ) {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let k = Arc::new(FakeKernel::sample_mdev_drivers().unwrap());
        let agent = open(&k);
        // What the last request answered as done says each UUID should be.
        let mut expected: BTreeMap<&str, bool> = BTreeMap::new();
        for o in &ops {
            let n = k.state_writes();
            let errno = if o.full_disk { ENOSPC } else { EROFS };
            k.fail_state_writes(
                [(o.faults & 1 != 0).then_some(n + 1), (o.faults & 2 != 0).then_some(n + 2)]
                    .into_iter()
                    .flatten(),
                errno,
            );
            let uuid = UUIDS[o.uuid];
            if o.create {
                let req = CreateRequest {
                    parent: "mbochs".to_owned(),
                    profile: "mbochs-small".to_owned(),
                    uuid: Some(uuid.to_owned()),
                    ..CreateRequest::default()
                };
                match rt.block_on(agent.create(req)) {
                    Ok(_) => {
                        prop_assert!(on_host(&k).contains(uuid), "a create answered done");
                        expected.insert(uuid, true);
                    }
                    Err(e) => prop_assert_eq!(e.status, 503, "{}", e.message),
                }
            } else {
                let before = on_host(&k);
                match rt.block_on(agent.remove(uuid.to_owned(), false)) {
                    Ok(_) => {
                        prop_assert!(!on_host(&k).contains(uuid), "a delete answered done");
                        expected.insert(uuid, false);
                    }
                    Err(e) if e.status == 404 => {
                        prop_assert!(!before.contains(uuid));
                        expected.insert(uuid, false);
                    }
                    Err(e) => {
                        prop_assert_eq!(e.status, 503, "{}", e.message);
                        prop_assert_eq!(on_host(&k), before, "a refused delete changes nothing");
                    }
                }
            }
            k.set_state_failing(None);
        }
        drop(agent);
        let again = open(&k);
        let host = on_host(&k);
        let state = again.store().load().unwrap();
        let promised: BTreeSet<String> =
            state.promises.iter().map(|p| p.device.id()).collect();
        prop_assert_eq!(&promised, &host, "host and promises agree");
        for p in &state.promises {
            prop_assert_eq!(p.phase, gpu_agent::Phase::Created, "every record finished");
        }
        for (uuid, present) in expected {
            prop_assert_eq!(host.contains(uuid), present, "{} as last answered", uuid);
        }
    }
}
