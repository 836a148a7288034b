#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! `gpuslice vgpu apply|assert|clear` on fake host trees: plans, diffs, exit statuses, and that
//! nothing is written when nothing should be.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use gpu_core::{MdevUuid, PciAddress};
use gpu_sysfs::apply::LayoutLock;
use gpu_sysfs::testing::builder::Tree;
use gpu_sysfs::testing::{MdevTypeSpec, PciSpec, TreeBuilder, snapshot};

fn example() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../gpu-core/tests/data/nvidia-configs/config-example.yaml")
}

const A2_TYPES: [(&str, &str, u64); 6] = [
    ("nvidia-745", "NVIDIA A2-2Q", 2048),
    ("nvidia-746", "NVIDIA A2-4Q", 4096),
    ("nvidia-747", "NVIDIA A2-8Q", 8192),
    ("nvidia-751", "NVIDIA A2-4A", 4096),
    ("nvidia-754", "NVIDIA A2-4C", 4096),
    ("nvidia-756", "NVIDIA A2-16C", 16384),
];

fn vf(i: u32) -> String {
    let rid = (8u32 << 8) + 4 + i;
    format!("0000:08:{:02x}.{:x}", (rid >> 3) & 0x1f, rid & 7)
}

/// An A2 with 16 VFs; `live` lists `(VF index, UUID, type)` of existing vGPUs.
fn a2_tree(live: &[(u32, String, &str)]) -> Tree {
    let mut b = TreeBuilder::new();
    let spec = PciSpec::new(0x10de, 0x25b6, 0x030200).driver("nvidia");
    b.pci(
        "0000:08:00.0",
        spec.clone().group(20).subsystem(0x10de, 0x157e),
    )
    .sriov("0000:08:00.0", 16, 16, 4, 1, spec, Some(21));
    let used: u64 = live
        .iter()
        .map(|(_, _, t)| A2_TYPES.iter().find(|x| x.0 == *t).unwrap().2)
        .sum();
    for i in 0..16 {
        let busy = live.iter().any(|(n, _, _)| *n == i);
        let types: Vec<MdevTypeSpec> = A2_TYPES
            .iter()
            .map(|(id, name, fb)| {
                let fits = !busy && used + fb <= 16384;
                let d = format!(
                    "num_heads=4, frl_config=60, framebuffer={fb}M, max_resolution=7680x4320, max_instance={}",
                    16384 / fb
                );
                MdevTypeSpec::new(id, name, u32::from(fits), Some(&d))
            })
            .collect();
        b.mdev_parent(&vf(i), &types);
    }
    for (i, uuid, t) in live {
        b.mdev_instance(uuid, &vf(*i), t);
    }
    b.finish().unwrap()
}

/// The A2 of the real capture: A2-4C, A2-4A and A2-4Q live.
fn captured_a2() -> Tree {
    a2_tree(&[
        (
            0,
            "f715f63c-0d00-4007-9c5a-b07b0c6c05de".into(),
            "nvidia-754",
        ),
        (
            2,
            "3deab9a4-200a-4c54-99b1-5eb0722d1d81".into(),
            "nvidia-751",
        ),
        (
            12,
            "c728e022-f16f-434b-ad2c-9665ee634d3d".into(),
            "nvidia-746",
        ),
    ])
}

/// An A2 already holding config `A2-4Q` as gpuslice lays it out on node `a2host`.
fn applied_a2() -> Tree {
    let pf: PciAddress = "0000:08:00.0".parse().unwrap();
    let live: Vec<(u32, String, &str)> = (0..4)
        .map(|i| {
            (
                i,
                MdevUuid::for_layout_slot("a2host", &pf, i).to_string(),
                "nvidia-746",
            )
        })
        .collect();
    a2_tree(&live)
}

fn gpuslice(root: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_gpuslice"))
        .arg("--root")
        .arg(root)
        .args(["--node", "a2host"])
        .args(args)
        .env_remove("VGPU_DM_CONFIG_FILE")
        .env_remove("VGPU_DM_SELECTED_CONFIG")
        .output()
        .unwrap()
}

/// The paths that differ between two snapshots, ignoring what an apply keeps under `run/gpuslice`.
fn changed(
    before: &std::collections::BTreeMap<String, gpu_sysfs::testing::Entry>,
    root: &Path,
) -> Vec<String> {
    let after = snapshot(root).unwrap();
    let keys: std::collections::BTreeSet<&String> = before.keys().chain(after.keys()).collect();
    keys.into_iter()
        .filter(|k| !k.starts_with("run/gpuslice"))
        .filter(|k| before.get(*k) != after.get(*k))
        .cloned()
        .collect()
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn dry_run_prints_the_plan_as_json_and_writes_nothing() {
    let tree = captured_a2();
    let before = snapshot(tree.root()).unwrap();
    let f = example();
    let out = gpuslice(
        tree.root(),
        &[
            "vgpu",
            "apply",
            "-f",
            f.to_str().unwrap(),
            "-c",
            "A2-4Q",
            "--dry-run",
            "-o",
            "json",
        ],
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["status"], "dry-run");
    let ops: Vec<String> = report["plan"]["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            format!(
                "{} {} {}",
                s["op"].as_str().unwrap(),
                s["instance"]["typeId"].as_str().unwrap(),
                s["instance"]["parent"].as_str().unwrap()
            )
        })
        .collect();
    assert_eq!(
        ops,
        [
            "remove nvidia-754 0000:08:00.4",
            "remove nvidia-751 0000:08:00.6",
            "create nvidia-746 0000:08:00.4",
            "create nvidia-746 0000:08:00.5",
            "create nvidia-746 0000:08:00.6"
        ]
    );
    assert_eq!(changed(&before, tree.root()), Vec::<String>::new());
}

#[test]
fn dry_run_as_a_table_lists_the_diff_and_the_steps() {
    let tree = captured_a2();
    let f = example();
    let out = gpuslice(
        tree.root(),
        &[
            "vgpu",
            "apply",
            "-f",
            f.to_str().unwrap(),
            "-c",
            "A2-4Q",
            "--dry-run",
        ],
    );
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(
        stdout.contains("nvidia0 (0000:08:00.0) index 0 [vgpu-configs.A2-4Q[0]]"),
        "{stdout}"
    );
    assert!(
        stdout.contains("~ A2-4Q            have  1  want  4"),
        "{stdout}"
    );
    assert!(
        stdout.contains(
            "1. - remove A2-4C (nvidia-754) f715f63c-0d00-4007-9c5a-b07b0c6c05de from 0000:08:00.4"
        ),
        "{stdout}"
    );
    assert!(
        stdout.contains("dry run: 5 steps to apply config \"A2-4Q\""),
        "{stdout}"
    );
}

#[test]
fn assert_exits_1_with_a_diff_when_the_layout_differs() {
    let tree = captured_a2();
    let f = example();
    let out = gpuslice(
        tree.root(),
        &["vgpu", "assert", "-f", f.to_str().unwrap(), "-c", "A2-4Q"],
    );
    assert_eq!(out.status.code(), Some(1));
    let stdout = text(&out.stdout);
    assert!(
        stdout.contains("config \"A2-4Q\" is not applied"),
        "{stdout}"
    );
    assert!(
        stdout.contains("nvidia0 (0000:08:00.0): A2-4C: have 1, want 0"),
        "{stdout}"
    );
}

#[test]
fn assert_and_apply_on_an_applied_host_succeed_without_writing() {
    let tree = applied_a2();
    let before = snapshot(tree.root()).unwrap();
    let f = example();
    let f = f.to_str().unwrap();
    let out = gpuslice(
        tree.root(),
        &["vgpu", "assert", "-f", f, "-c", "A2-4Q", "-o", "json"],
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let a: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(a["applied"], true);
    let out = gpuslice(tree.root(), &["vgpu", "apply", "-f", f, "-c", "A2-4Q"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("already in place"),
        "{}",
        text(&out.stdout)
    );
    assert_eq!(changed(&before, tree.root()), Vec::<String>::new());
}

#[test]
fn the_layout_can_come_from_standard_input() {
    let tree = applied_a2();
    let mut child = Command::new(env!("CARGO_BIN_EXE_gpuslice"))
        .arg("--root")
        .arg(tree.root())
        .args(["--node", "a2host", "vgpu", "assert", "-f", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"version: v1\nvgpu-configs:\n  mine:\n    - devices: [0]\n      vgpu-devices: {A2-4Q: 4}\n")
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stdout));
}

#[test]
fn bad_input_is_named_and_changes_nothing() {
    let tree = captured_a2();
    let f = example();
    let f = f.to_str().unwrap();
    let out = gpuslice(tree.root(), &["vgpu", "apply", "-f", f, "-c", "A2-5Q"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("no config named \"A2-5Q\""),
        "{}",
        text(&out.stderr)
    );
    let out = gpuslice(tree.root(), &["vgpu", "apply", "-f", f]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("choose one with -c NAME"),
        "{}",
        text(&out.stderr)
    );
    let out = gpuslice(tree.root(), &["vgpu", "apply", "-f", f, "-c", "A2-16Q"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("not offered"),
        "{}",
        text(&out.stderr)
    );
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.yaml");
    std::fs::write(
        &bad,
        "version: v1\nvgpu-configs:\n  c:\n    - devices: all\n      vgpu-devices: {A2-4Q: 0}\n",
    )
    .unwrap();
    let out = gpuslice(tree.root(), &["vgpu", "apply", "-f", bad.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("bad.yaml") && stderr.contains("vgpu-configs.c[0].vgpu-devices.A2-4Q"),
        "{stderr}"
    );
    let big = dir.path().join("big.yaml");
    std::fs::write(
        &big,
        "version: v1\nvgpu-configs:\n  c:\n    - devices: all\n      vgpu-devices: {A2-8Q: 3}\n",
    )
    .unwrap();
    let before = snapshot(tree.root()).unwrap();
    let out = gpuslice(tree.root(), &["vgpu", "apply", "-f", big.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("do not fit"),
        "{}",
        text(&out.stderr)
    );
    assert_eq!(changed(&before, tree.root()), Vec::<String>::new());
}

#[test]
fn a_write_the_kernel_does_not_honour_is_reported_and_rolled_back() {
    // A plain tree does not react to `create`: the first creation reads back as not applied.
    let tree = a2_tree(&[]);
    let f = example();
    let out = gpuslice(
        tree.root(),
        &[
            "vgpu",
            "apply",
            "-f",
            f.to_str().unwrap(),
            "-c",
            "A2-8Q",
            "-o",
            "json",
        ],
    );
    assert_eq!(out.status.code(), Some(3), "{}", text(&out.stderr));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["status"], "rolled-back");
    assert_eq!(report["rollback"]["complete"], true);
    assert!(
        text(&out.stderr).contains("rolled back"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn apply_gives_up_when_another_apply_holds_the_lock() {
    let tree = captured_a2();
    let _held = LayoutLock::acquire(tree.root(), None, &mut |_| {}).unwrap();
    let f = example();
    let out = gpuslice(
        tree.root(),
        &[
            "vgpu",
            "apply",
            "-f",
            f.to_str().unwrap(),
            "-c",
            "A2-4Q",
            "--lock-timeout",
            "0.3",
        ],
    );
    assert_eq!(out.status.code(), Some(2));
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("waiting for another gpuslice apply"),
        "{stderr}"
    );
    assert!(stderr.contains("gave up after"), "{stderr}");
}

#[test]
fn nvidias_environment_variables_name_the_file_and_config() {
    let tree = applied_a2();
    let out = Command::new(env!("CARGO_BIN_EXE_gpuslice"))
        .arg("--root")
        .arg(tree.root())
        .args(["--node", "a2host", "vgpu", "assert"])
        .env("VGPU_DM_CONFIG_FILE", example())
        .env("VGPU_DM_SELECTED_CONFIG", "A2-4Q")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("config \"A2-4Q\" is applied"),
        "{}",
        text(&out.stdout)
    );
}

#[test]
fn vgpu_clear_reads_nvidias_environment_variables_as_apply_does() {
    let tree = applied_a2();
    let clear = |extra: &[&str], config: &str| {
        Command::new(env!("CARGO_BIN_EXE_gpuslice"))
            .arg("--root")
            .arg(tree.root())
            .args(["--node", "a2host", "vgpu", "clear"])
            .args(extra)
            .env("VGPU_DM_CONFIG_FILE", example())
            .env("VGPU_DM_SELECTED_CONFIG", config)
            .output()
            .unwrap()
    };
    // The file from the environment, the config from the environment: a dry run plans it.
    let out = clear(&["--dry-run"], "A2-4Q");
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("A2-4Q"), "{}", text(&out.stdout));
    // An unknown config from the environment is the layout's own refusal: it was read.
    let out = clear(&["--dry-run"], "no-such-config");
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stdout));
    assert!(
        text(&out.stderr).contains("no-such-config"),
        "{}",
        text(&out.stderr)
    );
    // -f on the command line with the config from the environment.
    let f = example();
    let out = clear(&["-f", f.to_str().unwrap(), "--dry-run"], "A2-4Q");
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("remove A2-4Q"),
        "{}",
        text(&out.stdout)
    );
    // --gpu wins over the environment's file.
    let out = clear(&["--gpu", "0000:08:00.0", "--dry-run"], "no-such-config");
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
}

/// The real A2 capture (harvester/pcidevices recording in gpu-sysfs's test data) materialized, with
/// the separately captured VF type directories laid over every VF (the recorder did not descend
/// into them); VFs holding an mdev report 0, as an A2 VF holds one vGPU.
fn real_a2_capture() -> tempfile::TempDir {
    let data = Path::new(env!("CARGO_MANIFEST_DIR")).join("../gpu-sysfs/tests/data");
    let text = std::fs::read_to_string(data.join("a2-sriov-mdev-host.umockdev")).unwrap();
    let mut rec = gpu_sysfs::umockdev::parse(&text, "a2").unwrap();
    let types_dir = data.join("a2-vf-0000-08-01.7/mdev_supported_types");
    let mut types: Vec<String> = std::fs::read_dir(&types_dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    types.sort();
    let busy = ["0000:08:00.4", "0000:08:00.6", "0000:08:02.0"];
    for dev in &mut rec.devices {
        if dev.property("PCI_ID") != Some("10DE:25B6")
            || !dev.links.iter().any(|(n, _)| n == "physfn")
        {
            continue;
        }
        let held = busy.contains(&dev.name());
        for t in &types {
            for f in ["name", "description", "device_api", "available_instances"] {
                let mut v = std::fs::read(types_dir.join(t).join(f)).unwrap();
                if held && f == "available_instances" {
                    v = b"0\n".to_vec();
                }
                dev.attributes
                    .push((format!("mdev_supported_types/{t}/{f}"), v));
            }
        }
    }
    let dir = tempfile::tempdir().unwrap();
    rec.write_tree(dir.path(), "recording").unwrap();
    dir
}

/// Compares `actual` with `tests/golden/layout/<name>` (`GOLDEN_UPDATE=1` rewrites it).
fn golden(name: &str, actual: &str) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/golden/layout")
        .join(name);
    gpu_sysfs::testing::assert_golden(&path, actual);
}

#[test]
fn plans_and_diffs_on_the_real_a2_capture_match_the_golden_files() {
    let dir = real_a2_capture();
    let f = example();
    let f = f.to_str().unwrap();
    for (args, file, code) in [
        (
            vec!["vgpu", "apply", "-f", f, "-c", "A2-4Q", "--dry-run"],
            "a2-4q-dry-run.txt",
            0,
        ),
        (
            vec![
                "-o",
                "json",
                "vgpu",
                "apply",
                "-f",
                f,
                "-c",
                "A2-4Q",
                "--dry-run",
            ],
            "a2-4q-dry-run.json",
            0,
        ),
        (
            vec!["vgpu", "assert", "-f", f, "-c", "A2-4Q"],
            "a2-4q-assert.txt",
            1,
        ),
        (
            vec!["vgpu", "apply", "-f", f, "-c", "default", "--dry-run"],
            "default-dry-run.txt",
            0,
        ),
        (
            vec!["vgpu", "clear", "-f", f, "-c", "A2-4Q", "--dry-run"],
            "clear-dry-run.txt",
            0,
        ),
    ] {
        let out = gpuslice(dir.path(), &args);
        assert_eq!(
            out.status.code(),
            Some(code),
            "{file}: {}",
            text(&out.stderr)
        );
        golden(file, &text(&out.stdout));
    }
}

#[test]
fn a_recording_cannot_be_changed() {
    let rec = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../gpu-sysfs/tests/data/a2-sriov-mdev-host.umockdev");
    let f = example();
    let out = gpuslice(
        &rec,
        &["vgpu", "apply", "-f", f.to_str().unwrap(), "-c", "A2-4Q"],
    );
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("is a recording"),
        "{}",
        text(&out.stderr)
    );
}

/// The layout the real-kernel lab applies to the kernel's mbochs sample driver.
const MBOCHS_LAYOUT: &str = "version: v1
vgpu-configs:
  lab:
    mbochs: {mbochs-medium: 2, mbochs-small: 3}
";

/// The sample drivers' parents; `applied` adds the lab layout's five instances under their slot
/// UUIDs (node `a2host`, as [`gpuslice`] passes it).
fn sample_drivers(applied: bool) -> (Tree, PathBuf) {
    let mut b = TreeBuilder::new();
    gpu_sysfs::testing::fake_kernel::add_sample_mdev_drivers(&mut b);
    if applied {
        for (i, ty) in [
            "mbochs-medium",
            "mbochs-medium",
            "mbochs-small",
            "mbochs-small",
            "mbochs-small",
        ]
        .into_iter()
        .enumerate()
        {
            let u = MdevUuid::for_named_parent_slot("a2host", "mbochs", i as u32);
            b.mdev_instance(&u.to_string(), "mbochs", ty);
        }
    }
    let tree = b.finish().unwrap();
    let file = tree.root().join("lab-layout.yaml");
    std::fs::write(&file, MBOCHS_LAYOUT).unwrap();
    (tree, file)
}

#[test]
fn an_mbochs_layout_is_planned_and_asserted_by_parent_name() {
    let (tree, file) = sample_drivers(false);
    let f = file.to_str().unwrap();
    let before = snapshot(tree.root()).unwrap();
    let out = gpuslice(
        tree.root(),
        &["vgpu", "apply", "-f", f, "-c", "lab", "--dry-run"],
    );
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(
        stdout.contains("mbochs [vgpu-configs.lab.mbochs]"),
        "{stdout}"
    );
    let first = MdevUuid::for_named_parent_slot("a2host", "mbochs", 0);
    assert!(
        stdout.contains(&format!("1. + create mbochs-medium {first} on mbochs")),
        "{stdout}"
    );
    let out = gpuslice(tree.root(), &["vgpu", "assert", "-f", f, "-c", "lab"]);
    assert_eq!(out.status.code(), Some(1));
    let stdout = text(&out.stdout);
    assert!(
        stdout.contains("mbochs: mbochs-medium: have 0, want 2"),
        "{stdout}"
    );
    assert_eq!(changed(&before, tree.root()), Vec::<String>::new());
}

#[test]
fn an_applied_mbochs_layout_asserts_and_applies_without_writing() {
    let (tree, file) = sample_drivers(true);
    let f = file.to_str().unwrap();
    let before = snapshot(tree.root()).unwrap();
    let out = gpuslice(tree.root(), &["vgpu", "assert", "-f", f, "-c", "lab"]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    let out = gpuslice(
        tree.root(),
        &["vgpu", "apply", "-f", f, "-c", "lab", "-o", "json"],
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["status"], "unchanged");
    assert_eq!(report["plan"]["gpus"][0]["gpu"], "mbochs");
    assert_eq!(changed(&before, tree.root()), Vec::<String>::new());
}
