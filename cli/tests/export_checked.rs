//! The one hand-off check every export shares: `export qemu|libvirt` (`--uuid`, `--address`,
//! `--allocation`) and `export vm` refuse a device that does not exist on the node or that
//! another VM holds open (`--force` hands it off with a warning), and warn on one that is not
//! free for a VM yet.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod export_support;

use std::process::{Command, Output};

use export_support::*;
use gpu_core::{AllocatedDevice, Allocation, AllocationStatus, MdevUuid, ParentId, VgpuFramework};

/// The A2 capture's live 4Q vGPU.
const LIVE: &str = "c728e022-f16f-434b-ad2c-9665ee634d3d";
/// No instance anywhere.
const GONE: &str = "de306c9f-a714-4373-a290-dc15d4e49b71";

fn err(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn live_vgpu_allocation(node: &str) -> Allocation {
    Allocation {
        machine: "vm-1".into(),
        node: node.into(),
        status: AllocationStatus::Created,
        devices: vec![AllocatedDevice::Vgpu {
            request: "gpu".into(),
            index: 0,
            parent: ParentId::Pci("0000:08:02.0".parse().unwrap()),
            gpu: Some("0000:08:00.0".parse().unwrap()),
            framework: VgpuFramework::Mdev,
            profile: gpu_core::VgpuTypeId::from_str_unchecked("nvidia-746"),
            profile_name: "NVIDIA A2-4Q".into(),
            framebuffer_mib: Some(4096),
            mig_slices: None,
            uuid: LIVE.parse::<MdevUuid>().unwrap(),
            gpu_instance_start: None,
            placement_id: None,
        }],
    }
}

#[test]
fn a_gpu_hosting_live_vgpus_is_not_passed_through_whole_unless_forced() {
    let a2 = a2_root();
    let root = a2.path().to_str().unwrap();
    let out = run(&[
        "--root",
        root,
        "export",
        "qemu",
        "--address",
        "0000:08:00.0",
    ]);
    assert_eq!(out.status.code(), Some(2));
    assert!(out.stdout.is_empty());
    assert!(err(&out).contains("hosts 3 live vGPUs"), "{}", err(&out));
    let out = run(&[
        "--root",
        root,
        "export",
        "qemu",
        "--address",
        "0000:08:00.0",
        "--force",
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", err(&out));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "-device vfio-pci,host=0000:08:00.0\n"
    );
    assert!(
        err(&out).contains("warning:") && err(&out).contains("--force"),
        "{}",
        err(&out)
    );
}

#[test]
fn an_mdev_uuid_that_is_no_instance_here_is_refused_and_a_live_one_is_handed_off() {
    let a2 = a2_root();
    let root = a2.path().to_str().unwrap();
    let out = run(&["--root", root, "export", "libvirt", "--uuid", GONE]);
    assert_eq!(out.status.code(), Some(2));
    assert!(out.stdout.is_empty());
    assert!(
        err(&out).contains(&format!("mdev {GONE} is not a vGPU instance on node")),
        "{}",
        err(&out)
    );
    let xml = ok(&["--root", root, "export", "libvirt", "--uuid", LIVE]);
    assert!(xml.contains(LIVE), "{xml}");
}

#[test]
fn an_allocation_naming_a_gpu_the_node_lacks_is_refused_by_export_qemu_as_by_export_vm() {
    let a2 = a2_root();
    let root = a2.path().to_str().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut a = live_vgpu_allocation("a2");
    a.devices.push(AllocatedDevice::Gpu {
        request: "whole".into(),
        name: "nvidia9".into(),
        address: "0000:17:00.0".parse().unwrap(),
        functions: vec!["0000:17:00.0".parse().unwrap()],
        memory_mib: None,
    });
    let f = dir.path().join("a.json");
    std::fs::write(&f, serde_json::to_string(&a).unwrap()).unwrap();
    for cmd in ["qemu", "libvirt", "vm"] {
        let out = run(&[
            "--root",
            root,
            "--node",
            "a2",
            "export",
            cmd,
            "--allocation",
            f.to_str().unwrap(),
        ]);
        assert_eq!(out.status.code(), Some(2), "export {cmd}");
        assert!(
            err(&out).contains("request whole: GPU 0000:17:00.0 is not on node a2"),
            "export {cmd}: {}",
            err(&out)
        );
    }
    // The live vGPU alone is handed off by each.
    let f = dir.path().join("live.json");
    std::fs::write(
        &f,
        serde_json::to_string(&live_vgpu_allocation("a2")).unwrap(),
    )
    .unwrap();
    for cmd in ["qemu", "libvirt", "vm"] {
        ok(&[
            "--root",
            root,
            "--node",
            "a2",
            "export",
            cmd,
            "--allocation",
            f.to_str().unwrap(),
        ]);
    }
}

#[test]
fn a_vgpu_another_vm_holds_open_is_refused_by_every_export() {
    let t = tempfile::tempdir().unwrap();
    let sbx = t.path().join("sbx");
    ok(&["sandbox", "init", sbx.to_str().unwrap()]);
    let root = format!("sandbox:{}", sbx.display());
    ok(&["--root", &root, "sandbox", "hold", LIVE]);
    let f = t.path().join("live.json");
    std::fs::write(
        &f,
        serde_json::to_string(&live_vgpu_allocation("demo")).unwrap(),
    )
    .unwrap();
    let fs = f.to_str().unwrap();
    let cases: [&[&str]; 4] = [
        &["export", "qemu", "--uuid", LIVE],
        &["export", "libvirt", "--allocation", fs],
        &["export", "qemu", "--allocation", fs],
        &["export", "vm", "--allocation", fs],
    ];
    for args in cases {
        let mut all = vec!["--root", root.as_str(), "--node", "demo"];
        all.extend_from_slice(args);
        let out = run(&all);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        assert!(out.stdout.is_empty(), "{args:?}");
        assert!(
            err(&out).contains("is in use by pid"),
            "{args:?}: {}",
            err(&out)
        );
        all.push("--force");
        let out = run(&all);
        assert_eq!(
            out.status.code(),
            Some(0),
            "{args:?} --force: {}",
            err(&out)
        );
        assert!(err(&out).contains("warning:"), "{args:?}: {}", err(&out));
    }
}

#[test]
fn a_gpu_still_on_its_host_driver_is_handed_off_with_a_warning_to_bind_it() {
    let k = gpu_sysfs::testing::FakeKernel::passthrough_host().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_gpuslice"))
        .args([
            "--root",
            k.root().to_str().unwrap(),
            "export",
            "qemu",
            "--address",
            "0000:01:00.0",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", err(&out));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "-device vfio-pci,host=0000:01:00.0\n-device vfio-pci,host=0000:01:00.1\n"
    );
    assert!(
        err(&out).contains("is not free for a VM yet") && err(&out).contains("gpuslice gpu bind"),
        "{}",
        err(&out)
    );
}
