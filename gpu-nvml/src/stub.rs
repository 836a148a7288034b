//! A stand-in `libnvidia-ml.so.1` compiled from C for tests (feature `testing`), so that the real
//! loader, its symbol checks and every raw call run without a GPU. The C sources live with the
//! tests that use them (`gpu-health`'s readings, this crate's partition calls).

use std::io;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Compiles `src` with `gcc -shared -fPIC` and each of `defines` as `-D`, into a fresh temporary
/// directory as `libnvidia-ml.so.1`: the directory (removed when dropped) and the library.
/// `None`, after a `SKIPPED:` line on stdout, where there is no C compiler.
///
/// # Errors
/// The compiler could not be run or refused the source (its output is the message).
pub fn build(src: &Path, defines: &[&str]) -> io::Result<Option<(tempfile::TempDir, PathBuf)>> {
    build_named(src, "libnvidia-ml.so.1", defines)
}

/// [`build`] into a library called `name` (another vendor library's stand-in: gpu-fabric's
/// `libnvfm.so.1`).
///
/// # Errors
/// As [`build`].
pub fn build_named(
    src: &Path,
    name: &str,
    defines: &[&str],
) -> io::Result<Option<(tempfile::TempDir, PathBuf)>> {
    let compiler_works = Command::new("gcc")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !compiler_works {
        println!("SKIPPED: gcc is not available to build the {name} stub");
        return Ok(None);
    }
    let dir = tempfile::tempdir()?;
    let lib = dir.path().join(name);
    let out = Command::new("gcc")
        .args(["-shared", "-fPIC", "-Wall", "-o"])
        .arg(&lib)
        .arg(src)
        .args(defines.iter().map(|d| format!("-D{d}")))
        .output()?;
    if !out.status.success() {
        let why = String::from_utf8_lossy(&out.stderr);
        return Err(io::Error::other(format!(
            "gcc failed on {}: {why}",
            src.display()
        )));
    }
    Ok(Some((dir, lib)))
}
