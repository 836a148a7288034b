//! `--progress`: lines on a terminal while discovery runs, nothing in a pipe.

use std::process::Command;

fn recording() -> String {
    format!(
        "{}/../examples/hosts/a2-sriov-mdev.umockdev",
        env!("CARGO_MANIFEST_DIR")
    )
}

/// Runs gpuslice on a pseudo-terminal (util-linux `script`), returning what the terminal showed;
/// `None` when `script` is not there.
fn on_a_terminal(args: &[&str]) -> Option<String> {
    let mut line = String::from(env!("CARGO_BIN_EXE_gpuslice"));
    for a in args {
        line.push_str(&format!(" '{a}'"));
    }
    let out = Command::new("script")
        .args(["-qec", &line, "/dev/null"])
        // The first line at once, so a discovery of a few milliseconds shows it.
        .env("GPUSLICE_PROGRESS_AFTER_MS", "0")
        .output()
        .ok()?;
    Some(String::from_utf8_lossy(&out.stdout).into_owned())
}

#[test]
fn progress_on_a_terminal_says_what_is_being_discovered_and_how_long_it_took() {
    let root = recording();
    let Some(shown) = on_a_terminal(&["--progress", "--root", &root, "gpu", "list"]) else {
        println!("SKIPPED: util-linux `script` is not installed");
        return;
    };
    assert!(
        shown.contains(&format!("gpuslice: discovering {root}...")),
        "{shown}"
    );
    assert!(shown.contains("done in"), "{shown}");
    assert!(
        shown.contains("nvidia0"),
        "the listing still follows: {shown}"
    );
}

#[test]
fn without_the_flag_a_terminal_shows_no_progress() {
    let root = recording();
    let Some(shown) = on_a_terminal(&["--root", &root, "gpu", "list"]) else {
        println!("SKIPPED: util-linux `script` is not installed");
        return;
    };
    assert!(!shown.contains("discovering"), "{shown}");
}

#[test]
fn progress_in_a_pipe_prints_nothing_so_documents_stay_clean() {
    let out = Command::new(env!("CARGO_BIN_EXE_gpuslice"))
        .args([
            "--progress",
            "--root",
            &recording(),
            "-o",
            "json",
            "gpu",
            "list",
        ])
        .env("GPUSLICE_PROGRESS_AFTER_MS", "0")
        .output()
        .unwrap();
    assert!(out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("discovering"), "{stderr}");
    let _: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
}
