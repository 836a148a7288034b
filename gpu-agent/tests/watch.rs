//! The agent keeps the truth current: uevents from a fake source, health verdicts re-read on
//! each resync, a watched layout file, and a sysfs file that does not answer.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use gpu_agent::{ChannelSource, EventKind, WatchOptions, WatchedLayout};
use gpu_sysfs::Host as _;
use gpu_sysfs::testing::FakeKernel;
use support::{get, request, start_watched, wait_event};

const U1: &str = "6f1a2b3c-0000-4000-8000-000000000001";
const SOON: Duration = Duration::from_secs(5);

fn quiet() -> WatchOptions {
    WatchOptions {
        resync: None,
        ..WatchOptions::default()
    }
}

fn mdevs(socket: &Path) -> usize {
    get(socket, "/v1/vgpus").json()["mdevs"]
        .as_array()
        .map_or(0, Vec::len)
}

fn served_instances(socket: &Path) -> usize {
    let t = get(socket, "/v1/topology").json();
    t["mediatedDevices"]["parents"].as_array().map_or(0, |ps| {
        ps.iter()
            .map(|p| p["instances"].as_array().map_or(0, Vec::len))
            .sum()
    })
}

#[test]
fn a_uevent_for_an_mdev_made_by_hand_publishes_it_and_a_new_topology() {
    let k = Arc::new(FakeKernel::sample_mdev_drivers().unwrap());
    let (tx, source) = ChannelSource::new();
    let opts = WatchOptions {
        uevents: Some(Box::new(source)),
        ..quiet()
    };
    let a = start_watched(
        Arc::clone(&k),
        |c| c.hooks.metrics = Some(Arc::new(|_| Ok("# the host's metrics\n".to_owned()))),
        Some(opts),
    );
    assert_eq!(served_instances(&a.socket), 0);
    let before = a.agent.snapshot().revision;
    // Behind the agent's back, as `echo UUID > create` would.
    k.write(
        "sys/class/mdev_bus/mbochs/mdev_supported_types/mbochs-small/create",
        U1.as_bytes(),
    )
    .unwrap();
    let msg = format!(
        "add@/devices/virtual/mbochs/mbochs/{U1}\0ACTION=add\0DEVPATH=/devices/virtual/mbochs/mbochs/{U1}\0SUBSYSTEM=mdev\0MDEV_TYPE=mbochs-small\0SEQNUM=7\0"
    );
    tx.send(msg.into_bytes()).unwrap();
    let seen = wait_event(&a.agent, SOON, |e| e.kind == EventKind::Uevent).expect("uevent");
    assert_eq!(seen.data["action"], "add");
    assert_eq!(seen.data["subsystem"], "mdev");
    let changed = wait_event(&a.agent, SOON, |e| {
        e.kind == EventKind::TopologyChanged && e.revision > seen.revision
    })
    .expect("a new revision after the uevent");
    assert!(changed.revision > before);
    assert_eq!(served_instances(&a.socket), 1);
    assert!(a.agent.snapshot().revision >= changed.revision);
    assert_eq!(a.agent.stats().uevents_seen(), 1);
    // Only mbochs was read again, and what is served is what a full read gives.
    assert_eq!(a.agent.stats().narrow_rereads(), 1);
    let (full, _) = gpu_agent::agent::compose_topology(a.agent.host(), a.agent.config()).unwrap();
    assert_eq!(a.agent.snapshot().topology, full);
    let m = get(&a.socket, "/metrics").body;
    assert!(m.starts_with("# the host's metrics\n"), "{m}");
    for line in [
        "gpuslice_agent_uevents_seen_total 1\n",
        "gpuslice_agent_uevents_relevant_total 1\n",
        "gpuslice_agent_narrow_rereads_total 1\n",
        "gpuslice_agent_reads_timed_out_total 0\n",
    ] {
        assert!(m.contains(line), "{line:?} in {m}");
    }
    assert!(
        m.contains("gpuslice_agent_resync_last_duration_seconds "),
        "{m}"
    );
    assert!(m.contains("gpuslice_agent_events_sent_total "), "{m}");
}

#[test]
fn a_gpu_bound_to_vfio_pci_by_hand_is_re_read_alone_and_served_with_its_new_driver() {
    let k = Arc::new(FakeKernel::passthrough_host().unwrap());
    let (tx, source) = ChannelSource::new();
    let opts = WatchOptions {
        uevents: Some(Box::new(source)),
        ..quiet()
    };
    let a = start_watched(Arc::clone(&k), |_| {}, Some(opts));
    let dev = "0000:05:00.0";
    k.bind_by_hand(dev, "amdgpu", "vfio-pci").unwrap();
    let path = format!("/devices/pci0000:00/0000:00:03.0/{dev}");
    for (action, driver) in [("unbind", None), ("bind", Some("vfio-pci"))] {
        let mut msg = format!(
            "{action}@{path}\0ACTION={action}\0DEVPATH={path}\0SUBSYSTEM=pci\0PCI_SLOT_NAME={dev}\0"
        );
        if let Some(d) = driver {
            msg.push_str(&format!("DRIVER={d}\0"));
        }
        tx.send(msg.into_bytes()).unwrap();
    }
    let bound = wait_event(&a.agent, SOON, |e| {
        e.kind == EventKind::Uevent && e.data["action"] == "bind"
    })
    .expect("the bind uevent");
    wait_event(&a.agent, SOON, |e| {
        e.kind == EventKind::TopologyChanged && e.revision > bound.revision
    })
    .expect("a new revision after the bind");
    let t = get(&a.socket, "/v1/topology").json();
    let gpu = t["gpus"]
        .as_array()
        .and_then(|g| g.iter().find(|g| g["address"] == dev))
        .cloned()
        .unwrap();
    assert_eq!(gpu["driver"], "vfio-pci");
    assert_eq!(gpu["state"], "in-use");
    assert_eq!(a.agent.stats().narrow_rereads(), 1);
    let (full, _) = gpu_agent::agent::compose_topology(a.agent.host(), a.agent.config()).unwrap();
    assert_eq!(a.agent.snapshot().topology, full);
}

#[test]
fn irrelevant_and_malformed_uevents_change_nothing_but_are_counted() {
    let k = Arc::new(FakeKernel::sample_mdev_drivers().unwrap());
    let (tx, source) = ChannelSource::new();
    let opts = WatchOptions {
        uevents: Some(Box::new(source)),
        ..quiet()
    };
    let a = start_watched(Arc::clone(&k), |_| {}, Some(opts));
    let rev = a.agent.events().revision();
    tx.send(b"add@/devices/virtual/net/tap0\0SUBSYSTEM=net\0".to_vec())
        .unwrap();
    tx.send(b"\xff\xfe garbage without a header".to_vec())
        .unwrap();
    tx.send(b"libudev\0\xfe\xed".to_vec()).unwrap();
    let end = Instant::now() + SOON;
    while a.agent.stats().uevents_seen() < 3 && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(a.agent.stats().uevents_seen(), 3);
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(a.agent.events().revision(), rev);
}

const FATAL: &str = "Undefined 0\nDLP 0\nSDES 0\nTLP 0\nFCP 0\nCmpltTO 0\nCmpltAbrt 0\nUnxCmplt 0\nRxOF 0\nMalfTLP 1\nECRC 0\nUnsupReq 0\nACSViol 0\nTOTAL_ERR_FATAL 1\n";

#[test]
fn a_climbing_fatal_aer_counter_turns_the_gpu_unhealthy_with_an_evacuation_plan() {
    let k = Arc::new(FakeKernel::a2_mdev_host().unwrap());
    let opts = WatchOptions {
        resync: Some(Duration::from_millis(200)),
        ..WatchOptions::default()
    };
    let a = start_watched(Arc::clone(&k), |_| {}, Some(opts));
    let body = r#"{"parent":"0000:08:00.4","profile":"nvidia-746","machine":"vm-a"}"#;
    let r = request(&a.socket, "POST", "/v1/vgpus", Some(body));
    assert_eq!(r.status, 201, "{}", r.body);
    let from = a.agent.events().revision();
    std::fs::write(
        k.root()
            .join("sys/bus/pci/devices/0000:08:00.0/aer_dev_fatal"),
        FATAL,
    )
    .unwrap();
    let e = wait_event(&a.agent, SOON, |e| {
        e.kind == EventKind::HealthChanged
            && e.revision > from
            && e.data["health"]["state"] == "Unhealthy"
    })
    .expect("an Unhealthy event within one resync");
    assert_eq!(e.data["address"], "0000:08:00.0");
    assert!(
        e.data["reason"]
            .as_str()
            .unwrap()
            .to_lowercase()
            .contains("fatal"),
        "{}",
        e.data
    );
    let machines = e.data["evacuation"]["machines"].as_array().unwrap();
    assert_eq!(machines.len(), 1, "{}", e.data);
    assert_eq!(machines[0]["machine"], "vm-a");
    assert!(!machines[0]["affected"].as_array().unwrap().is_empty());
    let t = get(&a.socket, "/v1/topology").json();
    assert_eq!(
        t["gpus"][0]["health"]["state"], "Unhealthy",
        "{}",
        t["gpus"][0]["health"]
    );
}

fn layout(n: u32) -> String {
    format!("version: v1\nvgpu-configs:\n  lab:\n    mbochs: {{mbochs-small: {n}}}\n")
}

fn applied_after(a: &support::Running, after: u64) -> gpu_agent::Event {
    wait_event(&a.agent, SOON, |e| {
        e.kind == EventKind::LayoutApplied && e.revision > after
    })
    .expect("a layout-applied event")
}

#[test]
fn the_watched_layout_is_applied_at_start_and_again_when_the_file_is_edited() {
    let k = Arc::new(FakeKernel::sample_mdev_drivers().unwrap());
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("layout.yaml");
    std::fs::write(&file, layout(2)).unwrap();
    let opts = WatchOptions {
        layout: Some(WatchedLayout {
            path: file.clone(),
            config: Some("lab".into()),
        }),
        ..quiet()
    };
    let a = start_watched(Arc::clone(&k), |_| {}, Some(opts));
    let first = applied_after(&a, 0);
    assert_eq!(first.data["status"], "applied", "{}", first.data);
    assert_eq!(first.data["source"], file.display().to_string());
    assert_eq!(mdevs(&a.socket), 2);
    std::fs::write(&file, layout(3)).unwrap();
    let second = applied_after(&a, first.revision);
    assert_eq!(second.data["status"], "applied", "{}", second.data);
    assert_eq!(mdevs(&a.socket), 3);
    // A broken edit is refused and changes nothing.
    std::fs::write(&file, "version: v1\nvgpu-configs: [").unwrap();
    let refused = wait_event(&a.agent, SOON, |e| e.kind == EventKind::LayoutRefused)
        .expect("a layout-refused event");
    assert!(refused.revision > second.revision);
    assert_eq!(mdevs(&a.socket), 3);
}

/// Lays out a directory as the kubelet mounts a ConfigMap: `KEY -> ..data/KEY`,
/// `..data -> ..<timestamp>`, the files in the timestamped directory.
fn configmap_version(dir: &Path, version: &str, text: &str) {
    let v = dir.join(version);
    std::fs::create_dir(&v).unwrap();
    std::fs::write(v.join("layout.yaml"), text).unwrap();
    let tmp = dir.join("..data_tmp");
    std::os::unix::fs::symlink(version, &tmp).unwrap();
    std::fs::rename(&tmp, dir.join("..data")).unwrap();
}

#[test]
fn a_configmap_swap_by_symlink_rename_re_applies_the_layout() {
    let k = Arc::new(FakeKernel::sample_mdev_drivers().unwrap());
    let dir = tempfile::tempdir().unwrap();
    configmap_version(dir.path(), "..2026_12_01_10_00_00.1", &layout(1));
    let file = dir.path().join("layout.yaml");
    std::os::unix::fs::symlink("..data/layout.yaml", &file).unwrap();
    let opts = WatchOptions {
        layout: Some(WatchedLayout {
            path: file,
            config: None,
        }),
        ..quiet()
    };
    let a = start_watched(Arc::clone(&k), |_| {}, Some(opts));
    let first = applied_after(&a, 0);
    assert_eq!(mdevs(&a.socket), 1);
    configmap_version(dir.path(), "..2026_12_01_10_05_00.2", &layout(4));
    let second = applied_after(&a, first.revision);
    assert_eq!(second.data["status"], "applied", "{}", second.data);
    assert_eq!(mdevs(&a.socket), 4);
}

#[test]
fn a_fifo_in_place_of_a_sysfs_file_does_not_stall_the_other_answers() {
    let k = Arc::new(FakeKernel::a2_mdev_host().unwrap());
    let opts = WatchOptions {
        resync: Some(Duration::from_millis(100)),
        read_deadline: Duration::from_millis(300),
        ..WatchOptions::default()
    };
    let a = start_watched(Arc::clone(&k), |_| {}, Some(opts));
    let fifo = k
        .root()
        .join("sys/bus/pci/devices/0000:08:00.0/aer_dev_fatal");
    std::fs::remove_file(&fifo).ok();
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
    // The host refuses to read a FIFO (it would wait for a writer that never comes): resyncs go
    // on, none waits on it, and every answer comes at once.
    let before = a.agent.stats().resyncs();
    let t0 = Instant::now();
    while a.agent.stats().resyncs() < before + 3 {
        assert!(
            t0.elapsed() < SOON,
            "resyncs stopped after the FIFO appeared"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    for path in ["/v1/topology", "/v1/health", "/healthz"] {
        let t = Instant::now();
        let r = get(&a.socket, path);
        assert_eq!(r.status, 200, "{path}: {}", r.body);
        assert!(t.elapsed() < Duration::from_secs(2), "{path} waited");
    }
    let t = get(&a.socket, "/v1/topology").json();
    assert_eq!(t["gpus"][0]["name"], "nvidia0", "{t}");
    assert_eq!(a.agent.stats().reads_timed_out(), 0);
}

/// The layout document of the example DaemonSet's ConfigMap.
fn example_configmap_layout() -> String {
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../examples/agent/daemonset.yaml"
    ))
    .unwrap();
    for doc in serde_yaml_ng::Deserializer::from_str(&text) {
        let v = <serde_yaml_ng::Value as serde::Deserialize>::deserialize(doc).unwrap();
        if v["kind"].as_str() == Some("ConfigMap") {
            return v["data"]["layout.yaml"].as_str().unwrap().to_owned();
        }
    }
    panic!("no ConfigMap in examples/agent/daemonset.yaml");
}

#[test]
fn the_example_configmap_plans_its_counts_and_its_bus_id_pins() {
    let text = example_configmap_layout();
    let l40s = support::start(Arc::new(FakeKernel::l40s_vendor_vfio_host(4).unwrap()));
    let r = request(
        &l40s.socket,
        "PUT",
        "/v1/layout?dryRun=true&config=l40s-pins",
        Some(&text),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.json()["status"], "dry-run");
    let a2 = support::start(Arc::new(FakeKernel::a2_mdev_host().unwrap()));
    let r = request(
        &a2.socket,
        "PUT",
        "/v1/layout?dryRun=true&config=a2-4q",
        Some(&text),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.json()["status"], "dry-run");
}

#[test]
fn a_watched_layout_refused_while_vgpu_apply_holds_the_lock_is_applied_once_it_is_free() {
    let k = Arc::new(FakeKernel::sample_mdev_drivers().unwrap());
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("layout.yaml");
    let opts = WatchOptions {
        layout: Some(WatchedLayout {
            path: file.clone(),
            config: None,
        }),
        ..quiet()
    };
    // The file does not exist yet: the agent starts and waits for it.
    let a = start_watched(
        Arc::clone(&k),
        |c| c.lock_timeout = Duration::from_millis(200),
        Some(opts),
    );
    // An operator's `gpuslice vgpu apply` in progress when the file arrives.
    let held = gpu_sysfs::apply::LayoutLock::acquire(k.root(), None, &mut |_| {}).unwrap();
    std::fs::write(&file, layout(2)).unwrap();
    let refused = wait_event(&a.agent, SOON, |e| e.kind == EventKind::LayoutRefused)
        .expect("refused while the lock is held");
    assert_eq!(mdevs(&a.socket), 0);
    drop(held);
    let applied = wait_event(&a.agent, Duration::from_secs(20), |e| {
        e.kind == EventKind::LayoutApplied && e.revision > refused.revision
    })
    .expect("applied once the lock is free");
    assert_eq!(applied.data["status"], "applied", "{}", applied.data);
    assert_eq!(mdevs(&a.socket), 2);
}

#[test]
fn a_critical_xid_from_nvml_turns_the_gpu_unhealthy_at_once_with_an_evacuation_plan() {
    use gpu_health::{ChannelEventSource, EventVerdicts, GpuEvent, GpuEventKind};
    let k = Arc::new(FakeKernel::a2_mdev_host().unwrap());
    let (tx, source) = ChannelEventSource::new();
    let opts = WatchOptions {
        gpu_events: Some(Box::new(source)),
        ..quiet()
    };
    let a = start_watched(
        Arc::clone(&k),
        |c| c.health.events = Some(Arc::new(EventVerdicts::default())),
        Some(opts),
    );
    let body = r#"{"parent":"0000:08:00.4","profile":"nvidia-746","machine":"vm-a"}"#;
    let r = request(&a.socket, "POST", "/v1/vgpus", Some(body));
    assert_eq!(r.status, 201, "{}", r.body);
    let gpu = "0000:08:00.0".parse().unwrap();
    // An application's fault (XID 13) changes no verdict.
    let from = a.agent.events().revision();
    tx.send(GpuEvent {
        address: gpu,
        kind: GpuEventKind::Xid { xid: Some(13) },
    })
    .unwrap();
    let end = Instant::now() + SOON;
    while a.agent.stats().gpu_events() < 1 && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(a.agent.stats().gpu_events(), 1);
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(a.agent.events().revision(), from);
    // XID 79: the GPU fell off the bus.
    tx.send(GpuEvent {
        address: gpu,
        kind: GpuEventKind::Xid { xid: Some(79) },
    })
    .unwrap();
    let e = wait_event(&a.agent, SOON, |e| {
        e.kind == EventKind::HealthChanged
            && e.revision > from
            && e.data["health"]["state"] == "Unhealthy"
    })
    .expect("an Unhealthy event right after the XID, with no resync running");
    assert_eq!(e.data["address"], "0000:08:00.0");
    assert!(
        e.data["reason"].as_str().unwrap().contains("XID 79"),
        "{}",
        e.data
    );
    let machines = e.data["evacuation"]["machines"].as_array().unwrap();
    assert_eq!(machines[0]["machine"], "vm-a", "{}", e.data);
    // The verdict holds through later reads of the host.
    a.agent.refresh().unwrap();
    let t = get(&a.socket, "/v1/topology").json();
    assert_eq!(t["gpus"][0]["health"]["state"], "Unhealthy", "{t}");
    let m = a.agent.stats().render(0, 0);
    assert!(m.contains("gpuslice_agent_gpu_events_total 2\n"), "{m}");
}
