//! The agent's API on the public fake kernel: every route and every error kind.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::sync::Arc;

use gpu_sysfs::Host as _;
use gpu_sysfs::testing::FakeKernel;
use support::{get, raw, request, start};

const U1: &str = "6f1a2b3c-0000-4000-8000-000000000001";
const U2: &str = "6f1a2b3c-0000-4000-8000-000000000002";

fn kernel() -> Arc<FakeKernel> {
    Arc::new(FakeKernel::sample_mdev_drivers().unwrap())
}

#[test]
fn the_read_routes_answer_with_revisioned_documents() {
    let a = start(kernel());
    let t = get(&a.socket, "/v1/topology");
    assert_eq!(t.status, 200, "{}", t.body);
    let v = t.json();
    assert_eq!(v["node"], "node-a");
    assert!(v["revision"].is_u64());
    assert!(v["mediatedDevices"]["parents"].is_array(), "{}", t.body);
    let h = get(&a.socket, "/v1/health");
    assert_eq!(h.status, 200);
    assert!(h.json()["gpus"].is_array());
    let z = get(&a.socket, "/healthz");
    assert_eq!(z.json()["status"], "ok");
    let l = get(&a.socket, "/v1/vgpus");
    assert_eq!(l.status, 200);
    assert_eq!(l.json()["mdevs"].as_array().map(Vec::len), Some(0));
    let p = get(&a.socket, "/v1/promises");
    assert_eq!(p.status, 200);
    // No metrics hook in this agent: the route says so.
    assert_eq!(get(&a.socket, "/metrics").kind(), "not-found");
}

#[test]
fn a_create_is_recorded_served_and_removed() {
    let k = kernel();
    let a = start(Arc::clone(&k));
    let before = get(&a.socket, "/v1/topology").json()["revision"]
        .as_u64()
        .unwrap();
    let body = format!(r#"{{"parent":"mbochs","profile":"mbochs-small","uuid":"{U1}"}}"#);
    let c = request(&a.socket, "POST", "/v1/vgpus", Some(&body));
    assert_eq!(c.status, 201, "{}", c.body);
    let v = c.json();
    assert_eq!(v["kind"], "mdev");
    assert_eq!(v["uuid"], U1);
    assert!(v["handoff"]["qemu"].as_str().unwrap().contains(U1));
    assert!(k.exists(&format!("sys/bus/mdev/devices/{U1}")));
    // The answer names the device nodes the VM's process must be allowed to open.
    let group = k
        .read_link(&format!("sys/bus/mdev/devices/{U1}/iommu_group"))
        .unwrap();
    let group = group.file_name().unwrap().to_string_lossy().into_owned();
    let nodes = v["handoff"]["deviceNodes"].as_array().unwrap();
    assert_eq!(nodes[0], "/dev/vfio/vfio", "{}", c.body);
    assert_eq!(
        nodes[1],
        format!("/dev/vfio/{group}").as_str(),
        "{}",
        c.body
    );
    let state = std::fs::read_to_string(a.agent.store().file()).unwrap();
    assert!(
        state.contains(U1) && state.contains("\"created\""),
        "{state}"
    );
    let after = get(&a.socket, "/v1/topology").json()["revision"]
        .as_u64()
        .unwrap();
    assert!(after > before, "the topology carries the new revision");
    // The same create again is idempotent.
    let again = request(&a.socket, "POST", "/v1/vgpus", Some(&body));
    assert_eq!(again.status, 200, "{}", again.body);
    assert_eq!(again.json()["changed"], false);
    let d = request(&a.socket, "DELETE", &format!("/v1/vgpus/{U1}"), None);
    assert_eq!(d.status, 200, "{}", d.body);
    assert!(!k.exists(&format!("sys/bus/mdev/devices/{U1}")));
    let state = std::fs::read_to_string(a.agent.store().file()).unwrap();
    assert!(!state.contains(U1), "the promise is forgotten: {state}");
}

#[test]
fn a_machine_create_derives_a_stable_uuid() {
    let a = start(kernel());
    let body =
        r#"{"parent":"mbochs","profile":"mbochs-small","machine":"vm1","request":"gpu","index":1}"#;
    let c = request(&a.socket, "POST", "/v1/vgpus", Some(body));
    assert_eq!(c.status, 201, "{}", c.body);
    let uuid = gpu_core::MdevUuid::for_machine("vm1", "gpu", 1).to_string();
    assert_eq!(c.json()["uuid"], uuid);
    let p = get(&a.socket, "/v1/promises").json();
    assert_eq!(p["promises"][0]["machine"], "vm1");
    assert_eq!(p["promises"][0]["index"], 1);
}

#[test]
fn bad_requests_are_json_errors_with_the_right_status_and_write_nothing() {
    let k = kernel();
    let a = start(Arc::clone(&k));
    let writes = k.writes().len();
    let cases: Vec<(&str, &str, String, u16, &str)> = vec![
        (
            "POST",
            "/v1/vgpus",
            "{not json".to_owned(),
            400,
            "invalid-request",
        ),
        (
            "POST",
            "/v1/vgpus",
            format!(
                r#"{{"parent":"mbochs","profile":"mbochs-small","uuid":"{U1}","colour":"red"}}"#
            ),
            400,
            "invalid-request",
        ),
        (
            "POST",
            "/v1/vgpus",
            format!(r#"{{"parent":"../mbochs","profile":"mbochs-small","uuid":"{U1}"}}"#),
            400,
            "invalid-request",
        ),
        (
            "POST",
            "/v1/vgpus",
            r#"{"parent":"mbochs","profile":"mbochs-small","uuid":"../../etc"}"#.to_owned(),
            400,
            "invalid-request",
        ),
        (
            "POST",
            "/v1/vgpus",
            r#"{"parent":"mbochs","profile":"mbochs-small","uuid":"not-a-uuid"}"#.to_owned(),
            400,
            "invalid-argument",
        ),
        (
            "POST",
            "/v1/vgpus",
            format!(r#"{{"parent":"mbochs","profile":"mbochs-huge","uuid":"{U1}"}}"#),
            400,
            "unknown-profile",
        ),
        (
            "POST",
            "/v1/vgpus",
            format!(r#"{{"parent":"nosuch","profile":"x","uuid":"{U1}"}}"#),
            404,
            "not-found",
        ),
        ("GET", "/v1/nothing", String::new(), 404, "unknown-route"),
        (
            "PATCH",
            "/v1/topology",
            String::new(),
            405,
            "method-not-allowed",
        ),
        (
            "DELETE",
            "/v1/vgpus/..%2Fetc",
            String::new(),
            400,
            "invalid-request",
        ),
        (
            "DELETE",
            "/v1/vgpus/neither",
            String::new(),
            400,
            "invalid-request",
        ),
        (
            "DELETE",
            "/v1/vgpus/x?force=maybe",
            String::new(),
            400,
            "invalid-request",
        ),
        (
            "GET",
            "/v1/events?since=abc",
            String::new(),
            400,
            "invalid-request",
        ),
        ("PUT", "/v1/layout", "configs: [".to_owned(), 400, "decode"),
        (
            "POST",
            "/v1/gpus/nosuch/bind",
            String::new(),
            404,
            "not-found",
        ),
    ];
    for (method, path, body, status, kind) in cases {
        let r = request(&a.socket, method, path, Some(&body));
        assert_eq!(r.status, status, "{method} {path}: {}", r.body);
        assert_eq!(r.kind(), kind, "{method} {path}: {}", r.body);
        assert!(r.headers.contains("application/json"), "{}", r.headers);
        assert!(!r.json()["error"]["message"].as_str().unwrap().is_empty());
    }
    let big = "x".repeat(gpu_agent::http::MAX_BODY + 10);
    let r = request(&a.socket, "POST", "/v1/vgpus", Some(&big));
    assert_eq!(r.status, 413, "{}", r.body);
    assert_eq!(r.kind(), "too-large");
    assert_eq!(k.writes().len(), writes, "no request wrote to the host");
    assert!(
        !a.agent.store().file().exists() || {
            let s = std::fs::read_to_string(a.agent.store().file()).unwrap();
            !s.contains(U1)
        }
    );
}

#[test]
fn the_same_uuid_as_another_type_is_a_409_conflict() {
    let a = start(kernel());
    let small = format!(r#"{{"parent":"mbochs","profile":"mbochs-small","uuid":"{U1}"}}"#);
    assert_eq!(
        request(&a.socket, "POST", "/v1/vgpus", Some(&small)).status,
        201
    );
    let large = format!(r#"{{"parent":"mbochs","profile":"mbochs-large","uuid":"{U1}"}}"#);
    let r = request(&a.socket, "POST", "/v1/vgpus", Some(&large));
    assert_eq!(r.status, 409, "{}", r.body);
    assert_eq!(r.kind(), "exists-other-type");
}

#[test]
fn an_exhausted_pool_is_503_with_the_errno() {
    let a = start(kernel());
    for i in 0..4 {
        let body = format!(
            r#"{{"parent":"mbochs","profile":"mbochs-large","uuid":"6f1a2b3c-0000-4000-8000-00000000010{i}"}}"#
        );
        assert_eq!(
            request(&a.socket, "POST", "/v1/vgpus", Some(&body)).status,
            201
        );
    }
    let r = request(
        &a.socket,
        "POST",
        "/v1/vgpus",
        Some(&format!(
            r#"{{"parent":"mbochs","profile":"mbochs-large","uuid":"{U2}"}}"#
        )),
    );
    assert_eq!(r.status, 503, "{}", r.body);
    assert_eq!(r.kind(), "exhausted");
    assert_eq!(r.json()["error"]["errnoName"], "ENOSPC");
    let s = std::fs::read_to_string(a.agent.store().file()).unwrap();
    assert!(!s.contains(U2), "a failed create leaves no promise: {s}");
}

#[test]
fn a_delete_of_an_instance_a_vm_holds_is_409_naming_the_pid_unless_forced() {
    let k = kernel();
    let a = start(Arc::clone(&k));
    let body = format!(r#"{{"parent":"mbochs","profile":"mbochs-small","uuid":"{U1}"}}"#);
    assert_eq!(
        request(&a.socket, "POST", "/v1/vgpus", Some(&body)).status,
        201
    );
    let pid = k
        .open_device(&format!("sys/bus/mdev/devices/{U1}"))
        .unwrap();
    let r = request(&a.socket, "DELETE", &format!("/v1/vgpus/{U1}"), None);
    assert_eq!(r.status, 409, "{}", r.body);
    assert_eq!(r.kind(), "in-use");
    assert!(r.body.contains(&format!("pid {pid}")), "{}", r.body);
    let f = request(
        &a.socket,
        "DELETE",
        &format!("/v1/vgpus/{U1}?force=true"),
        None,
    );
    assert_eq!(f.status, 200, "{}", f.body);
}

#[test]
fn the_event_stream_replays_changes_in_revision_order() {
    let a = start(kernel());
    let body = format!(r#"{{"parent":"mbochs","profile":"mbochs-small","uuid":"{U1}"}}"#);
    assert_eq!(
        request(&a.socket, "POST", "/v1/vgpus", Some(&body)).status,
        201
    );
    assert_eq!(
        request(&a.socket, "DELETE", &format!("/v1/vgpus/{U1}"), None).status,
        200
    );
    // The stream stays open; read what the backlog sends, then stop the agent to end it.
    let sock = a.socket.clone();
    let reader = std::thread::spawn(move || {
        raw(
            &sock,
            b"GET /v1/events?since=0 HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n",
        )
    });
    std::thread::sleep(std::time::Duration::from_millis(300));
    a.stop();
    let r = reader.join().unwrap();
    assert_eq!(r.status, 200);
    assert!(r.headers.contains("application/x-ndjson"), "{}", r.headers);
    let events: Vec<serde_json::Value> = r
        .body
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let kinds: Vec<&str> = events.iter().map(|e| e["kind"].as_str().unwrap()).collect();
    assert!(
        kinds.contains(&"vgpu-created") && kinds.contains(&"vgpu-removed"),
        "{kinds:?}"
    );
    assert!(kinds.contains(&"topology-changed"), "{kinds:?}");
    let revs: Vec<u64> = events
        .iter()
        .map(|e| e["revision"].as_u64().unwrap())
        .collect();
    assert!(revs.windows(2).all(|w| w[0] < w[1]), "{revs:?}");
}

#[test]
fn server_sent_events_are_offered_on_request() {
    let a = start(kernel());
    let body = format!(r#"{{"parent":"mbochs","profile":"mbochs-small","uuid":"{U1}"}}"#);
    assert_eq!(
        request(&a.socket, "POST", "/v1/vgpus", Some(&body)).status,
        201
    );
    let sock = a.socket.clone();
    let reader = std::thread::spawn(move || {
        raw(
            &sock,
            b"GET /v1/events?since=0 HTTP/1.1\r\nHost: a\r\nAccept: text/event-stream\r\nConnection: close\r\n\r\n",
        )
    });
    std::thread::sleep(std::time::Duration::from_millis(300));
    a.stop();
    let r = reader.join().unwrap();
    assert!(r.headers.contains("text/event-stream"), "{}", r.headers);
    assert!(r.body.contains("event: vgpu-created\n"), "{}", r.body);
    assert!(r.body.contains("id: 1\n"), "{}", r.body);
}

#[test]
fn a_layout_is_applied_and_a_dry_run_writes_nothing() {
    let k = kernel();
    let a = start(Arc::clone(&k));
    let layout = "version: v1\nvgpu-configs:\n  lab:\n    mbochs: {mbochs-small: 2}\n";
    let writes = k.writes().len();
    let d = request(&a.socket, "PUT", "/v1/layout?dryRun=true", Some(layout));
    assert_eq!(d.status, 200, "{}", d.body);
    assert_eq!(d.json()["status"], "dry-run");
    assert_eq!(k.writes().len(), writes);
    let r = request(&a.socket, "PUT", "/v1/layout", Some(layout));
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.json()["status"], "applied");
    let l = get(&a.socket, "/v1/vgpus").json();
    assert_eq!(l["mdevs"].as_array().map(Vec::len), Some(2));
}

#[test]
fn a_slow_client_does_not_hold_up_others() {
    let a = start(kernel());
    // Three connections that never finish their request head.
    let mut idle = Vec::new();
    for _ in 0..3 {
        let mut s = std::os::unix::net::UnixStream::connect(&a.socket).unwrap();
        std::io::Write::write_all(&mut s, b"GET /v1/topology HTTP/1.1\r\nHo").unwrap();
        idle.push(s);
    }
    let t = std::time::Instant::now();
    let r = get(&a.socket, "/v1/topology");
    assert_eq!(r.status, 200);
    assert!(t.elapsed() < std::time::Duration::from_secs(5));
}

#[test]
fn a_create_on_a_gpu_picks_a_vf_and_a_retry_is_the_same_instance() {
    let k = Arc::new(FakeKernel::a2_mdev_host().unwrap());
    let a = start(Arc::clone(&k));
    let body = r#"{"parent":"0000:08:00.0","profile":"A2-4Q","machine":"vm1"}"#;
    let c = request(&a.socket, "POST", "/v1/vgpus", Some(body));
    assert_eq!(c.status, 201, "{}", c.body);
    assert_ne!(
        c.json()["parent"],
        "0000:08:00.0",
        "a VF was picked: {}",
        c.body
    );
    let again = request(&a.socket, "POST", "/v1/vgpus", Some(body));
    assert_eq!(again.status, 200, "{}", again.body);
    assert_eq!(again.json()["uuid"], c.json()["uuid"]);
}

#[test]
fn a_body_announced_as_a_terabyte_gets_413_at_once_and_the_connection_closes_unread() {
    use std::io::{Read as _, Write as _};
    let a = start(kernel());
    let mut s = std::os::unix::net::UnixStream::connect(&a.socket).unwrap();
    s.set_read_timeout(Some(std::time::Duration::from_secs(30)))
        .unwrap();
    // The head only: the body is announced and never sent.
    s.write_all(
        b"POST /v1/vgpus HTTP/1.1\r\nHost: agent\r\nContent-Type: application/json\r\nContent-Length: 1000000000000\r\n\r\n",
    )
    .unwrap();
    let t0 = std::time::Instant::now();
    let mut out = Vec::new();
    // Read to the end: the agent closes the connection after its answer, without waiting for
    // (or draining) the body the client still has not sent.
    s.read_to_end(&mut out).unwrap();
    let took = t0.elapsed();
    let r = support::parse(&out);
    assert_eq!(r.status, 413, "{}", r.body);
    assert_eq!(r.kind(), "too-large");
    assert!(r.body.contains("1000000000000"), "{}", r.body);
    assert!(
        took < std::time::Duration::from_secs(3),
        "the answer and the close took {took:?}"
    );
}

#[test]
fn a_whole_gpu_bind_on_a_vgpu_host_is_a_409_conflict_naming_the_gpu_once() {
    let k = Arc::new(FakeKernel::a2_mdev_host().unwrap());
    let a = start(Arc::clone(&k));
    let r = request(&a.socket, "POST", "/v1/gpus/0000:08:00.0/bind", None);
    assert_eq!(r.status, 409, "{}", r.body);
    assert_eq!(r.kind(), "conflict");
    let message = r.json()["error"]["message"].as_str().unwrap().to_owned();
    assert_eq!(message.matches("0000:08:00.0").count(), 1, "{message}");
    assert!(message.contains("SR-IOV"), "{message}");
    // Nothing changed: the GPU keeps its driver.
    assert_eq!(
        k.read_link("sys/bus/pci/devices/0000:08:00.0/driver")
            .unwrap()
            .file_name()
            .unwrap(),
        "nvidia"
    );
    // A VF given as a GPU is the request's fault.
    let vf = request(&a.socket, "POST", "/v1/gpus/0000:08:00.4/bind", None);
    assert_eq!(vf.status, 400, "{}", vf.body);
}
