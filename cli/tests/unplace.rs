#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! `gpuslice unplace` (the inverse of `place --save`), and what `place` answers to a profile no
//! node offers and to a refusal under `-o json`; `--json` and mdevctl's `--type`.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

fn golden(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/golden/place")
        .join(name)
}

fn gpuslice(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_gpuslice"))
        .args(args)
        .env_remove("GPUSLICE_ROOT")
        .output()
        .unwrap()
}

/// Runs `gpuslice -o json ARGS` that fails: its exit status and the error document on stderr.
fn json_failure(args: &[&str]) -> (Option<i32>, Value) {
    let out = gpuslice(&[&["-o", "json"][..], args].concat());
    assert!(out.stdout.is_empty(), "{}", text(&out.stdout));
    let doc = serde_json::from_slice(&out.stderr)
        .unwrap_or_else(|e| panic!("{e}: {}", text(&out.stderr)));
    (out.status.code(), doc)
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// A copy of the golden fleet to write to.
fn fleet_copy(dir: &Path) -> String {
    let path = dir.join("fleet.yaml");
    std::fs::copy(golden("fleet.yaml"), &path).unwrap();
    path.display().to_string()
}

#[test]
fn unplace_save_releases_what_place_save_recorded_so_it_fits_again() {
    let dir = tempfile::tempdir().unwrap();
    let fleet = fleet_copy(dir.path());
    let machine = golden("desktop.yaml").display().to_string();
    let place = [
        "place",
        "--inventory",
        &fleet,
        "--machine",
        &machine,
        "--save",
    ];
    let out = gpuslice(&place);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let placed = std::fs::read_to_string(&fleet).unwrap();
    assert!(placed.contains("desktop-1"));

    let out = gpuslice(&[
        "unplace",
        "--inventory",
        &fleet,
        "--machine",
        "desktop-1",
        "--save",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    assert!(
        stdout.starts_with("Machine desktop-1 released from node "),
        "{stdout}"
    );
    assert!(stdout.contains("A2-4Q"), "{stdout}");
    let after = std::fs::read_to_string(&fleet).unwrap();
    assert!(!after.contains("desktop-1"), "{after}");
    assert!(after.contains("train-1"), "other allocations stay: {after}");
    // The same Machine places again.
    assert!(gpuslice(&place).status.success());
}

#[test]
fn unplace_without_save_says_what_would_be_released_and_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let fleet = fleet_copy(dir.path());
    let before = std::fs::read_to_string(&fleet).unwrap();
    let out = gpuslice(&[
        "-o",
        "json",
        "unplace",
        "--inventory",
        &fleet,
        "--machine",
        "train-1",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let doc: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(doc["machine"], "train-1");
    assert_eq!(doc["node"], "gpu-h100");
    assert_eq!(doc["onHost"], true, "train-1 is created: {doc}");
    assert_eq!(doc["saved"], false);
    assert_eq!(doc["devices"][0]["name"], "nvidia3");
    assert_eq!(std::fs::read_to_string(&fleet).unwrap(), before);

    let out = gpuslice(&["unplace", "--inventory", &fleet, "--machine", "train-1"]);
    let stdout = text(&out.stdout);
    assert!(stdout.contains("would be released"), "{stdout}");
    assert!(stdout.contains("pass --save"), "{stdout}");
    assert!(stdout.contains("were created on node gpu-h100"), "{stdout}");
}

#[test]
fn unplace_of_an_unknown_machine_is_a_clear_error_with_exit_2() {
    let dir = tempfile::tempdir().unwrap();
    let fleet = fleet_copy(dir.path());
    let before = std::fs::read_to_string(&fleet).unwrap();
    let out = gpuslice(&[
        "unplace",
        "--inventory",
        &fleet,
        "--machine",
        "train-9",
        "--save",
    ]);
    assert_eq!(out.status.code(), Some(2));
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("no Machine \"train-9\" is placed in the fleet (nearest placed: train-1)"),
        "{stderr}"
    );
    assert_eq!(std::fs::read_to_string(&fleet).unwrap(), before);
    let (code, doc) = json_failure(&["unplace", "--inventory", &fleet, "--machine", "train-9"]);
    assert_eq!(code, Some(2));
    assert_eq!(doc["error"]["kind"], "not-found", "{doc}");
}

#[test]
fn a_profile_no_node_offers_is_an_invalid_request_listing_the_nearest_names() {
    let fleet = golden("fleet.yaml").display().to_string();
    let machine = golden("typo.yaml").display().to_string();
    let out = gpuslice(&["place", "--inventory", &fleet, "--machine", &machine]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains(
            "no node in the fleet offers vGPU profile \"A2-44Q\"; nearest offered: A2-4Q"
        ),
        "{stderr}"
    );
    let (code, doc) = json_failure(&["place", "--inventory", &fleet, "--machine", &machine]);
    assert_eq!(code, Some(2));
    assert_eq!(doc["error"]["kind"], "invalid-request", "{doc}");
}

#[test]
fn a_json_refusal_has_the_shape_of_every_other_error() {
    let fleet = golden("fleet.yaml").display().to_string();
    let machine = golden("too-big.yaml").display().to_string();
    let (code, doc) = json_failure(&["place", "--inventory", &fleet, "--machine", &machine]);
    assert_eq!(code, Some(3));
    let keys: Vec<&String> = doc.as_object().unwrap().keys().collect();
    assert_eq!(keys, ["error"], "{doc}");
    assert_eq!(doc["error"]["kind"], "unsatisfiable");
    assert!(
        doc["error"]["message"]
            .as_str()
            .unwrap()
            .contains("0/5 nodes")
    );
    assert_eq!(doc["error"]["refusal"]["machine"], "too-big");
}

#[test]
fn json_is_answered_with_the_output_option() {
    let out = gpuslice(&["topology", "--json"]);
    assert_eq!(out.status.code(), Some(2));
    let stderr = text(&out.stderr);
    assert!(stderr.contains("pass -o json"), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
}

#[test]
fn type_is_mdevctls_name_for_profile() {
    let out = gpuslice(&["vgpu", "create", "--help"]);
    assert!(
        text(&out.stdout).contains("--type"),
        "{}",
        text(&out.stdout)
    );
    // Parsed as --profile: the command gets past the arguments to the (missing) host.
    let dir = tempfile::tempdir().unwrap();
    let out = gpuslice(&[
        "--root",
        &dir.path().display().to_string(),
        "vgpu",
        "create",
        "--parent",
        "mbochs",
        "--type",
        "mbochs-small",
        "--uuid",
        "de306c9f-a714-4373-a290-dc15d4e49b71",
    ]);
    assert_eq!(out.status.code(), Some(2));
    let stderr = text(&out.stderr);
    assert!(!stderr.contains("unexpected argument"), "{stderr}");
    assert!(stderr.contains("invalid host root"), "{stderr}");
}
