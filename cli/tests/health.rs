//! `gpuslice health` end to end: the binary on fake trees and the real A2 capture, output checked
//! against golden files in `tests/golden/health/` (regenerate with `GOLDEN_UPDATE=1`).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod nvml_stub;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use gpu_sysfs::testing::{PciSpec, TreeBuilder};

fn bin() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_gpuslice"));
    c.env_remove("GPUSLICE_ROOT");
    c
}

fn run(root: &Path, args: &[&str]) -> Output {
    bin()
        .arg("--root")
        .arg(root)
        .args(["--node", "n1"])
        .args(args)
        .output()
        .unwrap()
}

fn stdout(o: &Output) -> String {
    String::from_utf8(o.stdout.clone()).unwrap()
}

fn stderr(o: &Output) -> String {
    String::from_utf8(o.stderr.clone()).unwrap()
}

fn golden(name: &str, actual: &str) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/golden/health")
        .join(name);
    gpu_sysfs::testing::assert_golden(&path, actual);
}

fn a2_recording() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../gpu-health/tests/data/a2-pf.umockdev")
}

/// A host with four GPUs: a clean x16 T4, a T4 that trained at x8 while its peer runs x16, an
/// A100 with fatal and non-fatal AER errors, and a Radeon that exposes no health files at all.
fn mixed_host() -> gpu_sysfs::testing::builder::Tree {
    let mut b = TreeBuilder::new();
    let t4 = || {
        PciSpec::new(0x10de, 0x1eb8, 0x030200)
            .subsystem(0x10de, 0x12a2)
            .driver("nvidia")
    };
    b.pci(
        "0000:3b:00.0",
        t4().group(10)
            .link(16, 16, "2.5 GT/s PCIe", "8.0 GT/s PCIe"),
    );
    b.pci(
        "0000:5e:00.0",
        t4().group(11).link(8, 16, "8.0 GT/s PCIe", "8.0 GT/s PCIe"),
    );
    b.pci(
        "0000:86:00.0",
        PciSpec::new(0x10de, 0x20f1, 0x030200)
            .driver("nvidia")
            .group(12)
            .link(16, 16, "16.0 GT/s PCIe", "16.0 GT/s PCIe"),
    );
    b.pci(
        "0000:c1:00.0",
        PciSpec::new(0x1002, 0x7448, 0x030000).group(13),
    );
    for a in ["0000:3b:00.0", "0000:5e:00.0", "0000:86:00.0"] {
        b.attr(
            a,
            "aer_dev_correctable",
            "RxErr 3\nBadTLP 0\nTOTAL_ERR_COR 3\n",
        );
    }
    b.attr(
        "0000:3b:00.0",
        "aer_dev_nonfatal",
        "CmpltTO 0\nTOTAL_ERR_NONFATAL 0\n",
    );
    b.attr(
        "0000:3b:00.0",
        "aer_dev_fatal",
        "DLP 0\nTOTAL_ERR_FATAL 0\n",
    );
    b.attr(
        "0000:86:00.0",
        "aer_dev_nonfatal",
        "CmpltTO 2\nUnsupReq 1\nTOTAL_ERR_NONFATAL 3\n",
    );
    b.attr(
        "0000:86:00.0",
        "aer_dev_fatal",
        "DLP 0\nMalfTLP 1\nTOTAL_ERR_FATAL 1\n",
    );
    b.finish().unwrap()
}

#[test]
fn health_of_the_real_a2_capture_is_healthy_in_table_and_json() {
    let rec = a2_recording();
    let o = run(&rec, &["health", "--no-nvml"]);
    assert!(o.status.success(), "{}", stderr(&o));
    golden("a2.txt", &stdout(&o));
    let o = run(&rec, &["health", "--no-nvml", "-o", "json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    golden("a2.json", &stdout(&o));
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(v["gpus"][0]["health"]["state"], "Healthy");
    assert_eq!(v["gpus"][0]["expectedLinkWidth"]["basis"], "board");
}

#[test]
fn health_of_a_mixed_host_lists_each_verdict_with_its_reasons() {
    let t = mixed_host();
    let o = run(t.root(), &["health", "--no-nvml"]);
    assert!(o.status.success(), "{}", stderr(&o));
    golden("mixed.txt", &stdout(&o));
    let o = run(t.root(), &["health", "--no-nvml", "-o", "json"]);
    golden("mixed.json", &stdout(&o));
}

#[test]
fn fail_on_sets_the_exit_status() {
    let t = mixed_host();
    assert_eq!(
        run(t.root(), &["health", "--no-nvml", "--fail-on", "unhealthy"])
            .status
            .code(),
        Some(1)
    );
    let rec = a2_recording();
    assert_eq!(
        run(&rec, &["health", "--no-nvml", "--fail-on", "degraded"])
            .status
            .code(),
        Some(0)
    );
}

#[test]
fn a_policy_file_changes_the_verdicts() {
    let t = mixed_host();
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("lenient.yaml");
    std::fs::write(
        &p,
        "aer:\n  fatalMax: 5\n  nonfatalGrowthMax: off\nlink:\n  comparePeers: false\n  fallback: none\n",
    )
    .unwrap();
    let o = run(
        t.root(),
        &["health", "--no-nvml", "--policy", p.to_str().unwrap()],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    golden("mixed-lenient.txt", &stdout(&o));
}

#[test]
fn a_policy_with_an_unknown_key_is_a_clear_error() {
    let t = mixed_host();
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("typo.toml");
    std::fs::write(&p, "[aer]\nfatal = 1\n").unwrap();
    let o = run(t.root(), &["health", "--policy", p.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2));
    let e = stderr(&o);
    assert!(e.starts_with("gpuslice: policy "), "{e}");
    assert!(
        e.contains("typo.toml") && e.contains("unknown field `fatal`"),
        "{e}"
    );
}

#[test]
fn print_policy_shows_the_documented_defaults() {
    let o = bin().args(["health", "--print-policy"]).output().unwrap();
    assert!(o.status.success());
    golden("default-policy.toml", &stdout(&o));
}

#[test]
fn an_explicit_nvml_library_that_does_not_load_is_an_error() {
    let rec = a2_recording();
    let o = run(
        &rec,
        &["health", "--nvml-lib", "/nonexistent/libnvidia-ml.so.1"],
    );
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("--nvml-lib /nonexistent/libnvidia-ml.so.1"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn record_baseline_remembers_the_widest_link_for_next_time() {
    let mut b = TreeBuilder::new();
    b.pci(
        "0000:3b:00.0",
        PciSpec::new(0x10de, 0x1eb8, 0x030200)
            .driver("nvidia")
            .group(10)
            .link(16, 16, "8.0 GT/s PCIe", "8.0 GT/s PCIe"),
    );
    let t = b.finish().unwrap();
    let o = run(t.root(), &["health", "--no-nvml", "--record-baseline"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let base = t.root().join("var/lib/gpuslice/health-baseline.json");
    let text = std::fs::read_to_string(&base).unwrap();
    assert!(text.contains("\"linkWidth\": 16"), "{text}");
    // The link drops; the baseline still says x16.
    std::fs::write(
        t.root()
            .join("sys/devices/pci0000:00/0000:3b:00.0/current_link_width"),
        "8\n",
    )
    .unwrap();
    let o = run(t.root(), &["health", "--no-nvml", "-o", "json"]);
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(v["gpus"][0]["health"]["reasons"][0], "link x8 of x16");
    assert_eq!(v["gpus"][0]["expectedLinkWidth"]["basis"], "baseline");
}

#[test]
fn a_recording_cannot_take_a_baseline() {
    let o = run(
        &a2_recording(),
        &["health", "--no-nvml", "--record-baseline"],
    );
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("--record-baseline needs a directory root"));
}

#[test]
fn health_reads_nvml_through_an_explicit_library() {
    let Some((_dir, lib)) = nvml_stub::build(&[]) else {
        return;
    };
    // The stub knows 0000:08:00.0 as a healthy 16 GiB GPU at 41 °C.
    let o = run(
        &a2_recording(),
        &["health", "--nvml-lib", lib.to_str().unwrap(), "-o", "json"],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    let g = &v["gpus"][0];
    assert_eq!(g["health"]["state"], "Healthy");
    assert_eq!(g["memoryMiB"], 16384);
    assert_eq!(g["telemetrySource"], "NVML (driver 550.54.15)");
    assert_eq!(g["signals"]["telemetry"]["temperatureC"]["value"], 41);
}
