//! `gpuslice export qemu|libvirt|kubevirt|cloud-init`: golden files for each format, well-formed
//! XML, and errors that name what was wrong.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod export_support;

use export_support::*;
use gpu_core::{
    AllocatedDevice, Allocation, AllocationStatus, ClassCode, Function, MdevUuid, ParentId, PciId,
    VgpuFramework, VgpuTypeId,
};

const UUID: &str = "DE306C9F-A714-4373-A290-DC15D4E49B71";

fn allocation_file(dir: &std::path::Path, allocations: &[Allocation]) -> std::path::PathBuf {
    let p = dir.join("allocation.json");
    std::fs::write(&p, serde_json::to_string_pretty(allocations).unwrap()).unwrap();
    p
}

fn machine() -> Allocation {
    let gpu: gpu_core::PciAddress = "0000:17:00.0".parse().unwrap();
    Allocation {
        machine: "vm-1".into(),
        node: "ws-1".into(),
        status: AllocationStatus::Created,
        devices: vec![
            AllocatedDevice::Gpu {
                request: "whole".into(),
                name: "nvidia0".into(),
                address: gpu,
                functions: vec![gpu, "0000:17:00.1".parse().unwrap()],
                memory_mib: Some(49152),
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
                uuid: MdevUuid::for_machine("vm-1", "desktop", 0),
                gpu_instance_start: None,
                placement_id: None,
            },
            AllocatedDevice::Vgpu {
                request: "compute".into(),
                index: 0,
                parent: ParentId::Pci("0000:26:00.5".parse().unwrap()),
                gpu: Some("0000:26:00.0".parse().unwrap()),
                framework: VgpuFramework::VendorVfio,
                profile: VgpuTypeId::from_str_unchecked("1155"),
                profile_name: "NVIDIA L40S-24Q".into(),
                framebuffer_mib: Some(24576),
                mig_slices: None,
                uuid: MdevUuid::for_machine("vm-1", "compute", 0),
                gpu_instance_start: None,
                placement_id: None,
            },
        ],
    }
}

/// Parses the XML and returns each hostdev's (type, source address attributes).
fn hostdevs(xml: &str) -> Vec<(String, Vec<(String, String)>)> {
    let doc =
        roxmltree::Document::parse(xml).unwrap_or_else(|e| panic!("not well-formed: {e}\n{xml}"));
    doc.descendants()
        .filter(|n| n.has_tag_name("hostdev"))
        .map(|h| {
            assert_eq!(h.attribute("mode"), Some("subsystem"));
            if h.attribute("type") == Some("pci") {
                // gpuslice binds the device; libvirt must not rebind a vendor-VFIO VF.
                assert_eq!(h.attribute("managed"), Some("no"));
            } else {
                assert_eq!(h.attribute("model"), Some("vfio-pci"));
            }
            let addr = h.descendants().find(|n| n.has_tag_name("address")).unwrap();
            (
                h.attribute("type").unwrap().to_owned(),
                addr.attributes()
                    .map(|a| (a.name().to_owned(), a.value().to_owned()))
                    .collect(),
            )
        })
        .collect()
}

#[test]
fn an_mdev_uuid_becomes_a_sysfsdev_argument_and_an_mdev_hostdev() {
    // No host has this instance: --force hands it off anyway (the check has its own tests).
    let empty = gpu_sysfs::testing::TreeBuilder::new().finish().unwrap();
    let e = empty.root().to_str().unwrap();
    let qemu = ok(&["--root", e, "export", "qemu", "--uuid", UUID, "--force"]);
    assert_eq!(
        qemu,
        "-device vfio-pci,sysfsdev=/sys/bus/mdev/devices/de306c9f-a714-4373-a290-dc15d4e49b71\n"
    );
    let json: Vec<String> = serde_json::from_str(&ok(&[
        "--root", e, "-o", "json", "export", "qemu", "--uuid", UUID, "--force",
    ]))
    .unwrap();
    assert_eq!(json[0], "-device");
    let xml = ok(&["--root", e, "export", "libvirt", "--uuid", UUID, "--force"]);
    golden("export", "mdev-hostdev.xml", &xml);
    let h = hostdevs(&xml);
    assert_eq!(h.len(), 1);
    assert_eq!(h[0].0, "mdev");
    assert_eq!(
        h[0].1,
        [(
            "uuid".to_owned(),
            "de306c9f-a714-4373-a290-dc15d4e49b71".to_owned()
        )]
    );
}

#[test]
fn an_allocation_hands_off_the_gpu_with_its_audio_an_mdev_and_a_vf() {
    let dir = tempfile::tempdir().unwrap();
    let f = allocation_file(dir.path(), &[machine()]);
    // The node's devices are not on an empty host: --force hands them off anyway.
    let empty = gpu_sysfs::testing::TreeBuilder::new().finish().unwrap();
    let e = empty.root().to_str().unwrap();
    let unchecked = ["--root", e, "--node", "ws-1"];
    let qemu = ok(&[
        &unchecked[..],
        &[
            "export",
            "qemu",
            "--allocation",
            f.to_str().unwrap(),
            "--force",
        ],
    ]
    .concat());
    golden("export", "allocation-qemu.txt", &qemu);
    assert_eq!(
        qemu.lines().collect::<Vec<_>>(),
        [
            "-device vfio-pci,host=0000:17:00.0",
            "-device vfio-pci,host=0000:17:00.1",
            &format!(
                "-device vfio-pci,sysfsdev=/sys/bus/mdev/devices/{}",
                MdevUuid::for_machine("vm-1", "desktop", 0)
            ),
            "-device vfio-pci,host=0000:26:00.5",
        ]
    );
    let xml = ok(&[
        &unchecked[..],
        &[
            "export",
            "libvirt",
            "--allocation",
            f.to_str().unwrap(),
            "--force",
        ],
    ]
    .concat());
    golden("export", "allocation-libvirt.xml", &xml);
    let h = hostdevs(&xml);
    let kinds: Vec<&str> = h.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(kinds, ["pci", "pci", "mdev", "pci"]);
    let vf: Vec<(&str, &str)> = h[3]
        .1
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    assert_eq!(
        vf,
        [
            ("domain", "0x0000"),
            ("bus", "0x26"),
            ("slot", "0x00"),
            ("function", "0x5")
        ]
    );
}

#[test]
fn an_allocation_file_with_several_machines_needs_one_named() {
    let dir = tempfile::tempdir().unwrap();
    let mut other = machine();
    other.machine = "vm-2".into();
    let f = allocation_file(dir.path(), &[machine(), other]);
    let out = run(&["export", "qemu", "--allocation", f.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&out.stderr)
            .contains("holds 2 allocations; pick one with --machine")
    );
    let empty = gpu_sysfs::testing::TreeBuilder::new().finish().unwrap();
    let qemu = ok(&[
        "--root",
        empty.root().to_str().unwrap(),
        "--node",
        "ws-1",
        "export",
        "qemu",
        "--allocation",
        f.to_str().unwrap(),
        "--machine",
        "vm-2",
        "--force",
    ]);
    assert_eq!(qemu.lines().count(), 4);
    let out = run(&[
        "export",
        "qemu",
        "--allocation",
        f.to_str().unwrap(),
        "--machine",
        "vm-9",
    ]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("no allocation for machine vm-9"));
}

#[test]
fn an_address_is_checked_against_the_host() {
    let busy = l40s_root(true);
    let root = busy.root().to_str().unwrap();
    // The VF holding the L40S-24Q goes to the VM itself.
    assert_eq!(
        ok(&[
            "--root",
            root,
            "export",
            "qemu",
            "--address",
            "0000:26:00.5"
        ]),
        "-device vfio-pci,host=0000:26:00.5\n"
    );
    let out = run(&[
        "--root",
        root,
        "export",
        "qemu",
        "--address",
        "0000:26:00.6",
    ]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("VF 0000:26:00.6 has no vGPU type set"));
    let out = run(&[
        "--root",
        root,
        "export",
        "qemu",
        "--address",
        "0000:99:00.0",
    ]);
    assert!(
        String::from_utf8_lossy(&out.stderr)
            .contains("0000:99:00.0 is neither a GPU nor a vendor-VFIO VF")
    );
    let out = run(&[
        "--root",
        root,
        "export",
        "qemu",
        "--address",
        "not-an-address",
    ]);
    assert_eq!(out.status.code(), Some(2));

    let a2 = a2_root();
    let out = run(&[
        "--root",
        a2.path().to_str().unwrap(),
        "export",
        "libvirt",
        "--address",
        "0000:01:00.1",
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("GPU matrox0 (0000:01:00.1) cannot go to a VM: IOMMU group 33"),
        "{err}"
    );
}

#[test]
fn a_fleet_gpu_address_brings_its_companion_functions() {
    let dir = tempfile::tempdir().unwrap();
    let mut node = mixed_node("ws-1");
    node.gpus[0].functions.push(Function {
        address: "0000:17:00.1".parse().unwrap(),
        class: ClassCode(0x040300),
        device_id: PciId(0x22ba),
        driver: Some("snd_hda_intel".into()),
    });
    let f = write_fleet(
        dir.path(),
        "fleet.json",
        &fleet(vec![node, h200_node("h200-a", 1)]),
    );
    let inv = f.to_str().unwrap();
    let out = run(&[
        "export",
        "qemu",
        "--inventory",
        inv,
        "--address",
        "0000:17:00.0",
    ]);
    assert!(
        String::from_utf8_lossy(&out.stderr)
            .contains("the fleet has 2 nodes; name one with --node")
    );
    let xml = ok(&[
        "--node",
        "ws-1",
        "export",
        "libvirt",
        "--inventory",
        inv,
        "--address",
        "0000:17:00.0",
    ]);
    let h = hostdevs(&xml);
    assert_eq!(h.len(), 2);
    assert_eq!(h[1].1[3], ("function".to_owned(), "0x1".to_owned()));
}

#[test]
fn kubevirt_permits_mdev_types_by_name_and_every_vendor_vfio_profile_on_request() {
    let a2 = a2_root();
    let yaml = ok(&["--root", a2.path().to_str().unwrap(), "export", "kubevirt"]);
    golden("export", "a2-capture-kubevirt.yaml", &yaml);
    let v: serde_json::Value = serde_yaml_ng::from_str(&yaml).unwrap();
    let permitted = &v["spec"]["configuration"]["permittedHostDevices"];
    let mdevs = permitted["mediatedDevices"].as_array().unwrap();
    assert_eq!(mdevs.len(), 15, "every A2 type");
    assert!(mdevs.iter().any(|m| m["mdevNameSelector"] == "NVIDIA A2-4Q"
        && m["resourceName"] == "nvidia.com/NVIDIA_A2-4Q"));
    // The A2 runs vGPUs, so its PF is not offered for passthrough (its selector would match the VFs).
    assert!(permitted.get("pciHostDevices").is_none());

    let l40s = l40s_root(false);
    let json = ok(&[
        "--root",
        l40s.root().to_str().unwrap(),
        "-o",
        "json",
        "export",
        "kubevirt",
        "--configured-only=false",
    ]);
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    let pci = v["spec"]["configuration"]["permittedHostDevices"]["pciHostDevices"]
        .as_array()
        .unwrap();
    assert_eq!(pci.len(), 23, "one resource per L40S profile");
    let q24 = pci
        .iter()
        .find(|p| p["resourceName"] == "nvidia.com/L40S-24Q")
        .unwrap();
    assert_eq!(q24["pciVendorSelector"], "10DE:26B9");
    assert!(q24.get("externalResourceProvider").is_none());

    let dir = tempfile::tempdir().unwrap();
    let f = write_fleet(dir.path(), "fleet.json", &fleet(vec![mixed_node("ws-1")]));
    let yaml = ok(&["export", "kubevirt", "--inventory", f.to_str().unwrap()]);
    golden("export", "modelled-kubevirt.yaml", &yaml);
    let v: serde_json::Value = serde_yaml_ng::from_str(&yaml).unwrap();
    let pci = v["spec"]["configuration"]["permittedHostDevices"]["pciHostDevices"]
        .as_array()
        .unwrap();
    // The free AMD GPU is offered whole; the blocked T4 is not.
    assert_eq!(pci.len(), 1);
    assert_eq!(pci[0]["pciVendorSelector"], "1002:740F");
}

#[test]
fn cloud_init_places_the_token_and_gridd_conf() {
    let dir = tempfile::tempdir().unwrap();
    let token = "eyJhbGciOiJSUzI1NiJ9.client-configuration-token.signature\n";
    let f = dir
        .path()
        .join("client_configuration_token_11-29-2026-11-00-00.tok");
    std::fs::write(&f, token).unwrap();
    let yaml = ok(&[
        "export",
        "cloud-init",
        "--license-token",
        f.to_str().unwrap(),
    ]);
    golden("export", "cloud-init.yaml", &yaml);
    assert!(yaml.starts_with("#cloud-config\n"));
    let v: serde_json::Value = serde_yaml_ng::from_str(&yaml).unwrap();
    let files = v["write_files"].as_array().unwrap();
    assert_eq!(
        files[0]["path"],
        "/etc/nvidia/ClientConfigToken/client_configuration_token_11-29-2026-11-00-00.tok"
    );
    assert_eq!(files[0]["permissions"], "0744");
    assert_eq!(files[0]["encoding"], "b64");
    assert_eq!(
        files[0]["content"],
        "ZXlKaGJHY2lPaUpTVXpJMU5pSjkuY2xpZW50LWNvbmZpZ3VyYXRpb24tdG9rZW4uc2lnbmF0dXJlCg=="
    );
    assert_eq!(files[1]["path"], "/etc/nvidia/gridd.conf");
    assert!(
        files[1]["content"]
            .as_str()
            .unwrap()
            .lines()
            .any(|l| l == "FeatureType=1")
    );

    std::fs::write(&f, "").unwrap();
    let out = run(&[
        "export",
        "cloud-init",
        "--license-token",
        f.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("the license token is empty"));
    let out = run(&[
        "export",
        "cloud-init",
        "--license-token",
        "/nonexistent.tok",
    ]);
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("cannot read license token /nonexistent.tok")
    );
}

#[test]
fn the_json_that_place_prints_is_an_allocation_to_hand_off() {
    let place = golden_dir("place");
    let json = ok(&[
        "place",
        "--inventory",
        place.join("fleet.yaml").to_str().unwrap(),
        "--machine",
        place.join("inference-mig.yaml").to_str().unwrap(),
        "-o",
        "json",
    ]);
    let placed: serde_json::Value = serde_json::from_str(&json).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("placed.json");
    std::fs::write(&f, &json).unwrap();
    // Checked against the fleet's node, where the placed (pending) VFs have no type yet.
    let qemu = ok(&[
        "export",
        "qemu",
        "--allocation",
        f.to_str().unwrap(),
        "--inventory",
        place.join("fleet.yaml").to_str().unwrap(),
        "--force",
    ]);
    let expected: Vec<String> = placed["devices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| format!("-device vfio-pci,host={}", d["parent"].as_str().unwrap()))
        .collect();
    assert!(!expected.is_empty());
    assert_eq!(qemu.lines().collect::<Vec<_>>(), expected);
}
