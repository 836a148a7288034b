#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! Every document the CLI reads stops at the cap: 64 MiB by default, raised by
//! `--max-document-mib` or `GPUSLICE_MAX_DOCUMENT_MIB`; standard input is capped the same way.

use std::io::Write;
use std::path::Path;
use std::process::{Command, Output, Stdio};

fn gpuslice(args: &[&str], env: &[(&str, &str)], stdin: Option<usize>) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_gpuslice"));
    cmd.args(args)
        .env_remove("GPUSLICE_ROOT")
        .env_remove("GPUSLICE_MAX_DOCUMENT_MIB")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().unwrap();
    let mut input = child.stdin.take().unwrap();
    if let Some(n) = stdin {
        // The reader stops one byte past the cap and the command exits: a broken pipe ends this.
        let chunk = vec![b' '; 1 << 20];
        for _ in 0..n.div_ceil(chunk.len()) {
            if input.write_all(&chunk).is_err() {
                break;
            }
        }
    }
    drop(input);
    child.wait_with_output().unwrap()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// A sparse fleet file of `mib` MiB (nothing written, so nothing to read but zeros).
fn sparse(dir: &Path, mib: u64) -> String {
    let p = dir.join("fleet.json");
    std::fs::File::create(&p)
        .unwrap()
        .set_len(mib << 20)
        .unwrap();
    p.display().to_string()
}

#[test]
fn a_fleet_over_64_mib_is_refused_by_default_saying_how_to_raise_the_cap() {
    let dir = tempfile::tempdir().unwrap();
    let fleet = sparse(dir.path(), 65);
    let o = gpuslice(&["gpu", "list", "--inventory", &fleet], &[], None);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    let e = stderr(&o);
    assert!(
        e.contains("fleet is 68157440 bytes; at most 64 MiB are read"),
        "{e}"
    );
    assert!(e.contains("--max-document-mib"), "{e}");
}

#[test]
fn the_flag_and_the_environment_raise_the_cap() {
    let dir = tempfile::tempdir().unwrap();
    let fleet = sparse(dir.path(), 65);
    for (args, env) in [
        (
            vec![
                "gpu",
                "list",
                "--max-document-mib",
                "66",
                "--inventory",
                &fleet,
            ],
            vec![],
        ),
        (
            vec!["gpu", "list", "--inventory", &fleet],
            vec![("GPUSLICE_MAX_DOCUMENT_MIB", "66")],
        ),
    ] {
        let o = gpuslice(&args, &env, None);
        let e = stderr(&o);
        // Read whole this time: the zeros are then refused by the decoder, not by size.
        assert_ne!(o.status.code(), Some(0), "{e}");
        assert!(!e.contains("at most"), "{args:?}: {e}");
        assert!(e.contains("cannot decode fleet"), "{args:?}: {e}");
    }
}

#[test]
fn standard_input_stops_at_the_cap() {
    let o = gpuslice(
        &["gpu", "list", "--max-document-mib", "1", "--inventory", "-"],
        &[],
        Some(8 << 20),
    );
    let e = stderr(&o);
    assert_eq!(o.status.code(), Some(2), "{e}");
    assert!(e.contains("standard input"), "{e}");
    assert!(e.contains("larger than 1048576 bytes"), "{e}");
}

#[test]
fn a_fifo_named_as_a_document_is_refused_without_blocking() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("fleet.yaml");
    assert!(Command::new("mkfifo").arg(&p).status().unwrap().success());
    let o = gpuslice(
        &["gpu", "list", "--inventory", &p.display().to_string()],
        &[],
        None,
    );
    let e = stderr(&o);
    assert_eq!(o.status.code(), Some(2), "{e}");
    assert!(e.contains("is a FIFO"), "{e}");
}

/// A fleet in the full form, `n` copies of the example fleet's first node, as JSON.
fn full_fleet(dir: &Path, n: usize) -> String {
    let example =
        gpu_core::Fleet::from_text(include_str!("../../examples/fleet/fleet.yaml")).unwrap();
    let fleet = gpu_core::Fleet {
        nodes: (0..n)
            .map(|i| {
                let mut t = example.nodes[0].clone();
                t.node = format!("node-{i:03}");
                t
            })
            .collect(),
        ..gpu_core::Fleet::default()
    };
    let p = dir.join("full.json");
    std::fs::write(&p, fleet.to_text_full(true).unwrap()).unwrap();
    p.display().to_string()
}

#[test]
fn a_json_fleet_is_decoded_as_it_is_read_within_the_raised_cap() {
    let dir = tempfile::tempdir().unwrap();
    let fleet = full_fleet(dir.path(), 100);
    let len = std::fs::metadata(&fleet).unwrap().len();
    assert!(len > 1 << 20 && len < 2 << 20, "{len} bytes");
    let show = |mib: &str| {
        gpuslice(
            &[
                "topology",
                "--max-document-mib",
                mib,
                "--inventory",
                &fleet,
                "--node",
                "node-099",
                "-o",
                "json",
            ],
            &[],
            None,
        )
    };
    let refused = show("1");
    assert_eq!(refused.status.code(), Some(2), "{}", stderr(&refused));
    assert!(
        stderr(&refused).contains(&format!("fleet is {len} bytes; at most 1 MiB")),
        "{}",
        stderr(&refused)
    );
    let shown = show("2");
    assert!(shown.status.success(), "{}", stderr(&shown));
    let t: serde_json::Value = serde_json::from_slice(&shown.stdout).unwrap();
    assert_eq!(t["node"], "node-099");

    // The same document on standard input is capped as it streams.
    let o = Command::new(env!("CARGO_BIN_EXE_gpuslice"))
        .args(["gpu", "list", "--max-document-mib", "1", "--inventory", "-"])
        .env_remove("GPUSLICE_MAX_DOCUMENT_MIB")
        .stdin(std::fs::File::open(&fleet).unwrap())
        .output()
        .unwrap();
    let e = stderr(&o);
    assert_eq!(o.status.code(), Some(2), "{e}");
    assert!(
        e.contains("cannot read fleet from standard input") && e.contains("larger than 1048576"),
        "{e}"
    );
}
