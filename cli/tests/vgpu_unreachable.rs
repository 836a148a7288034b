//! `vgpu list` and `vgpu remove` on a tree where an instance's link leads outside the root: the
//! instance is warned about, naming the link, not reported as absent.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::process::Command;

use gpu_sysfs::testing::{MdevTypeSpec, TreeBuilder};

const U1: &str = "de306c9f-a714-4373-a290-dc15d4e49b71";

fn gpuslice(root: &std::path::Path, args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_gpuslice"))
        .arg("--root")
        .arg(root)
        .args(args)
        .output()
        .unwrap()
}

#[test]
fn an_instance_linked_out_of_the_root_is_warned_about_not_reported_absent() {
    let outside = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(outside.path().join("mdev")).unwrap();
    let mut b = TreeBuilder::new();
    b.mdev_parent(
        "mbochs",
        &[MdevTypeSpec::new("mbochs-small", "mbochs-small", 63, None)],
    );
    b.mkdir("sys/bus/mdev/devices");
    let tree = b.finish().unwrap();
    let link = tree.root().join(format!("sys/bus/mdev/devices/{U1}"));
    std::os::unix::fs::symlink(outside.path().join("mdev"), &link).unwrap();

    let list = gpuslice(tree.root(), &["vgpu", "list"]);
    assert!(list.status.success());
    let err = String::from_utf8_lossy(&list.stderr);
    assert!(err.contains("warning") && err.contains(U1), "{err}");
    let json = gpuslice(tree.root(), &["-o", "json", "vgpu", "list"]);
    let v: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    assert!(v["warnings"][0].as_str().unwrap().contains(U1), "{v}");

    let remove = gpuslice(tree.root(), &["vgpu", "remove", U1]);
    let out = String::from_utf8_lossy(&remove.stdout);
    let err = String::from_utf8_lossy(&remove.stderr);
    assert!(!out.contains("nothing to remove"), "{out}");
    assert!(out.contains("cannot be reached"), "{out}");
    assert!(
        err.contains("outside the root") || err.contains("leads"),
        "{err}"
    );
    assert!(
        link.exists() || std::fs::symlink_metadata(&link).is_ok(),
        "nothing was removed"
    );
}
