#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! `gpuslice place` and `gpuslice plan` against golden files in `tests/golden/place/`.
//! `GOLDEN_UPDATE=1 cargo test -p gpuslice-cli --test place` rewrites the `.out` files.

use std::path::{Path, PathBuf};
use std::process::Command;

fn golden_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden/place")
}

/// Runs gpuslice in the golden directory and renders exit status, stdout and stderr.
fn run(args: &[&str]) -> (i32, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_gpuslice"))
        .args(args)
        .current_dir(golden_dir())
        .env_remove("GPUSLICE_ROOT")
        .output()
        .unwrap();
    let code = out.status.code().unwrap_or(-1);
    let text = format!(
        "$ gpuslice {}\n--- exit {code}\n--- stdout\n{}--- stderr\n{}",
        args.join(" "),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (code, text)
}

fn check(name: &str, args: &[&str], want_code: i32) {
    let (code, text) = run(args);
    let path = golden_dir().join(format!("{name}.out"));
    gpu_sysfs::testing::assert_golden(&path, &text);
    assert_eq!(code, want_code, "{name}: exit status");
}

#[test]
fn place_prints_the_allocation_as_a_table() {
    check(
        "place-desktop",
        &[
            "place",
            "--inventory",
            "fleet.yaml",
            "--machine",
            "desktop.yaml",
        ],
        0,
    );
}

#[test]
fn place_marks_devices_on_degraded_gpus() {
    check(
        "place-degraded",
        &[
            "place",
            "--inventory",
            "fleet.yaml",
            "--machine",
            "training-3.yaml",
        ],
        0,
    );
}

#[test]
fn place_prints_json_with_spread_policy() {
    check(
        "place-mig-json",
        &[
            "place",
            "--inventory",
            "fleet.yaml",
            "--machine",
            "inference-mig.yaml",
            "--policy",
            "spread",
            "-o",
            "json",
        ],
        0,
    );
}

#[test]
fn place_exits_3_with_the_refusal_on_stderr() {
    check(
        "place-refused",
        &[
            "place",
            "--inventory",
            "fleet.yaml",
            "--machine",
            "too-big.yaml",
        ],
        3,
    );
    check(
        "place-refused-json",
        &[
            "place",
            "--inventory",
            "fleet.yaml",
            "--machine",
            "too-big.yaml",
            "-o",
            "json",
        ],
        3,
    );
}

#[test]
fn place_detail_adds_every_refused_node_to_the_json_refusal() {
    check(
        "place-refused-json-detail",
        &[
            "place",
            "--inventory",
            "fleet.yaml",
            "--machine",
            "too-big.yaml",
            "-o",
            "json",
            "--detail",
        ],
        3,
    );
}

#[test]
fn place_rejects_an_invalid_machine_with_exit_2() {
    check(
        "place-invalid",
        &[
            "place",
            "--inventory",
            "fleet.yaml",
            "--machine",
            "bad.yaml",
        ],
        2,
    );
    check(
        "place-bad-policy",
        &[
            "place",
            "--inventory",
            "fleet.yaml",
            "--machine",
            "desktop.yaml",
            "--policy",
            "first-fit",
        ],
        2,
    );
}

#[test]
fn plan_migrate_explains_a_destination_that_cannot_take_it() {
    check(
        "plan-migrate-refused",
        &[
            "plan",
            "migrate",
            "--inventory",
            "fleet.yaml",
            "--machine",
            "train-1",
            "--to",
            "gpu-a2",
        ],
        3,
    );
    check(
        "plan-migrate",
        &[
            "plan",
            "migrate",
            "--inventory",
            "fleet.yaml",
            "--machine",
            "train-1",
            "--to",
            "gpu-h100-b",
        ],
        0,
    );
}

#[test]
fn plan_drain_uses_the_global_node_option() {
    check(
        "plan-drain",
        &[
            "plan",
            "drain",
            "--inventory",
            "fleet.yaml",
            "--node",
            "gpu-h100",
        ],
        0,
    );
    check(
        "plan-drain-no-node",
        &["plan", "drain", "--inventory", "fleet.yaml"],
        2,
    );
}

#[test]
fn plan_evacuate_lists_machines_on_unhealthy_gpus() {
    check(
        "plan-evacuate",
        &["plan", "evacuate", "--inventory", "fleet.yaml"],
        0,
    );
    check(
        "plan-evacuate-json",
        &[
            "plan",
            "evacuate",
            "--inventory",
            "fleet.yaml",
            "-o",
            "json",
        ],
        0,
    );
}

#[test]
fn place_save_records_the_allocation_in_the_fleet_file() {
    let dir = tempfile::tempdir().unwrap();
    let fleet = dir.path().join("fleet.yaml");
    std::fs::copy(golden_dir().join("fleet.yaml"), &fleet).unwrap();
    let place = |machine: &str| {
        Command::new(env!("CARGO_BIN_EXE_gpuslice"))
            .args(["place", "--save", "--inventory"])
            .arg(&fleet)
            .arg("--machine")
            .arg(golden_dir().join(machine))
            .output()
            .unwrap()
    };
    assert!(place("desktop.yaml").status.success());
    let saved = gpu_core::Fleet::from_text(&std::fs::read_to_string(&fleet).unwrap()).unwrap();
    assert!(saved.allocations.iter().any(|a| a.machine == "desktop-1"));
    // The same Machine again, unchanged (an orchestrator retrying): its placement, exit 0,
    // and the file is not written again.
    let saved_text = std::fs::read(&fleet).unwrap();
    let again = place("desktop.yaml");
    assert_eq!(again.status.code(), Some(0));
    let stdout = String::from_utf8_lossy(&again.stdout);
    assert!(
        stdout.contains("Machine desktop-1 is already placed on node"),
        "{stdout}"
    );
    assert_eq!(std::fs::read(&fleet).unwrap(), saved_text);
}

#[test]
fn place_save_keeps_the_fleets_node_order() {
    let dir = tempfile::tempdir().unwrap();
    let fleet = dir.path().join("fleet.yaml");
    std::fs::copy(golden_dir().join("fleet.yaml"), &fleet).unwrap();
    let order = |text: &str| -> Vec<String> {
        gpu_core::Fleet::from_text(text)
            .unwrap()
            .nodes
            .into_iter()
            .map(|n| n.node)
            .collect()
    };
    let before = order(&std::fs::read_to_string(&fleet).unwrap());
    let out = Command::new(env!("CARGO_BIN_EXE_gpuslice"))
        .args(["place", "--save", "--inventory"])
        .arg(&fleet)
        .arg("--machine")
        .arg(golden_dir().join("desktop.yaml"))
        .output()
        .unwrap();
    assert!(out.status.success());
    assert_eq!(order(&std::fs::read_to_string(&fleet).unwrap()), before);
    let mut by_name = before.clone();
    by_name.sort();
    assert_ne!(by_name, before, "the golden fleet is not in name order");
}

#[test]
fn place_without_save_says_would_and_a_dry_run_says_so_in_every_format() {
    let (_, text) = run(&[
        "place",
        "--inventory",
        "fleet.yaml",
        "--machine",
        "desktop.yaml",
    ]);
    assert!(text.contains("would be placed on node"), "{text}");
    assert!(text.contains("pass --save to record it"), "{text}");
    for (format, marker) in [("json", "\"dryRun\": true"), ("yaml", "dryRun: true")] {
        let (code, text) = run(&[
            "place",
            "--dry-run",
            "--inventory",
            "fleet.yaml",
            "--machine",
            "desktop.yaml",
            "-o",
            format,
        ]);
        assert_eq!(code, 0);
        assert!(text.contains(marker), "{format}: {text}");
    }
    let (_, text) = run(&[
        "place",
        "--inventory",
        "fleet.yaml",
        "--machine",
        "desktop.yaml",
        "-o",
        "json",
    ]);
    assert!(text.contains("\"saved\": false"), "{text}");
}

#[test]
fn place_node_means_the_target_node_and_two_different_nodes_are_refused() {
    let (code, text) = run(&[
        "--node",
        "gpu-mbochs",
        "place",
        "--inventory",
        "fleet.yaml",
        "--machine",
        "desktop.yaml",
    ]);
    // Without the target the desktop goes to gpu-a2 (exit 0); on gpu-mbochs it is refused.
    assert_eq!(code, 3, "{text}");
    assert!(text.contains("ProfileNotOffered"), "{text}");
    let (code, text) = run(&[
        "--node",
        "gpu-a2",
        "place",
        "--target-node",
        "gpu-mbochs",
        "--inventory",
        "fleet.yaml",
        "--machine",
        "desktop.yaml",
    ]);
    assert_eq!(code, 2, "{text}");
    assert!(text.contains("name different nodes"), "{text}");
}

#[test]
fn place_dry_run_says_where_and_records_nothing() {
    check(
        "place-dry-run",
        &[
            "place",
            "--dry-run",
            "--inventory",
            "fleet.yaml",
            "--machine",
            "desktop.yaml",
        ],
        0,
    );
    let dir = tempfile::tempdir().unwrap();
    let fleet = dir.path().join("fleet.yaml");
    std::fs::copy(golden_dir().join("fleet.yaml"), &fleet).unwrap();
    let before = std::fs::read(&fleet).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_gpuslice"))
        .args(["place", "--dry-run", "--save", "--inventory"])
        .arg(&fleet)
        .arg("--machine")
        .arg(golden_dir().join("desktop.yaml"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "--dry-run and --save conflict");
    assert_eq!(std::fs::read(&fleet).unwrap(), before);
}

#[test]
fn place_target_node_refuses_with_that_nodes_reasons() {
    check(
        "place-target-node",
        &[
            "place",
            "--target-node",
            "gpu-mbochs",
            "--inventory",
            "fleet.yaml",
            "--machine",
            "desktop.yaml",
        ],
        3,
    );
    check(
        "place-target-node-unknown",
        &[
            "place",
            "--target-node",
            "nowhere",
            "--inventory",
            "fleet.yaml",
            "--machine",
            "desktop.yaml",
        ],
        2,
    );
}
