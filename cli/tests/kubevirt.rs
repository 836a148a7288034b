//! `gpuslice export kubevirt` and `export vm`: golden files on the real A2 capture, an L40S with
//! 16 VFs (the captured `creatable_vgpu_types`, some VFs typed), the modelled H200 host and a host
//! whose VFs report another device ID than their PF; the VirtualMachine fields checked against
//! KubeVirt's published schema; errors that name what was wrong and print nothing.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod export_support;

use export_support::*;
use gpu_core::{
    AllocatedDevice, Allocation, AllocationStatus, Instance, MdevUuid, ParentId, PciId, Sriov,
    VgpuFramework, VgpuTypeId,
};
use gpu_sysfs::testing::builder::Tree;
use gpu_sysfs::testing::{PciSpec, TreeBuilder};

/// An L40S (PF 0000:26:00.0) with 16 VFs (26:00.4 .. 26:02.3) whose IDs are `vf_device`. VFs 0
/// and 1 hold an L40S-12Q (1153), VF 2 an L40S-12A (1163) when `mixed`, else a third 12Q; the
/// free VFs list what still fits on the 48 GB card (one more 12 GB vGPU), from the captured file.
fn l40s_16(vf_device: u16, mixed: bool) -> Tree {
    let all = l40s_types();
    let fitting: Vec<(u32, &str)> = all
        .iter()
        .filter(|(_, n)| n.ends_with("-12Q") || n.ends_with("-12A"))
        .map(|(i, n)| (*i, n.as_str()))
        .collect();
    let mut b = TreeBuilder::new();
    b.pci(
        "0000:26:00.0",
        PciSpec::new(0x10de, 0x26b9, 0x030200)
            .driver("nvidia")
            .group(40)
            .numa(0)
            .subsystem(0x10de, 0x1851),
    )
    .sriov(
        "0000:26:00.0",
        16,
        32,
        4,
        1,
        PciSpec::new(0x10de, vf_device, 0x030200).driver("nvidia"),
        Some(41),
    );
    let vfs: Vec<String> = (0..16u32)
        .map(|i| {
            let rid = 0x26 * 256 + 4 + i;
            format!("0000:26:{:02x}.{}", (rid >> 3) & 0x1f, rid & 7)
        })
        .collect();
    for (i, vf) in vfs.iter().enumerate() {
        match i {
            0 | 1 => b.vendor_vfio_vf(vf, &[], 1153),
            2 => b.vendor_vfio_vf(vf, &[], if mixed { 1163 } else { 1153 }),
            _ => b.vendor_vfio_vf(vf, &fitting, 0),
        };
    }
    b.finish().unwrap()
}

fn pci_entries(v: &serde_json::Value) -> Vec<serde_json::Value> {
    v["spec"]["configuration"]["permittedHostDevices"]["pciHostDevices"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

/// Runs `gpuslice` and returns (stdout, stderr), asserting success.
fn ok_with_stderr(args: &[&str]) -> (String, String) {
    let out = run(args);
    assert!(
        out.status.success(),
        "gpuslice {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    (
        String::from_utf8(out.stdout).unwrap(),
        String::from_utf8(out.stderr).unwrap(),
    )
}

#[test]
fn l40s_vfs_are_permitted_per_configured_type_named_as_nvidia_writes_it() {
    let t = l40s_16(0x26b9, false);
    let root = t.root().to_str().unwrap();
    let (yaml, stderr) =
        ok_with_stderr(&["--root", root, "--node", "l40s-1", "export", "kubevirt"]);
    golden("kubevirt", "l40s-16vf-kubevirt.yaml", &yaml);
    assert!(stderr.is_empty(), "no warning: {stderr}");
    let v: serde_json::Value = serde_yaml_ng::from_str(&yaml).unwrap();
    let pci = pci_entries(&v);
    assert_eq!(pci.len(), 1, "only the type set on VFs: {pci:?}");
    assert_eq!(pci[0]["resourceName"], "nvidia.com/L40S-12Q");
    assert_eq!(pci[0]["pciVendorSelector"], "10DE:26B9");
    assert!(
        pci[0].get("externalResourceProvider").is_none(),
        "virt-handler serves the VFs itself"
    );
    assert!(
        v["spec"]["configuration"]["permittedHostDevices"]
            .get("mediatedDevices")
            .is_none()
    );
    assert!(
        !yaml.contains("DisableMDEVConfiguration"),
        "no mdev, no note"
    );
}

#[test]
fn two_types_behind_one_selector_are_a_warning() {
    let t = l40s_16(0x26b9, true);
    let root = t.root().to_str().unwrap();
    let (yaml, stderr) =
        ok_with_stderr(&["--root", root, "--node", "l40s-1", "export", "kubevirt"]);
    golden("kubevirt", "l40s-16vf-mixed-kubevirt.yaml", &yaml);
    let v: serde_json::Value = serde_yaml_ng::from_str(&yaml).unwrap();
    let names: Vec<String> = pci_entries(&v)
        .iter()
        .map(|p| p["resourceName"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(names, ["nvidia.com/L40S-12A", "nvidia.com/L40S-12Q"]);
    assert!(
        stderr.contains("nvidia.com/L40S-12A, nvidia.com/L40S-12Q share the selector 10DE:26B9"),
        "{stderr}"
    );
    assert!(yaml.contains("# WARNING: nvidia.com/L40S-12A, nvidia.com/L40S-12Q share"));
}

#[test]
fn the_selector_uses_the_vfs_own_device_id_and_warns_when_it_differs_from_the_pfs() {
    let t = l40s_16(0x26ba, false);
    let root = t.root().to_str().unwrap();
    let (yaml, stderr) =
        ok_with_stderr(&["--root", root, "--node", "l40s-1", "export", "kubevirt"]);
    golden("kubevirt", "other-vf-id-kubevirt.yaml", &yaml);
    let v: serde_json::Value = serde_yaml_ng::from_str(&yaml).unwrap();
    assert_eq!(pci_entries(&v)[0]["pciVendorSelector"], "10DE:26BA");
    assert!(
        stderr.contains("report device ID 26ba, their PF 26b9"),
        "{stderr}"
    );
    // The topology records the VFs' ID, so a fleet file gives the same selector.
    let topo: serde_json::Value =
        serde_json::from_str(&ok(&["--root", root, "-o", "json", "topology"])).unwrap();
    assert_eq!(topo["gpus"][0]["sriov"]["vfDeviceId"], "26ba");
}

#[test]
fn every_offered_type_and_another_prefix_on_request() {
    let t = l40s_16(0x26b9, false);
    let root = t.root().to_str().unwrap();
    let v: serde_json::Value = serde_json::from_str(&ok(&[
        "--root",
        root,
        "-o",
        "json",
        "export",
        "kubevirt",
        "--configured-only=false",
        "--resource-prefix",
        "example.com",
    ]))
    .unwrap();
    let names: Vec<String> = pci_entries(&v)
        .iter()
        .map(|p| p["resourceName"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(names, ["example.com/L40S-12A", "example.com/L40S-12Q"]);
}

#[test]
fn a2_capture_permits_mdev_types_with_the_feature_gate_note() {
    let a2 = a2_root();
    let root = a2.path().to_str().unwrap();
    let yaml = ok(&["--root", root, "--node", "l40s-1", "export", "kubevirt"]);
    golden("kubevirt", "a2-capture-kubevirt.yaml", &yaml);
    assert!(yaml.starts_with("# KubeVirt CR patch"));
    assert!(yaml.contains("DisableMDEVConfiguration"));
    let v: serde_json::Value = serde_yaml_ng::from_str(&yaml).unwrap();
    let mdevs = v["spec"]["configuration"]["permittedHostDevices"]["mediatedDevices"]
        .as_array()
        .unwrap();
    assert_eq!(mdevs.len(), 15, "every offered A2 type");
    // --configured-only keeps the three types that have an instance.
    let v: serde_json::Value = serde_json::from_str(&ok(&[
        "--root",
        root,
        "-o",
        "json",
        "export",
        "kubevirt",
        "--configured-only",
    ]))
    .unwrap();
    let names: Vec<&str> = v["spec"]["configuration"]["permittedHostDevices"]["mediatedDevices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["mdevNameSelector"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["NVIDIA A2-4A", "NVIDIA A2-4C", "NVIDIA A2-4Q"]);
}

/// The modelled H200 node with VF IDs recorded and a type set on some VFs.
fn h200_configured() -> gpu_core::NodeTopology {
    let mut t = h200_node("h200-1", 4);
    for g in &mut t.gpus {
        let pf = g.address;
        g.sriov = Some(Sriov {
            total_vfs: 16,
            num_vfs: 2,
            vfs: t
                .mediated_devices
                .parents
                .iter()
                .filter(|p| p.gpu == Some(pf))
                .filter_map(|p| match &p.id {
                    ParentId::Pci(a) => Some(*a),
                    ParentId::Named(_) => None,
                })
                .collect(),
            vf_device_id: Some(PciId(0x2335)),
            ..Sriov::default()
        });
    }
    for (i, p) in t.mediated_devices.parents.iter_mut().enumerate() {
        if i % 2 == 0 {
            p.instances.push(Instance {
                uuid: None,
                address: match &p.id {
                    ParentId::Pci(a) => Some(*a),
                    ParentId::Named(_) => None,
                },
                profile: VgpuTypeId::from_str_unchecked("1414"),
                profile_name: Some("NVIDIA H200X-1-18C".into()),
                framebuffer_mib: Some(18 * 1024),
                in_use: None,
                placement_id: None,
            });
        }
    }
    t
}

#[test]
fn modelled_h200_fleet_permits_the_mig_backed_type_set_on_its_vfs() {
    let dir = tempfile::tempdir().unwrap();
    let f = write_fleet(dir.path(), "fleet.json", &fleet(vec![h200_configured()]));
    let (yaml, stderr) =
        ok_with_stderr(&["export", "kubevirt", "--inventory", f.to_str().unwrap()]);
    golden("kubevirt", "h200-modelled-kubevirt.yaml", &yaml);
    assert!(stderr.is_empty(), "{stderr}");
    let v: serde_json::Value = serde_yaml_ng::from_str(&yaml).unwrap();
    let pci = pci_entries(&v);
    assert_eq!(pci.len(), 1);
    assert_eq!(pci[0]["resourceName"], "nvidia.com/H200X-1-18C");
    assert_eq!(pci[0]["pciVendorSelector"], "10DE:2335");

    // A fleet file from before VF IDs were recorded: the PF's ID, said out loud.
    let f = write_fleet(dir.path(), "old.json", &fleet(vec![h200_node("h200-1", 1)]));
    let (_, stderr) = ok_with_stderr(&[
        "export",
        "kubevirt",
        "--inventory",
        f.to_str().unwrap(),
        "--configured-only=false",
    ]);
    assert!(stderr.contains("VF device ID of GPU nvidia0 (0000:18:00.0) is not recorded"));
}

#[test]
fn with_no_vf_typed_nothing_is_permitted_and_the_operator_is_told_why() {
    let t = l40s_root(false);
    let (yaml, stderr) =
        ok_with_stderr(&["--root", t.root().to_str().unwrap(), "export", "kubevirt"]);
    assert!(stderr.contains("no VF has a vGPU type set"), "{stderr}");
    let v: serde_json::Value = serde_yaml_ng::from_str(&yaml).unwrap();
    assert!(pci_entries(&v).is_empty());
}

// ---- export vm ----

fn vm_allocation(node: &str) -> Allocation {
    Allocation {
        machine: "train-1".into(),
        node: node.into(),
        status: AllocationStatus::Created,
        devices: vec![
            AllocatedDevice::Vgpu {
                request: "compute".into(),
                index: 0,
                parent: ParentId::Pci("0000:26:00.4".parse().unwrap()),
                gpu: Some("0000:26:00.0".parse().unwrap()),
                framework: VgpuFramework::VendorVfio,
                profile: VgpuTypeId::from_str_unchecked("1153"),
                profile_name: "NVIDIA L40S-12Q".into(),
                framebuffer_mib: Some(12288),
                mig_slices: None,
                uuid: MdevUuid::for_machine("train-1", "compute", 0),
                gpu_instance_start: None,
                placement_id: None,
            },
            AllocatedDevice::Vgpu {
                request: "compute".into(),
                index: 1,
                parent: ParentId::Pci("0000:26:00.5".parse().unwrap()),
                gpu: Some("0000:26:00.0".parse().unwrap()),
                framework: VgpuFramework::VendorVfio,
                profile: VgpuTypeId::from_str_unchecked("1153"),
                profile_name: "NVIDIA L40S-12Q".into(),
                framebuffer_mib: Some(12288),
                mig_slices: None,
                uuid: MdevUuid::for_machine("train-1", "compute", 1),
                gpu_instance_start: None,
                placement_id: None,
            },
        ],
    }
}

fn write_json<T: serde::Serialize>(dir: &std::path::Path, name: &str, v: &T) -> String {
    let p = dir.join(name);
    std::fs::write(&p, serde_json::to_string_pretty(v).unwrap()).unwrap();
    p.to_str().unwrap().to_owned()
}

/// The field paths of KubeVirt's VirtualMachine (kubevirt.io/v1, as in KubeVirt's OpenAPI
/// reference: `v1.VirtualMachine`, `v1.VirtualMachineInstanceSpec`, `v1.Devices`, `v1.GPU`,
/// `v1.HostDevice`, `v1.Disk`, `v1.DiskTarget`, `v1.Volume`, `v1.CloudInitNoCloudSource`) that
/// `export vm` writes. Every leaf of the output must be one of these.
const SCHEMA_PATHS: [&str; 15] = [
    "apiVersion",
    "kind",
    "metadata.name",
    "spec.template.spec.nodeSelector.*",
    "spec.template.spec.domain.devices.gpus[].name",
    "spec.template.spec.domain.devices.gpus[].deviceName",
    "spec.template.spec.domain.devices.hostDevices[].name",
    "spec.template.spec.domain.devices.hostDevices[].deviceName",
    "spec.template.spec.domain.devices.disks[].name",
    "spec.template.spec.domain.devices.disks[].disk.bus",
    "spec.template.spec.volumes[].name",
    "spec.template.spec.volumes[].cloudInitNoCloud.userData",
    // The required ones, present in every fragment:
    "apiVersion",
    "kind",
    "metadata.name",
];

fn leaf_paths(v: &serde_json::Value, prefix: &str, out: &mut Vec<String>) {
    match v {
        serde_json::Value::Object(m) => {
            for (k, x) in m {
                let p = if prefix.is_empty() {
                    k.clone()
                } else if prefix.ends_with("nodeSelector") {
                    format!("{prefix}.*")
                } else {
                    format!("{prefix}.{k}")
                };
                if prefix.ends_with("nodeSelector") {
                    out.push(p);
                } else {
                    leaf_paths(x, &p, out);
                }
            }
        }
        serde_json::Value::Array(items) => {
            for x in items {
                leaf_paths(x, &format!("{prefix}[]"), out);
            }
        }
        _ => out.push(prefix.to_owned()),
    }
}

fn assert_schema_fields(vm: &serde_json::Value) {
    let mut paths = Vec::new();
    leaf_paths(vm, "", &mut paths);
    for p in &paths {
        assert!(
            SCHEMA_PATHS.contains(&p.as_str()),
            "{p} is not a VirtualMachine field gpuslice checked against KubeVirt's schema"
        );
    }
    for required in &SCHEMA_PATHS[12..] {
        assert!(paths.iter().any(|p| p == required), "{required} missing");
    }
}

#[test]
fn export_vm_names_the_resources_export_kubevirt_permits_and_adds_the_licence() {
    let t = l40s_16(0x26b9, false);
    let root = t.root().to_str().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let alloc = write_json(dir.path(), "alloc.json", &vm_allocation("l40s-1"));
    let token = dir.path().join("client_configuration_token_12-01-2026.tok");
    std::fs::write(&token, "eyJ0b2tlbiI6ImV4YW1wbGUifQ.sig\n").unwrap();
    let yaml = ok(&[
        "--root",
        root,
        "--node",
        "l40s-1",
        "export",
        "vm",
        "--allocation",
        &alloc,
        "--license-token",
        token.to_str().unwrap(),
    ]);
    golden("kubevirt", "l40s-16vf-vm.yaml", &yaml);
    let vm: serde_json::Value = serde_yaml_ng::from_str(&yaml).unwrap();
    assert_schema_fields(&vm);
    let gpus = vm["spec"]["template"]["spec"]["domain"]["devices"]["gpus"]
        .as_array()
        .unwrap();
    assert_eq!(gpus.len(), 2);
    assert_eq!(gpus[0]["name"], "compute-0");
    let permitted = kubevirt_json_plain(root);
    for g in gpus {
        assert!(
            pci_entries(&permitted)
                .iter()
                .any(|p| p["resourceName"] == g["deviceName"]),
            "{g} is permitted by export kubevirt"
        );
    }
    let user_data = vm["spec"]["template"]["spec"]["volumes"][0]["cloudInitNoCloud"]["userData"]
        .as_str()
        .unwrap();
    assert!(user_data.starts_with("#cloud-config\n"));
    assert!(
        user_data
            .contains("/etc/nvidia/ClientConfigToken/client_configuration_token_12-01-2026.tok")
    );
    assert_eq!(vm["metadata"]["name"], "train-1");
}

fn kubevirt_json_plain(root: &str) -> serde_json::Value {
    serde_json::from_str(&ok(&["--root", root, "-o", "json", "export", "kubevirt"])).unwrap()
}

#[test]
fn export_vm_on_a_fleet_with_whole_gpus_and_mdev_vgpus() {
    let dir = tempfile::tempdir().unwrap();
    let f = write_fleet(dir.path(), "fleet.json", &fleet(vec![mixed_node("ws-1")]));
    let allocation = Allocation {
        machine: "desk-1".into(),
        node: "ws-1".into(),
        status: AllocationStatus::Created,
        devices: vec![
            AllocatedDevice::Gpu {
                request: "whole".into(),
                name: "radeon0".into(),
                address: "0000:3b:00.0".parse().unwrap(),
                functions: vec![],
                memory_mib: None,
            },
            AllocatedDevice::Vgpu {
                request: "desktop".into(),
                index: 0,
                parent: ParentId::Pci("0000:af:00.0".parse().unwrap()),
                gpu: Some("0000:af:00.0".parse().unwrap()),
                framework: VgpuFramework::Mdev,
                profile: VgpuTypeId::from_str_unchecked("nvidia-223"),
                profile_name: "GRID T4-2Q".into(),
                framebuffer_mib: Some(2048),
                mig_slices: None,
                uuid: MdevUuid::for_machine("desk-1", "desktop", 0),
                gpu_instance_start: None,
                placement_id: None,
            },
        ],
    };
    let alloc = write_json(dir.path(), "alloc.json", &allocation);
    let json = ok(&[
        "-o",
        "json",
        "export",
        "vm",
        "--allocation",
        &alloc,
        "--inventory",
        f.to_str().unwrap(),
        "--name",
        "desktop-vm",
        // The fleet's node shows no instance with the allocation's UUID yet.
        "--force",
    ]);
    golden("kubevirt", "modelled-vm.json", &json);
    let vm: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_schema_fields(&vm);
    let devices = &vm["spec"]["template"]["spec"]["domain"]["devices"];
    assert_eq!(devices["gpus"][0]["deviceName"], "nvidia.com/GRID_T4-2Q");
    assert_eq!(
        devices["hostDevices"][0]["deviceName"],
        "amd.com/Aldebaran_MI200__Instinct_MI210_"
    );
    assert!(vm["spec"]["template"]["spec"].get("volumes").is_none());
}

fn fails_with(args: &[&str], message: &str) {
    let out = run(args);
    assert_eq!(out.status.code(), Some(2), "{args:?}");
    assert!(out.stdout.is_empty(), "nothing printed");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(message), "{err}");
}

#[test]
fn export_vm_refuses_another_nodes_allocation_another_framework_and_an_unreadable_token() {
    let t = l40s_16(0x26b9, false);
    let root = t.root().to_str().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let other = write_json(dir.path(), "other.json", &vm_allocation("gpu-b"));
    fails_with(
        &[
            "--root",
            root,
            "--node",
            "l40s-1",
            "export",
            "vm",
            "--allocation",
            &other,
        ],
        "the allocation of Machine train-1 is for node gpu-b, but this host is node l40s-1",
    );
    let mut wrong = vm_allocation("l40s-1");
    if let AllocatedDevice::Vgpu { framework, .. } = &mut wrong.devices[0] {
        *framework = VgpuFramework::Mdev;
    }
    let wrong = write_json(dir.path(), "wrong.json", &wrong);
    fails_with(
        &[
            "--root",
            root,
            "--node",
            "l40s-1",
            "export",
            "vm",
            "--allocation",
            &wrong,
        ],
        "the allocation puts a mdev vGPU on 0000:26:00.4, but that parent is vendor-vfio",
    );
    let good = write_json(dir.path(), "good.json", &vm_allocation("l40s-1"));
    fails_with(
        &[
            "--root",
            root,
            "--node",
            "l40s-1",
            "export",
            "vm",
            "--allocation",
            &good,
            "--license-token",
            "/nonexistent/token.tok",
        ],
        "cannot read license token /nonexistent/token.tok",
    );
    let f = write_fleet(dir.path(), "fleet.json", &fleet(vec![mixed_node("ws-1")]));
    fails_with(
        &[
            "export",
            "vm",
            "--allocation",
            &good,
            "--inventory",
            f.to_str().unwrap(),
        ],
        "is for node l40s-1, which the fleet file has not",
    );
}

fn one_vgpu(
    node: &str,
    parent: &str,
    gpu: &str,
    framework: VgpuFramework,
    id: &str,
    name: &str,
) -> Allocation {
    Allocation {
        machine: "vm-a".into(),
        node: node.into(),
        status: AllocationStatus::Created,
        devices: vec![AllocatedDevice::Vgpu {
            request: "gpu".into(),
            index: 0,
            parent: ParentId::Pci(parent.parse().unwrap()),
            gpu: Some(gpu.parse().unwrap()),
            framework,
            profile: VgpuTypeId::from_str_unchecked(id),
            profile_name: name.into(),
            framebuffer_mib: None,
            mig_slices: None,
            uuid: MdevUuid::for_machine("vm-a", "gpu", 0),
            gpu_instance_start: None,
            placement_id: None,
        }],
    }
}

#[test]
fn export_vm_on_the_a2_capture_the_h200_model_and_the_other_vf_id_host() {
    let dir = tempfile::tempdir().unwrap();

    let a2 = a2_root();
    let alloc = write_json(
        dir.path(),
        "a2.json",
        &one_vgpu(
            "a2",
            "0000:08:01.7",
            "0000:08:00.0",
            VgpuFramework::Mdev,
            "nvidia-746",
            "NVIDIA A2-4Q",
        ),
    );
    let yaml = ok(&[
        "--root",
        a2.path().to_str().unwrap(),
        "--node",
        "a2",
        "export",
        "vm",
        "--allocation",
        &alloc,
        // The allocation is pending: its vGPU is not created on the capture yet.
        "--force",
    ]);
    golden("kubevirt", "a2-capture-vm.yaml", &yaml);
    assert!(yaml.contains("deviceName: nvidia.com/NVIDIA_A2-4Q"));

    let f = write_fleet(dir.path(), "fleet.json", &fleet(vec![h200_configured()]));
    let alloc = write_json(
        dir.path(),
        "h200.json",
        &one_vgpu(
            "h200-1",
            "0000:18:00.4",
            "0000:18:00.0",
            VgpuFramework::VendorVfio,
            "1414",
            "NVIDIA H200X-1-18C",
        ),
    );
    let yaml = ok(&[
        "export",
        "vm",
        "--allocation",
        &alloc,
        "--inventory",
        f.to_str().unwrap(),
    ]);
    golden("kubevirt", "h200-modelled-vm.yaml", &yaml);
    assert!(yaml.contains("deviceName: nvidia.com/H200X-1-18C"));

    let t = l40s_16(0x26ba, false);
    let alloc = write_json(dir.path(), "l40s.json", &vm_allocation("l40s-1"));
    let yaml = ok(&[
        "--root",
        t.root().to_str().unwrap(),
        "--node",
        "l40s-1",
        "export",
        "vm",
        "--allocation",
        &alloc,
    ]);
    golden("kubevirt", "other-vf-id-vm.yaml", &yaml);
    let vm: serde_json::Value = serde_yaml_ng::from_str(&yaml).unwrap();
    assert_schema_fields(&vm);
}
