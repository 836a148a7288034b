//! JSON documents are streamed to standard output: the whole document with its newline, and a
//! reader that goes away early ends the command quietly.

use std::io::Read;
use std::process::{Command, Stdio};

/// `gpuslice topology -o json` of the A2 recording (a 116 KB document).
fn topology_json() -> Command {
    let recording = format!(
        "{}/../examples/hosts/a2-sriov-mdev.umockdev",
        env!("CARGO_MANIFEST_DIR")
    );
    let mut c = Command::new(env!("CARGO_BIN_EXE_gpuslice"));
    c.args(["--root", &recording, "topology", "-o", "json"]);
    c
}

#[test]
fn a_streamed_topology_is_one_whole_json_document_and_a_newline() {
    let out = topology_json().output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Larger than the stream's buffer, so it took several writes.
    assert!(out.stdout.len() > 64 * 1024, "{}", out.stdout.len());
    assert_eq!(out.stdout.last(), Some(&b'\n'));
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        doc["mediatedDevices"]["parents"].as_array().map(Vec::len),
        Some(16)
    );
}

#[test]
fn a_reader_that_goes_away_ends_the_command_quietly() {
    let mut child = topology_json()
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = [0u8; 16];
    child.stdout.take().unwrap().read_exact(&mut first).unwrap();
    // The pipe's read end is closed here: the document (116 KB) does not fit in a pipe.
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{:?}", out.status);
    assert!(
        out.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(first.starts_with(b"{"));
}
