//! `gpuslice gpu bind|release`, `vgpu create|remove|list` and `sriov enable` run as a process on
//! fake trees. The process cannot use the in-process fake kernel, so these trees are plain files:
//! the tests check what the command wrote, what it refused, and how it said so.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::Path;
use std::process::{Command, Output};

use gpu_core::MdevUuid;
use gpu_sysfs::testing::builder::Tree;
use gpu_sysfs::testing::{MdevTypeSpec, PciSpec, TreeBuilder, snapshot};

fn gpuslice(root: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_gpuslice"))
        .arg("--root")
        .arg(root)
        .arg("--node")
        .arg("node-a")
        .args(args)
        .output()
        .unwrap()
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

const U1: &str = "de306c9f-a714-4373-a290-dc15d4e49b71";

/// mbochs with one existing small instance, an L40S VF with type 1155 and a free one, a GPU
/// sharing its IOMMU group with a NIC.
fn host() -> Tree {
    let mut b = TreeBuilder::new();
    b.mdev_parent(
        "mbochs",
        &[
            MdevTypeSpec::new("mbochs-small", "mbochs-small", 63, None),
            MdevTypeSpec::new("mbochs-large", "mbochs-large", 3, None),
        ],
    )
    .mdev_instance(U1, "mbochs", "mbochs-small")
    .pci(
        "0000:26:00.0",
        PciSpec::new(0x10de, 0x26b9, 0x030200)
            .driver("nvidia")
            .group(30),
    )
    .sriov(
        "0000:26:00.0",
        2,
        32,
        4,
        1,
        PciSpec::new(0x10de, 0x26b9, 0x030200).driver("nvidia"),
        Some(31),
    )
    .vendor_vfio_vf("0000:26:00.4", &[], 1155)
    .vendor_vfio_vf("0000:26:00.5", &[(1155, "NVIDIA L40S-24Q")], 0)
    .pci(
        "0000:02:00.0",
        PciSpec::new(0x10de, 0x1eb8, 0x030200)
            .driver("nvidia")
            .group(2),
    )
    .pci(
        "0000:03:00.0",
        PciSpec::new(0x8086, 0x10d3, 0x020000)
            .driver("e1000e")
            .group(2),
    );
    b.finish().unwrap()
}

#[test]
fn vgpu_list_shows_mdevs_and_typed_vfs_with_their_handoff() {
    let t = host();
    let o = gpuslice(t.root(), &["-o", "json", "vgpu", "list"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(v["mdevs"][0]["uuid"], U1);
    assert_eq!(v["mdevs"][0]["parent"], "mbochs");
    assert_eq!(v["mdevs"][0]["typeId"], "mbochs-small");
    assert_eq!(
        v["mdevs"][0]["handoff"]["qemu"],
        format!("-device vfio-pci,sysfsdev=/sys/bus/mdev/devices/{U1}")
    );
    assert_eq!(v["vendorVfio"][0]["vf"], "0000:26:00.4");
    assert_eq!(v["vendorVfio"][0]["typeId"], "1155");
    assert_eq!(v["vendorVfio"][0]["typeName"], "NVIDIA L40S-24Q");
    assert_eq!(v["vendorVfio"].as_array().unwrap().len(), 1);
    let table = gpuslice(t.root(), &["vgpu", "list"]);
    assert!(stdout(&table).contains(U1), "{}", stdout(&table));
}

#[test]
fn vgpu_create_of_an_existing_instance_is_success_without_writing() {
    let t = host();
    let before = snapshot(t.root()).unwrap();
    let o = gpuslice(
        t.root(),
        &[
            "-o",
            "json",
            "vgpu",
            "create",
            "--parent",
            "mbochs",
            "--profile",
            "mbochs-small",
            "--uuid",
            U1,
        ],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(v["kind"], "mdev");
    assert_eq!(v["changed"], false);
    assert!(
        v["handoff"]["libvirt"]
            .as_str()
            .unwrap()
            .contains(&format!("<address uuid='{U1}'/>"))
    );
    assert_eq!(snapshot(t.root()).unwrap(), before);
}

#[test]
fn vgpu_create_writes_the_machines_uuid_to_the_types_create_file() {
    let t = host();
    let o = gpuslice(
        t.root(),
        &[
            "vgpu",
            "create",
            "--parent",
            "mbochs",
            "--profile",
            "mbochs-large",
            "--machine",
            "vm-7",
            "--request",
            "display",
            "--index",
            "1",
        ],
    );
    let uuid = MdevUuid::for_machine("vm-7", "display", 1).to_string();
    let written = std::fs::read_to_string(
        t.root()
            .join("sys/devices/virtual/mbochs/mbochs/mdev_supported_types/mbochs-large/create"),
    )
    .unwrap();
    assert_eq!(written, uuid);
    // A plain file is not a kernel: no instance appears, and the command says so.
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("but the kernel now shows \"no such instance\""),
        "{}",
        stderr(&o)
    );
}

#[test]
fn vgpu_create_with_the_uuid_of_another_type_is_refused() {
    let t = host();
    let o = gpuslice(
        t.root(),
        &[
            "vgpu",
            "create",
            "--parent",
            "mbochs",
            "--profile",
            "mbochs-large",
            "--uuid",
            U1,
        ],
    );
    assert_eq!(o.status.code(), Some(2));
    assert_eq!(
        stderr(&o).trim(),
        format!(
            "gpuslice: cannot create mdev {U1} on mbochs: mdev {U1} already exists as mbochs-small on mbochs, not mbochs-large on mbochs"
        )
    );
}

#[test]
fn vgpu_create_on_a_vendor_vfio_gpu_picks_a_free_vf_by_profile_name() {
    let t = host();
    let o = gpuslice(
        t.root(),
        &[
            "-o",
            "json",
            "vgpu",
            "create",
            "--parent",
            "0000:26:00.0",
            "--profile",
            "L40S-24Q",
        ],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(v["kind"], "vendorVfio");
    assert_eq!(v["vf"], "0000:26:00.5");
    assert_eq!(v["handoff"]["qemu"], "-device vfio-pci,host=0000:26:00.5");
    let cur = std::fs::read_to_string(
        t.root()
            .join("sys/devices/pci0000:00/0000:26:00.5/nvidia/current_vgpu_type"),
    )
    .unwrap();
    assert_eq!(cur.trim(), "1155");
}

#[test]
fn bad_identities_are_rejected_before_anything_is_written() {
    let t = host();
    let before = snapshot(t.root()).unwrap();
    let cases: &[(&[&str], &str)] = &[
        (
            &[
                "vgpu",
                "create",
                "--parent",
                "../../etc",
                "--profile",
                "x",
                "--uuid",
                U1,
            ],
            "invalid --parent: invalid vGPU parent \"../../etc\"",
        ),
        (
            &[
                "vgpu",
                "create",
                "--parent",
                "mbochs",
                "--profile",
                "x",
                "--uuid",
                "not-a-uuid",
            ],
            "invalid mdev UUID",
        ),
        (
            &[
                "vgpu",
                "create",
                "--parent",
                "mbochs",
                "--profile",
                "../create",
                "--uuid",
                U1,
            ],
            "mbochs has no vGPU type \"../create\"",
        ),
        (
            &[
                "vgpu",
                "create",
                "--parent",
                "mbochs",
                "--profile",
                "mbochs-small",
            ],
            "pass --uuid UUID or --machine NAME",
        ),
        (
            &[
                "vgpu",
                "create",
                "--parent",
                "mbochs",
                "--profile",
                "mbochs-small",
                "--machine",
                "a/b",
            ],
            "invalid --machine",
        ),
        (&["vgpu", "remove", "1234"], "neither an mdev UUID"),
        (
            &["gpu", "bind", "../0000:02:00.0"],
            "neither a PCI address nor a GPU name",
        ),
        (
            &["gpu", "bind", "0000:09:00.0"],
            "PCI device 0000:09:00.0 not found",
        ),
        (
            &["sriov", "enable", "0000:02:00.0"],
            "is not SR-IOV capable",
        ),
    ];
    for (args, want) in cases {
        let o = gpuslice(t.root(), args);
        assert_eq!(o.status.code(), Some(2), "{args:?}");
        assert!(stderr(&o).contains(want), "{args:?}: {}", stderr(&o));
    }
    assert_eq!(snapshot(t.root()).unwrap(), before);
}

#[test]
fn gpu_bind_by_name_refuses_a_group_shared_with_a_nic() {
    let t = host();
    let before = snapshot(t.root()).unwrap();
    // nvidia0 is the first NVIDIA GPU in address order: 0000:02:00.0.
    let o = gpuslice(t.root(), &["gpu", "bind", "nvidia0"]);
    assert_eq!(o.status.code(), Some(2));
    assert_eq!(
        stderr(&o).trim(),
        "gpuslice: cannot bind 0000:02:00.0 to vfio-pci: 0000:02:00.0: IOMMU group 2 also holds 0000:03:00.0 (driver e1000e), which are not part of the card; a VM can only take the whole group"
    );
    assert_eq!(snapshot(t.root()).unwrap(), before);
    let o = gpuslice(t.root(), &["gpu", "bind", "nvidia7"]);
    assert!(
        stderr(&o).contains("no GPU named \"nvidia7\""),
        "{}",
        stderr(&o)
    );
}

#[test]
fn gpu_bind_writes_the_kernels_sequence_and_reports_a_probe_that_did_not_bind() {
    let mut b = TreeBuilder::new();
    b.pci(
        "0000:01:00.0",
        PciSpec::new(0x10de, 0x2204, 0x030000)
            .driver("nvidia")
            .group(1),
    );
    let t = b.finish().unwrap();
    let o = gpuslice(t.root(), &["gpu", "bind", "0000:01:00.0"]);
    // Plain files: the override and probe are written, but no driver moves.
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains(
            "0000:01:00.0: vfio-pci did not bind after drivers_probe (driver now: nvidia)"
        ),
        "{}",
        stderr(&o)
    );
    let probe = std::fs::read_to_string(t.root().join("sys/bus/pci/drivers_probe")).unwrap();
    assert_eq!(probe, "0000:01:00.0");
    let unbind =
        std::fs::read_to_string(t.root().join("sys/bus/pci/drivers/nvidia/unbind")).unwrap();
    assert_eq!(unbind, "0000:01:00.0");
}

#[test]
fn gpu_bind_refuses_an_unhealthy_gpu_unless_forced() {
    let mut b = TreeBuilder::new();
    b.pci(
        "0000:01:00.0",
        PciSpec::new(0x10de, 0x2204, 0x030000)
            .driver("nvidia")
            .group(1),
    )
    .attr(
        "0000:01:00.0",
        "aer_dev_fatal",
        "Undefined 0\nDLP 0\nSDES 0\nTLP 0\nFCP 0\nCmpltTO 0\nCmpltAbrt 0\nUnxCmplt 0\nRxOF 0\nMalfTLP 3\nECRC 0\nUnsupReq 0\nACSViol 0\nTOTAL_ERR_FATAL 3\n",
    );
    let t = b.finish().unwrap();
    let before = snapshot(t.root()).unwrap();
    let o = gpuslice(t.root(), &["gpu", "bind", "0000:01:00.0"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert_eq!(
        stderr(&o).trim(),
        "gpuslice: 0000:01:00.0 is Unhealthy (AER fatal 3 (MalfTLP 3)); a VM would get a failing \
         GPU; nothing was changed (--force binds it anyway)"
    );
    assert_eq!(snapshot(t.root()).unwrap(), before, "nothing written");
    let o = gpuslice(t.root(), &["gpu", "bind", "--force", "0000:01:00.0"]);
    assert!(
        stderr(&o).contains("gpuslice: warning: 0000:01:00.0 is Unhealthy"),
        "{}",
        stderr(&o)
    );
    let probe = std::fs::read_to_string(t.root().join("sys/bus/pci/drivers_probe")).unwrap();
    assert_eq!(probe, "0000:01:00.0", "--force binds it");
}

#[test]
fn vgpu_remove_of_an_instance_a_vm_holds_is_refused() {
    let mut b = TreeBuilder::new();
    b.mdev_parent(
        "mbochs",
        &[MdevTypeSpec::new("mbochs-small", "mbochs-small", 63, None)],
    )
    .mdev_instance(U1, "mbochs", "mbochs-small")
    .link(
        &format!("sys/devices/virtual/mbochs/mbochs/{U1}/iommu_group"),
        "../../../../kernel/iommu_groups/9",
    )
    .mkdir("sys/kernel/iommu_groups/9/devices")
    .file("proc/3131/comm", "qemu-kvm\n")
    .link("proc/3131/fd/17", "/dev/vfio/9");
    let t = b.finish().unwrap();
    let o = gpuslice(t.root(), &["vgpu", "remove", U1]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains(&format!(
            "mdev {U1} is in use by pid 3131 (qemu-kvm) (its VFIO device /dev/vfio/9 is open); stop the VM first or pass --force"
        )),
        "{}",
        stderr(&o)
    );
    let remove = t
        .root()
        .join(format!("sys/devices/virtual/mbochs/mbochs/{U1}/remove"));
    assert_eq!(std::fs::read_to_string(&remove).unwrap(), "");
    let o = gpuslice(t.root(), &["vgpu", "remove", U1, "--force"]);
    assert_eq!(std::fs::read_to_string(&remove).unwrap(), "1");
    assert_eq!(o.status.code(), Some(2), "a plain file cannot remove it");

    let gone = "00000000-0000-4000-8000-000000000001";
    let o = gpuslice(t.root(), &["vgpu", "remove", gone]);
    assert!(o.status.success());
    assert_eq!(
        stdout(&o).trim(),
        format!("no mdev {gone} (nothing to remove)")
    );
}

fn script(dir: &Path, name: &str, body: &str) -> String {
    use std::os::unix::fs::PermissionsExt;
    let p = dir.join(name);
    std::fs::write(&p, format!("#!/bin/sh\n{body}\n")).unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
    p.to_string_lossy().into_owned()
}

fn sriov_host() -> Tree {
    let mut b = TreeBuilder::new();
    b.pci(
        "0000:26:00.0",
        PciSpec::new(0x10de, 0x26b9, 0x030200)
            .driver("nvidia")
            .group(30),
    )
    .attr("0000:26:00.0", "sriov_totalvfs", "32\n")
    .attr("0000:26:00.0", "sriov_numvfs", "0\n");
    b.finish().unwrap()
}

#[test]
fn sriov_enable_catches_a_script_that_exits_0_without_vfs() {
    let t = sriov_host();
    let bin = tempfile::tempdir().unwrap();
    let prog = script(
        bin.path(),
        "sriov-manage",
        "echo \"Enabling VFs on $2\"; exit 0",
    );
    let o = gpuslice(
        t.root(),
        &["sriov", "enable", "nvidia0", "--program", &prog],
    );
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains(&format!(
            "{prog} -e 0000:26:00.0 exited 0 but sriov_numvfs is 0; SR-IOV was not enabled: Enabling VFs on 0000:26:00.0"
        )),
        "{}",
        stderr(&o)
    );
}

#[test]
fn sriov_enable_kills_a_hanging_script_at_the_timeout() {
    let t = sriov_host();
    let bin = tempfile::tempdir().unwrap();
    let prog = script(
        bin.path(),
        "sriov-manage",
        "echo waiting for GPU >&2; sleep 30; echo never",
    );
    let start = std::time::Instant::now();
    let o = gpuslice(
        t.root(),
        &[
            "sriov",
            "enable",
            "0000:26:00.0",
            "--program",
            &prog,
            "--timeout",
            "1",
        ],
    );
    assert!(
        start.elapsed().as_secs() < 10,
        "the script's child was killed too"
    );
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("did not finish within 1 s and was killed: waiting for GPU"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn sriov_enable_reports_the_vfs_a_working_script_made() {
    let t = sriov_host();
    let bin = tempfile::tempdir().unwrap();
    let numvfs = t
        .root()
        .join("sys/devices/pci0000:00/0000:26:00.0/sriov_numvfs");
    let prog = script(
        bin.path(),
        "sriov-manage",
        &format!("echo 4 > '{}'", numvfs.display()),
    );
    let o = gpuslice(
        t.root(),
        &[
            "-o",
            "json",
            "sriov",
            "enable",
            "0000:26:00.0",
            "--program",
            &prog,
        ],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(v["numvfs"], 4);
    assert_eq!(v["changed"], true);
}

/// Compares `actual` with `tests/golden/actuate/<name>` (`GOLDEN_UPDATE=1` rewrites it).
fn golden(name: &str, actual: &str) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/golden/actuate")
        .join(name);
    gpu_sysfs::testing::assert_golden(&path, actual);
}

#[test]
fn vgpu_list_output_matches_the_golden_files() {
    let t = host();
    for (format, file) in [("table", "vgpu-list.txt"), ("json", "vgpu-list.json")] {
        let o = gpuslice(t.root(), &["-o", format, "vgpu", "list"]);
        assert!(o.status.success(), "{}", stderr(&o));
        golden(file, &stdout(&o));
    }
}

#[test]
fn vgpu_create_output_matches_the_golden_file() {
    let t = host();
    let o = gpuslice(
        t.root(),
        &[
            "vgpu",
            "create",
            "--parent",
            "mbochs",
            "--profile",
            "mbochs-small",
            "--uuid",
            U1,
        ],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    golden("vgpu-create-present.txt", &stdout(&o));
}

#[test]
fn vgpu_create_by_gpu_name_on_an_sriov_mdev_card_writes_to_the_first_vf() {
    let mut b = TreeBuilder::new();
    gpu_sysfs::testing::fake_kernel::add_a2_mdev_gpu(&mut b);
    let t = b.finish().unwrap();
    let o = gpuslice(
        t.root(),
        &[
            "vgpu",
            "create",
            "--parent",
            "nvidia0",
            "--profile",
            "A2-4Q",
            "--machine",
            "vm-1",
        ],
    );
    let written = std::fs::read_to_string(
        t.root()
            .join("sys/devices/pci0000:00/0000:08:00.4/mdev_supported_types/nvidia-746/create"),
    )
    .unwrap();
    assert_eq!(written, MdevUuid::for_machine("vm-1", "gpu", 0).to_string());
    assert_eq!(o.status.code(), Some(2), "plain files make no instance");
}

#[test]
fn sriov_enable_without_the_script_says_how_to_reach_the_hosts_copy() {
    let t = sriov_host();
    let o = gpuslice(
        t.root(),
        &[
            "sriov",
            "enable",
            "0000:26:00.0",
            "--program",
            "/nonexistent/sriov-manage",
        ],
    );
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("from a container, run it through chroot <host-root>"),
        "{}",
        stderr(&o)
    );
}
