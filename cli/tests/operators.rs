//! What operators of the platform guides expect (issue 46, point 7): fleet views that charge
//! pending vGPUs and name each instance's Machine, HOLDER naming the process that holds a device
//! open, `export cloud-init --feature-type`, and the doctor's KubeVirt-version and guest-license
//! checks.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod export_support;

use export_support::*;
use gpu_sysfs::testing::doctor_hosts;

fn stderr(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn stdout(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Runs `gpuslice args`, which must be refused as bad input (exit 2, nothing on stdout), and
/// returns its stderr.
fn refused(args: &[&str]) -> String {
    let out = run(args);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stdout(&out).is_empty(), "{}", stdout(&out));
    stderr(&out)
}

#[test]
fn export_cloud_init_writes_the_feature_type_asked_for() {
    let dir = tempfile::tempdir().unwrap();
    let tok = dir.path().join("client_configuration_token.tok");
    std::fs::write(&tok, "eyJhbGciOiJSUzI1NiJ9.token\n").unwrap();
    let yaml = ok(&[
        "export",
        "cloud-init",
        "--license-token",
        tok.to_str().unwrap(),
        "--feature-type",
        "4",
    ]);
    let v: serde_json::Value = serde_yaml_ng::from_str(&yaml).unwrap();
    let gridd = &v["write_files"][1];
    assert_eq!(gridd["path"], "/etc/nvidia/gridd.conf");
    assert!(
        gridd["content"]
            .as_str()
            .unwrap()
            .lines()
            .any(|l| l == "FeatureType=4"),
        "{yaml}"
    );

    let e = refused(&["export", "cloud-init", "--feature-type", "3"]);
    assert!(e.contains("4 (NVIDIA Virtual Compute Server)"), "{e}");
}

#[test]
fn export_cloud_init_without_a_token_is_refused_unless_the_guest_is_unlicensed() {
    let out = run(&["export", "cloud-init"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let e = stderr(&out);
    assert!(
        e.contains("--license-token") && e.contains("FeatureType=1"),
        "{e}"
    );
    assert!(stdout(&out).is_empty());

    let yaml = ok(&["export", "cloud-init", "--feature-type", "0"]);
    assert!(yaml.contains("FeatureType=0"), "{yaml}");
    assert!(!yaml.contains("ClientConfigToken"), "{yaml}");
}

fn doctor(root: &std::path::Path, extra: &[&str]) -> (Option<i32>, serde_json::Value) {
    let mut args = vec![
        "--root",
        root.to_str().unwrap(),
        "--node",
        "n1",
        "-o",
        "json",
        "doctor",
    ];
    args.extend(extra);
    let out = run(&args);
    let v = serde_json::from_str(&stdout(&out))
        .unwrap_or_else(|e| panic!("{e}: {}{}", stdout(&out), stderr(&out)));
    (out.status.code(), v)
}

fn check<'a>(v: &'a serde_json::Value, name: &str) -> Option<&'a serde_json::Value> {
    v["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["check"] == name)
}

#[test]
fn doctor_fails_a_kubevirt_too_old_for_the_nodes_sriov_vgpus_and_says_where_it_read_it() {
    let t = doctor_hosts::ready().unwrap();
    let (code, v) = doctor(t.root(), &["--kubevirt-version", "v1.8.2"]);
    assert_eq!(code, Some(1));
    let c = check(&v, "kubevirt-version").expect("a kubevirt-version check");
    assert_eq!(c["verdict"], "fail");
    let m = c["message"].as_str().unwrap();
    assert!(
        m.contains("1.8") && m.contains("--kubevirt-version") && m.contains("1.9"),
        "{m}"
    );
    assert!(c["subject"].as_str().unwrap().contains("nvidia"), "{c}");

    let (code, v) = doctor(t.root(), &["--kubevirt-version", "1.9.0"]);
    assert_eq!(code, Some(0), "{v}");
    assert_eq!(check(&v, "kubevirt-version").unwrap()["verdict"], "ok");

    let e = refused(&[
        "--root",
        t.root().to_str().unwrap(),
        "doctor",
        "--kubevirt-version",
        "latest",
    ]);
    assert!(e.contains("expected MAJOR.MINOR"), "{e}");
}

#[test]
fn doctor_says_when_it_cannot_see_the_kubevirt_version_and_guesses_none() {
    // virt-handler runs on this node, and no version is given.
    let t = doctor_hosts::broken().unwrap();
    let (_, v) = doctor(t.root(), &[]);
    let c = check(&v, "kubevirt-version").expect("a kubevirt-version check");
    assert_eq!(c["verdict"], "warn");
    let m = c["message"].as_str().unwrap();
    assert!(
        m.contains("cannot be seen") && m.contains("not checked"),
        "{m}"
    );
    assert!(c["fix"].as_str().unwrap().contains("--kubevirt-version"));
    // Nothing to say where KubeVirt is neither running nor named.
    let t = doctor_hosts::ready().unwrap();
    let (_, v) = doctor(t.root(), &[]);
    assert!(check(&v, "kubevirt-version").is_none(), "{v}");
}

#[test]
fn doctor_fails_a_guest_cloud_config_that_asks_for_a_license_without_a_token() {
    let t = doctor_hosts::ready().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let user_data = dir.path().join("user-data");
    std::fs::write(
        &user_data,
        "#cloud-config\nwrite_files:\n- path: /etc/nvidia/gridd.conf\n  content: |\n    FeatureType=1\n",
    )
    .unwrap();
    let (code, v) = doctor(t.root(), &["--cloud-init", user_data.to_str().unwrap()]);
    assert_eq!(code, Some(1));
    let c = check(&v, "guest-license").expect("a guest-license check");
    assert_eq!(c["verdict"], "fail");
    assert!(
        c["fix"].as_str().unwrap().contains("--license-token"),
        "{c}"
    );

    let tok = dir.path().join("a.tok");
    std::fs::write(&tok, "eyJ.token\n").unwrap();
    let rendered = ok(&[
        "export",
        "cloud-init",
        "--license-token",
        tok.to_str().unwrap(),
    ]);
    std::fs::write(&user_data, rendered).unwrap();
    let (code, v) = doctor(t.root(), &["--cloud-init", user_data.to_str().unwrap()]);
    assert_eq!(code, Some(0), "{v}");
    assert_eq!(check(&v, "guest-license").unwrap()["verdict"], "ok");
}

/// The free count of `profile` in `topology`'s text (its first PROFILE line).
fn free_of(text: &str, profile: &str) -> u32 {
    let line = text
        .lines()
        .find(|l| l.trim_start().starts_with(profile))
        .unwrap_or_else(|| panic!("no {profile} line in\n{text}"));
    let cols: Vec<&str> = line.split_whitespace().collect();
    // NAME is two words (`NVIDIA A2-4Q`), then ID, SIZE (`4096 MiB`), FREE.
    cols[5].parse().unwrap()
}

#[test]
fn a_fleet_node_charges_a_pending_vgpu_and_names_its_machine() {
    let dir = tempfile::tempdir().unwrap();
    let fleet = dir.path().join("fleet.yaml");
    std::fs::copy("../examples/fleet/fleet.yaml", &fleet).unwrap();
    let f = fleet.to_str().unwrap();
    let show = || ok(&["topology", "--inventory", f, "--node", "gpu-a2"]);
    let before = show();
    let free = free_of(&before, "NVIDIA A2-4Q");
    assert!(free > 0, "{before}");
    ok(&[
        "place",
        "--inventory",
        f,
        "--machine",
        "../examples/fleet/desktop.yaml",
        "--save",
    ]);
    let after = show();
    assert_eq!(free_of(&after, "NVIDIA A2-4Q"), free - 1, "{after}");
    let row = after
        .lines()
        .find(|l| l.contains("Machine desktop-1"))
        .unwrap_or_else(|| panic!("no instance row names the Machine:\n{after}"));
    assert!(
        row.contains("493ff4c1-65cb-5221-9607-032069f5a3f7")
            && row.contains("NVIDIA A2-4Q")
            && row.contains("0000:10:00.4")
            && row.ends_with("Machine desktop-1 (pending)"),
        "{row}"
    );

    let json = ok(&[
        "-o",
        "json",
        "topology",
        "--inventory",
        f,
        "--node",
        "gpu-a2",
    ]);
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    let held = &v["allocatedInstances"][0];
    assert_eq!(held["machine"], "desktop-1");
    assert_eq!(held["status"], "pending");
    assert_eq!(held["made"], false);
    assert_eq!(held["uuid"], "493ff4c1-65cb-5221-9607-032069f5a3f7");
    let vf = v["mediatedDevices"]["parents"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["id"] == "0000:10:00.4")
        .unwrap();
    let a2_4q = vf["profiles"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "NVIDIA A2-4Q")
        .unwrap();
    assert_eq!(
        a2_4q["availableInstances"], 0,
        "the VF the pending vGPU takes: {vf}"
    );
    // The keys every NodeTopology has are still there.
    for key in ["node", "gpus", "mediatedDevices"] {
        assert!(v.get(key).is_some(), "{key}");
    }
}

fn held_host() -> gpu_sysfs::testing::builder::Tree {
    use gpu_sysfs::testing::{MdevTypeSpec, PciSpec, TreeBuilder};
    const U1: &str = "8b5c0a2e-1f3d-4e5a-9b6c-7d8e9f0a1b2c";
    let mut b = TreeBuilder::new();
    b.pci(
        "0000:17:00.0",
        PciSpec::new(0x10de, 0x26b9, 0x030200)
            .driver("vfio-pci")
            .group(42),
    )
    .mdev_parent(
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
    .link("proc/3131/fd/17", "/dev/vfio/9")
    .file("proc/4242/comm", "qemu-system-x86\n")
    .link("proc/4242/fd/0", "/dev/null")
    .link("proc/4242/fd/23", "/dev/vfio/42");
    b.finish().unwrap()
}

#[test]
fn holder_names_the_process_holding_a_whole_gpu_or_an_mdev_open() {
    let t = held_host();
    let root = t.root().to_str().unwrap();
    let text = ok(&["--root", root, "--node", "n1", "topology"]);
    let gpu = text.lines().find(|l| l.contains("0000:17:00.0")).unwrap();
    assert!(text.contains("HOLDER"), "{text}");
    assert!(gpu.ends_with("pid 4242 (qemu-system-x86)"), "{gpu}");
    let mdev = text
        .lines()
        .find(|l| l.contains("8b5c0a2e-1f3d-4e5a-9b6c-7d8e9f0a1b2c"))
        .unwrap();
    assert!(mdev.ends_with("pid 3131 (qemu-kvm)"), "{mdev}");

    let v: serde_json::Value =
        serde_json::from_str(&ok(&["--root", root, "-o", "json", "topology"])).unwrap();
    let g = v["gpus"]
        .as_array()
        .unwrap()
        .iter()
        .find(|g| g["address"] == "0000:17:00.0")
        .unwrap();
    assert_eq!(g["holder"]["pid"], 4242);
    assert_eq!(g["holder"]["command"], "qemu-system-x86");
    assert_eq!(g["holder"]["node"], "/dev/vfio/42");
    let i = &v["mediatedDevices"]["parents"][0]["instances"][0];
    assert_eq!(i["holder"]["pid"], 3131, "{v}");

    let list = ok(&["--root", root, "gpu", "list"]);
    assert!(list.lines().next().unwrap().ends_with("HOLDER"), "{list}");
    assert!(
        list.lines()
            .any(|l| l.contains("0000:17:00.0") && l.ends_with("pid 4242 (qemu-system-x86)")),
        "{list}"
    );
    let v: serde_json::Value =
        serde_json::from_str(&ok(&["--root", root, "-o", "json", "gpu", "list"])).unwrap();
    assert_eq!(v[0]["holder"]["pid"], 4242, "{v}");
}

#[test]
fn no_holder_column_where_nothing_is_held_open() {
    let list = ok(&["--root", capture_a2().to_str().unwrap(), "gpu", "list"]);
    assert!(!list.contains("HOLDER"), "{list}");
}

fn capture_a2() -> std::path::PathBuf {
    std::path::PathBuf::from("../examples/hosts/a2-sriov-mdev.umockdev")
}
