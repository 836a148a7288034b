//! The one atomic file writer of gpuslice's state files (layout names, DRA claims, health
//! baseline, fleet files): write a private temporary file next to the target, fsync it, rename it
//! over the target, fsync the directory. A reader sees the old file or the new one, never half
//! of one, and a crash leaves no torn file behind.

use std::io::{self, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::sync::atomic::{AtomicU32, Ordering};

static COUNTER: AtomicU32 = AtomicU32::new(0);

/// Replaces `path` with `data` atomically (write, fsync, rename, fsync the directory).
///
/// The temporary file is created with `O_EXCL | O_NOFOLLOW` next to `path`, so a planted file or
/// symlink of that name is never written through; it is removed when any step fails.
///
/// # Errors
/// The I/O error of the step that failed; `path` is then as it was.
pub fn write_file_atomic(path: &Path, data: &[u8]) -> io::Result<()> {
    let name = path
        .file_name()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "no file name to write"))?;
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let tmp = dir.join(format!(
        ".{}.{}.{}.tmp",
        name.to_string_lossy(),
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    ));
    let written = (|| {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o644)
            .custom_flags(nix::libc::O_NOFOLLOW)
            .open(&tmp)?;
        f.write_all(data)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if let Err(e) = written {
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    // The rename is durable once the directory entry is.
    std::fs::File::open(dir)?.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_write_replaces_the_file_and_leaves_no_temporary_behind() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("state.json");
        std::fs::write(&p, "old").unwrap();
        write_file_atomic(&p, b"new").unwrap();
        assert_eq!(std::fs::read_to_string(&p).unwrap(), "new");
        let names: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
        assert_eq!(names.len(), 1);
    }

    #[test]
    fn a_failed_write_leaves_the_target_as_it_was() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("missing-dir").join("state.json");
        assert!(write_file_atomic(&p, b"new").is_err());
        assert!(!p.exists());
    }
}
