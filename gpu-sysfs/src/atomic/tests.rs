use super::*;
use std::os::unix::fs::symlink;
use std::time::Duration;

fn tree() -> (tempfile::TempDir, Dir) {
    let t = tempfile::tempdir().unwrap();
    let d = Dir::open(t.path()).unwrap();
    (t, d)
}

/// Runs `f` on another thread and fails the test if it has not answered within 10 s (a
/// FIFO opened by mistake would block it forever).
fn promptly<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(Duration::from_secs(10))
        .expect("blocked: a FIFO was opened")
}

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

#[test]
fn temporary_names_are_not_the_same_twice_and_not_the_pid() {
    let a = temporary_name("state.json");
    let b = temporary_name("state.json");
    assert_ne!(a, b);
    assert!(a.starts_with(".state.json.") && a.ends_with(".tmp"), "{a}");
    assert!(!a.contains(&format!(".{}.", std::process::id())), "{a}");
    assert!(temporary_name(&"x".repeat(255)).len() < 100);
}

#[test]
fn a_link_planted_at_a_guessed_temporary_name_is_left_alone_and_its_target_unchanged() {
    let (t, d) = tree();
    let victim = t.path().join("victim");
    std::fs::write(&victim, "keep").unwrap();
    std::fs::create_dir(t.path().join("cdi")).unwrap();
    let cdi = d.sub("cdi").unwrap().unwrap();
    let planted = t
        .path()
        .join(format!("cdi/.spec.json.{}.tmp", std::process::id()));
    symlink(&victim, &planted).unwrap();
    cdi.write("spec.json", b"{}").unwrap();
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "keep");
    assert!(planted.symlink_metadata().unwrap().file_type().is_symlink());
    assert_eq!(
        std::fs::read_to_string(t.path().join("cdi/spec.json")).unwrap(),
        "{}"
    );
}

#[test]
fn a_link_at_the_target_is_refused_naming_it_and_never_written_through() {
    let (t, d) = tree();
    let victim = t.path().join("victim");
    std::fs::write(&victim, "keep").unwrap();
    symlink(&victim, t.path().join("spec.json")).unwrap();
    let e = d.write("spec.json", b"new").unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
    assert!(e.to_string().contains("spec.json is a link"), "{e}");
    assert_eq!(errno_of(&e), Some(libc_eloop()));
    let e = d.write_if_changed("spec.json", b"new").unwrap_err();
    assert!(e.to_string().contains("spec.json is a link"), "{e}");
    assert!(d.read("spec.json", 100).is_err());
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "keep");
}

fn libc_eloop() -> i32 {
    Errno::ELOOP as i32
}

#[test]
fn a_directory_reached_through_a_link_is_refused_naming_the_link() {
    let (t, d) = tree();
    std::fs::create_dir(t.path().join("outside")).unwrap();
    std::fs::create_dir(t.path().join("a")).unwrap();
    symlink(t.path().join("outside"), t.path().join("a/metadata")).unwrap();
    for e in [
        d.create_sub("a/metadata/uid").unwrap_err(),
        d.sub("a/metadata").unwrap_err(),
    ] {
        assert!(e.to_string().contains("a/metadata is a link"), "{e}");
    }
    assert!(Dir::create_named(&t.path().join("a/metadata")).is_err());
    assert_eq!(
        std::fs::read_dir(t.path().join("outside")).unwrap().count(),
        0
    );
    std::fs::write(t.path().join("a/file"), "").unwrap();
    let e = d.create_sub("a/file/x").unwrap_err();
    assert!(e.to_string().contains("a/file is a file"), "{e}");
}

#[test]
fn a_fifo_where_a_file_is_expected_is_refused_promptly_naming_it() {
    let (t, d) = tree();
    let fifo = t.path().join("spec.json");
    nix::unistd::mkfifo(&fifo, Mode::S_IRWXU).unwrap();
    let (e1, e2, e3) = promptly(move || {
        (
            d.write_if_changed("spec.json", b"{}").unwrap_err(),
            d.read("spec.json", 100).unwrap_err(),
            d.open_lock("spec.json").unwrap_err(),
        )
    });
    for e in [e1, e2, e3] {
        assert!(e.to_string().contains("spec.json is a FIFO"), "{e}");
    }
}

#[test]
fn an_unchanged_file_is_not_rewritten_and_a_changed_one_is() {
    let (t, d) = tree();
    assert!(d.write_if_changed("f", b"one").unwrap());
    let before = std::fs::metadata(t.path().join("f")).unwrap();
    assert!(!d.write_if_changed("f", b"one").unwrap());
    let after = std::fs::metadata(t.path().join("f")).unwrap();
    use std::os::unix::fs::MetadataExt;
    assert_eq!(before.ino(), after.ino());
    assert!(d.write_if_changed("f", b"two").unwrap());
    assert_eq!(d.read("f", 10).unwrap().as_deref(), Some(&b"two"[..]));
}

#[test]
fn a_read_past_the_cap_is_refused_without_reading() {
    let (t, d) = tree();
    let f = File::create(t.path().join("big")).unwrap();
    f.set_len(1 << 30).unwrap();
    let e = d.read("big", 1000).unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::InvalidData);
    assert!(e.to_string().contains("larger than 1000"), "{e}");
    assert_eq!(d.read("missing", 10).unwrap(), None);
}

#[test]
fn removing_a_tree_never_follows_a_link_out_of_it() {
    let (t, d) = tree();
    std::fs::create_dir(t.path().join("outside")).unwrap();
    std::fs::write(t.path().join("outside/keep"), "x").unwrap();
    let claim = d.create_sub("meta/uid/gpu").unwrap();
    claim.write("m.json", b"{}").unwrap();
    symlink(t.path().join("outside"), t.path().join("meta/uid/link")).unwrap();
    let meta = d.sub("meta").unwrap().unwrap();
    assert!(meta.remove_tree("uid").unwrap());
    assert!(!meta.remove_tree("uid").unwrap());
    assert!(t.path().join("outside/keep").exists());
    assert_eq!(meta.list().unwrap(), Vec::<String>::new());
    // A link itself is removed, not what it points to.
    symlink(t.path().join("outside"), t.path().join("meta/l")).unwrap();
    assert!(meta.remove("l").unwrap());
    assert!(t.path().join("outside/keep").exists());
    std::fs::create_dir(t.path().join("meta/d")).unwrap();
    assert!(meta.remove("d").is_err());
}

#[test]
fn a_lock_file_is_created_once_and_a_link_there_is_refused() {
    let (t, d) = tree();
    d.open_lock("x.lock").unwrap();
    d.open_lock("x.lock").unwrap();
    symlink(t.path().join("elsewhere"), t.path().join("y.lock")).unwrap();
    let e = d.open_lock("y.lock").unwrap_err();
    assert!(e.to_string().contains("y.lock is a link"), "{e}");
    assert!(!t.path().join("elsewhere").exists());
}

#[test]
fn an_os_error_keeps_its_errno_and_names_the_file() {
    let (t, d) = tree();
    std::fs::create_dir(t.path().join("f")).unwrap();
    let e = d.write("f", b"1").unwrap_err();
    assert_eq!(errno_of(&e), Some(Errno::EISDIR as i32));
    assert!(e.to_string().contains("/f is a directory"), "{e}");
    assert!(check_name("a/b").is_err() && check_name("..").is_err());
}
