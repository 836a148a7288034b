//! With `-o json`, a failure is also machine-readable on stderr: programs driving the CLI tell
//! failures apart by `kind`, not by parsing messages.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::process::Command;

const UUID: &str = "de306c9f-a714-4373-a290-dc15d4e49b71";

fn gpuslice(root: &std::path::Path, args: &[&str]) -> (i32, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_gpuslice"))
        .arg("--root")
        .arg(root)
        .args(args)
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn create_args(output: &str) -> Vec<&str> {
    vec![
        "-o",
        output,
        "vgpu",
        "create",
        "--parent",
        "mbochs",
        "--profile",
        "mbochs-small",
        "--uuid",
        UUID,
    ]
}

#[test]
fn a_json_error_names_its_kind_and_message() {
    let dir = tempfile::tempdir().unwrap();
    let (code, stderr) = gpuslice(dir.path(), &create_args("json"));
    assert_eq!(code, 2, "{stderr}");
    let doc: serde_json::Value =
        serde_json::from_str(stderr.trim()).unwrap_or_else(|e| panic!("{e}: {stderr}"));
    assert_eq!(doc["error"]["kind"], "host-error", "{doc}");
    assert!(
        doc["error"]["message"]
            .as_str()
            .unwrap()
            .contains("invalid host root"),
        "{doc}"
    );
}

#[test]
fn a_yaml_error_is_yaml() {
    let dir = tempfile::tempdir().unwrap();
    let (code, stderr) = gpuslice(dir.path(), &create_args("yaml"));
    assert_eq!(code, 2, "{stderr}");
    let doc: serde_json::Value =
        serde_yaml_ng::from_str(&stderr).unwrap_or_else(|e| panic!("{e}: {stderr}"));
    assert_eq!(doc["error"]["kind"], "host-error", "{doc}");
}

#[test]
fn a_table_error_is_one_line_for_people() {
    let dir = tempfile::tempdir().unwrap();
    let (code, stderr) = gpuslice(dir.path(), &create_args("table"));
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.starts_with("gpuslice: "), "{stderr}");
    assert_eq!(stderr.trim_end().lines().count(), 1, "{stderr}");
}
