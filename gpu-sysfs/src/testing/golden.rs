//! The one golden-file check of gpuslice's test suites, with one variable to regenerate every
//! golden file: `GOLDEN_UPDATE=1 cargo test`.

use std::path::Path;

/// The environment variable that makes [`assert_golden`] rewrite the files instead of comparing.
pub const UPDATE_VAR: &str = "GOLDEN_UPDATE";

/// Compares `actual` with the golden file at `path`; with `GOLDEN_UPDATE` set, writes `actual`
/// there instead (creating the directory).
///
/// # Panics
/// When the file is missing or differs (this is a test assertion), or cannot be written while
/// regenerating.
#[allow(clippy::panic)]
pub fn assert_golden(path: &Path, actual: &str) {
    if std::env::var_os(UPDATE_VAR).is_some() {
        let written = path
            .parent()
            .map_or(Ok(()), std::fs::create_dir_all)
            .and_then(|()| std::fs::write(path, actual));
        if let Err(e) = written {
            panic!("cannot write golden file {}: {e}", path.display());
        }
        return;
    }
    let expected = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) => panic!(
            "golden file {} missing ({e}); run with {UPDATE_VAR}=1 to create it",
            path.display()
        ),
    };
    if expected != actual {
        panic!(
            "output differs from golden file {} ({UPDATE_VAR}=1 rewrites it)\n--- expected\n{expected}\n--- actual\n{actual}",
            path.display()
        );
    }
}
