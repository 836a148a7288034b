//! The host's own files (the layout lock, remembered type names) are written through the one
//! confined writer: a FIFO or a link planted where one of them belongs is refused promptly,
//! naming it, and nothing outside changes.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::path::Path;
use std::sync::mpsc;
use std::time::Duration;

use gpu_sysfs::apply::{LOCK_PATH, LayoutLock, NAMES_PATH, RememberedNames};
use gpu_sysfs::{Host, RealHost};

/// Runs `f` on another thread; a call that has not answered in 10 s fails the test (a FIFO
/// opened by mistake blocks forever).
fn promptly<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(Duration::from_secs(10))
        .expect("the call blocked on a FIFO")
}

fn fifo_at(root: &Path, rel: &str) {
    let p = root.join(rel);
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    nix::unistd::mkfifo(&p, nix::sys::stat::Mode::S_IRWXU).unwrap();
}

#[test]
fn a_fifo_at_the_host_lock_is_refused_promptly_naming_it() {
    let t = tempfile::tempdir().unwrap();
    let root = t.path().to_path_buf();
    fifo_at(&root, LOCK_PATH);
    let e = promptly(move || {
        LayoutLock::acquire(&root, Some(Duration::from_millis(50)), &mut |_| {})
            .unwrap_err()
            .to_string()
    });
    assert!(e.contains("vgpu.lock"), "{e}");
}

#[test]
fn a_fifo_at_a_state_file_is_refused_promptly_and_never_opened() {
    let t = tempfile::tempdir().unwrap();
    let root = t.path().to_path_buf();
    fifo_at(&root, NAMES_PATH);
    let e = promptly(move || {
        let host = RealHost::new(&root).unwrap();
        let mut names = RememberedNames::read(&host, None);
        names.remember(1155, "NVIDIA L40S-48Q");
        names.save(&host).unwrap_err().to_string()
    });
    assert!(e.contains("vgpu-type-names.json is a FIFO"), "{e}");
}

#[test]
fn a_link_planted_at_the_old_guessable_temporary_name_is_left_alone_with_its_target() {
    let t = tempfile::tempdir().unwrap();
    let root = t.path().join("root");
    std::fs::create_dir_all(root.join("run/gpuslice")).unwrap();
    let victim = t.path().join("victim");
    std::fs::write(&victim, "keep").unwrap();
    let planted = root.join(format!(
        "run/gpuslice/.vgpu-type-names.json.{}.0.tmp",
        std::process::id()
    ));
    std::os::unix::fs::symlink(&victim, &planted).unwrap();
    let host = RealHost::new(&root).unwrap();
    host.write_atomic(NAMES_PATH, b"{}").unwrap();
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "keep");
    assert!(planted.symlink_metadata().unwrap().file_type().is_symlink());
    assert_eq!(
        std::fs::read_to_string(root.join(NAMES_PATH)).unwrap(),
        "{}"
    );
}
