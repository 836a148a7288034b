//! `vgpu clear --gpu GPU | --all` without a layout file, `vgpu types` as `mdevctl types` prints
//! them, and a full pool explained from gpuslice's own model before the kernel's errno: each on
//! a sandbox made from the bundled A2 (4 vGPUs of 4 GiB fill its 16 GiB card).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::Path;
use std::process::{Command, Output};

fn on(dir: &Path, args: &[&str]) -> Output {
    let root = format!("sandbox:{}", dir.display());
    let mut all = vec!["--root", root.as_str(), "--node", "demo"];
    all.extend_from_slice(args);
    Command::new(env!("CARGO_BIN_EXE_gpuslice"))
        .env_remove("GPUSLICE_ROOT")
        .args(&all)
        .output()
        .unwrap()
}

fn out(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn err(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// The error document on stderr, after the sandbox's notice.
fn error_doc(o: &Output) -> serde_json::Value {
    let e = err(o);
    let start = e.find('{').unwrap_or_else(|| panic!("no document: {e}"));
    serde_json::from_str(&e[start..]).unwrap_or_else(|x| panic!("{x}: {e}"))
}

fn ok(o: Output) -> Output {
    assert!(
        o.status.success(),
        "stdout: {}\nstderr: {}",
        out(&o),
        err(&o)
    );
    o
}

/// A sandbox of the bundled A2: three vGPUs on nvidia0 (one more 4 GiB one fits).
fn sandbox() -> (tempfile::TempDir, std::path::PathBuf) {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("sbx");
    let o = Command::new(env!("CARGO_BIN_EXE_gpuslice"))
        .args(["sandbox", "init", dir.to_str().unwrap()])
        .output()
        .unwrap();
    ok(o);
    (t, dir)
}

const U1: &str = "11111111-2222-3333-4444-555555555555";
const U2: &str = "11111111-2222-3333-4444-666666666666";

fn mdevs(dir: &Path) -> usize {
    let o = ok(on(dir, &["-o", "json", "vgpu", "list"]));
    let doc: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    doc["mdevs"].as_array().unwrap().len()
}

#[test]
fn clear_gpu_refuses_a_vgpu_a_vm_holds_naming_it_and_removes_nothing_then_clears_them_all() {
    let (_t, dir) = sandbox();
    assert_eq!(mdevs(&dir), 3);
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
    let pid = out(&ok(on(&dir, &["sandbox", "hold", U1])))
        .trim()
        .to_owned();
    let o = on(&dir, &["vgpu", "clear", "--gpu", "nvidia0"]);
    assert_eq!(o.status.code(), Some(2), "{}", out(&o));
    assert!(err(&o).contains(&format!("pid {pid}")), "{}", err(&o));
    assert!(err(&o).contains(&format!("mdev {U1}")), "{}", err(&o));
    assert_eq!(mdevs(&dir), 4, "nothing removed before the check failed");
    let o = on(&dir, &["-o", "json", "vgpu", "clear", "--gpu", "nvidia0"]);
    let doc = error_doc(&o);
    assert_eq!(doc["error"]["kind"], "in-use", "{doc}");

    ok(on(&dir, &["sandbox", "unhold", &pid]));
    let dry = out(&ok(on(
        &dir,
        &["vgpu", "clear", "--gpu", "0000:08:00.0", "--dry-run"],
    )));
    assert!(dry.contains("dry run: 4 vGPU(s) to clear"), "{dry}");
    assert_eq!(mdevs(&dir), 4);
    let o = out(&ok(on(&dir, &["vgpu", "clear", "--gpu", "nvidia0"])));
    assert!(o.contains(&format!("removed mdev {U1}")), "{o}");
    assert!(o.contains("cleared 4 vGPU(s) on 0000:08:00.0"), "{o}");
    assert_eq!(mdevs(&dir), 0);
    let again = out(&ok(on(&dir, &["vgpu", "clear", "--all"])));
    assert!(again.contains("nothing to clear"), "{again}");
}

#[test]
fn clear_all_removes_every_vgpu_and_clear_without_a_selection_says_what_to_give() {
    let (_t, dir) = sandbox();
    let o = ok(on(&dir, &["-o", "json", "vgpu", "clear", "--all"]));
    let doc: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(doc["removed"].as_array().unwrap().len(), 3, "{doc}");
    assert_eq!(mdevs(&dir), 0);
    let o = on(&dir, &["vgpu", "clear"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(err(&o).contains("--gpu GPU"), "{}", err(&o));
}

#[test]
fn types_lists_each_parents_types_with_free_instances_as_mdevctl_does() {
    let (_t, dir) = sandbox();
    let text = out(&ok(on(
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
fn a_full_pool_is_explained_from_the_model_before_the_kernels_errno() {
    let (_t, dir) = sandbox();
    ok(on(
        &dir,
        &[
            "vgpu",
            "create",
            "--parent",
            "0000:08:00.5",
            "--type",
            "A2-4Q",
            "--uuid",
            U1,
        ],
    ));
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
    assert_eq!(o.status.code(), Some(2));
    let e = err(&o);
    let model = e
        .find("nvidia0's 16384 MiB pool holds 4 × 4096 MiB")
        .unwrap_or_else(|| panic!("{e}"));
    let errno = e.find("ENOSPC").unwrap_or_else(|| panic!("{e}"));
    assert!(model < errno, "the model first: {e}");
    assert!(
        e.contains("A2-4Q needs 4096 MiB framebuffer, 0 MiB free"),
        "{e}"
    );
    // Through the GPU's name too, and the kind stays the kernel's.
    let o = on(
        &dir,
        &[
            "-o",
            "json",
            "vgpu",
            "create",
            "--parent",
            "nvidia0",
            "--profile",
            "A2-4Q",
            "--uuid",
            U2,
        ],
    );
    let doc = error_doc(&o);
    assert_eq!(doc["error"]["kind"], "exhausted", "{doc}");
    let message = doc["error"]["message"].as_str().unwrap();
    assert!(
        message.starts_with("nvidia0's 16384 MiB pool holds"),
        "{message}"
    );
}
