//! The JSON/YAML wire format: round trips for every type, the key names orchestrators rely on,
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! and no panics on arbitrary input.

use gpu_core::testing;
use gpu_core::*;
use proptest::prelude::*;

fn json_roundtrip<T>(v: &T) -> T
where
    T: serde::Serialize + serde::de::DeserializeOwned,
{
    let text = serde_json::to_string(v).expect("serialize");
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"))
}

fn yaml_roundtrip<T>(v: &T) -> T
where
    T: serde::Serialize + serde::de::DeserializeOwned,
{
    let text = serde_yaml_ng::to_string(v).expect("serialize");
    serde_yaml_ng::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"))
}

proptest! {
    #[test]
    fn pci_address_round_trips(a in testing::pci_address()) {
        prop_assert_eq!(a.to_string().parse::<PciAddress>().unwrap(), a);
        prop_assert_eq!(json_roundtrip(&a), a);
    }

    #[test]
    fn uuid_round_trips(u in testing::mdev_uuid()) {
        prop_assert_eq!(json_roundtrip(&u), u);
        prop_assert_eq!(u.to_string().to_uppercase().parse::<MdevUuid>().unwrap(), u);
    }

    #[test]
    fn gpu_round_trips(g in testing::gpu()) {
        prop_assert_eq!(json_roundtrip(&g), g.clone());
        prop_assert_eq!(yaml_roundtrip(&g), g);
    }

    #[test]
    fn profile_and_parent_round_trip(p in testing::parent()) {
        prop_assert_eq!(json_roundtrip(&p), p.clone());
        prop_assert_eq!(yaml_roundtrip(&p), p);
    }

    #[test]
    fn pool_round_trips(p in testing::pool()) {
        prop_assert_eq!(json_roundtrip(&p), p);
    }

    #[test]
    fn health_round_trips(h in testing::health()) {
        prop_assert_eq!(json_roundtrip(&h), h);
    }

    #[test]
    fn topology_round_trips(t in testing::topology()) {
        prop_assert_eq!(json_roundtrip(&t), t.clone());
        prop_assert_eq!(yaml_roundtrip(&t), t);
    }

    #[test]
    fn machine_round_trips(m in testing::machine()) {
        prop_assert_eq!(json_roundtrip(&m), m.clone());
        prop_assert_eq!(yaml_roundtrip(&m), m);
    }

    #[test]
    fn allocation_round_trips(a in testing::allocation()) {
        prop_assert_eq!(json_roundtrip(&a), a.clone());
        prop_assert_eq!(yaml_roundtrip(&a), a);
    }

    #[test]
    fn fleet_round_trips(f in testing::fleet()) {
        prop_assert_eq!(json_roundtrip(&f), f);
    }

    #[test]
    fn parsers_never_panic_on_arbitrary_strings(s in ".{0,64}") {
        let _ = s.parse::<PciAddress>();
        let _ = s.parse::<MdevUuid>();
        let _ = s.parse::<VgpuTypeId>();
        let _ = s.parse::<ParentId>();
        let _ = s.parse::<PciId>();
        let _ = s.parse::<ClassCode>();
        let _ = MiB::parse_quantity(&s);
        let _ = gpu_core::nvidia::VgpuTypeName::parse(&s);
        let _ = gpu_core::nvidia::TypeDescription::parse(&s);
        let _ = Machine::from_text(&s);
        let _ = Fleet::from_text(&s);
        let _ = NodeTopology::from_text(&s);
    }

    #[test]
    fn parse_errors_name_the_input(s in "[^\\x00]{1,32}") {
        if let Err(e) = s.parse::<PciAddress>() {
            let needle = format!("{s:?}");
            prop_assert!(e.to_string().contains(&needle));
        }
        if let Err(e) = s.parse::<MdevUuid>() {
            let needle = format!("{s:?}");
            prop_assert!(e.to_string().contains(&needle));
        }
    }
}

#[test]
fn topology_json_uses_the_documented_keys() {
    let mut t = NodeTopology::new("node-a");
    let a: PciAddress = "0000:08:00.0".parse().unwrap();
    let mut g = Gpu::new("nvidia0", a, 0x10de, 0x25b6, 0x030200);
    g.memory_mib = Some(16384);
    g.vgpu_framework = Some(VgpuFramework::Mdev);
    g.sriov = Some(Sriov {
        total_vfs: 16,
        num_vfs: 16,
        vfs: vec![],
        vf_device_id: None,
        ..Sriov::default()
    });
    t.gpus.push(g);
    t.mediated_devices.parents.push(Parent {
        id: ParentId::Pci("0000:08:00.4".parse().unwrap()),
        gpu: Some(a),
        framework: VgpuFramework::Mdev,
        health: Health::healthy(),
        profiles: vec![Profile {
            id: "nvidia-746".parse().unwrap(),
            name: "NVIDIA A2-4Q".into(),
            framebuffer_mib: Some(4096),
            max_instances: Some(4),
            available_instances: 1,
            reported_instances: Some(1),
            device_api: "vfio-pci".into(),
            mig_slices: None,
            mig_memory_gib: None,
            description: None,
        }],
        instances: vec![Instance {
            uuid: Some("de306c9f-a714-4373-a290-dc15d4e49b71".parse().unwrap()),
            address: None,
            profile: "nvidia-746".parse().unwrap(),
            profile_name: None,
            framebuffer_mib: None,
            in_use: None,
            placement_id: None,
        }],
        warnings: vec![],
    });
    t.mediated_devices.pools.push(Pool {
        gpu: ParentId::Pci(a),
        parents: vec![ParentId::Pci("0000:08:00.4".parse().unwrap())],
        total_mib: 16384,
        used_mib: 4096,
        size_locked_mib: Some(4096),
        mixed_size: false,
        mig_slices_total: None,
        mig_slices_used: None,
        mig_slots: None,
    });
    let v = serde_json::to_value(&t).unwrap();
    assert_eq!(v["node"], "node-a");
    let g = &v["gpus"][0];
    for key in [
        "name",
        "address",
        "vendorId",
        "deviceId",
        "subsystemVendorId",
        "subsystemDeviceId",
        "class",
        "vendor",
        "model",
        "driver",
        "numaNode",
        "iommuGroup",
        "functions",
        "state",
        "stateReason",
        "memoryMiB",
        "sriov",
        "vgpuFramework",
        "health",
    ] {
        assert!(g.get(key).is_some(), "gpu key {key} missing: {g}");
    }
    assert_eq!(g["vendorId"], "10de");
    assert_eq!(g["class"], "0x030200");
    assert_eq!(g["state"], "free");
    assert_eq!(g["vgpuFramework"], "mdev");
    assert_eq!(g["health"]["state"], "Unknown");
    let p = &v["mediatedDevices"]["parents"][0];
    for key in ["id", "gpu", "framework", "health", "profiles", "instances"] {
        assert!(p.get(key).is_some(), "parent key {key} missing");
    }
    let prof = &p["profiles"][0];
    for key in [
        "id",
        "name",
        "framebufferMiB",
        "maxInstances",
        "availableInstances",
        "deviceApi",
        "migSlices",
        "migMemoryGiB",
    ] {
        assert!(prof.get(key).is_some(), "profile key {key} missing");
    }
    assert_eq!(
        p["instances"][0]["uuid"],
        "de306c9f-a714-4373-a290-dc15d4e49b71"
    );
    assert_eq!(p["instances"][0]["profile"], "nvidia-746");
    let pool = &v["mediatedDevices"]["pools"][0];
    for key in ["gpu", "parents", "totalMiB", "usedMiB", "sizeLockedMiB"] {
        assert!(pool.get(key).is_some(), "pool key {key} missing");
    }
}

#[test]
fn vendor_vfio_framework_spelling() {
    assert_eq!(
        serde_json::to_string(&VgpuFramework::VendorVfio).unwrap(),
        "\"vendor-vfio\""
    );
    assert_eq!(
        serde_json::to_string(&GpuState::InUse).unwrap(),
        "\"in-use\""
    );
}

#[test]
fn decode_errors_name_what_and_where() {
    let e = Fleet::from_text("nodes: [ {node: a, gpus: 3} ]").unwrap_err();
    let msg = e.to_string();
    assert!(msg.starts_with("cannot decode fleet"), "{msg}");
    assert!(msg.contains("line") || msg.contains("column"), "{msg}");
}

#[test]
fn a_node_naming_a_missing_shape_is_refused_naming_the_node_and_the_shape() {
    let e = Fleet::from_text("nodes: [ {node: n1, shape: l40s} ]").unwrap_err();
    assert!(
        e.to_string()
            .contains("nodes[0] (node \"n1\"): no shape \"l40s\" in the fleet's `shapes`"),
        "{e}"
    );
}

#[test]
fn a_gpu_name_the_host_lacks_is_not_found_listing_the_host_gpus() {
    let mut topo = NodeTopology::new("n1");
    let e = topo.gpu_address_by_name("nvidia7").unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NotFound);
    assert_eq!(
        e.to_string(),
        "no GPU named \"nvidia7\" on this host; GPUs: none"
    );
    topo.gpus.push(Gpu::new(
        "nvidia0",
        "0000:3b:00.0".parse().unwrap(),
        0x10de,
        0x1e78,
        0x030000,
    ));
    assert_eq!(
        topo.gpu_address_by_name("nvidia7").unwrap_err().to_string(),
        "no GPU named \"nvidia7\" on this host; GPUs: nvidia0 (0000:3b:00.0)"
    );
    assert_eq!(
        topo.gpu_address_by_name("nvidia0").unwrap().to_string(),
        "0000:3b:00.0"
    );
}

#[test]
fn a_file_that_is_not_a_fleet_is_refused_not_read_as_an_empty_fleet() {
    let e =
        Fleet::from_text("name: inference\ndevices: [{name: gpu, profile: A2-4Q}]\n").unwrap_err();
    assert!(e.to_string().contains("unknown field"), "{e}");
}
