#![allow(clippy::unwrap_used, clippy::expect_used)]

use super::*;

const U1: &str = "11111111-2222-3333-4444-555555555555";
const U2: &str = "11111111-2222-3333-4444-666666666666";

fn vfio_dev(s: &Sandbox, uuid: &str) -> Vec<String> {
    s.list(&format!("sys/bus/mdev/devices/{uuid}/vfio-dev"))
        .unwrap()
}

#[test]
fn a_second_open_sees_the_first_ones_vgpu_and_gives_the_next_a_fresh_vfio_device() {
    let k = FakeKernel::sample_mdev_drivers().unwrap();
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("sbx");
    let made = init(&dir, k.root()).unwrap();
    assert_eq!(made.state.pools.len(), 3, "{:?}", made.state.pools);
    let create = "sys/class/mdev_bus/mbochs/mdev_supported_types/mbochs-large/create";
    let avail = "sys/class/mdev_bus/mbochs/mdev_supported_types/mbochs-small/available_instances";
    {
        let s = open(&dir).unwrap();
        s.write(create, U1.as_bytes()).unwrap();
        assert_eq!(s.read_string(avail).unwrap(), "48");
    }
    let s = open(&dir).unwrap();
    assert!(s.exists(&format!("sys/bus/mdev/devices/{U1}")));
    // The pool is counted from what the first process left: 64 of 256 units taken.
    assert_eq!(s.read_string(avail).unwrap(), "48");
    s.write(create, U2.as_bytes()).unwrap();
    assert_eq!(vfio_dev(&s, U1), ["vfio0"]);
    assert_eq!(vfio_dev(&s, U2), ["vfio1"]);
}

#[test]
fn a_directory_without_a_state_file_is_not_a_sandbox() {
    let t = tempfile::tempdir().unwrap();
    let e = open(t.path()).unwrap_err();
    assert!(e.to_string().contains("gpuslice sandbox init"), "{e}");
}

#[test]
fn init_refuses_the_machines_own_root_and_makes_nothing() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("sbx");
    let e = init(&dir, Path::new("/")).unwrap_err();
    assert!(e.to_string().contains("the machine's own `/`"), "{e}");
    assert!(!dir.exists());
}

/// A sandbox made from the kernel's sample drivers, in `<tempdir>/sbx`.
fn made() -> (tempfile::TempDir, PathBuf) {
    let k = FakeKernel::sample_mdev_drivers().unwrap();
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("sbx");
    init(&dir, k.root()).unwrap();
    (t, dir)
}

/// Runs `f` on another thread; a call that has not answered in 10 s fails the test (a FIFO
/// opened by mistake blocks forever).
fn promptly<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(Duration::from_secs(10))
        .expect("the call blocked")
}

fn set_state(dir: &Path, edit: impl FnOnce(&mut serde_json::Value)) {
    let path = dir.join(STATE_FILE);
    let mut v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    edit(&mut v);
    std::fs::write(&path, v.to_string()).unwrap();
}

#[test]
fn a_link_at_the_lock_file_is_refused_and_creates_nothing_outside() {
    let (t, dir) = made();
    let _ = std::fs::remove_file(dir.join(LOCK_FILE));
    let outside = t.path().join("created-outside");
    std::os::unix::fs::symlink(&outside, dir.join(LOCK_FILE)).unwrap();
    let e = open(&dir).unwrap_err();
    assert!(format!("{e:#}").contains(LOCK_FILE), "{e}");
    let chain = std::error::Error::source(&e).map(ToString::to_string);
    assert!(
        chain.is_some_and(|c| c.contains("sandbox.lock is a link")),
        "{e:?}"
    );
    assert!(!outside.exists(), "a read-only open made a file outside");
}

#[test]
fn a_link_at_the_old_temporary_state_name_is_never_written_through() {
    let (t, dir) = made();
    let victim = t.path().join("victim");
    std::fs::write(&victim, "keep").unwrap();
    let planted = dir.join(format!("{STATE_FILE}.tmp"));
    std::os::unix::fs::symlink(&victim, &planted).unwrap();
    let s = open(&dir).unwrap();
    let state = s.state.lock().unwrap().clone();
    write_state(&dir, &state).unwrap();
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "keep");
    assert!(planted.symlink_metadata().unwrap().file_type().is_symlink());
    assert!(
        std::fs::symlink_metadata(dir.join(STATE_FILE))
            .unwrap()
            .file_type()
            .is_file()
    );
}

#[test]
fn a_link_at_the_state_file_is_refused_and_its_target_unchanged() {
    let (t, dir) = made();
    let s = open(&dir).unwrap();
    let state = s.state.lock().unwrap().clone();
    let victim = t.path().join("victim.json");
    std::fs::write(&victim, "keep").unwrap();
    std::fs::remove_file(dir.join(STATE_FILE)).unwrap();
    std::os::unix::fs::symlink(&victim, dir.join(STATE_FILE)).unwrap();
    let e = write_state(&dir, &state).unwrap_err();
    let text = std::error::Error::source(&e).map(ToString::to_string);
    assert!(
        text.is_some_and(|t| t.contains("sandbox.json is a link")),
        "{e:?}"
    );
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "keep");
    assert!(open(&dir).is_err(), "a linked state file is not read");
}

#[test]
fn a_host_tree_that_is_a_link_elsewhere_is_refused_naming_it() {
    let (t, dir) = made();
    let other = t.path().join("other");
    std::fs::create_dir(&other).unwrap();
    std::fs::copy(dir.join(STATE_FILE), other.join(STATE_FILE)).unwrap();
    std::os::unix::fs::symlink(dir.join(HOST_DIR), other.join(HOST_DIR)).unwrap();
    let e = open(&other).unwrap_err();
    assert!(e.to_string().contains("other/host is a link"), "{e}");
}

#[test]
fn a_fifo_at_the_state_file_is_refused_promptly_naming_it() {
    let (_t, dir) = made();
    std::fs::remove_file(dir.join(STATE_FILE)).unwrap();
    nix::unistd::mkfifo(&dir.join(STATE_FILE), nix::sys::stat::Mode::S_IRWXU).unwrap();
    let e = promptly(move || open(&dir).unwrap_err());
    let text = format!(
        "{e}: {}",
        std::error::Error::source(&e)
            .map(ToString::to_string)
            .unwrap_or_default()
    );
    assert!(text.contains("sandbox.json is a FIFO"), "{text}");
}

#[test]
fn a_state_file_over_the_document_cap_is_refused_before_it_is_read() {
    let (_t, dir) = made();
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(dir.join(STATE_FILE))
        .unwrap();
    f.set_len(1 << 30).unwrap();
    let e = open(&dir).unwrap_err();
    let text = std::error::Error::source(&e)
        .map(ToString::to_string)
        .unwrap_or_default();
    assert!(text.contains("sandbox.json is 1073741824 bytes"), "{text}");
    assert!(text.contains("--max-document-mib"), "{text}");
}

#[test]
fn an_invalid_pci_address_in_the_state_file_is_refused_naming_it() {
    let (_t, dir) = made();
    set_state(&dir, |v| {
        v["hostDrivers"]["0000:zz:00.0"] = serde_json::json!("nvidia");
    });
    let e = open(&dir).unwrap_err();
    assert!(
        e.to_string().contains("hostDrivers: \"0000:zz:00.0\""),
        "{e}"
    );
}

#[test]
fn an_invalid_physical_function_address_in_the_state_file_is_refused_naming_its_field() {
    let (_t, dir) = made();
    set_state(&dir, |v| {
        v["pools"] = serde_json::json!([{
            "kind": "vendorVfio",
            "pf": "0000:3b:zz.0",
            "framebufferMib": 49152,
            "types": [],
        }]);
    });
    let e = open(&dir).unwrap_err();
    assert!(
        e.to_string().contains("pools[0].pf: \"0000:3b:zz.0\""),
        "{e}"
    );
}

#[test]
fn a_parent_or_driver_that_would_leave_the_tree_is_refused_naming_the_field() {
    let (_t, dir) = made();
    set_state(&dir, |v| {
        v["pools"][0]["parent"] = serde_json::json!("../../etc");
    });
    let e = open(&dir).unwrap_err();
    assert!(
        e.to_string().contains("pools[0].parent: \"../../etc\""),
        "{e}"
    );
    let (_t, dir) = made();
    set_state(&dir, |v| {
        v["hostDrivers"]["0000:00:02.0"] = serde_json::json!("..");
    });
    let e = open(&dir).unwrap_err();
    assert!(
        e.to_string().contains("hostDrivers[\"0000:00:02.0\"]"),
        "{e}"
    );
}

#[test]
fn sriov_enabled_again_on_a_recorded_host_puts_the_vfs_beside_their_pf_with_their_types() {
    let bundled =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/hosts/a2-sriov-mdev.umockdev");
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("sbx");
    init(&dir, &bundled).unwrap();
    let s = open(&dir).unwrap();
    let pf = "sys/bus/pci/devices/0000:08:00.0";
    let bridge = "sys/devices/pci0000:00/0000:00:03.0";
    s.write(&format!("{pf}/sriov_numvfs"), b"0").unwrap();
    assert!(!s.exists("sys/bus/pci/devices/0000:08:00.4"));
    s.write(&format!("{pf}/sriov_numvfs"), b"16").unwrap();
    let vf = s
        .kernel()
        .canonicalize("sys/bus/pci/devices/0000:08:00.4")
        .unwrap();
    assert_eq!(vf, format!("{bridge}/0000:08:00.4"));
    assert_eq!(
        s.kernel().canonicalize(&format!("{vf}/physfn")).unwrap(),
        format!("{bridge}/0000:08:00.0")
    );
    assert_eq!(
        s.kernel().canonicalize(&format!("{pf}/virtfn15")).unwrap(),
        format!("{bridge}/0000:08:02.3")
    );
    // Nothing is made at the builder's default place for a function.
    assert!(!s.exists("sys/devices/pci0000:00/0000:08:00.0"));
    assert!(!s.exists("sys/devices/pci0000:00/0000:08:00.4"));
    assert_eq!(s.read_string(&format!("{pf}/sriov_numvfs")).unwrap(), "16");
    // The A2's driver registers the new VFs as mdev parents with the types they had.
    let t = "sys/class/mdev_bus/0000:08:00.5/mdev_supported_types/nvidia-746";
    assert_eq!(s.read_string(&format!("{t}/name")).unwrap(), "NVIDIA A2-4Q");
    assert_eq!(
        s.read_string(&format!("{t}/available_instances")).unwrap(),
        "1"
    );
    s.write(&format!("{t}/create"), U1.as_bytes()).unwrap();
    assert!(s.exists(&format!("sys/bus/mdev/devices/{U1}")));
}
