//! `gpuslice realize`: the road Machine → placement → devices on the A2 sandbox, each step a
//! separate process: the sandbox's topology as a fleet, `place --save`, then `realize`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod export_support;

use std::path::{Path, PathBuf};

use export_support::{ok, ok_on, on, run};

/// The A2 sandbox, its topology written as a fleet file, and a desktop Machine placed and saved
/// there: the sandbox and the fleet file.
fn placed(t: &Path) -> (PathBuf, PathBuf) {
    let dir = t.join("sbx");
    let from = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../examples/hosts/a2-sriov-mdev.umockdev"
    );
    ok(&["sandbox", "init", "--from", from, dir.to_str().unwrap()]);
    let node: serde_json::Value =
        serde_json::from_str(&ok_on(&dir, &["topology", "-o", "json", "--no-nvml"])).unwrap();
    let fleet = t.join("fleet.json");
    std::fs::write(&fleet, serde_json::json!({"nodes": [node]}).to_string()).unwrap();
    let machine = t.join("desktop.yaml");
    let spec = "name: desktop-1\ndevices:\n  - {name: gpu, profile: A2-4Q}\n";
    std::fs::write(&machine, spec).unwrap();
    let (f, m) = (fleet.to_str().unwrap(), machine.to_str().unwrap());
    ok(&["place", "--inventory", f, "--machine", m, "--save"]);
    (dir, fleet)
}

#[test]
fn a_machine_placed_and_saved_is_realized_on_the_sandbox_in_one_command() {
    let t = tempfile::tempdir().unwrap();
    let (dir, fleet) = placed(t.path());
    let f = fleet.to_str().unwrap();
    let args = ["realize", "--inventory", f, "--machine", "desktop-1"];
    let json = ok_on(&dir, &[&args[..], &["-o", "json"]].concat());
    let done: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(done["machine"], "desktop-1");
    assert_eq!(done["changed"], true, "{done}");
    // The allocation as realized, as the agent's `POST /v1/realize` answers it.
    assert_eq!(done["allocation"]["status"], "created", "{done}");
    assert_eq!(done["allocation"]["machine"], "desktop-1", "{done}");
    let uuid = done["devices"][0]["created"]["uuid"].as_str().unwrap();
    let qemu = done["handoff"]["qemu"][1].as_str().unwrap();
    assert_eq!(
        qemu,
        format!("vfio-pci,sysfsdev=/sys/bus/mdev/devices/{uuid}")
    );
    // The vGPU is on the sandbox host now, as `vgpu list` reads it in another process.
    let listed = ok_on(&dir, &["vgpu", "list"]);
    assert!(listed.contains(uuid), "{listed}");
    // Again: nothing to make.
    let again = ok_on(&dir, &args);
    assert!(
        again.starts_with("already realized: Machine desktop-1 on node demo"),
        "{again}"
    );
    assert!(again.contains("qemu:"), "{again}");
}

#[test]
fn an_allocation_for_another_node_is_refused_naming_both_with_nothing_changed() {
    let t = tempfile::tempdir().unwrap();
    let (dir, fleet) = placed(t.path());
    let root = format!("sandbox:{}", dir.display());
    let f = fleet.to_str().unwrap();
    let before = ok_on(&dir, &["vgpu", "list", "-o", "json"]);
    let o = run(&[
        "--root",
        &root,
        "--node",
        "other",
        "realize",
        "--inventory",
        f,
        "-o",
        "json",
    ]);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{stderr}");
    // After the sandbox notice, the error document.
    let doc = stderr.lines().nth(1).unwrap_or_default();
    let e: serde_json::Value = serde_json::from_str(doc).unwrap_or_else(|_| panic!("{stderr}"));
    assert_eq!(e["error"]["kind"], "invalid-request", "{e}");
    let m = e["error"]["message"].as_str().unwrap();
    assert!(
        m.contains("is for node demo, but this host is node other"),
        "{m}"
    );
    let after = ok_on(&dir, &["vgpu", "list", "-o", "json"]);
    assert_eq!(before, after, "nothing changed");
}

#[test]
fn a_write_that_did_not_finish_is_warned_about_by_the_next_command_that_opens_the_node() {
    let t = tempfile::tempdir().unwrap();
    let (dir, _) = placed(t.path());
    // What a `realize` killed after its first change leaves.
    let record = dir.join("host/var/lib/gpuslice/node/intent.json");
    std::fs::create_dir_all(record.parent().unwrap()).unwrap();
    let what = "realize Machine desktop-1: create A2-4Q mdev 1b4e on 0000:08:00.5";
    let intent = serde_json::json!({"op": "realize", "what": what,
        "check": "`gpuslice vgpu list`", "state": "started", "pid": 4242, "started": 0});
    std::fs::write(&record, intent.to_string()).unwrap();
    let o = on(&dir, &["vgpu", "list"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    let said = format!("warning: an earlier gpuslice write (process 4242, realize: {what})");
    assert!(err.contains(&said), "{err}");
    assert!(
        err.contains("did not finish; check: `gpuslice vgpu list`"),
        "{err}"
    );
}
