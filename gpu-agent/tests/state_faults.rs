//! The agent's promises where its own state meets the host: state paths linked out of the root,
//! a full disk, a read-only disk, a create or removal whose record fails half-way, an oversized
//! state file, a FIFO as the watched layout, and a request body announced too large.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::io::{Read as _, Write as _};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use gpu_agent::state::DEFAULT_STATE_DIR;
use gpu_agent::{Agent, AgentConfig, EventKind, WatchOptions, WatchedLayout};
use gpu_sysfs::Host as _;
use gpu_sysfs::testing::FakeKernel;
use support::{get, request, start, start_watched, wait_event};

const U1: &str = "6f1a2b3c-0000-4000-8000-000000000001";
const ENOSPC: i32 = 28;
const EROFS: i32 = 30;
const SOON: Duration = Duration::from_secs(5);

fn kernel() -> Arc<FakeKernel> {
    Arc::new(FakeKernel::sample_mdev_drivers().unwrap())
}

fn create(socket: &Path, uuid: &str) -> support::Reply {
    let body = format!(r#"{{"parent":"mbochs","profile":"mbochs-small","uuid":"{uuid}"}}"#);
    request(socket, "POST", "/v1/vgpus", Some(&body))
}

fn exists(k: &FakeKernel, uuid: &str) -> bool {
    k.exists(&format!("sys/bus/mdev/devices/{uuid}"))
}

fn phases(k: &FakeKernel) -> Vec<String> {
    let text = std::fs::read_to_string(k.root().join(DEFAULT_STATE_DIR).join("promises.json"))
        .unwrap_or_default();
    let v: serde_json::Value = serde_json::from_str(&text).unwrap_or_default();
    v["promises"]
        .as_array()
        .map(|ps| {
            ps.iter()
                .map(|p| p["phase"].as_str().unwrap_or("").to_owned())
                .collect()
        })
        .unwrap_or_default()
}

fn open_error(k: Arc<FakeKernel>) -> String {
    Agent::open(k, AgentConfig::new("node-a"))
        .expect_err("the agent refused to start")
        .message
}

#[test]
fn a_state_dir_linked_out_of_the_root_is_refused_at_start_naming_the_link() {
    for linked in ["var/lib/gpuslice/agent", "var/lib"] {
        let k = kernel();
        let outside = tempfile::tempdir().unwrap();
        let link = k.root().join(linked);
        std::fs::create_dir_all(link.parent().unwrap()).unwrap();
        std::os::unix::fs::symlink(outside.path(), &link).unwrap();
        let message = open_error(Arc::clone(&k));
        assert!(message.contains(&link.display().to_string()), "{message}");
        assert!(message.contains("outside the root"), "{message}");
        assert_eq!(
            std::fs::read_dir(outside.path()).unwrap().count(),
            0,
            "nothing was written outside the root"
        );
    }
}

#[test]
fn a_temporary_state_file_linked_out_is_never_written_through() {
    let k = kernel();
    let dir = k.root().join(DEFAULT_STATE_DIR);
    std::fs::create_dir_all(&dir).unwrap();
    let outside = tempfile::tempdir().unwrap();
    let victim = outside.path().join("victim");
    std::fs::write(&victim, "keep").unwrap();
    std::os::unix::fs::symlink(&victim, dir.join(".promises.json.tmp")).unwrap();
    let a = start(Arc::clone(&k));
    assert_eq!(create(&a.socket, U1).status, 201);
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "keep");
    assert_eq!(phases(&k), ["created"]);
}

#[test]
fn a_delete_on_a_full_disk_is_refused_with_nothing_changed() {
    let k = kernel();
    let a = start(Arc::clone(&k));
    assert_eq!(create(&a.socket, U1).status, 201);
    k.set_state_failing(Some(ENOSPC));
    let d = request(&a.socket, "DELETE", &format!("/v1/vgpus/{U1}"), None);
    assert_eq!(d.status, 503, "{}", d.body);
    assert!(
        d.json()["error"]["message"]
            .as_str()
            .unwrap()
            .contains("nothing was removed")
    );
    assert_eq!(d.json()["error"]["errnoName"], "ENOSPC", "{}", d.body);
    assert!(exists(&k, U1), "the instance is still there");
    assert_eq!(phases(&k), ["created"]);
    a.stop();
    k.set_state_failing(None);
    let b = start(Arc::clone(&k));
    assert!(exists(&k, U1));
    assert_eq!(
        get(&b.socket, "/v1/promises").json()["reconciled"][0]["outcome"],
        "present"
    );
}

#[test]
fn a_delete_on_a_read_only_state_dir_is_refused_and_a_restart_keeps_the_instance() {
    let k = kernel();
    let a = start(Arc::clone(&k));
    assert_eq!(create(&a.socket, U1).status, 201);
    k.set_state_failing(Some(EROFS));
    let d = request(&a.socket, "DELETE", &format!("/v1/vgpus/{U1}"), None);
    assert_eq!(d.status, 503, "{}", d.body);
    assert!(exists(&k, U1));
    a.stop();
    // Still read-only at the next start: the agent starts, nothing is lost or re-created.
    let b = start(Arc::clone(&k));
    assert!(exists(&k, U1));
    assert_eq!(phases(&k), ["created"]);
    b.stop();
}

#[test]
fn a_delete_whose_record_fails_after_the_removal_says_so_and_is_never_undone() {
    let k = kernel();
    let a = start(Arc::clone(&k));
    assert_eq!(create(&a.socket, U1).status, 201);
    // The `removing` record is written; the one that forgets the promise fails.
    k.fail_state_writes([k.state_writes() + 2], EROFS);
    let d = request(&a.socket, "DELETE", &format!("/v1/vgpus/{U1}"), None);
    assert_eq!(d.status, 200, "{}", d.body);
    let warning = d.json()["warnings"][0].as_str().unwrap().to_owned();
    assert!(warning.contains("was removed"), "{warning}");
    assert!(!exists(&k, U1));
    assert_eq!(phases(&k), ["removing"]);
    a.stop();
    let b = start(Arc::clone(&k));
    assert!(!exists(&k, U1), "a removed instance is never re-created");
    let p = get(&b.socket, "/v1/promises").json();
    assert_eq!(p["reconciled"][0]["outcome"], "removed", "{p}");
    assert_eq!(phases(&k), Vec::<String>::new());
}

#[test]
fn a_create_whose_created_record_fails_answers_the_truth_and_the_next_start_finishes_it() {
    let k = kernel();
    let a = start(Arc::clone(&k));
    // `pending` is written; `created` fails (the state dir turned read-only in between).
    k.fail_state_writes([k.state_writes() + 2], EROFS);
    let c = create(&a.socket, U1);
    assert_eq!(c.status, 201, "{}", c.body);
    assert!(
        c.json()["warnings"][0]
            .as_str()
            .unwrap()
            .contains("was created")
    );
    assert!(exists(&k, U1), "the mdev exists, as the answer says");
    assert_eq!(phases(&k), ["pending"]);
    a.stop();
    let b = start(Arc::clone(&k));
    assert_eq!(phases(&k), ["created"]);
    assert!(exists(&k, U1));
    b.stop();
}

#[test]
fn a_create_whose_pending_record_fails_is_refused_with_nothing_created() {
    let k = kernel();
    let a = start(Arc::clone(&k));
    k.set_state_failing(Some(ENOSPC));
    let c = create(&a.socket, U1);
    assert_eq!(c.status, 503, "{}", c.body);
    assert!(c.body.contains("nothing was created"), "{}", c.body);
    assert!(!exists(&k, U1));
}

#[test]
fn an_oversized_state_file_is_refused_before_it_is_read_whole() {
    let k = kernel();
    let dir = k.root().join(DEFAULT_STATE_DIR);
    std::fs::create_dir_all(&dir).unwrap();
    // Sparse: 1 GiB long, no disk used.
    let f = std::fs::File::create(dir.join("promises.json")).unwrap();
    f.set_len(1 << 30).unwrap();
    let message = open_error(k);
    assert!(message.contains("larger than"), "{message}");
    assert!(message.contains("promises.json"), "{message}");
}

#[test]
fn deleting_a_vgpu_that_never_existed_answers_404_and_publishes_nothing() {
    let a = start(kernel());
    let before = a.agent.events().revision();
    let d = request(&a.socket, "DELETE", &format!("/v1/vgpus/{U1}"), None);
    assert_eq!(d.status, 404, "{}", d.body);
    assert_eq!(d.kind(), "not-found");
    let (events, _) = a.agent.events().subscribe(before);
    assert!(
        events.iter().all(|e| e.kind != EventKind::VgpuRemoved),
        "{events:?}"
    );
}

#[test]
fn a_body_announced_over_the_cap_is_refused_at_once_without_waiting_for_it() {
    let a = start(kernel());
    let mut s = UnixStream::connect(&a.socket).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
    s.write_all(
        b"POST /v1/vgpus HTTP/1.1\r\nHost: agent\r\nContent-Type: application/json\r\nContent-Length: 1000000000000\r\n\r\n{",
    )
    .unwrap();
    let mut out = vec![0u8; 4096];
    let n = s.read(&mut out).expect("an answer before the body timeout");
    let reply = support::parse(&out[..n]);
    assert_eq!(reply.status, 413, "{}", reply.body);
}

fn layout(n: u32) -> String {
    format!("version: v1\nvgpu-configs:\n  lab:\n    mbochs: {{mbochs-small: {n}}}\n")
}

#[test]
fn a_fifo_renamed_over_the_watched_layout_is_refused_and_the_watcher_keeps_watching() {
    let k = kernel();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("layout.yaml");
    std::fs::write(&file, layout(1)).unwrap();
    let opts = WatchOptions {
        resync: None,
        layout: Some(WatchedLayout {
            path: file.clone(),
            config: Some("lab".into()),
        }),
        ..WatchOptions::default()
    };
    let a = start_watched(Arc::clone(&k), |_| {}, Some(opts));
    let first = wait_event(&a.agent, SOON, |e| e.kind == EventKind::LayoutApplied)
        .expect("the layout applied at start");
    let fifo = dir.path().join("fifo");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::S_IRWXU).unwrap();
    std::fs::rename(&fifo, &file).unwrap();
    let refused = wait_event(&a.agent, SOON, |e| {
        e.kind == EventKind::LayoutRefused && e.revision > first.revision
    })
    .expect("a layout-refused event for the FIFO");
    assert!(
        refused.data["message"].as_str().unwrap().contains("FIFO"),
        "{}",
        refused.data
    );
    let next = dir.path().join("next.yaml");
    std::fs::write(&next, layout(2)).unwrap();
    std::fs::rename(&next, &file).unwrap();
    let applied = wait_event(&a.agent, SOON, |e| {
        e.kind == EventKind::LayoutApplied && e.revision > refused.revision
    })
    .expect("the valid layout renamed in later is applied");
    assert_eq!(applied.data["status"], "applied", "{}", applied.data);
}

#[test]
fn an_instance_linked_out_of_the_root_is_named_not_reported_absent() {
    let k = kernel();
    let outside = tempfile::tempdir().unwrap();
    let link = k.root().join(format!("sys/bus/mdev/devices/{U1}"));
    std::os::unix::fs::symlink(outside.path(), &link).unwrap();
    let a = start(Arc::clone(&k));
    let l = get(&a.socket, "/v1/vgpus").json();
    assert!(l["warnings"][0].as_str().unwrap().contains(U1), "{l}");
    let d = request(&a.socket, "DELETE", &format!("/v1/vgpus/{U1}"), None);
    assert_eq!(d.status, 404, "{}", d.body);
    assert!(d.body.contains("cannot be followed"), "{}", d.body);
    assert!(
        std::fs::symlink_metadata(&link).is_ok(),
        "nothing was removed"
    );
}
