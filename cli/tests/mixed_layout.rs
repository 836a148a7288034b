//! `vgpu apply` with an entry's `mixed-sizes: true` on the bundled L40S sandbox (same-size mode
//! at first): the idle GPU is turned to mixed-size mode before the layout's writes and takes
//! two sizes, each vGPU at its own placement; without the opt-in the same-size rule still
//! refuses the mix; a GPU with a vGPU running is refused before anything is written.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod sandbox_support;

use std::path::Path;

use sandbox_support::{l40s_sandbox, ok, on, stderr, stdout};

const LAYOUT: &str = "version: v1
vgpu-configs:
  mixed:
    - devices: all
      mixed-sizes: true
      vgpu-devices:
        L40S-24Q: 1
        L40S-12Q: 2
  one-size:
    - devices: all
      vgpu-devices:
        L40S-24Q: 1
        L40S-12Q: 2
";

fn l40s(tmp: &Path) -> std::path::PathBuf {
    let dir = l40s_sandbox(tmp);
    std::fs::write(tmp.join("layout.yaml"), LAYOUT).unwrap();
    dir
}

fn apply(dir: &Path, tmp: &Path, config: &str) -> std::process::Output {
    let file = tmp.join("layout.yaml");
    on(
        dir,
        &["vgpu", "apply", "-f", file.to_str().unwrap(), "-c", config],
    )
}

fn saved_mode(dir: &Path) -> bool {
    std::fs::read_to_string(dir.join("nvml.json"))
        .unwrap_or_default()
        .contains("heterogeneous")
}

#[test]
fn a_layout_that_asks_for_mixed_sizes_turns_the_idle_gpu_and_places_two_sizes() {
    let t = tempfile::tempdir().unwrap();
    let dir = l40s(t.path());
    ok(apply(&dir, t.path(), "mixed"));
    assert!(saved_mode(&dir), "the mode is on");
    let o = ok(on(&dir, &["vgpu", "list", "-o", "json"]));
    let flat: String = stdout(&o).split_whitespace().collect();
    for p in [
        "\"placementId\":0",
        "\"placementId\":24",
        "\"placementId\":36",
    ] {
        assert!(flat.contains(p), "{p}: {flat}");
    }
}

#[test]
fn without_the_opt_in_a_layout_keeps_one_size_and_writes_nothing() {
    let t = tempfile::tempdir().unwrap();
    let dir = l40s(t.path());
    let o = apply(&dir, t.path(), "one-size");
    assert!(!o.status.success());
    assert!(stderr(&o).contains("same-size rule"), "{}", stderr(&o));
    assert!(!saved_mode(&dir), "the mode is untouched");
}

#[test]
fn a_gpu_with_a_vgpu_is_not_turned_to_mixed_sizes_by_a_layout() {
    let t = tempfile::tempdir().unwrap();
    let dir = l40s(t.path());
    ok(on(
        &dir,
        &[
            "vgpu",
            "create",
            "--parent",
            "0000:26:00.0",
            "--profile",
            "L40S-8Q",
        ],
    ));
    let o = apply(&dir, t.path(), "mixed");
    assert!(!o.status.success(), "{}", stdout(&o));
    assert!(
        stderr(&o).contains("mixed-size mode can be turned on only where no vGPU runs"),
        "{}",
        stderr(&o)
    );
    assert!(!saved_mode(&dir), "the mode is untouched");
    let o = ok(on(&dir, &["vgpu", "list", "-o", "json"]));
    assert!(
        stdout(&o).contains("L40S-8Q"),
        "the vGPU stays: {}",
        stdout(&o)
    );
}
