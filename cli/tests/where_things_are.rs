//! Where things are: errors under `--root` name paths where they are under the root, `-o json`
//! refusals are a document on stderr (as `--help` says), and `--help` lists what options take.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::process::{Command, Output};

fn gpuslice(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_gpuslice"))
        .env_remove("GPUSLICE_ROOT")
        .args(args)
        .output()
        .unwrap()
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn an_error_under_a_sandbox_names_the_path_under_it_not_this_machines_sys() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("sbx");
    assert!(
        gpuslice(&["sandbox", "init", dir.to_str().unwrap()])
            .status
            .success()
    );
    let root = format!("sandbox:{}", dir.display());
    let create = |uuid: &str, json: bool| {
        let mut args = vec!["--root", root.as_str()];
        if json {
            args.extend(["-o", "json"]);
        }
        args.extend([
            "vgpu",
            "create",
            "--parent",
            "0000:08:00.7",
            "--profile",
            "A2-4Q",
            "--uuid",
            uuid,
        ]);
        gpuslice(&args)
    };
    assert!(
        create("11111111-2222-3333-4444-555555555555", false)
            .status
            .success()
    );
    let out = create("11111111-2222-3333-4444-666666666666", false);
    assert_eq!(out.status.code(), Some(2));
    let err = text(&out.stderr);
    let under = format!("{}/host/sys/class/mdev_bus/0000:08:00.7/", dir.display());
    assert!(err.contains(&under), "{err}");
    assert!(!err.contains(" /sys/"), "{err}");
    // The -o json refusal: one document on stderr naming the same path, nothing on stdout.
    let out = create("11111111-2222-3333-4444-777777777777", true);
    assert_eq!(out.status.code(), Some(2));
    assert!(out.stdout.is_empty());
    let line = text(&out.stderr)
        .lines()
        .find(|l| l.starts_with('{'))
        .unwrap()
        .to_owned();
    let doc: serde_json::Value = serde_json::from_str(&line).unwrap();
    assert_eq!(doc["error"]["kind"], "exhausted");
    assert!(doc["error"]["message"].as_str().unwrap().contains(&under));
}

#[test]
fn help_says_where_json_refusals_go_and_lists_the_placement_policies() {
    let help = text(&gpuslice(&["topology", "--help"]).stdout);
    assert!(help.contains("written to stderr"), "{help}");
    assert!(help.contains("sandbox:DIR"), "{help}");
    let place = text(&gpuslice(&["place", "--help"]).stdout);
    for p in ["binpack", "spread", "firstfit"] {
        assert!(place.contains(p), "--policy help lacks {p}:\n{place}");
    }
}
