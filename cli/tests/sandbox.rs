//! The sandbox host: `gpuslice sandbox init DIR [--from ...]` and `--root sandbox:DIR`, each
//! command a separate process, the fake kernel's state kept in DIR between them.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod sandbox_support;

use std::path::Path;
use std::process::{Command, Output};

use gpu_sysfs::testing::FakeKernel;
use sandbox_support::{gpuslice, ok, on, stderr, stdout};

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
    // Said from gpuslice's own model of the pool first, the kernel's errno after.
    let e = stderr(&o);
    let model = e
        .find("nvidia0's 16384 MiB pool holds 4 × 4096 MiB")
        .unwrap_or_else(|| panic!("{e}"));
    let errno = e.find("ENOSPC").unwrap_or_else(|| panic!("{e}"));
    assert!(model < errno, "{e}");
    assert!(
        e.contains("A2-4Q needs 4096 MiB framebuffer, 0 MiB free"),
        "{e}"
    );
    // The same through the GPU's name, with the kernel's kind.
    let by_name = ["--parent", "nvidia0", "--profile", "A2-4Q", "--uuid", U2];
    let o = on(
        &dir,
        &[&["-o", "json", "vgpu", "create"][..], &by_name].concat(),
    );
    let doc = error_doc(&o);
    assert_eq!(doc["error"]["kind"], "exhausted", "{doc}");
    let message = doc["error"]["message"].as_str().unwrap();
    assert!(
        message.starts_with("nvidia0's 16384 MiB pool holds"),
        "{message}"
    );
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
fn a_vgpu_a_sandbox_holder_keeps_open_is_not_removed_or_cleared_until_it_lets_go() {
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
    // `vgpu clear --gpu` keeps the same rule, for every vGPU of the GPU before the first goes.
    let o = on(&dir, &["vgpu", "clear", "--gpu", "nvidia0"]);
    assert_eq!(o.status.code(), Some(2), "{}", stdout(&o));
    assert!(stderr(&o).contains(&format!("pid {pid}")), "{}", stderr(&o));
    assert!(stderr(&o).contains(&format!("mdev {U1}")), "{}", stderr(&o));
    assert_eq!(mdevs(&dir), 4, "nothing removed before the check failed");
    let doc = error_doc(&on(
        &dir,
        &["-o", "json", "vgpu", "clear", "--gpu", "nvidia0"],
    ));
    assert_eq!(doc["error"]["kind"], "in-use", "{doc}");
    ok(on(&dir, &["sandbox", "unhold", &pid]));
    ok(on(&dir, &["vgpu", "remove", U1]));
    // Once let go, the GPU is cleared without a layout file.
    let dry = stdout(&ok(on(
        &dir,
        &["vgpu", "clear", "--gpu", "0000:08:00.0", "--dry-run"],
    )));
    assert!(dry.contains("dry run: 3 vGPU(s) to clear"), "{dry}");
    assert_eq!(mdevs(&dir), 3);
    let o = stdout(&ok(on(&dir, &["vgpu", "clear", "--gpu", "nvidia0"])));
    assert!(o.contains("cleared 3 vGPU(s) on 0000:08:00.0"), "{o}");
    assert_eq!(mdevs(&dir), 0);
    let again = stdout(&ok(on(&dir, &["vgpu", "clear", "--all"])));
    assert!(again.contains("nothing to clear"), "{again}");
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

// `vgpu clear --gpu GPU | --all` without a layout file, `vgpu types` as `mdevctl types` prints
// them, and a full pool explained from gpuslice's own model before the kernel's errno, on the
// bundled A2 (three 4 GiB vGPUs on its 16 GiB card: one more fits).

/// The error document on stderr, after the sandbox's notice.
fn error_doc(o: &Output) -> serde_json::Value {
    let e = stderr(o);
    let start = e.find('{').unwrap_or_else(|| panic!("no document: {e}"));
    serde_json::from_str(&e[start..]).unwrap_or_else(|x| panic!("{x}: {e}"))
}

fn mdevs(dir: &Path) -> usize {
    let o = ok(on(dir, &["-o", "json", "vgpu", "list"]));
    let doc: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    doc["mdevs"].as_array().unwrap().len()
}

#[test]
fn clear_all_removes_every_vgpu_and_clear_without_a_selection_says_what_to_give() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("sbx");
    init_default(&dir);
    let o = ok(on(&dir, &["-o", "json", "vgpu", "clear", "--all"]));
    let doc: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(doc["removed"].as_array().unwrap().len(), 3, "{doc}");
    assert_eq!(mdevs(&dir), 0);
    let o = on(&dir, &["vgpu", "clear"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("--gpu GPU"), "{}", stderr(&o));
}

#[test]
fn types_lists_each_parents_types_with_free_instances_as_mdevctl_does() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("sbx");
    init_default(&dir);
    let text = stdout(&ok(on(
        &dir,
        &["vgpu", "types", "--parent", "0000:08:00.5"],
    )));
    assert!(text.starts_with("0000:08:00.5\n  nvidia-"), "{text}");
    assert!(
        text.contains("  nvidia-746\n    Available instances: 1\n    Device API: vfio-pci\n    Name: NVIDIA A2-4Q\n    Description: "),
        "{text}"
    );
    let o = ok(on(&dir, &["-o", "json", "vgpu", "types"]));
    let doc: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let parents = doc.as_array().unwrap();
    assert_eq!(parents.len(), 16, "one entry per VF of the A2");
    let vf = parents
        .iter()
        .find(|p| p["parent"] == "0000:08:00.5")
        .unwrap();
    assert_eq!(vf["gpu"], "nvidia0");
    let a2_4q = vf["types"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "NVIDIA A2-4Q")
        .unwrap();
    assert_eq!(a2_4q["availableInstances"], 1);
    assert_eq!(a2_4q["framebufferMiB"], 4096);
}

#[test]
fn gpu_bind_of_a_vgpu_host_is_a_conflict_as_the_agents_409_says() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("sbx");
    init_default(&dir);
    // The bundled A2 holds three vGPUs on its VFs: the GPU is taken by another way of sharing.
    let o = on(&dir, &["-o", "json", "gpu", "bind", "nvidia0"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    let doc = error_doc(&o);
    assert_eq!(doc["error"]["kind"], "conflict", "{doc}");
    let message = doc["error"]["message"].as_str().unwrap();
    assert!(message.contains("is shared as vGPUs"), "{message}");
    // A VF given as a GPU stays the request's fault, not a conflict.
    let o = on(&dir, &["-o", "json", "gpu", "bind", "0000:08:00.4"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert_eq!(error_doc(&o)["error"]["kind"], "unsupported");
    assert_eq!(mdevs(&dir), 3, "nothing changed");
}
