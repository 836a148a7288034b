//! Fuzzing by property: the sysfs parsers (NVIDIA `creatable_vgpu_types`, type descriptions) and
//! umockdev recordings never panic, and a recording, whatever its links, never materializes
//! anything outside its tree.
//!
//! `GPUSLICE_FUZZ_CASES` sets the cases per target (default 256; see the README for a long run).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

use gpu_sysfs::discover::{parse_creatable_vgpu_types, parse_current_vgpu_type, parse_description};
use gpu_sysfs::umockdev;
use proptest::prelude::*;

fn cases() -> u32 {
    gpu_core::testing::fuzz_cases(256)
}

/// Lines of a recording: paths, attributes and links, with hostile targets among them.
fn recording() -> impl Strategy<Value = String> {
    let line = prop_oneof![
        Just("P: /devices/a\n".to_owned()),
        Just("P: /devices/a/b\n".to_owned()),
        Just("P: /devices/a/up/c\n".to_owned()),
        Just("E: SUBSYSTEM=pci\n".to_owned()),
        Just("E: SUBSYSTEM=mdev\n".to_owned()),
        Just("E: DRIVER=nvidia\n".to_owned()),
        Just("A: class=0x030200\n".to_owned()),
        Just("A: mdev_supported_types/t/name=x\\n\n".to_owned()),
        Just("H: config=00ff\n".to_owned()),
        Just("L: up=..\n".to_owned()),
        Just("L: up=../..\n".to_owned()),
        Just("L: esc=up/../../../outside\n".to_owned()),
        Just("L: driver=../../bus/pci/drivers/nvidia\n".to_owned()),
        Just("L: iommu_group=../../kernel/iommu_groups/3\n".to_owned()),
        Just("L: loop=loop\n".to_owned()),
        Just("L: abs=/etc\n".to_owned()),
        Just("\n".to_owned()),
        "[PEALHNS]: [a-z/=.]{0,16}\n",
    ];
    proptest::collection::vec(line, 0..24).prop_map(|v| v.concat())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(cases()))]

    #[test]
    fn the_creatable_types_parser_never_panics(
        near in "([0-9]{0,11} ?: ?(NVIDIA )?[A-Za-z0-9 -]{0,12}\r?\n){0,8}",
        text in any::<String>(),
    ) {
        if let Ok(types) = parse_creatable_vgpu_types(&near, "f") {
            prop_assert!(types.iter().all(|(id, name)| *id > 0 && !name.trim().is_empty()));
        }
        let _ = parse_creatable_vgpu_types(&text, "f");
        let _ = parse_current_vgpu_type(&text, "f");
    }

    #[test]
    fn the_description_parser_never_panics(
        near in "((num_heads|framebuffer|max_instance|frl_config|max_resolution)=[0-9MGx]{0,24}, ?){0,6}",
        text in any::<String>(),
    ) {
        let _ = parse_description(&near, "f");
        let _ = parse_description(&text, "f");
    }

    #[test]
    fn recordings_never_panic_and_never_materialize_outside_their_tree(text in recording()) {
        let _ = umockdev::parse(&text, "fuzz");
        if let Ok(rec) = umockdev::parse(&text, "fuzz") {
            let base = tempfile::tempdir().unwrap();
            let root = base.path().join("root");
            std::fs::create_dir_all(&root).unwrap();
            let _ = rec.write_tree(&root, "fuzz");
            let outside: Vec<_> = std::fs::read_dir(base.path())
                .unwrap()
                .map(|e| e.unwrap().file_name())
                .collect();
            prop_assert_eq!(outside, vec![std::ffi::OsString::from("root")]);
        }
    }

    #[test]
    fn recordings_of_any_text_never_panic(text in any::<String>()) {
        let _ = umockdev::parse(&text, "fuzz");
    }
}
