//! `gpuslice export qemu|libvirt --device-nodes`: the nodes a VM's device cgroup or container
//! must allow, read from the host.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod export_support;

use export_support::*;

#[test]
fn a_vf_needs_the_container_and_its_groups_node() {
    let t = l40s_root(true);
    let root = t.root().to_str().unwrap();
    let text = ok(&[
        "--root",
        root,
        "export",
        "qemu",
        "--address",
        "0000:26:00.5",
        "--device-nodes",
    ]);
    assert_eq!(text, "/dev/vfio/vfio\n/dev/vfio/42\n");
    let json = ok(&[
        "--root",
        root,
        "-o",
        "json",
        "export",
        "libvirt",
        "--address",
        "0000:26:00.5",
        "--device-nodes",
    ]);
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(v[0]["device"], "0000:26:00.5");
    assert_eq!(
        v[0]["deviceNodes"],
        serde_json::json!(["/dev/vfio/vfio", "/dev/vfio/42"])
    );
}

#[test]
fn a_device_without_a_group_here_is_an_error_naming_it() {
    let t = l40s_root(true);
    let out = run(&[
        "--root",
        t.root().to_str().unwrap(),
        "export",
        "qemu",
        "--uuid",
        "de306c9f-a714-4373-a290-dc15d4e49b71",
        "--device-nodes",
        // Past the hand-off check (no such instance here): the device nodes are checked too.
        "--force",
    ]);
    assert_eq!(out.status.code(), Some(2));
    assert!(out.stdout.is_empty());
    assert!(
        String::from_utf8_lossy(&out.stderr)
            .contains("de306c9f-a714-4373-a290-dc15d4e49b71 has no IOMMU group on this host")
    );
}
