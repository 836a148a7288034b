//! `gpuslice realize`: the road Machine → placement → devices on the A2 sandbox, each step a
//! separate process: the sandbox's topology as a fleet, `place --save`, then `realize`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::Path;
use std::process::{Command, Output};

fn gpuslice(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_gpuslice"))
        .env_remove("GPUSLICE_ROOT")
        .args(args)
        .output()
        .unwrap()
}

fn on(dir: &Path, args: &[&str]) -> Output {
    let root = format!("sandbox:{}", dir.display());
    let mut all = vec!["--root", root.as_str(), "--node", "demo"];
    all.extend_from_slice(args);
    gpuslice(&all)
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn ok(o: Output) -> Output {
    assert!(
        o.status.success(),
        "exit {:?}\nstdout: {}\nstderr: {}",
        o.status.code(),
        text(&o.stdout),
        text(&o.stderr)
    );
    o
}

/// The A2 sandbox, its topology written as a fleet file, and a desktop Machine placed and saved
/// there: the fleet file's path.
fn placed(t: &Path) -> (std::path::PathBuf, std::path::PathBuf) {
    let dir = t.join("sbx");
    let from = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../examples/hosts/a2-sriov-mdev.umockdev"
    );
    ok(gpuslice(&[
        "sandbox",
        "init",
        "--from",
        from,
        dir.to_str().unwrap(),
    ]));
    let topology = ok(on(&dir, &["topology", "-o", "json", "--no-nvml"]));
    let node: serde_json::Value = serde_json::from_slice(&topology.stdout).unwrap();
    let fleet = t.join("fleet.json");
    let doc = serde_json::json!({"nodes": [node]});
    std::fs::write(&fleet, serde_json::to_string(&doc).unwrap()).unwrap();
    let machine = t.join("desktop.yaml");
    std::fs::write(
        &machine,
        "name: desktop-1\ndevices:\n  - {name: gpu, profile: A2-4Q}\n",
    )
    .unwrap();
    let m = machine.to_str().unwrap();
    ok(gpuslice(&[
        "place",
        "--inventory",
        fleet.to_str().unwrap(),
        "--machine",
        m,
        "--save",
    ]));
    (dir, fleet)
}

#[test]
fn a_machine_placed_and_saved_is_realized_on_the_sandbox_in_one_command() {
    let t = tempfile::tempdir().unwrap();
    let (dir, fleet) = placed(t.path());
    let f = fleet.to_str().unwrap();
    let o = ok(on(
        &dir,
        &[
            "realize",
            "--inventory",
            f,
            "--machine",
            "desktop-1",
            "-o",
            "json",
        ],
    ));
    let done: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(done["machine"], "desktop-1");
    assert_eq!(done["changed"], true, "{done}");
    let uuid = done["devices"][0]["created"]["uuid"]
        .as_str()
        .unwrap()
        .to_owned();
    let qemu = done["handoff"]["qemu"][1].as_str().unwrap();
    assert_eq!(qemu, format!("vfio-pci,sysfsdev=/sys/bus/mdev/devices/{uuid}"));
    // The vGPU is on the sandbox host now, as `vgpu list` reads it in another process.
    let listed = text(&ok(on(&dir, &["vgpu", "list"])).stdout);
    assert!(listed.contains(&uuid), "{listed}");
    // Again: nothing to make.
    let again = text(
        &ok(on(
            &dir,
            &["realize", "--inventory", f, "--machine", "desktop-1"],
        ))
        .stdout,
    );
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
    let before = ok(on(&dir, &["vgpu", "list", "-o", "json"])).stdout;
    let args = [
        "--root",
        &root,
        "--node",
        "other",
        "realize",
        "--inventory",
        f,
        "-o",
        "json",
    ];
    let o = gpuslice(&args);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o.stderr));
    let e: serde_json::Value =
        serde_json::from_slice(o.stderr.split(|b| *b == b'\n').nth(1).unwrap())
            .unwrap_or_else(|_| panic!("{}", text(&o.stderr)));
    assert_eq!(e["error"]["kind"], "invalid-request", "{e}");
    let m = e["error"]["message"].as_str().unwrap();
    assert!(
        m.contains("is for node demo, but this host is node other"),
        "{m}"
    );
    let after = ok(on(&dir, &["vgpu", "list", "-o", "json"])).stdout;
    assert_eq!(text(&before), text(&after), "nothing changed");
}

#[test]
fn a_write_that_did_not_finish_is_warned_about_by_the_next_command_that_opens_the_node() {
    let t = tempfile::tempdir().unwrap();
    let (dir, _) = placed(t.path());
    // What a `realize` killed after its first change leaves.
    let record = dir.join("host/var/lib/gpuslice/node/intent.json");
    std::fs::create_dir_all(record.parent().unwrap()).unwrap();
    let intent = serde_json::json!({"op": "realize", "what": "realize Machine desktop-1: create \
        A2-4Q mdev 1b4e on 0000:08:00.5", "check": "`gpuslice vgpu list`", "state": "started",
        "pid": 4242, "started": 0});
    std::fs::write(&record, intent.to_string()).unwrap();
    let o = ok(on(&dir, &["vgpu", "list"]));
    let err = text(&o.stderr);
    assert!(
        err.contains(
            "warning: an earlier gpuslice write (process 4242, realize: realize Machine desktop-1"
        ),
        "{err}"
    );
    assert!(
        err.contains("did not finish; check: `gpuslice vgpu list`"),
        "{err}"
    );
}
