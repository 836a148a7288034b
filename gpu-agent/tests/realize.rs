//! `POST /v1/realize`: a placed Machine's devices made through the agent by the node's one
//! writer (`gpu_node::Node::realize`, what `gpuslice realize --allocation` calls), the allocation
//! answered as realized (`status: created`), and the health rule of a bind kept.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::sync::Arc;

use gpu_core::Allocation;
use gpu_sysfs::discover::DiscoverOptions;
use gpu_sysfs::testing::{FakeKernel, TreeBuilder};
use support::{request, start};

const NODE: &str = "node-a";

/// What `gpuslice place --save` records: `machine` placed on the node as discovery reads it.
fn placed(k: &FakeKernel, machine: serde_json::Value) -> Allocation {
    let t = gpu_sysfs::discover::discover(k, &DiscoverOptions::new(NODE)).unwrap();
    gpu_sched::testing::placed_on(t, machine)
}

fn mdev_count(k: &FakeKernel) -> usize {
    let t = gpu_sysfs::discover::discover(k, &DiscoverOptions::new(NODE)).unwrap();
    let parents = t.mediated_devices.parents.iter();
    parents.map(|p| p.instances.len()).sum()
}

#[test]
fn a_placed_machine_is_realized_through_the_agent_and_answered_as_created() {
    let k = Arc::new(FakeKernel::a2_mdev_host().unwrap());
    let machine = serde_json::json!({"name": "vm1", "devices": [
        {"name": "gpu", "profile": "A2-4Q", "count": 2}]});
    let allocation = placed(&k, machine);
    assert_eq!(allocation.status.as_str(), "pending");
    let body = serde_json::to_string(&allocation).unwrap();
    let a = start(Arc::clone(&k));
    let r = request(&a.socket, "POST", "/v1/realize", Some(&body));
    assert_eq!(r.status, 201, "{}", r.body);
    let v = r.json();
    assert_eq!(v["changed"], true);
    assert_eq!(v["machine"], "vm1");
    assert_eq!(v["devices"].as_array().map(Vec::len), Some(2), "{}", r.body);
    assert_eq!(v["allocation"]["status"], "created", "{}", r.body);
    assert_eq!(v["allocation"]["machine"], "vm1");
    assert!(v["revision"].as_u64().is_some(), "{}", r.body);
    assert_eq!(mdev_count(&k), 2, "both vGPUs are on the host");
    for d in &allocation.devices {
        let gpu_core::AllocatedDevice::Vgpu { uuid, .. } = d else {
            panic!("a vGPU allocation")
        };
        assert!(r.body.contains(&uuid.to_string()), "{uuid} in {}", r.body);
    }
    // Asked again: nothing written, answered 200.
    let writes = k.writes().len();
    let r = request(&a.socket, "POST", "/v1/realize", Some(&body));
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.json()["changed"], false);
    assert_eq!(k.writes().len(), writes, "nothing written the second time");
    a.stop();
}

#[test]
fn an_allocation_for_another_node_or_not_an_allocation_is_refused_with_nothing_written() {
    let k = Arc::new(FakeKernel::a2_mdev_host().unwrap());
    let machine = serde_json::json!({"name": "vm1", "devices": [
        {"name": "gpu", "profile": "A2-4Q", "count": 1}]});
    let mut allocation = placed(&k, machine);
    allocation.node = "node-b".to_owned();
    let body = serde_json::to_string(&allocation).unwrap();
    let a = start(Arc::clone(&k));
    let before = k.snapshot().unwrap();
    let r = request(&a.socket, "POST", "/v1/realize", Some(&body));
    assert_eq!(r.status, 400, "{}", r.body);
    assert_eq!(r.kind(), "invalid-request", "{}", r.body);
    let r = request(&a.socket, "POST", "/v1/realize", Some("{\"nodes\": 3}"));
    assert!(r.status >= 400 && r.status < 500, "{}", r.body);
    assert_eq!(k.snapshot().unwrap(), before, "nothing written");
    a.stop();
}

/// One GPU with three fatal AER errors (Unhealthy), alone in its IOMMU group on `nvidia`.
fn unhealthy_gpu() -> Arc<FakeKernel> {
    let mut b = TreeBuilder::new();
    support::unhealthy_gpu(&mut b);
    Arc::new(FakeKernel::new(b.finish().unwrap()).unwrap())
}

#[test]
fn an_allocation_on_an_unhealthy_gpu_is_refused_with_409_unless_forced() {
    let k = unhealthy_gpu();
    let t = gpu_sysfs::discover::discover(k.as_ref(), &DiscoverOptions::new(NODE)).unwrap();
    let name = &t.gpus[0].name;
    let body = format!(
        r#"{{"machine": "vm-1", "node": "{NODE}", "devices": [{{"kind": "gpu", "request": "gpu", "name": "{name}", "address": "0000:01:00.0"}}]}}"#
    );
    let a = start(Arc::clone(&k));
    let before = k.snapshot().unwrap();
    let r = request(&a.socket, "POST", "/v1/realize", Some(&body));
    assert_eq!(r.status, 409, "{}", r.body);
    assert_eq!(r.kind(), "unhealthy", "{}", r.body);
    let message = r.json()["error"]["message"].as_str().unwrap().to_owned();
    assert!(
        message.starts_with("Machine vm-1: 0000:01:00.0 is Unhealthy (AER fatal 3"),
        "{message}"
    );
    assert_eq!(k.snapshot().unwrap(), before, "nothing written");

    let r = request(&a.socket, "POST", "/v1/realize?force=true", Some(&body));
    assert_eq!(r.status, 201, "{}", r.body);
    assert!(
        r.json()["warnings"]
            .to_string()
            .contains("0000:01:00.0 is Unhealthy"),
        "{}",
        r.body
    );
    assert_eq!(r.json()["allocation"]["status"], "created");
    a.stop();
}

#[test]
fn an_interrupted_write_is_undone_at_start_and_shown_on_healthz() {
    use gpu_node::intent::{INTENT_DIR, INTENT_FILE, Intent, Planned};
    use gpu_sysfs::Host;
    let k = Arc::new(FakeKernel::a2_mdev_host().unwrap());
    let machine = serde_json::json!({"name": "vm1", "devices": [
        {"name": "gpu", "profile": "A2-4Q", "count": 1}]});
    let allocation = placed(&k, machine);
    let opts = DiscoverOptions::new(NODE);
    gpu_node::Node::new(k.as_ref(), &opts)
        .realize(&allocation)
        .unwrap();
    assert_eq!(mdev_count(&k), 1);
    let gpu_core::AllocatedDevice::Vgpu { uuid, .. } = &allocation.devices[0] else {
        panic!("a vGPU")
    };
    // A realize killed after its first write: its record left `started`.
    let killed = Intent::new("realize", "realize Machine vm1", "check")
        .creating(vec![Planned::Mdev { uuid: *uuid }]);
    k.create_dir_all(INTENT_DIR).unwrap();
    k.write_atomic(INTENT_FILE, &serde_json::to_vec(&killed).unwrap())
        .unwrap();
    let a = start(Arc::clone(&k));
    assert_eq!(
        mdev_count(&k),
        0,
        "what the interrupted call made is undone"
    );
    let r = support::get(&a.socket, "/healthz");
    assert_eq!(r.status, 200, "{}", r.body);
    let w = &r.json()["interruptedWrite"];
    assert_eq!(w["intent"]["op"], "realize", "{}", r.body);
    assert_eq!(
        w["rolledBack"][0],
        format!("removed mdev {uuid}"),
        "{}",
        r.body
    );
    assert_eq!(w["resolved"], true);
    a.stop();
}
