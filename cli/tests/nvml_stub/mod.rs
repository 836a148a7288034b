//! The C NVML stand-in of gpu-health (`gpu-health/tests/data/nvml_stub.c`), built for the CLI's
//! tests that pass `--nvml-lib`.

use std::path::{Path, PathBuf};
use std::process::Command;

/// Builds the stand-in with extra `-D` flags into its own tempdir; `None` (and a SKIPPED line)
/// without a C compiler.
pub fn build(defines: &[&str]) -> Option<(tempfile::TempDir, PathBuf)> {
    let gcc = Command::new("gcc").arg("--version").output();
    if !gcc.is_ok_and(|o| o.status.success()) {
        println!("SKIPPED: gcc is not available to build the NVML stub");
        return None;
    }
    let dir = tempfile::tempdir().unwrap();
    let lib = dir.path().join("libnvidia-ml.so.1");
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../gpu-health/tests/data/nvml_stub.c");
    let built = Command::new("gcc")
        .args(["-shared", "-fPIC", "-o"])
        .arg(&lib)
        .arg(&src)
        .args(defines.iter().map(|d| format!("-D{d}")))
        .status()
        .unwrap();
    assert!(built.success());
    Some((dir, lib))
}
