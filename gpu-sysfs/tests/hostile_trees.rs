//! Trees shaped by an adversary: links that lead outside the root, FIFOs and huge files in place
//! of attributes, garbage and looping entries. Nothing outside the root is read or written, no
//! read hangs, and every device whose reads fail is reported with the reason.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use gpu_core::MdevUuid;
use gpu_sysfs::discover::{DiscoverOptions, discover};
use gpu_sysfs::testing::{MdevTypeSpec, PciSpec, TreeBuilder};
use gpu_sysfs::{Host, RealHost, is_outside_root};
use proptest::prelude::*;

const GPU: &str = "0000:41:00.0";
const UUID: &str = "5e2b0c1a-0000-4000-8000-000000000001";

/// A base directory holding `root/` (the tree) and `outside/` (files the tree must not reach).
struct Setup {
    _base: tempfile::TempDir,
    root: PathBuf,
    outside: PathBuf,
}

fn setup() -> Setup {
    let base = tempfile::tempdir().unwrap();
    let root = base.path().join("root");
    let outside = base.path().join("outside");
    std::fs::create_dir_all(&root).unwrap();
    std::fs::create_dir_all(&outside).unwrap();
    for f in ["remove", "driver_override", "name", "secret"] {
        std::fs::write(outside.join(f), "victim\n").unwrap();
    }
    Setup {
        _base: base,
        root,
        outside,
    }
}

fn untouched(outside: &Path) {
    for f in ["remove", "driver_override", "name", "secret"] {
        assert_eq!(
            std::fs::read_to_string(outside.join(f)).unwrap(),
            "victim\n",
            "{f} outside the root was written"
        );
    }
}

/// From a link at `rel` (root-relative), the relative target that reaches `outside/<leaf>`.
fn out_of(rel: &str, leaf: &str) -> String {
    let depth = rel.split('/').count();
    format!("{}outside/{leaf}", "../".repeat(depth))
}

fn a_gpu_with_a_type(root: &Path) -> TreeBuilder {
    let mut b = TreeBuilder::at(root);
    b.pci(GPU, PciSpec::new(0x10de, 0x1eb8, 0x030200).group(7))
        .mdev_parent(
            GPU,
            &[MdevTypeSpec::new("nvidia-222", "GRID T4-1B", 16, None)],
        );
    b
}

fn discovered(root: &Path) -> gpu_core::NodeTopology {
    discover(&RealHost::new(root).unwrap(), &DiscoverOptions::new("n1")).unwrap()
}

fn all_warnings(t: &gpu_core::NodeTopology) -> String {
    serde_json::to_string(t).unwrap()
}

#[test]
fn a_mdev_instance_linked_outside_is_not_removed_through_the_link() {
    let s = setup();
    let rel = format!("sys/bus/mdev/devices/{UUID}");
    let mut b = a_gpu_with_a_type(&s.root);
    b.link(&rel, &format!("{}outside", "../".repeat(5)));
    b.finish().unwrap();
    let host = RealHost::new(&s.root).unwrap();
    let e = host.write(&format!("{rel}/remove"), b"1").unwrap_err();
    assert!(is_outside_root(&e), "{e}");
    assert!(
        e.to_string().contains(&rel),
        "the error names the path: {e}"
    );
    let uuid: MdevUuid = UUID.parse().unwrap();
    let _ = gpu_sysfs::actuate::mdev::remove_mdev(&host, &uuid, true);
    untouched(&s.outside);
}

#[test]
fn a_driver_override_linked_outside_is_not_written() {
    let s = setup();
    let mut b = a_gpu_with_a_type(&s.root);
    let rel = format!("sys/devices/pci0000:00/{GPU}/driver_override");
    b.link(&rel, &out_of(&rel, "driver_override"));
    b.finish().unwrap();
    let host = RealHost::new(&s.root).unwrap();
    let via_bus = format!("sys/bus/pci/devices/{GPU}/driver_override");
    let e = host.write(&via_bus, b"vfio-pci").unwrap_err();
    assert!(is_outside_root(&e), "{e}");
    untouched(&s.outside);
}

#[test]
fn a_type_name_linked_outside_is_not_read_and_discovery_warns() {
    let s = setup();
    let b = a_gpu_with_a_type(&s.root);
    let tree = b.finish().unwrap();
    let host = RealHost::new(tree.root()).unwrap();
    let name = host
        .canonicalize(&format!(
            "sys/bus/pci/devices/{GPU}/mdev_supported_types/nvidia-222/name"
        ))
        .unwrap();
    std::fs::remove_file(s.root.join(&name)).unwrap();
    std::os::unix::fs::symlink(out_of(&name, "secret"), s.root.join(&name)).unwrap();
    let t = discovered(&s.root);
    let json = all_warnings(&t);
    assert!(!json.contains("victim"), "outside content was read: {json}");
    assert!(json.contains("leads outside the root"), "{json}");
    assert_eq!(t.gpus.len(), 1, "discovery carries on");
}

#[test]
fn an_absolute_link_resolves_against_the_root_not_the_machine() {
    let s = setup();
    let mut b = TreeBuilder::at(&s.root);
    b.link("sys/abs", s.outside.join("secret").to_str().unwrap());
    b.file("etc/hostname", "inside\n");
    b.link("sys/host", "/etc/hostname");
    b.finish().unwrap();
    let host = RealHost::new(&s.root).unwrap();
    assert!(
        host.read("sys/abs").is_err(),
        "an absolute target is root-relative"
    );
    assert_eq!(host.read_string("sys/host").unwrap(), "inside");
}

#[test]
fn a_link_climbing_out_through_an_intermediate_link_is_an_error_naming_the_path() {
    let s = setup();
    let mut b = TreeBuilder::at(&s.root);
    b.link("sys/up", "..");
    b.link("sys/dev", "up/../../outside");
    b.finish().unwrap();
    let host = RealHost::new(&s.root).unwrap();
    for op in ["read", "write", "list", "canonicalize"] {
        let r = match op {
            "read" => host.read("sys/dev/secret").map(|_| ()),
            "write" => host.write("sys/dev/secret", b"x"),
            "list" => host.list("sys/dev").map(|_| ()),
            _ => host.canonicalize("sys/dev/secret").map(|_| ()),
        };
        let e = r.unwrap_err();
        assert!(e.to_string().contains("sys/dev"), "{op}: {e}");
    }
    assert!(!host.exists("sys/dev/secret"));
    untouched(&s.outside);
}

#[test]
fn links_that_stay_inside_are_followed_as_before() {
    let s = setup();
    let mut b = TreeBuilder::at(&s.root);
    b.file("sys/devices/a/value", "42\n");
    b.link("sys/x", "devices/./a/../a");
    b.link("sys/y", "x");
    b.finish().unwrap();
    let host = RealHost::new(&s.root).unwrap();
    assert_eq!(host.read_string("sys/y/value").unwrap(), "42");
    assert_eq!(host.list("sys/y").unwrap(), ["value"]);
    assert_eq!(
        host.canonicalize("sys/y/value").unwrap(),
        "sys/devices/a/value"
    );
    host.write("sys/y/value", b"77").unwrap();
    assert_eq!(host.read_string("sys/devices/a/value").unwrap(), "77");
}

#[test]
fn a_fifo_in_place_of_an_attribute_is_refused_at_once() {
    let s = setup();
    a_gpu_with_a_type(&s.root).finish().unwrap();
    let host = RealHost::new(&s.root).unwrap();
    let name = host
        .canonicalize(&format!(
            "sys/bus/pci/devices/{GPU}/mdev_supported_types/nvidia-222/name"
        ))
        .unwrap();
    std::fs::remove_file(s.root.join(&name)).unwrap();
    nix::unistd::mkfifo(&s.root.join(&name), nix::sys::stat::Mode::S_IRWXU).unwrap();
    let start = Instant::now();
    let e = host.read(&name).unwrap_err();
    assert!(e.to_string().contains("is a FIFO"), "{e}");
    assert!(host.write(&name, b"x").is_err());
    let t = discovered(&s.root);
    assert!(
        start.elapsed() < Duration::from_secs(4),
        "{:?}",
        start.elapsed()
    );
    assert!(all_warnings(&t).contains("is a FIFO"));
}

#[test]
fn a_huge_type_name_is_refused_with_a_warning_not_printed() {
    let s = setup();
    a_gpu_with_a_type(&s.root).finish().unwrap();
    let host = RealHost::new(&s.root).unwrap();
    let name = host
        .canonicalize(&format!(
            "sys/bus/pci/devices/{GPU}/mdev_supported_types/nvidia-222/name"
        ))
        .unwrap();
    std::fs::write(s.root.join(&name), "A".repeat(1 << 20)).unwrap();
    let t = discovered(&s.root);
    let json = all_warnings(&t);
    assert!(json.len() < 64 * 1024, "{} bytes of topology", json.len());
    assert!(json.contains("is larger than"), "{json}");
}

#[test]
fn a_gpu_whose_class_is_garbage_is_reported_not_dropped() {
    let s = setup();
    a_gpu_with_a_type(&s.root).finish().unwrap();
    std::fs::write(
        s.root.join(format!("sys/devices/pci0000:00/{GPU}/class")),
        "garbage\n",
    )
    .unwrap();
    let t = discovered(&s.root);
    assert!(
        t.warnings
            .iter()
            .any(|w| w.contains(GPU) && w.contains("class")),
        "{:?}",
        t.warnings
    );
}

#[test]
fn a_looping_bus_entry_is_reported_not_dropped() {
    let s = setup();
    let mut b = TreeBuilder::at(&s.root);
    b.link("sys/bus/pci/devices/0000:42:00.0", "0000:42:00.0");
    b.finish().unwrap();
    let t = discovered(&s.root);
    assert!(
        t.warnings.iter().any(|w| w.contains("0000:42:00.0")),
        "{:?}",
        t.warnings
    );
}

/// Targets a hostile tree may give its links: inside, outside, absolute, climbing through links.
fn target() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("..".to_owned()),
        Just("../..".to_owned()),
        Just("../../..".to_owned()),
        Just("../../../outside".to_owned()),
        Just("../../../../outside".to_owned()),
        Just("up/../../..".to_owned()),
        Just("/".to_owned()),
        Just("/sys".to_owned()),
        Just("l0".to_owned()),
        Just("l1/l2".to_owned()),
        Just("../a/l1".to_owned()),
        Just(".".to_owned()),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(gpu_core::testing::fuzz_cases(32)))]

    /// Whatever links a tree holds, no write, read or listing through the host reaches outside.
    #[test]
    fn no_access_through_the_host_reaches_outside_the_tree(
        links in proptest::collection::vec(
            (prop_oneof![Just("sys/up"), Just("sys/a/l0"), Just("sys/a/l1"), Just("sys/l2"),
                         Just("sys/a/b/l3"), Just("sys/bus")], target()),
            1..6,
        ),
        probes in proptest::collection::vec(
            prop_oneof![Just("sys/up/outside/remove"), Just("sys/a/l0/remove"),
                        Just("sys/a/l1/driver_override"), Just("sys/l2/name"),
                        Just("sys/a/b/l3/secret"), Just("sys/bus/remove"),
                        Just("sys/a/l1/outside/secret"), Just("sys/a/b/l3/outside/name")],
            1..6,
        ),
    ) {
        let s = setup();
        let mut b = TreeBuilder::at(&s.root);
        b.mkdir("sys/a/b");
        for (at, t) in &links {
            if !s.root.join(at).exists() && std::fs::symlink_metadata(s.root.join(at)).is_err() {
                b.link(at, t);
            }
        }
        b.finish().unwrap();
        let host = RealHost::new(&s.root).unwrap();
        for p in &probes {
            let _ = host.write(p, b"1");
            let read = host.read(p).unwrap_or_default();
            prop_assert!(!String::from_utf8_lossy(&read).contains("victim"));
            let dir = p.rsplit_once('/').map_or("", |(d, _)| d);
            let listed = host.list(dir).unwrap_or_default();
            prop_assert!(!listed.iter().any(|n| n == "secret"), "{dir} listed outside: {listed:?}");
        }
        untouched(&s.outside);
    }
}

#[test]
fn state_files_are_never_written_through_a_planted_link() {
    use gpu_sysfs::apply::{LOCK_PATH, LayoutLock, NAMES_PATH, RememberedNames};
    let s = setup();
    // The temporary name is a link to an outside file; the lock file is one too.
    let mut b = TreeBuilder::at(&s.root);
    let tmp = format!("{NAMES_PATH}.tmp");
    b.link(&tmp, &out_of(&tmp, "secret"));
    b.link(LOCK_PATH, &out_of(LOCK_PATH, "remove"));
    b.finish().unwrap();
    let mut names = RememberedNames::load(&s.root, None);
    names.remember(1155, "NVIDIA L40S-48Q");
    names.save(&RealHost::new(&s.root).unwrap()).unwrap();
    assert!(
        std::fs::read_to_string(s.root.join(NAMES_PATH))
            .unwrap()
            .contains("L40S-48Q")
    );
    assert!(LayoutLock::acquire(&s.root, Some(Duration::from_millis(50)), &mut |_| {}).is_err());
    untouched(&s.outside);
}

#[test]
fn a_state_directory_that_is_a_link_is_refused() {
    use gpu_sysfs::apply::{NAMES_PATH, RememberedNames};
    let s = setup();
    let mut b = TreeBuilder::at(&s.root);
    b.link("run/gpuslice", &out_of("run/gpuslice", ""));
    b.finish().unwrap();
    let mut names = RememberedNames::load(&s.root, None);
    names.remember(1155, "NVIDIA L40S-48Q");
    let e = names.save(&RealHost::new(&s.root).unwrap()).unwrap_err();
    assert!(e.to_string().contains("run/gpuslice is a link"), "{e}");
    assert!(!s.outside.join("vgpu-type-names.json").exists());
    assert!(!s.root.join(NAMES_PATH).exists());
}

#[test]
fn the_fake_kernel_over_an_outside_link_tree_writes_nothing_outside() {
    let s = setup();
    let mut b = a_gpu_with_a_type(&s.root);
    let mdev = format!("sys/bus/mdev/devices/{UUID}");
    b.link(&mdev, &format!("{}outside", "../".repeat(5)));
    let rel = format!("sys/devices/pci0000:00/{GPU}/driver_override");
    b.link(&rel, &out_of(&rel, "driver_override"));
    let kernel = gpu_sysfs::testing::FakeKernel::new(b.finish().unwrap()).unwrap();
    let uuid: MdevUuid = UUID.parse().unwrap();
    let _ = gpu_sysfs::actuate::mdev::remove_mdev(&kernel, &uuid, true);
    // The fake kernel refuses it (its model has no such attribute; the tree's link is not
    // followed); either way nothing outside changes.
    assert!(
        kernel
            .write(
                &format!("sys/bus/pci/devices/{GPU}/driver_override"),
                b"vfio-pci"
            )
            .is_err()
    );
    untouched(&s.outside);
}
