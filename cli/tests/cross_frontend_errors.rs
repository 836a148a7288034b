//! The CLI's side of the cross-front-end error cases (`tests/error-cases.json`): every bad input
//! fails with the kind the Python and Node bindings report for it too.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::Path;
use std::process::Command;

use serde_json::Value;

fn cases() -> Vec<Value> {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/error-cases.json");
    let doc: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    doc["cases"].as_array().unwrap().clone()
}

fn write(dir: &Path, name: &str, value: &Value) -> String {
    let path = dir.join(name);
    let text = match value {
        Value::String(s) => s.clone(),
        other => serde_json::to_string(other).unwrap(),
    };
    std::fs::write(&path, text).unwrap();
    path.display().to_string()
}

/// Runs the case through the CLI with `-o json`; returns the `kind` it printed on stderr.
fn cli_kind(case: &Value, dir: &Path) -> String {
    let root = dir.join("root");
    std::fs::create_dir_all(root.join("sys")).unwrap();
    let root = root.display().to_string();
    let mut args: Vec<String> = vec!["-o".into(), "json".into()];
    match case["call"].as_str().unwrap() {
        "place" => {
            let fleet = write(dir, "fleet.json", &case["fleet"]);
            let machine = write(dir, "machine.json", &case["machine"]);
            args.extend(["place", "--inventory", &fleet, "--machine", &machine].map(String::from));
        }
        "layout" => {
            let layout = write(dir, "layout.yaml", &case["layout"]);
            let config = case["config"].as_str().unwrap();
            args.extend(
                [
                    "--root",
                    &root,
                    "vgpu",
                    "apply",
                    "--dry-run",
                    "-f",
                    &layout,
                    "-c",
                    config,
                ]
                .map(String::from),
            );
        }
        "policy" => {
            let policy = write(dir, "policy.yaml", &case["policy"]);
            args.extend(["--root", &root, "health", "--policy", &policy].map(String::from));
        }
        "discover" => {
            let missing = case["root"].as_str().unwrap();
            args.extend(["--root", missing, "topology"].map(String::from));
        }
        other => panic!("unknown call {other}"),
    }
    let out = Command::new(env!("CARGO_BIN_EXE_gpuslice"))
        .args(&args)
        .output()
        .unwrap();
    assert!(
        !out.status.success(),
        "{}: {args:?} succeeded",
        case["name"]
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    let doc: Value = serde_json::from_str(stderr.trim())
        .unwrap_or_else(|e| panic!("{}: {e}: {stderr}", case["name"]));
    // Every error, a refusal too, prints `{"error": {"kind": ..., "message": ...}}` and nothing
    // else.
    assert_eq!(
        doc.as_object()
            .map(|o| o.keys().map(String::as_str).collect::<Vec<_>>()),
        Some(vec!["error"]),
        "{}: {doc}",
        case["name"]
    );
    assert!(
        doc["error"]["message"].is_string(),
        "{}: {doc}",
        case["name"]
    );
    doc["error"]["kind"]
        .as_str()
        .unwrap_or_else(|| panic!("{}: no kind in {doc}", case["name"]))
        .to_owned()
}

#[test]
fn every_bad_input_fails_with_the_kind_the_bindings_report_too() {
    let cases = cases();
    assert_eq!(cases.len(), 7);
    for case in &cases {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(
            cli_kind(case, dir.path()),
            case["kind"].as_str().unwrap(),
            "{}",
            case["name"]
        );
    }
}

#[test]
fn the_documents_of_the_cases_decode_so_each_case_fails_where_it_means_to() {
    for case in cases() {
        if let Some(t) = case.get("topology") {
            gpu_core::NodeTopology::from_text(&t.to_string()).unwrap();
        }
        if case["kind"] != "invalid-config" {
            if let Some(f) = case.get("fleet") {
                gpu_core::Fleet::from_text(&f.to_string()).unwrap();
            }
        }
    }
}
