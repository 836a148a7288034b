#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! Reading layout files: NVIDIA's own examples unchanged, gpuslice's per-address forms, and every
//! rejection with an error that names the place.

use gpu_core::Gpu;
use gpu_core::layout::{DeviceFilter, Devices, LayoutError, LayoutFile, Selector, TypeRef, Want};
use gpu_core::topology::PciId;

const EXAMPLE: &str = include_str!("data/nvidia-configs/config-example.yaml");
const T4: &str = include_str!("data/nvidia-configs/config-t4.yaml");

fn invalid(text: &str) -> (String, String) {
    match LayoutFile::parse(text) {
        Err(LayoutError::Invalid { at, why }) => (at, why),
        other => panic!("expected Invalid, got {other:?}"),
    }
}

#[test]
fn every_config_of_nvidias_example_file_parses_and_validates() {
    let f = LayoutFile::parse(EXAMPLE).unwrap();
    assert_eq!(f.configs.len(), 711);
    let entries: usize = f.configs.iter().map(|c| c.entries.len()).sum();
    assert_eq!(entries, 766);
    let default = f.select(Some("default")).unwrap();
    assert_eq!(default.entries.len(), 56);
    for e in &default.entries {
        let Selector::Indexed { devices, filters } = &e.selector else {
            panic!("default uses NVIDIA's form");
        };
        assert_eq!(*devices, Devices::All);
        assert_eq!(filters.len(), 1);
        assert_eq!(filters[0].vendor, 0x10de);
    }
    let me = f.select(Some("A30-1-6CME")).unwrap();
    let Want::Counts { types } = &me.entries[0].want else {
        panic!()
    };
    assert_eq!((types[0].name.as_str(), types[0].count), ("A30-1-6CME", 1));
}

#[test]
fn every_t4_layout_parses_with_per_index_entries() {
    let f = LayoutFile::parse(T4).unwrap();
    let names: Vec<&str> = f.configs.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "T4-1Q",
            "T4-2Q",
            "T4-4Q",
            "T4-8Q",
            "T4-16Q",
            "T4-small",
            "T4-medium",
            "T4-large"
        ]
    );
    let small = f.select(Some("T4-small")).unwrap();
    let devices: Vec<Devices> = small
        .entries
        .iter()
        .map(|e| match &e.selector {
            Selector::Indexed { devices, .. } => devices.clone(),
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(
        devices,
        [Devices::Indices(vec![0]), Devices::Indices(vec![1])]
    );
}

#[test]
fn choosing_a_config_needs_a_name_when_there_are_several() {
    let f = LayoutFile::parse(T4).unwrap();
    let e = f.select(None).unwrap_err();
    assert!(
        matches!(e, LayoutError::ConfigNotChosen { count: 8, .. }),
        "{e}"
    );
    let e = f.select(Some("T4-huge")).unwrap_err();
    assert!(
        e.to_string().contains("\"T4-huge\"") && e.to_string().contains("T4-small"),
        "{e}"
    );
    let one = LayoutFile::parse(
        "version: v1\nvgpu-configs:\n  only:\n    - devices: all\n      vgpu-devices: {A2-4Q: 4}\n",
    )
    .unwrap();
    assert_eq!(one.select(None).unwrap().name, "only");
}

#[test]
fn unknown_keys_are_rejected_at_every_level() {
    let (at, why) = invalid("version: v1\nvgpu-config: {}\n");
    assert_eq!(at, "the file");
    assert!(why.contains("\"vgpu-config\""), "{why}");
    let (at, why) = invalid(
        "version: v1\nvgpu-configs:\n  c:\n    - devices: all\n      vgpu-device: {A2-4Q: 4}\n",
    );
    assert_eq!(at, "vgpu-configs.c[0]");
    assert!(why.contains("unknown key \"vgpu-device\""), "{why}");
}

#[test]
fn counts_must_be_positive_integers() {
    for (count, shown) in [("0", "0"), ("-2", "-2"), ("two", "\"two\""), ("1.5", "1.5")] {
        let (at, why) = invalid(&format!(
            "version: v1\nvgpu-configs:\n  c:\n    - devices: all\n      vgpu-devices:\n        A2-4Q: {count}\n"
        ));
        assert_eq!(at, "vgpu-configs.c[0].vgpu-devices.A2-4Q");
        assert!(
            why.contains("positive integer") && why.contains(shown),
            "{why}"
        );
    }
}

#[test]
fn time_sliced_and_mig_backed_types_do_not_mix_in_one_entry() {
    let (at, why) = invalid(
        "version: v1\nvgpu-configs:\n  c:\n    - devices: all\n      vgpu-devices:\n        A100-1-5C: 2\n        A100-4C: 1\n",
    );
    assert_eq!(at, "vgpu-configs.c[0].vgpu-devices");
    assert!(
        why.contains("\"A100-4C\" is time-sliced") && why.contains("\"A100-1-5C\" is MIG-backed"),
        "{why}"
    );
}

#[test]
fn two_names_of_one_type_are_rejected_naming_both() {
    let e = LayoutFile::parse(
        "version: v1\nvgpu-configs:\n  c:\n    - devices: all\n      vgpu-devices:\n        A2-4Q: 2\n        NVIDIA A2-4Q: 1\n",
    )
    .unwrap_err();
    let LayoutError::DuplicateType { first, second, .. } = &e else {
        panic!("{e:?}")
    };
    assert_eq!((first.as_str(), second.as_str()), ("A2-4Q", "NVIDIA A2-4Q"));
    assert!(
        e.to_string().contains("\"A2-4Q\" and \"NVIDIA A2-4Q\""),
        "{e}"
    );
}

#[test]
fn malformed_values_are_rejected_naming_the_place() {
    let cases = [
        ("version: v2\nvgpu-configs: {}\n", "version", "only v1"),
        ("vgpu-configs: {}\n", "the file", "'version'"),
        (
            "version: v1\nvgpu-configs: {}\n",
            "vgpu-configs",
            "at least one",
        ),
        (
            "version: v1\nvgpu-configs:\n  c: []\n",
            "vgpu-configs.c",
            "at least one entry",
        ),
        (
            "version: v1\nvgpu-configs:\n  c:\n    - devices: some\n      vgpu-devices: {A2-4Q: 1}\n",
            "vgpu-configs.c[0].devices",
            "\"some\"",
        ),
        (
            "version: v1\nvgpu-configs:\n  c:\n    - devices: [0, -1]\n      vgpu-devices: {A2-4Q: 1}\n",
            "vgpu-configs.c[0].devices",
            "-1",
        ),
        (
            "version: v1\nvgpu-configs:\n  c:\n    - vgpu-devices: {A2-4Q: 1}\n",
            "vgpu-configs.c[0]",
            "'devices'",
        ),
        (
            "version: v1\nvgpu-configs:\n  c:\n    - devices: all\n      device-filter: 0x25B6\n      vgpu-devices: {A2-4Q: 1}\n",
            "vgpu-configs.c[0].device-filter",
            "0xDDDDVVVV",
        ),
        (
            "version: v1\nvgpu-configs:\n  c:\n    - devices: all\n      device-filter: [\"0x25B610DE:0x1234\"]\n      vgpu-devices: {A2-4Q: 1}\n",
            "vgpu-configs.c[0].device-filter",
            "0x25B610DE:0x1234",
        ),
        (
            "version: v1\nvgpu-configs:\n  c:\n    - devices: all\n      vgpu-devices: {A2-4q: 1}\n",
            "vgpu-configs.c[0].vgpu-devices.A2-4q",
            "series",
        ),
        (
            "version: v1\nvgpu-configs:\n  c:\n    \"0000:08:00\": {A2-4Q: 1}\n",
            "vgpu-configs.c.0000:08:00",
            "PCI address",
        ),
        (
            "version: v1\nvgpu-configs:\n  c:\n    \"0000:26:00.4\": [1155]\n",
            "vgpu-configs.c.0000:26:00.4",
            "type ID or name",
        ),
    ];
    for (text, want_at, want_why) in cases {
        let (at, why) = invalid(text);
        assert_eq!(at, want_at, "{text}");
        assert!(why.contains(want_why), "{text}: {why}");
    }
    let e = LayoutFile::parse("version: v1\nvgpu-configs: [unclosed\n").unwrap_err();
    assert!(matches!(e, LayoutError::Decode { .. }));
    assert_eq!(e.kind().as_str(), "decode");
}

#[test]
fn device_filters_match_ids_and_optionally_the_subsystem() {
    let mut gpu = Gpu::new(
        "nvidia0",
        "0000:3b:00.0".parse().unwrap(),
        0x10de,
        0x1e78,
        0x030000,
    );
    gpu.subsystem_vendor_id = Some(PciId(0x10de));
    gpu.subsystem_device_id = Some(PciId(0x13d8));
    assert!(DeviceFilter::parse("0x1E7810DE").unwrap().matches(&gpu));
    assert!(DeviceFilter::parse("1e7810de").unwrap().matches(&gpu));
    assert!(
        DeviceFilter::parse("0x1E7810DE:0x13D810DE")
            .unwrap()
            .matches(&gpu)
    );
    assert!(
        !DeviceFilter::parse("0x1E7810DE:0x13D910DE")
            .unwrap()
            .matches(&gpu)
    );
    assert!(!DeviceFilter::parse("0x20B510DE").unwrap().matches(&gpu));
    assert_eq!(
        DeviceFilter::parse("0x1e7810de:0x13d810de")
            .unwrap()
            .to_string(),
        "0x1E7810DE:0x13D810DE"
    );
}

#[test]
fn per_address_forms_select_gpus_and_pin_vf_types() {
    let f = LayoutFile::parse(
        "version: v1\nvgpu-configs:\n  lab:\n    \"0000:08:00.0\": {A2-4Q: 4}\n    0000:09:00.0: {}\n  pinned:\n    \"0000:26:00.4\": 1155\n    \"0000:26:00.5\": L40S-24Q\n    \"0000:26:00.6\": 0\n",
    )
    .unwrap();
    let lab = f.select(Some("lab")).unwrap();
    assert_eq!(
        lab.entries[0].selector,
        Selector::Gpu {
            address: "0000:08:00.0".parse().unwrap()
        }
    );
    assert_eq!(
        lab.entries[1].want,
        Want::Counts { types: vec![] },
        "an empty mapping asks for no vGPUs"
    );
    let pinned = f.select(Some("pinned")).unwrap();
    let wants: Vec<&Want> = pinned.entries.iter().map(|e| &e.want).collect();
    assert_eq!(
        wants,
        [
            &Want::VfType {
                ty: Some(TypeRef::Id("1155".into()))
            },
            &Want::VfType {
                ty: Some(TypeRef::Name("L40S-24Q".into()))
            },
            &Want::VfType { ty: None },
        ]
    );
}

#[test]
fn the_documented_example_layouts_parse() {
    for (name, text, configs) in [
        ("a2.yaml", include_str!("../../examples/layouts/a2.yaml"), 3),
        (
            "per-gpu.yaml",
            include_str!("../../examples/layouts/per-gpu.yaml"),
            2,
        ),
        (
            "l40s-vfs.yaml",
            include_str!("../../examples/layouts/l40s-vfs.yaml"),
            1,
        ),
    ] {
        let f = LayoutFile::parse(text).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(f.configs.len(), configs, "{name}");
    }
}

#[test]
fn the_per_device_form_names_virtual_mdev_parents_with_their_drivers_type_names() {
    let f = LayoutFile::parse(
        "version: v1\nvgpu-configs:\n  lab:\n    mbochs: {mbochs-medium: 2, mbochs-small: 3}\n    mtty: {Single port serial: 2, mtty-2: 1}\n    mdpy:\n",
    )
    .unwrap();
    let lab = f.select(Some("lab")).unwrap();
    let selectors: Vec<String> = lab
        .entries
        .iter()
        .map(|e| match &e.selector {
            Selector::Parent { parent } => parent.to_string(),
            other => panic!("expected a named parent, got {other:?}"),
        })
        .collect();
    assert_eq!(selectors, ["mbochs", "mtty", "mdpy"]);
    let Want::Counts { types } = &lab.entries[1].want else {
        panic!("counts expected");
    };
    let names: Vec<(&str, u32)> = types.iter().map(|t| (t.name.as_str(), t.count)).collect();
    assert_eq!(names, [("Single port serial", 2), ("mtty-2", 1)]);
    assert_eq!(
        lab.entries[2].want,
        Want::Counts { types: vec![] },
        "an empty entry asks for no instances"
    );
}

#[test]
fn a_named_parent_entry_is_refused_when_malformed() {
    let (at, why) = invalid("version: v1\nvgpu-configs:\n  lab:\n    mbochs: 3\n");
    assert_eq!(at, "vgpu-configs.lab.mbochs");
    assert!(why.contains("type name → count"), "{why}");
    let (at, why) = invalid("version: v1\nvgpu-configs:\n  lab:\n    mbochs: {mbochs-small: 0}\n");
    assert_eq!(at, "vgpu-configs.lab.mbochs.mbochs-small");
    assert!(why.contains("positive"), "{why}");
    let (at, why) =
        invalid("version: v1\nvgpu-configs:\n  lab:\n    \"0000:zz:00.0\": {A2-4Q: 1}\n");
    assert_eq!(at, "vgpu-configs.lab.0000:zz:00.0");
    assert!(why.contains("PCI addresses or mdev parent names"), "{why}");
    let (_, why) =
        invalid("version: v1\nvgpu-configs:\n  lab:\n    ../mbochs: {mbochs-small: 1}\n");
    assert!(why.contains("device name"), "{why}");
}

#[test]
fn a_malformed_device_filter_is_a_typed_error_naming_the_text() {
    let e = DeviceFilter::parse("0x1E78").unwrap_err();
    assert_eq!(
        e,
        gpu_core::CoreError::InvalidDeviceFilter {
            input: "0x1E78".into()
        }
    );
    assert_eq!(
        e.to_string(),
        "invalid device-filter \"0x1E78\": expected 0xDDDDVVVV (device and vendor ID) with an \
         optional :0xSSSSVVVV (subsystem device and vendor ID)"
    );
}
