//! The bundled hosts of `examples/hosts/`, one for every way to share a GPU: each makes a
//! sandbox (`sandbox init --from`), shows its way to share in `topology -o json`, and takes
//! every write it offers (bind and release, SR-IOV disable and enable, vGPU create, remove and
//! layouts), each command a separate process.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod sandbox_support;

use std::path::{Path, PathBuf};
use std::process::Output;

use sandbox_support::{gpuslice, ok, on, stderr, stdout};
use serde_json::Value;

const U1: &str = "11111111-2222-3333-4444-555555555555";
const LAYOUTS: &str = "examples/hosts/layouts.yaml";

fn refused(o: Output) -> String {
    assert_eq!(o.status.code(), Some(2), "{}\n{}", stdout(&o), stderr(&o));
    stderr(&o)
}

/// `vgpu apply -f examples/hosts/layouts.yaml -c CONFIG`.
fn apply(dir: &Path, config: &str) -> Output {
    on(dir, &["vgpu", "apply", "-f", LAYOUTS, "-c", config])
}

/// `vgpu create --parent PARENT --profile PROFILE [--uuid UUID]`.
fn create(dir: &Path, parent: &str, profile: &str, uuid: Option<&str>) -> Output {
    let mut args = vec!["vgpu", "create", "--parent", parent, "--profile", profile];
    if let Some(u) = uuid {
        args.extend(["--uuid", u]);
    }
    on(dir, &args)
}

/// A sandbox made from the bundled host `name` (`examples/hosts/<name>.umockdev`).
fn sandbox(name: &str) -> (tempfile::TempDir, PathBuf) {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join(name);
    let from = format!("examples/hosts/{name}.umockdev");
    ok(gpuslice(&[
        "sandbox",
        "init",
        "--from",
        &from,
        dir.to_str().unwrap(),
    ]));
    (t, dir)
}

fn topology(dir: &Path) -> Value {
    serde_json::from_slice(&ok(on(dir, &["topology", "-o", "json"])).stdout).unwrap()
}

fn gpu<'a>(t: &'a Value, address: &str) -> &'a Value {
    t["gpus"]
        .as_array()
        .unwrap()
        .iter()
        .find(|g| g["address"] == address)
        .unwrap_or_else(|| panic!("no GPU {address} in {t}"))
}

fn pool<'a>(t: &'a Value, address: &str) -> &'a Value {
    t["mediatedDevices"]["pools"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["gpu"] == address)
        .unwrap_or_else(|| panic!("no pool of {address} in {t}"))
}

/// The parents of GPU `address` with their framework.
fn parents<'a>(t: &'a Value, address: &str) -> Vec<&'a Value> {
    t["mediatedDevices"]["parents"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["gpu"] == address)
        .collect()
}

fn sys(dir: &Path, rel: &str) -> PathBuf {
    dir.join("host/sys").join(rel)
}

fn driver(dir: &Path, bdf: &str) -> String {
    std::fs::read_link(sys(dir, &format!("bus/pci/devices/{bdf}/driver")))
        .map(|l| l.file_name().unwrap().to_string_lossy().into_owned())
        .unwrap_or_default()
}

fn vgpu_type(dir: &Path, vf: &str) -> String {
    std::fs::read_to_string(sys(
        dir,
        &format!("bus/pci/devices/{vf}/nvidia/current_vgpu_type"),
    ))
    .unwrap()
    .trim()
    .to_owned()
}

fn numvfs(dir: &Path, pf: &str) -> String {
    std::fs::read_to_string(sys(dir, &format!("bus/pci/devices/{pf}/sriov_numvfs")))
        .unwrap()
        .trim()
        .to_owned()
}

/// Where the tree has a function: the directory its bus link resolves to, under `sys/`.
fn device_dir(dir: &Path, bdf: &str) -> String {
    let host = std::fs::canonicalize(dir.join("host")).unwrap();
    let real = std::fs::canonicalize(sys(dir, &format!("bus/pci/devices/{bdf}"))).unwrap();
    real.strip_prefix(host).unwrap().display().to_string()
}

/// SR-IOV off then on again: the VFs come back beside their PF, below its bridge.
fn sriov_round_trip(dir: &Path, pf: &str, vfs: &str, first_vf: &str) {
    let out = stdout(&ok(on(dir, &["sriov", "disable", pf])));
    assert!(out.contains(&format!("({vfs} VFs removed)")), "{out}");
    assert_eq!(numvfs(dir, pf), "0");
    assert!(!sys(dir, &format!("bus/pci/devices/{first_vf}")).exists());
    ok(on(dir, &["sriov", "enable", pf]));
    assert_eq!(numvfs(dir, pf), vfs);
    let pf_dir = device_dir(dir, pf);
    let bridge = pf_dir.rsplit_once('/').unwrap().0;
    assert_eq!(device_dir(dir, first_vf), format!("{bridge}/{first_vf}"));
}

#[test]
fn workstation_has_two_whole_gpus_free_and_one_blocked_by_its_usb_and_sata_neighbours() {
    let (_t, dir) = sandbox("workstation-passthrough");
    let t = topology(&dir);
    for free in ["0000:01:00.0", "0000:02:00.0"] {
        assert_eq!(gpu(&t, free)["state"], "free", "{}", gpu(&t, free));
        assert_eq!(gpu(&t, free)["vgpuFramework"], Value::Null);
    }
    let blocked = gpu(&t, "0000:07:00.0");
    assert_eq!(blocked["state"], "blocked");
    let why = blocked["stateReason"].as_str().unwrap();
    assert!(
        why.contains("0000:05:00.0 (1022:149c, driver xhci_hcd)")
            && why.contains("0000:06:00.0 (1022:7901, driver ahci)"),
        "{why}"
    );
    // The free ones go to vfio-pci with their HD audio, and back.
    ok(on(&dir, &["gpu", "bind", "nvidia0"]));
    assert_eq!(driver(&dir, "0000:01:00.0"), "vfio-pci");
    assert_eq!(driver(&dir, "0000:01:00.1"), "vfio-pci");
    // The blocked one is refused naming the group's other devices, and nothing changes.
    let e = refused(on(&dir, &["gpu", "bind", "0000:07:00.0"]));
    assert!(
        e.contains("IOMMU group 16 also holds 0000:05:00.0 (driver xhci_hcd)"),
        "{e}"
    );
    assert_eq!(driver(&dir, "0000:07:00.0"), "nvidia");
    assert_eq!(driver(&dir, "0000:05:00.0"), "xhci_hcd");
    ok(on(&dir, &["gpu", "release", "nvidia0"]));
    assert_eq!(driver(&dir, "0000:01:00.0"), "nvidia");
    assert_eq!(driver(&dir, "0000:01:00.1"), "snd_hda_intel");
    ok(on(&dir, &["gpu", "bind", "nvidia1"]));
    assert_eq!(driver(&dir, "0000:02:00.1"), "vfio-pci");
}

#[test]
fn l40s_host_offers_vendor_vfio_types_on_every_vf_and_takes_every_write() {
    let (_t, dir) = sandbox("l40s-vendor-vfio");
    let pf = "0000:26:00.0";
    let t = topology(&dir);
    assert_eq!(gpu(&t, pf)["vgpuFramework"], "vendor-vfio");
    assert_eq!(gpu(&t, pf)["sriov"]["numVfs"], 32);
    let ps = parents(&t, pf);
    assert_eq!(ps.len(), 32);
    assert!(ps.iter().all(|p| p["framework"] == "vendor-vfio"));
    // Every VF lists the captured types.
    assert!(
        ps.iter()
            .all(|p| p["profiles"].as_array().unwrap().len() == 23)
    );
    assert_eq!(pool(&t, pf)["totalMiB"], 49152);

    ok(create(&dir, "0000:26:00.4", "L40S-24Q", None));
    assert_eq!(vgpu_type(&dir, "0000:26:00.4"), "1155");
    ok(on(&dir, &["vgpu", "remove", "0000:26:00.4"]));
    assert_eq!(vgpu_type(&dir, "0000:26:00.4"), "0");
    ok(apply(&dir, "l40s-2x24q"));
    assert_eq!(vgpu_type(&dir, "0000:26:00.4"), "1155");
    assert_eq!(vgpu_type(&dir, "0000:26:00.5"), "1155");
    let e = refused(on(&dir, &["sriov", "disable", pf]));
    assert!(e.contains("VF 0000:26:00.4 holds vGPU type 1155"), "{e}");
    ok(apply(&dir, "none"));
    sriov_round_trip(&dir, pf, "32", "0000:26:00.4");
    // The VFs made again list the card's types and take one.
    ok(create(&dir, "0000:26:00.5", "L40S-48Q", None));
    assert_eq!(vgpu_type(&dir, "0000:26:00.5"), "1156");
}

#[test]
fn h200_host_offers_mig_backed_types_placed_by_the_gpus_slices() {
    let (_t, dir) = sandbox("h200-mig");
    let pf = "0000:18:00.0";
    let t = topology(&dir);
    assert_eq!(gpu(&t, pf)["vgpuFramework"], "vendor-vfio");
    assert_eq!(pool(&t, pf)["migSlicesTotal"], 7);
    assert_eq!(pool(&t, pf)["migSlicesUsed"], 0);
    let ps = parents(&t, pf);
    assert_eq!(ps.len(), 16);
    let names: Vec<&str> = ps[0]["profiles"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            assert!(p["migSlices"].as_u64().is_some(), "{p}");
            p["name"].as_str().unwrap()
        })
        .collect();
    assert_eq!(names.len(), 7);
    assert!(names.contains(&"NVIDIA H200X-7-141C"), "{names:?}");

    // A 4g instance takes slices 0-3: a second one has nowhere to start.
    ok(create(&dir, "0000:18:00.4", "H200X-4-71C", None));
    let e = refused(create(&dir, "0000:18:00.5", "H200X-4-71C", None));
    // Said by the GPU instance it would need (the sandbox's NVML), before any write.
    assert!(e.contains("no room for a 4g.71gb GPU instance"), "{e}");
    ok(on(&dir, &["vgpu", "remove", "0000:18:00.4"]));
    ok(apply(&dir, "h200-3g-2g-1g"));
    // The layout's GPU instances were made for it; the one 1g start left is what MIG lists
    // (the VFs list no MIG-backed type until an instance for it exists, as the driver does).
    let mig: serde_json::Value =
        serde_json::from_slice(&ok(on(&dir, &["mig", "list", "-o", "json"])).stdout).unwrap();
    assert_eq!(mig[0]["gpuInstances"].as_array().unwrap().len(), 3, "{mig}");
    let free: Vec<(String, serde_json::Value)> = mig[0]["profiles"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| !p["placements"].as_array().unwrap().is_empty())
        .map(|p| {
            (
                p["name"].as_str().unwrap().to_owned(),
                p["placements"].clone(),
            )
        })
        .collect();
    assert_eq!(
        free,
        [("1g.18gb".to_owned(), serde_json::json!([3]))],
        "{mig}"
    );
    // Topology says the GPU's MIG-backed types need a GPU instance now (none is free).
    let g = topology(&dir);
    let types = gpu(&g, pf)["migBackedTypes"]["types"].clone();
    let seven = types.as_array().unwrap().iter().find(|t| t["id"] == "1420");
    assert_eq!(seven.unwrap()["needsGpuInstance"], true, "{types}");
    ok(apply(&dir, "none"));
    sriov_round_trip(&dir, pf, "16", "0000:18:00.4");
    ok(create(&dir, "0000:18:00.4", "H200X-7-141C", None));
    assert_eq!(vgpu_type(&dir, "0000:18:00.4"), "1420");
}

#[test]
fn hgx_host_lists_its_eight_gpus_and_leaves_the_nvswitches_out() {
    let (_t, dir) = sandbox("hgx-h100-nvswitch");
    let t = topology(&dir);
    let gpus = t["gpus"].as_array().unwrap();
    assert_eq!(gpus.len(), 8, "{t}");
    for g in gpus {
        assert_eq!(g["deviceId"], "2330");
        assert_eq!(g["state"], "free", "{g}");
    }
    // The four NVSwitches are in the tree, bound to nvidia, and are not GPUs.
    for bus in ["05", "06", "07", "08"] {
        let sw = format!("0000:{bus}:00.0");
        let class = std::fs::read_to_string(sys(&dir, &format!("bus/pci/devices/{sw}/class")));
        assert_eq!(class.unwrap().trim(), "0x068000");
        assert!(gpus.iter().all(|g| g["address"] != sw.as_str()));
    }
    ok(on(&dir, &["gpu", "bind", "nvidia3"]));
    assert_eq!(driver(&dir, "0000:5d:00.0"), "vfio-pci");
    ok(on(&dir, &["gpu", "release", "nvidia3"]));
    assert_eq!(driver(&dir, "0000:5d:00.0"), "nvidia");
}

#[test]
fn mixed_node_has_an_mdev_a2_and_a_vendor_vfio_l40s_and_one_layout_sets_both() {
    let (_t, dir) = sandbox("mixed-a2-l40s");
    let (a2, l40s) = ("0000:08:00.0", "0000:84:00.0");
    let t = topology(&dir);
    assert_eq!(gpu(&t, a2)["vgpuFramework"], "mdev");
    assert_eq!(gpu(&t, l40s)["vgpuFramework"], "vendor-vfio");
    assert!(parents(&t, a2).iter().all(|p| p["framework"] == "mdev"));
    assert_eq!(parents(&t, l40s).len(), 32);

    ok(create(&dir, "0000:08:00.5", "A2-4Q", Some(U1)));
    ok(create(&dir, "0000:84:00.4", "L40S-24Q", None));
    assert_eq!(vgpu_type(&dir, "0000:84:00.4"), "1155");
    ok(on(&dir, &["vgpu", "remove", U1]));
    ok(on(&dir, &["vgpu", "remove", "0000:84:00.4"]));
    assert!(!sys(&dir, &format!("bus/mdev/devices/{U1}")).exists());

    ok(apply(&dir, "a2-4q-l40s-24q"));
    let list: Value =
        serde_json::from_slice(&ok(on(&dir, &["vgpu", "list", "-o", "json"])).stdout).unwrap();
    let mdevs = list["mdevs"].as_array().unwrap();
    assert_eq!(mdevs.len(), 4, "{list}");
    assert!(mdevs.iter().all(|m| m["typeName"] == "NVIDIA A2-4Q"));
    assert_eq!(list["vendorVfio"].as_array().unwrap().len(), 2, "{list}");

    ok(apply(&dir, "none"));
    sriov_round_trip(&dir, a2, "16", "0000:08:00.4");
    sriov_round_trip(&dir, l40s, "32", "0000:84:00.4");
    // The A2's VFs made again are mdev parents with their types; the whole card is free.
    ok(create(&dir, "0000:08:00.5", "A2-16Q", Some(U1)));
    ok(create(&dir, "0000:84:00.4", "L40S-48Q", None));
}
