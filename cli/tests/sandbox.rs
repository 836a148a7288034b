//! The sandbox host: `gpuslice sandbox init DIR [--from ...]` and `--root sandbox:DIR`, each
//! command a separate process, the fake kernel's state kept in DIR between them.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::Path;
use std::process::{Command, Output};

use gpu_sysfs::testing::FakeKernel;

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

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn ok(o: Output) -> Output {
    assert!(
        o.status.success(),
        "exit {:?}\nstdout: {}\nstderr: {}",
        o.status.code(),
        stdout(&o),
        stderr(&o)
    );
    o
}

fn init_default(dir: &Path) {
    ok(gpuslice(&["sandbox", "init", dir.to_str().unwrap()]));
}

const U1: &str = "11111111-2222-3333-4444-555555555555";
const U2: &str = "11111111-2222-3333-4444-666666666666";

#[test]
fn a_sandbox_made_from_the_bundled_a2_keeps_its_vgpus_and_its_pool_between_commands() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("sbx");
    init_default(&dir);
    // The A2 recording's card holds one more 4 GiB vGPU: the first create takes it ...
    let o = ok(on(
        &dir,
        &[
            "vgpu",
            "create",
            "--parent",
            "0000:08:00.5",
            "--profile",
            "A2-4Q",
            "--uuid",
            U1,
        ],
    ));
    assert!(
        stdout(&o).contains(&format!("created mdev {U1}")),
        "{}",
        stdout(&o)
    );
    // ... and a second process sees the card full, on another parent.
    let o = on(
        &dir,
        &[
            "vgpu",
            "create",
            "--parent",
            "0000:08:00.7",
            "--profile",
            "A2-4Q",
            "--uuid",
            U2,
        ],
    );
    assert_eq!(o.status.code(), Some(2), "{}", stdout(&o));
    assert!(stderr(&o).contains("ENOSPC"), "{}", stderr(&o));
    let list = stdout(&ok(on(&dir, &["vgpu", "list"])));
    assert!(list.contains(U1), "{list}");
    assert!(!list.contains(U2), "{list}");
    // Removing gives the room back to the next process.
    ok(on(&dir, &["vgpu", "remove", U1]));
    ok(on(
        &dir,
        &[
            "vgpu",
            "create",
            "--parent",
            "0000:08:00.7",
            "--profile",
            "A2-4Q",
            "--uuid",
            U2,
        ],
    ));
}

#[test]
fn every_output_on_a_sandbox_says_so_on_stderr_and_json_stays_a_document() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("sbx");
    init_default(&dir);
    let o = ok(on(&dir, &["-o", "json", "topology"]));
    let doc: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(doc["node"], "demo");
    assert!(
        stderr(&o).contains("sandbox host") && stderr(&o).contains("nothing here touches"),
        "{}",
        stderr(&o)
    );
    // The environment variable names a sandbox just as --root does.
    let o = ok(Command::new(env!("CARGO_BIN_EXE_gpuslice"))
        .env("GPUSLICE_ROOT", format!("sandbox:{}", dir.display()))
        .args(["gpu", "list"])
        .output()
        .unwrap());
    assert!(stdout(&o).contains("nvidia0"), "{}", stdout(&o));
    assert!(stderr(&o).contains("sandbox host"), "{}", stderr(&o));
}

#[test]
fn a_vgpu_a_sandbox_holder_keeps_open_is_not_removed_until_it_lets_go() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("sbx");
    init_default(&dir);
    ok(on(
        &dir,
        &[
            "vgpu",
            "create",
            "--parent",
            "0000:08:00.5",
            "--profile",
            "A2-4Q",
            "--uuid",
            U1,
        ],
    ));
    let pid = stdout(&ok(on(&dir, &["sandbox", "hold", U1])))
        .trim()
        .to_owned();
    let o = on(&dir, &["vgpu", "remove", U1]);
    assert_ne!(o.status.code(), Some(0));
    assert!(stderr(&o).contains(&format!("pid {pid}")), "{}", stderr(&o));
    ok(on(&dir, &["sandbox", "unhold", &pid]));
    ok(on(&dir, &["vgpu", "remove", U1]));
}

#[test]
fn a_vendor_vfio_sandbox_shrinks_the_other_vfs_creatable_lists_between_commands() {
    let k = FakeKernel::l40s_vendor_vfio_host(4).unwrap();
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("sbx");
    ok(gpuslice(&[
        "sandbox",
        "init",
        dir.to_str().unwrap(),
        "--from",
        k.root().to_str().unwrap(),
    ]));
    let creatable = |vf: &str| {
        std::fs::read_to_string(dir.join(format!(
            "host/sys/bus/pci/devices/{vf}/nvidia/creatable_vgpu_types"
        )))
        .unwrap()
    };
    assert!(creatable("0000:26:00.5").contains("L40S-48Q"));
    ok(on(
        &dir,
        &[
            "vgpu",
            "create",
            "--parent",
            "0000:26:00.4",
            "--profile",
            "L40S-24Q",
            "--uuid",
            U1,
        ],
    ));
    let other = creatable("0000:26:00.5");
    assert!(other.contains("L40S-24Q"), "{other}");
    assert!(!other.contains("L40S-48Q"), "{other}");
    assert!(!other.contains("L40S-12Q"), "{other}");
    // A second 24Q fills the card: a third process is refused.
    ok(on(
        &dir,
        &[
            "vgpu",
            "create",
            "--parent",
            "0000:26:00.5",
            "--profile",
            "L40S-24Q",
            "--uuid",
            U2,
        ],
    ));
    assert!(
        !creatable("0000:26:00.6").contains("L40S"),
        "{}",
        creatable("0000:26:00.6")
    );
}

#[test]
fn sriov_enable_on_a_sandbox_makes_the_virtual_functions() {
    let k = FakeKernel::l40s_vendor_vfio_host(0).unwrap();
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("sbx");
    ok(gpuslice(&[
        "sandbox",
        "init",
        dir.to_str().unwrap(),
        "--from",
        k.root().to_str().unwrap(),
    ]));
    ok(on(&dir, &["sriov", "enable", "0000:26:00.0"]));
    assert!(dir.join("host/sys/bus/pci/devices/0000:26:00.4").exists());
    let n = std::fs::read_to_string(dir.join("host/sys/bus/pci/devices/0000:26:00.0/sriov_numvfs"))
        .unwrap();
    assert_eq!(n.trim(), "32");
}

#[test]
fn sriov_disable_is_refused_while_a_vf_holds_a_vgpu_then_takes_the_vfs_away() {
    let k = FakeKernel::l40s_vendor_vfio_host(4).unwrap();
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("sbx");
    ok(gpuslice(&[
        "sandbox",
        "init",
        dir.to_str().unwrap(),
        "--from",
        k.root().to_str().unwrap(),
    ]));
    let pf = "0000:26:00.0";
    let numvfs = || {
        std::fs::read_to_string(dir.join(format!("host/sys/bus/pci/devices/{pf}/sriov_numvfs")))
            .unwrap()
            .trim()
            .to_owned()
    };
    let made: serde_json::Value = serde_json::from_str(&stdout(&ok(on(
        &dir,
        &[
            "vgpu",
            "create",
            "--parent",
            pf,
            "--profile",
            "NVIDIA L40S-24Q",
            "-o",
            "json",
        ],
    ))))
    .unwrap();
    let vf = made["vf"].as_str().unwrap().to_owned();

    // A VF holds a vGPU: refused, naming it, and SR-IOV stays on.
    let o = on(&dir, &["sriov", "disable", pf]);
    assert_eq!(o.status.code(), Some(2));
    let err = stderr(&o);
    assert!(
        err.contains(&format!("cannot disable SR-IOV on {pf}")),
        "{err}"
    );
    assert!(err.contains(&format!("VF {vf} holds vGPU type")), "{err}");
    assert_eq!(numvfs(), "4");
    let o = on(&dir, &["sriov", "disable", pf, "-o", "json"]);
    let err = stderr(&o);
    let at = err
        .find('{')
        .unwrap_or_else(|| panic!("no error document in {err}"));
    let doc: serde_json::Value = serde_json::from_str(&err[at..]).unwrap();
    assert_eq!(doc["error"]["kind"], "in-use", "{doc}");

    // Once the vGPU is gone, the VFs go.
    ok(on(&dir, &["vgpu", "remove", &vf]));
    let out = stdout(&ok(on(&dir, &["sriov", "disable", pf])));
    assert_eq!(
        out.trim(),
        format!("disabled SR-IOV on {pf} (4 VFs removed)")
    );
    assert_eq!(numvfs(), "0");
    assert!(!dir.join(format!("host/sys/bus/pci/devices/{vf}")).exists());
    let out = stdout(&ok(on(&dir, &["sriov", "disable", pf])));
    assert_eq!(out.trim(), format!("{pf} has no VFs (nothing to disable)"));
}

#[test]
fn a_gpu_bound_to_vfio_pci_in_one_command_goes_back_to_its_host_driver_in_the_next() {
    let k = FakeKernel::passthrough_host().unwrap();
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("sbx");
    ok(gpuslice(&[
        "sandbox",
        "init",
        dir.to_str().unwrap(),
        "--from",
        k.root().to_str().unwrap(),
    ]));
    let driver = |bdf: &str| {
        std::fs::read_link(dir.join(format!("host/sys/bus/pci/devices/{bdf}/driver")))
            .ok()
            .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
    };
    // The GPU and its HD-audio function go to vfio-pci ...
    ok(on(&dir, &["gpu", "bind", "0000:01:00.0"]));
    assert_eq!(driver("0000:01:00.0").as_deref(), Some("vfio-pci"));
    assert_eq!(driver("0000:01:00.1").as_deref(), Some("vfio-pci"));
    // ... and a later process, which never saw them bound to their own drivers, gives them back.
    ok(on(&dir, &["gpu", "release", "0000:01:00.0"]));
    assert_eq!(driver("0000:01:00.0").as_deref(), Some("nvidia"));
    assert_eq!(driver("0000:01:00.1").as_deref(), Some("snd_hda_intel"));
}

#[test]
fn sandbox_init_refuses_this_machine_and_a_directory_in_use_and_makes_nothing() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("sbx");
    let o = gpuslice(&["sandbox", "init", dir.to_str().unwrap(), "--from", "/"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("the machine's own `/`"),
        "{}",
        stderr(&o)
    );
    assert!(!dir.exists(), "a refused init made {}", dir.display());
    std::fs::create_dir(&dir).unwrap();
    std::fs::write(dir.join("notes"), "mine").unwrap();
    let o = gpuslice(&["sandbox", "init", dir.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("not empty"), "{}", stderr(&o));
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 1);
}

#[test]
fn a_directory_that_is_not_a_sandbox_is_refused_with_the_command_that_makes_one() {
    let t = tempfile::tempdir().unwrap();
    let o = on(t.path(), &["gpu", "list"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("gpuslice sandbox init"),
        "{}",
        stderr(&o)
    );
}

fn mdev_count(dir: &Path) -> usize {
    let v: serde_json::Value =
        serde_json::from_str(&stdout(&ok(on(dir, &["-o", "json", "vgpu", "list"])))).unwrap();
    v["mdevs"].as_array().map_or(0, Vec::len)
}

#[test]
fn reload_driver_drops_every_vgpu_and_is_refused_while_one_is_held() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("sbx");
    init_default(&dir);
    assert_eq!(mdev_count(&dir), 3, "the bundled A2 holds three vGPUs");
    let v: serde_json::Value =
        serde_json::from_str(&stdout(&ok(on(&dir, &["-o", "json", "vgpu", "list"])))).unwrap();
    let uuid = v["mdevs"][0]["uuid"].as_str().unwrap().to_owned();
    let pid = stdout(&ok(on(&dir, &["sandbox", "hold", &uuid])))
        .trim()
        .to_owned();
    let o = on(&dir, &["sandbox", "reload-driver"]);
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains(&uuid) && stderr(&o).contains("in use"),
        "{}",
        stderr(&o)
    );
    assert_eq!(mdev_count(&dir), 3, "a refused reload changes nothing");
    ok(on(&dir, &["sandbox", "unhold", &pid]));
    let o = ok(on(&dir, &["sandbox", "reload-driver"]));
    assert_eq!(
        stdout(&o).trim(),
        "vGPU manager reloaded: 3 mdev(s) removed, 0 VF type(s) cleared"
    );
    assert_eq!(mdev_count(&dir), 0);
    let o = gpuslice(&["sandbox", "reload-driver"]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("not a sandbox"), "{}", stderr(&o));
}
